"""What llm-api reads in one English message: a city, a stay, guests, a price limit, which offer to book, a booking
id, and what the person wants. Pure functions; ``today`` is passed in (docs/llm-api.md lists every phrasing).

Dates are ISO (``2031-03-10``), or a day and a month name in either order (``10 March``, ``March 10th``, ``10th of
Mar 2031``), or ``today``/``tomorrow``; without a year, the next such date from today (a check-out: the next after
the check-in). Numeric forms like ``10/03`` are ambiguous (10 March or 3 October) and are never guessed: the
message is flagged so the model asks for the month in words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from enum import StrEnum
from typing import Any

__all__ = [
    "Intent",
    "Reading",
    "Selection",
    "StaySlots",
    "find_booking_id",
    "read",
    "resolve_day",
    "select_offer",
]

MONTHS = {
    "january": 1,
    "february": 2,
    "march": 3,
    "april": 4,
    "may": 5,
    "june": 6,
    "july": 7,
    "august": 8,
    "september": 9,
    "october": 10,
    "november": 11,
    "december": 12,
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "sept": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
}
NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "single": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "twenty": 20,
    "thirty": 30,
}
ORDINALS = {
    "first": 1,
    "second": 2,
    "third": 3,
    "fourth": 4,
    "fifth": 5,
    "sixth": 6,
    "seventh": 7,
    "eighth": 8,
    "ninth": 9,
    "tenth": 10,
}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_MONTH = r"(?P<{name}>" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<{name}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<{name}>\d{{4}}))?"
_NUMBER = r"(?P<{name}>\d+|" + "|".join(sorted(NUMBER_WORDS, key=len, reverse=True)) + ")"
_COUNT = (
    r"(?P<{name}>\d{{1,2}}|" + "|".join(sorted(set(NUMBER_WORDS) - {"a", "an", "single"}, key=len, reverse=True)) + ")"
)
_MONTH_NAMES = "|".join(sorted(MONTHS, key=len, reverse=True))


def _p(template: str, **names: str) -> str:
    return template.format(**names)


_ISO = re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})\b")
_DAY_MONTH = re.compile(
    r"\b" + _p(_DAY, name="d") + r"(?:\s+of)?\s+" + _p(_MONTH, name="m") + _p(_YEAR, name="y") + r"\b", re.I
)
_MONTH_DAY = re.compile(r"\b" + _p(_MONTH, name="m") + r"\s+" + _p(_DAY, name="d") + _p(_YEAR, name="y") + r"\b", re.I)
_RANGE_SEP = r"\s*(?:-|–|to|until|till|through)\s*"
_DAYS_MONTH = re.compile(
    r"\b" + _p(_DAY, name="d1") + _RANGE_SEP + _p(_DAY, name="d2") + r"(?:\s+of)?\s+" + _p(_MONTH, name="m") + r"\b",
    re.I,
)
_MONTH_DAYS = re.compile(
    r"\b" + _p(_MONTH, name="m") + r"\s+" + _p(_DAY, name="d1") + _RANGE_SEP + _p(_DAY, name="d2") + r"\b", re.I
)
_BETWEEN_DAYS = re.compile(
    r"\bbetween\s+"
    + _p(_DAY, name="d1")
    + r"\s+and\s+"
    + _p(_DAY, name="d2")
    + r"(?:\s+of)?\s+"
    + _p(_MONTH, name="m"),
    re.I,
)
_RELATIVE = re.compile(r"\b(?P<w>the day after tomorrow|today|tonight|tomorrow)\b", re.I)
_NUMERIC_DATE = re.compile(r"(?<![\d/.-])(?P<text>\d{1,2}/\d{1,2}(?:/\d{2,4})?|\d{1,2}\.\d{1,2}\.\d{2,4})(?![\d/.])")
_PRICE_PER_NIGHT = re.compile(
    r"(?:€|\$)?(?P<n>\d+(?:[.,]\d+)?)\s*(?:€|eur|euros?|\$|usd|dollars?)?\s*(?:a|per|each|/)\s*night\b", re.I
)
_NIGHTS = re.compile(r"\b" + _p(_NUMBER, name="n") + r"\s+(?P<unit>nights?|weeks?)\b", re.I)
_A_NIGHT = re.compile(r"\b(?:for\s+)?(?:a|one|the)\s+(?P<unit>night|week)\b", re.I)
_CHECKOUT_WORDS = re.compile(
    r"\b(?:check[- ]?out|leaving|leave|depart(?:ure|ing)?|until|till|through|to|and)\s*(?:on|is|:|the)?\s*$", re.I
)
_CHECKIN_WORDS = re.compile(
    r"\b(?:check[- ]?in|arriv(?:e|ing|al)|from|starting|start|on|beginning)\s*(?:on|is|:|the)?\s*$", re.I
)
_GUESTS = (
    re.compile(r"\b" + _p(_COUNT, name="n") + r"\s+(?:guests?|people|persons?|adults?|travell?ers|of us)\b", re.I),
    re.compile(r"\bparty of\s+" + _p(_COUNT, name="n") + r"\b", re.I),
    re.compile(r"\bguests?\s*(?:[:=]|is|are)?\s*" + _p(_COUNT, name="n") + r"\b", re.I),
    re.compile(
        r"\bfor\s+(?:the\s+)?" + _p(_COUNT, name="n") + r"\b(?!\s*(?:-|–)?\s*(?:nights?|weeks?|days?|stars?|"
        r"eur|euros?|dollars?|usd|a night|per night|" + _MONTH_NAMES + r")\b)(?![.,/]\d|\d|\s*[€$])",
        re.I,
    ),
)
_SOLO = re.compile(r"\b(?:just me|only me|by myself|alone|solo|for myself)\b", re.I)
_COUPLE = re.compile(r"\b(?:my (?:wife|husband|partner|girlfriend|boyfriend) and (?:i|me)|for us two|a couple)\b", re.I)
_PRICE = re.compile(
    r"\b(?:under|below|less than|cheaper than|max(?:imum)?|at most|up to|no more than|not more than|budget(?: of| is)?|"
    r"spend(?:ing)? at most)\s*(?:of\s*)?(?:€|\$|eur\s*|usd\s*)?(?P<n>\d+(?:[.,]\d+)?)"
    r"(?!\s*(?:guests?|people|persons?|nights?|adults?|stars?|weeks?)\b)",
    re.I,
)
_PRICE_AFTER = re.compile(
    r"(?:€|\$)?(?P<n>\d+(?:[.,]\d+)?)\s*(?:€|eur|euros?|\$|usd|dollars?)?\s+(?:max(?:imum)?|tops)\b", re.I
)
_NO_PRICE_LIMIT = re.compile(r"\b(?:any price|no (?:price )?limit|price doesn'?t matter|no budget)\b", re.I)
_CITY_AFTER = re.compile(r"\b(?:in|to|visiting|visit)\s+(?P<city>[A-Z][a-zà-öø-ÿ]+(?:[ -][A-Z][a-zà-öø-ÿ]+)?)")
_BOOKING_ID = re.compile(r"\b(?P<id>[0-9a-f]{32})\b", re.I)
_NAMED_BOOKING = re.compile(
    r"\bbooking(?:\s+(?:id|number|no\.?|#))?\s*[:#]?\s*(?P<id>[A-Za-z0-9][A-Za-z0-9_-]{5,63})\b"
)
_HOTEL_ID = re.compile(r"\b(?P<id>[a-z]+(?:-[a-z]+)*-\d{2})\b", re.I)
_ORDINAL = re.compile(
    r"\b(?P<word>"
    + "|".join(ORDINALS)
    + r"|last)\b|\b(?P<num>\d{1,2})(?:st|nd|rd|th)\b(?!\s+(?:of\s+)?(?:"
    + _MONTH_NAMES
    + r")\b)|"
    r"(?:\bnumber|\bno\.|\boption|#)\s*(?P<n>\d{1,2})\b",
    re.I,
)
_CHEAPEST = re.compile(r"\b(?:cheapest|lowest price|least expensive|most affordable|cheaper one|budget one)\b", re.I)
_PRICIEST = re.compile(r"\b(?:most expensive|priciest|dearest)\b", re.I)
_BEST = re.compile(r"\b(?:best|highest[- ]rated|most stars|top[- ]rated|nicest|luxur\w*)\b", re.I)
_THAT_ONE = re.compile(r"\b(?:it|that one|this one|that hotel|this hotel|that|this)\b", re.I)

_CANCEL = re.compile(r"\bcancel(?:l?ing|l?ed|lation)?\b", re.I)
_STATUS = re.compile(
    r"\b(?:status|what(?:'s| is) happening with|how is my booking|where is my booking|is (?:my|the) booking|"
    r"check (?:on )?(?:my |the )?booking|look up (?:my |the )?booking|show (?:me )?(?:my |the )?booking)\b",
    re.I,
)
_LIST = re.compile(
    r"\b(?:(?:my|our|all) (?:bookings|reservations)|(?:bookings|reservations) (?:do|have) (?:i|we)|"
    r"list (?:my |the )?(?:bookings|reservations))\b",
    re.I,
)
_BOOK = re.compile(r"\b(?:book|reserve|i'?ll take|we'?ll take|take|go (?:for|with)|choose|pick|want|i'?d like)\b", re.I)
_SEARCH = re.compile(
    r"\b(?:hotels?|rooms?|stay|search|find|look(?:ing)? for|accommodation|place to stay|options)\b", re.I
)
_THANKS = re.compile(r"\b(?:thanks|thank you|cheers|great|perfect|bye|goodbye)\b", re.I)
_DECLINE = re.compile(r"^\s*(?:no|nope|nothing|never ?mind|don'?t|do not)\b", re.I)


class Intent(StrEnum):
    """What the person asks for in a message."""

    SEARCH = "search"
    BOOK = "book"
    STATUS = "status"
    LIST = "list"
    """The person's bookings ("what bookings do I have?")."""
    CANCEL = "cancel"
    THANKS = "thanks"
    DECLINE = "decline"
    OTHER = "other"


@dataclass(frozen=True)
class Selection:
    """Which offer "book ..." means: by position (1-based, -1 the last), the cheapest, the priciest, the best, a
    hotel id, a name (matched against the offers later), or "it" (the only one)."""

    position: int | None = None
    cheapest: bool = False
    priciest: bool = False
    best: bool = False
    hotel_id: str | None = None
    words: str = ""
    """The message, lower-cased, to match hotel names in."""
    only_one: bool = False

    @property
    def explicit(self) -> bool:
        return self.position is not None or self.cheapest or self.priciest or self.best or self.hotel_id is not None


@dataclass(frozen=True)
class StaySlots:
    """A search as far as the conversation gave it; later messages override earlier ones piece by piece."""

    city: str | None = None
    checkin: date | None = None
    checkout: date | None = None
    nights: int | None = None
    guests: int | None = None
    max_price: float | None = None
    no_price_limit: bool = False

    def merged(self, newer: StaySlots) -> StaySlots:
        out = self
        if newer.city:
            out = replace(out, city=newer.city)
        if newer.checkin:
            out = replace(out, checkin=newer.checkin)
            if out.checkout is not None and out.checkout <= newer.checkin and newer.checkout is None:
                out = replace(out, checkout=None)
        if newer.checkout:
            out = replace(out, checkout=newer.checkout, nights=newer.nights)
        elif newer.nights:
            out = replace(out, nights=newer.nights, checkout=None)
        if newer.guests:
            out = replace(out, guests=newer.guests)
        if newer.no_price_limit:
            out = replace(out, max_price=None)
        elif newer.max_price is not None:
            out = replace(out, max_price=newer.max_price)
        return out

    @property
    def stay_end(self) -> date | None:
        if self.checkin is None:
            return None
        if self.checkout is not None:
            return self.checkout
        return self.checkin + timedelta(days=self.nights) if self.nights else None

    def missing(self) -> list[str]:
        """What a search still needs, in words."""
        needs = []
        if not self.city:
            needs.append("the city")
        if self.checkin is None:
            needs.append('the check-in date (e.g. "from 10 March")')
        elif self.stay_end is None:
            needs.append('how many nights (or the check-out date, e.g. "for 2 nights")')
        if not self.guests:
            needs.append('how many guests (e.g. "for two")')
        return needs


@dataclass(frozen=True)
class Reading:
    """One message, read."""

    intent: Intent
    slots: StaySlots
    selection: Selection
    booking_id: str | None = None
    ambiguous_dates: tuple[str, ...] = ()
    mentions_stay: bool = False
    wants_booking: bool = False
    """``book`` (or a synonym) appears, whatever else the message asks."""
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_day(day: int, month: int, year: int | None, after: date) -> date | None:
    """The date ``day month [year]``; without a year, the first one on or after ``after``. ``None``: no such day."""
    if year is not None:
        try:
            return date(year, month, day)
        except ValueError:
            return None
    for candidate_year in range(after.year, after.year + 9):  # 29 February comes back within 8 years
        try:
            candidate = date(candidate_year, month, day)
        except ValueError:
            continue
        if candidate >= after:
            return candidate
    return None


def _number(text: str) -> int | None:
    text = text.lower()
    if text.isdigit():
        return int(text)
    return NUMBER_WORDS.get(text)


@dataclass(frozen=True)
class _Found:
    start: int
    end: int
    day: int | None = None
    month: int | None = None
    year: int | None = None
    exact: date | None = None
    """ISO and relative dates are exact (no "next such day")."""


def _dates(text: str, today: date) -> tuple[list[_Found], list[tuple[_Found, _Found]]]:
    """Single dates and ranges (``10-12 March``), in order of appearance, none overlapping."""
    taken: list[tuple[int, int]] = []

    def free(start: int, end: int) -> bool:
        return all(end <= s or start >= e for s, e in taken)

    ranges: list[tuple[_Found, _Found]] = []
    for pattern in (_DAYS_MONTH, _MONTH_DAYS, _BETWEEN_DAYS):
        for match in pattern.finditer(text):
            if not free(*match.span()):
                continue
            month = MONTHS[match["m"].lower().rstrip(".")]
            first = _Found(match.start(), match.end(), int(match["d1"]), month)
            second = _Found(match.start(), match.end(), int(match["d2"]), month)
            ranges.append((first, second))
            taken.append(match.span())
    singles: list[_Found] = []
    for match in _ISO.finditer(text):
        if free(*match.span()):
            singles.append(_Found(match.start(), match.end(), int(match["d"]), int(match["m"]), int(match["y"])))
            taken.append(match.span())
    for pattern in (_DAY_MONTH, _MONTH_DAY):
        for match in pattern.finditer(text):
            if not free(*match.span()):
                continue
            year = int(match["y"]) if match["y"] else None
            month = MONTHS[match["m"].lower().rstrip(".")]
            singles.append(_Found(match.start(), match.end(), int(match["d"]), month, year))
            taken.append(match.span())
    for match in _RELATIVE.finditer(text):
        if free(*match.span()):
            word = match["w"].lower()
            offset = {"today": 0, "tonight": 0, "tomorrow": 1}.get(word, 2)
            singles.append(_Found(match.start(), match.end(), exact=today + timedelta(days=offset)))
            taken.append(match.span())
    singles.sort(key=lambda f: f.start)
    return singles, ranges


def _resolve(found: _Found, after: date) -> date | None:
    if found.exact is not None:
        return found.exact
    assert found.day is not None and found.month is not None
    return resolve_day(found.day, found.month, found.year, after)


def _role(text: str, found: _Found) -> str | None:
    """``checkin`` or ``checkout`` by the words just before the date, or ``None``."""
    before = text[max(0, found.start - 24) : found.start]
    if _CHECKOUT_WORDS.search(before):
        return "checkout"
    if _CHECKIN_WORDS.search(before):
        return "checkin"
    return None


def _stay(text: str, today: date) -> tuple[date | None, date | None, int | None]:
    """``(checkin, checkout, nights)`` as far as ``text`` says them (a price "a night" is no stay)."""
    text = _PRICE_PER_NIGHT.sub(lambda m: " " * len(m[0]), text)
    singles, ranges = _dates(text, today)
    nights = None
    match = _NIGHTS.search(text) or _A_NIGHT.search(text)
    if match:
        count = _number(match.groupdict().get("n") or "1") or 1
        nights = count * 7 if match["unit"].lower().startswith("week") else count
    if ranges:
        first, second = ranges[0]
        checkin = _resolve(first, today)
        checkout = _resolve(second, checkin + timedelta(days=1)) if checkin else None
        return checkin, checkout, None
    roles = [(_role(text, found), found) for found in singles]
    arrive = next((f for r, f in roles if r == "checkin"), None) or next((f for r, f in roles if r is None), None)
    leave = next((f for r, f in roles if r == "checkout"), None)
    if leave is None and arrive is not None:
        leave = next((f for r, f in roles if r is None and f.start > arrive.start), None)
    checkin = _resolve(arrive, today) if arrive is not None else None
    checkout = _resolve(leave, checkin + timedelta(days=1) if checkin else today) if leave is not None else None
    return checkin, checkout, nights if checkout is None else None


def _guests(text: str) -> int | None:
    for pattern in _GUESTS:
        match = pattern.search(text)
        if match:
            number = _number(match["n"])
            if number:
                return number
    if _SOLO.search(text):
        return 1
    if _COUPLE.search(text) and not re.search(r"\ba couple of\b", text, re.I):
        return 2
    return None


def _price(text: str) -> float | None:
    match = _PRICE.search(text) or _PRICE_AFTER.search(text) or _PRICE_PER_NIGHT.search(text)
    return float(match["n"].replace(",", ".")) if match else None


def _city(text: str, known: Iterable[str]) -> str | None:
    lowered = text.lower()
    best: tuple[int, str] | None = None
    for city in known:
        found = re.search(rf"\b{re.escape(city.lower())}\b", lowered)
        if found and (best is None or found.start() < best[0]):
            best = (found.start(), city)
    if best is not None:
        return best[1]
    for match in _CITY_AFTER.finditer(text):
        words = match["city"].split()
        if words[0].lower() in MONTHS or words[0].lower() in WEEKDAYS:
            continue
        return match["city"]
    return None


def _without_dates(text: str) -> str:
    """``text`` with its dates blanked out (so "March 10th" is no "10th one")."""
    for pattern in (_DAYS_MONTH, _MONTH_DAYS, _BETWEEN_DAYS, _ISO, _DAY_MONTH, _MONTH_DAY):
        text = pattern.sub(lambda m: " " * len(m[0]), text)
    return text


def find_booking_id(text: str) -> str | None:
    """A booking id in ``text``: 32 hex characters, or the word after "booking" when it looks like an id."""
    match = _BOOKING_ID.search(text)
    if match:
        return match["id"].lower()
    named = _NAMED_BOOKING.search(text)
    if named and any(c.isdigit() for c in named["id"]):
        return named["id"]
    return None


def _selection(text: str) -> Selection:
    lowered = text.lower()
    position = None
    for match in _ORDINAL.finditer(text):
        if match["word"]:
            position = -1 if match["word"].lower() == "last" else ORDINALS[match["word"].lower()]
        else:
            position = int(match["num"] or match["n"])
        break
    hotel = _HOTEL_ID.search(text)
    return Selection(
        position=position,
        cheapest=bool(_CHEAPEST.search(text)),
        priciest=bool(_PRICIEST.search(text)),
        best=bool(_BEST.search(text)),
        hotel_id=hotel["id"].lower() if hotel else None,
        words=lowered,
        only_one=bool(_THAT_ONE.search(text)),
    )


def read(text: str, today: date, cities: Sequence[str] = ()) -> Reading:
    """Read one message of the person's (``cities``: names known for sure, matched anywhere in any case)."""
    checkin, checkout, nights = _stay(text, today)
    slots = StaySlots(
        city=_city(text, cities),
        checkin=checkin,
        checkout=checkout,
        nights=nights,
        guests=_guests(text),
        max_price=_price(text),
        no_price_limit=bool(_NO_PRICE_LIMIT.search(text)),
    )
    selection = _selection(_without_dates(text))
    ambiguous = tuple(m["text"] for m in _NUMERIC_DATE.finditer(text))
    mentions_stay = any(
        (
            slots.city,
            slots.checkin,
            slots.checkout,
            slots.nights,
            slots.guests,
            slots.max_price is not None,
            slots.no_price_limit,
        )
    )
    wants_booking = bool(_BOOK.search(text))
    booking_id = find_booking_id(text)
    if _CANCEL.search(text):
        intent = Intent.CANCEL
    elif _LIST.search(text) and not booking_id:
        intent = Intent.LIST
    elif _STATUS.search(text) or (booking_id and not mentions_stay and not wants_booking):
        intent = Intent.STATUS
    elif (wants_booking and (selection.explicit or not mentions_stay) and not _SEARCH.search(text)) or (
        wants_booking and selection.explicit
    ):
        intent = Intent.BOOK
    elif mentions_stay or ambiguous or _SEARCH.search(text) or wants_booking:
        intent = Intent.SEARCH
    elif _DECLINE.search(text):
        intent = Intent.DECLINE
    elif _THANKS.search(text):
        intent = Intent.THANKS
    else:
        intent = Intent.OTHER
    return Reading(intent, slots, selection, booking_id, ambiguous, mentions_stay, wants_booking)


def _name_words(name: str, city: str) -> str:
    """A hotel's name without its city ("Grand Palace Lisbon" → "grand palace")."""
    words = name.lower().split()
    city_words = city.lower().split()
    if city_words and words[-len(city_words) :] == city_words:
        words = words[: -len(city_words)]
    return " ".join(words)


def select_offer(selection: Selection, offers: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The offer ``selection`` means among ``offers`` (in the order they were shown), or ``None``."""
    if not offers:
        return None
    if selection.hotel_id:
        by_id = [o for o in offers if str(o.get("hotel_id", "")).lower() == selection.hotel_id]
        if by_id:
            return by_id[0]
    named = []
    for offer in offers:
        name = str(offer.get("name", "")).lower()
        short = _name_words(name, str(offer.get("city", "")))
        for candidate in (name, short):
            if candidate and re.search(rf"\b{re.escape(candidate)}\b", selection.words):
                named.append((len(candidate), offer))
                break
    if named:
        return max(named, key=lambda pair: pair[0])[1]
    priced = [o for o in offers if isinstance(o.get("price_per_night"), int | float)]
    if selection.cheapest and priced:
        return min(priced, key=lambda o: o["price_per_night"])
    if selection.priciest and priced:
        return max(priced, key=lambda o: o["price_per_night"])
    if selection.best:
        rated = [o for o in offers if isinstance(o.get("stars"), int)]
        if rated:
            return max(rated, key=lambda o: (o["stars"], -float(o.get("price_per_night") or 0)))
    if selection.position is not None:
        index = selection.position - 1 if selection.position > 0 else len(offers) + selection.position
        return offers[index] if 0 <= index < len(offers) else None
    if selection.only_one and len(offers) == 1:
        return offers[0]
    return None
