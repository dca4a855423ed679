"""What llm-api answers to a conversation: one tool call, or words (docs/llm-api.md has the rules and phrasings).

The person's messages accumulate a search (a later message overrides a piece of an earlier one); the last one says
what to do. After a tool result the model reports it in words, books straight after a search when the person asked
for it ("book the cheapest in Lisbon from 10 March for 2 nights for two"), and retries a tool once when its error
names an argument that its own reading of the conversation gives differently. It only calls tools the request
offers, and asks in words for whatever a call still lacks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, SEARCH_HOTELS
from providers.llm.language import (
    Intent,
    Reading,
    StaySlots,
    find_booking_id,
    read,
    select_offer,
)
from providers.llm.wire import AssistantMessage, SystemMessage, ToolMessage, UserMessage, text_of

__all__ = ["Conversation", "Decision", "PlannedCall", "today_from_prompt"]

AnyMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage

_TODAY = re.compile(
    r"\b(?:today is|today's date is|current date(?: is)?:?|the date is|date today:?)\s*(\d{4}-\d{2}-\d{2})", re.I
)
_MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_BARE_NUMBER = re.compile(r"^\s*(\d{1,2}|one|two|three|four|five|six|seven|eight)\s*[.!]?\s*$", re.I)
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
_DECLINED = ("declined", "refused", "rejected", "denied")
HELP = (
    "I can find and book hotels. Tell me the city, the dates and how many guests, for example: "
    '"two nights in Lisbon from 10 March for two, under 150 a night". I can also tell you the status of a booking '
    "or cancel it."
)
DEFAULT_SEARCH_DAYS_AHEAD = 30
"""A runaway search (``loop_tool``) with no stay in the conversation looks this far ahead, for two nights."""


@dataclass(frozen=True)
class PlannedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """The model's answer: words, or one tool call."""

    text: str | None = None
    call: PlannedCall | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.call is None):
            raise ValueError("a decision is either text or a tool call")


def today_from_prompt(messages: Sequence[AnyMessage], default: date) -> date:
    """ "Today is YYYY-MM-DD" in a system message sets the model's today (as a real prompt tells a real model)."""
    for message in messages:
        if isinstance(message, SystemMessage):
            match = _TODAY.search(text_of(message.content))
            if match:
                try:
                    return date.fromisoformat(match[1])
                except ValueError:
                    continue
    return default


def _day(value: date) -> str:
    return f"{value.day} {_MONTH_NAMES[value.month - 1]} {value.year}"


def _span(checkin: date, checkout: date) -> str:
    if checkin.year == checkout.year:
        return f"{checkin.day} {_MONTH_NAMES[checkin.month - 1]} to {_day(checkout)}"
    return f"{_day(checkin)} to {_day(checkout)}"


def _money(amount: object, currency: object) -> str:
    if not isinstance(amount, int | float):
        return "?"
    shown = f"{amount:.0f}" if float(amount).is_integer() else f"{amount:.2f}"
    return f"{shown} {currency or 'EUR'}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _json(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


def _unwrap(data: Any) -> Any:
    """A tool result inside a wrapper (``{"result": ...}``, ``{"data": ...}``, ``{"output": ...}``)."""
    for _ in range(3):
        if isinstance(data, Mapping) and len(data) == 1:
            ((key, inner),) = data.items()
            if key in ("result", "data", "output", "content") and isinstance(inner, Mapping | list | str):
                data = _json(inner) if isinstance(inner, str) else inner
                continue
        break
    return data


def _error_of(data: Any) -> dict[str, Any] | None:
    """``{"code", "message", "field"}`` when a tool result is an error, else ``None``."""
    if isinstance(data, str):
        if re.match(r"^\s*(?:error|exception|tool error)\b", data, re.I):
            return {"code": None, "message": data.strip(), "field": None}
        return None
    if not isinstance(data, Mapping):
        return None
    error = data.get("error")
    if error is None or error is False:
        return None
    if isinstance(error, str):
        message = data.get("message") if isinstance(data.get("message"), str) else None
        return {"code": error, "message": message, "field": data.get("field") or data.get("param")}
    if isinstance(error, Mapping):
        return {
            "code": error.get("code") or error.get("type"),
            "message": error.get("message"),
            "field": error.get("field") or error.get("param") or error.get("fields"),
        }
    return {"code": None, "message": str(error), "field": None}


def _offers_of(data: Any) -> list[dict[str, Any]] | None:
    if isinstance(data, Mapping) and isinstance(data.get("offers"), list):
        return [o for o in data["offers"] if isinstance(o, Mapping)]  # type: ignore[misc]
    if isinstance(data, list) and all(isinstance(o, Mapping) and "hotel_id" in o for o in data):
        return list(data)
    return None


def _booking_of(data: Any) -> dict[str, Any] | None:
    if isinstance(data, Mapping):
        if isinstance(data.get("booking"), Mapping):
            return dict(data["booking"])
        if "booking_id" in data or "status" in data:
            return dict(data)
    return None


def _declined(data: Any) -> bool:
    """The person refused the approval (the concierge says so in the tool result)."""
    if isinstance(data, str):
        return any(word in data.lower() for word in _DECLINED) and "card" not in data.lower()
    if not isinstance(data, Mapping):
        return False
    if data.get("approved") is False or data.get("approve") is False:
        return True
    status = str(data.get("status") or data.get("decision") or "").lower()
    if status in _DECLINED:
        return True
    error = _error_of(data)
    code = str((error or {}).get("code") or "").lower()
    return any(word in code for word in _DECLINED) and "payment" not in code and "card" not in code


def _arguments(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class _Step:
    """One tool call of the conversation and its result (``None`` while it has none)."""

    index: int
    """The position of the assistant message that made it."""
    call_id: str
    name: str
    raw_arguments: str
    result: Any = None
    answered: bool = False

    @property
    def arguments(self) -> dict[str, Any] | None:
        return _arguments(self.raw_arguments)

    @property
    def error(self) -> dict[str, Any] | None:
        """The tool's error; a booking that failed is a result (its ``error`` is the booking's), not one."""
        data = _unwrap(self.result)
        if not self.answered or (isinstance(data, Mapping) and "booking_id" in data and "status" in data):
            return None
        return _error_of(data)


class Conversation:
    """One request's conversation, read once; ``decide()`` is the model's answer."""

    def __init__(self, messages: Sequence[AnyMessage], offered: Sequence[str], today: date, cities: Sequence[str]):
        self.messages = list(messages)
        self.offered = tuple(offered)
        self.today = today_from_prompt(self.messages, today)
        self.cities = tuple(cities)
        users = [i for i, m in enumerate(self.messages) if isinstance(m, UserMessage)]
        self.last_user = users[-1] if users else -1
        self.readings = [read(text_of(self.messages[i].content), self.today, self.cities) for i in users]
        self.slots = StaySlots()
        for reading in self.readings:
            self.slots = self.slots.merged(reading.slots)
        self.steps = self._steps()

    # ------------------------------------------------------------------------------------------- what was said

    def _steps(self) -> list[_Step]:
        steps: list[_Step] = []
        by_id: dict[str, int] = {}
        for index, message in enumerate(self.messages):
            if isinstance(message, AssistantMessage):
                for call in message.tool_calls or ():
                    by_id[call.id] = len(steps)
                    steps.append(_Step(index, call.id, call.function.name, call.function.arguments))
            elif isinstance(message, ToolMessage) and message.tool_call_id in by_id:
                at = by_id[message.tool_call_id]
                step = steps[at]
                steps[at] = _Step(
                    step.index, step.call_id, step.name, step.raw_arguments, _json(text_of(message.content)), True
                )
        return steps

    @property
    def reading(self) -> Reading | None:
        return self.readings[-1] if self.readings else None

    def _last_search(self) -> tuple[_Step, list[dict[str, Any]]] | None:
        for step in reversed(self.steps):
            if step.name == SEARCH_HOTELS and step.answered and step.error is None:
                offers = _offers_of(_unwrap(step.result))
                if offers is not None:
                    return step, offers
        return None

    def _last_booking_id(self) -> str | None:
        """The booking the conversation is about: the newest id said by anyone."""
        for message in reversed(self.messages):
            if isinstance(message, ToolMessage):
                booking = _booking_of(_unwrap(_json(text_of(message.content))))
                if booking and isinstance(booking.get("booking_id"), str):
                    return str(booking["booking_id"])
            elif isinstance(message, UserMessage | AssistantMessage):
                found = find_booking_id(text_of(message.content))
                if found:
                    return found
        return None

    def search_arguments(self, slots: StaySlots | None = None) -> dict[str, Any] | None:
        """``search_hotels``' arguments from the conversation, or ``None`` while something is missing."""
        slots = slots or self.slots
        end = slots.stay_end
        if slots.missing() or slots.checkin is None or end is None:
            return None
        arguments: dict[str, Any] = {
            "city": slots.city,
            "checkin": slots.checkin.isoformat(),
            "checkout": end.isoformat(),
            "guests": slots.guests,
        }
        if slots.max_price is not None:
            arguments["max_price_per_night"] = slots.max_price
        return arguments

    def runaway_search(self) -> dict[str, Any]:
        """What a model stuck on searching searches: the conversation's stay, else one a month ahead."""
        found = self.search_arguments()
        if found is not None:
            return found
        checkin = self.today + timedelta(days=DEFAULT_SEARCH_DAYS_AHEAD)
        return {
            "city": self.slots.city or "Lisbon",
            "checkin": checkin.isoformat(),
            "checkout": (checkin + timedelta(days=2)).isoformat(),
            "guests": self.slots.guests or 2,
        }

    # ---------------------------------------------------------------------------------------------- deciding

    def decide(self) -> Decision:
        last = self.messages[-1]
        if isinstance(last, ToolMessage):
            return self._after_tools()
        if self.reading is None:
            return Decision(text=HELP)
        return self._after_person(self.reading)

    def _call(self, name: str, arguments: dict[str, Any], *, otherwise: str) -> Decision:
        if name not in self.offered:
            return Decision(text=otherwise)
        return Decision(call=PlannedCall(name, arguments))

    def _after_person(self, reading: Reading) -> Decision:
        if reading.intent is Intent.CANCEL:
            return self._about_booking(reading, CANCEL_BOOKING, "cancel")
        if reading.intent is Intent.STATUS:
            return self._about_booking(reading, GET_BOOKING, "look up")
        if reading.ambiguous_dates and reading.intent in (Intent.SEARCH, Intent.BOOK):
            shown = ", ".join(f'"{d}"' for d in reading.ambiguous_dates)
            return Decision(
                text=f"I can't tell which date {shown} means (day/month or month/day). Please write the month as a "
                'word, for example "10 March" or "March 10".'
            )
        if reading.intent is Intent.BOOK:
            booked = self._book_from_offers(reading)
            if booked is not None:
                return booked
            if not reading.mentions_stay and self._last_search() is None and self.search_arguments() is None:
                return Decision(text=self._ask_for_search("Before I can book, I need to search."))
        if reading.intent in (Intent.SEARCH, Intent.BOOK):
            return self._search()
        bare = _BARE_NUMBER.match(text_of(self.messages[self.last_user].content)) if self.last_user >= 0 else None
        if bare is not None and self.slots.missing():
            return self._answer_to_question(bare[1])
        if reading.intent is Intent.THANKS:
            return Decision(text="You're welcome! Anything else I can do for you?")
        if reading.intent is Intent.DECLINE:
            return Decision(text="All right, nothing booked. Anything else?")
        return Decision(text=HELP)

    def _answer_to_question(self, word: str) -> Decision:
        """A bare number answers what was asked last: the guests, else the nights."""
        number = int(word) if word.isdigit() else _WORD_NUMBERS[word.lower()]
        if not self.slots.guests:
            self.slots = StaySlots(**{**self.slots.__dict__, "guests": number})
        elif self.slots.checkin is not None and self.slots.stay_end is None:
            self.slots = StaySlots(**{**self.slots.__dict__, "nights": number})
        return self._search()

    def _ask_for_search(self, lead: str = "") -> str:
        missing = self.slots.missing()
        if len(missing) > 1:
            needs = ", ".join(missing[:-1]) + " and " + missing[-1]
        else:
            needs = missing[0] if missing else "the city, the dates and the guests"
        return f"{lead} To search for a hotel I still need {needs}.".strip()

    def _search(self) -> Decision:
        arguments = self.search_arguments()
        if arguments is None:
            return Decision(text=self._ask_for_search())
        return self._call(SEARCH_HOTELS, arguments, otherwise="I can't search for hotels here (no search tool).")

    def _about_booking(self, reading: Reading, tool: str, verb: str) -> Decision:
        booking_id = reading.booking_id or self._last_booking_id()
        if booking_id is None:
            return Decision(text=f"Which booking should I {verb}? Please give me its booking id.")
        return self._call(tool, {"booking_id": booking_id}, otherwise=f"I can't {verb} bookings here.")

    def _book_from_offers(self, reading: Reading) -> Decision | None:
        """``book_hotel`` for the offer the person chose among the last search's, when the message asks for nothing
        else (a new city or stay is a new search first); words when the choice is unclear; ``None``: search."""
        found = self._last_search()
        if found is None:
            return None
        step, offers = found
        searched = step.arguments or self.search_arguments() or {}
        if reading.mentions_stay and self._changes_search(reading.slots, searched):
            return None
        offer = select_offer(reading.selection, offers)
        if offer is None:
            if not offers:
                return Decision(text="The last search found nothing to book. Shall I search other dates or a city?")
            names = "; ".join(f"{i}. {o.get('name')}" for i, o in enumerate(offers, 1))
            return Decision(text=f"Which one should I book? {names}.")
        return self._book(offer, searched)

    @staticmethod
    def _changes_search(slots: StaySlots, searched: Mapping[str, Any]) -> bool:
        if slots.city and slots.city.lower() != str(searched.get("city", "")).lower():
            return True
        if slots.checkin and slots.checkin.isoformat() != searched.get("checkin"):
            return True
        if slots.guests and slots.guests != searched.get("guests"):
            return True
        return bool(slots.nights or slots.checkout)

    def _book(self, offer: Mapping[str, Any], searched: Mapping[str, Any]) -> Decision:
        arguments = {
            "hotel_id": offer.get("hotel_id"),
            "city": offer.get("city") or searched.get("city"),
            "checkin": searched.get("checkin"),
            "checkout": searched.get("checkout"),
            "guests": searched.get("guests"),
        }
        return self._call(BOOK_HOTEL, arguments, otherwise=f"I can't book here; {offer.get('name')} is the one.")

    # ----------------------------------------------------------------------------------------- after the tools

    def _after_tools(self) -> Decision:
        turn = [s for s in self.steps if s.index > self.last_user]
        step = turn[-1] if turn else None
        if step is None or not step.answered:
            return Decision(text=HELP)
        latest = [s for s in turn if s.index == step.index]
        step = latest[0]
        data = _unwrap(step.result)
        if step.name == BOOK_HOTEL and _declined(data):
            return Decision(text=f"All right, I did not book {self._hotel_name(step)}. Anything else?")
        error = step.error
        if error is not None:
            return self._after_error(step, error, turn)
        if step.name == SEARCH_HOTELS:
            return self._after_search(step, data)
        if step.name == BOOK_HOTEL:
            return Decision(text=self._booked_text(step, data))
        if step.name == GET_BOOKING:
            return Decision(text=self._status_text(data))
        if step.name == CANCEL_BOOKING:
            return Decision(text=self._cancel_text(data))
        return Decision(text=f"Done: {json.dumps(data)[:300]}")

    def _after_search(self, step: _Step, data: Any) -> Decision:
        offers = _offers_of(data) or []
        searched = step.arguments or {}
        reading = self.reading
        if offers and reading is not None and reading.wants_booking:
            offer = select_offer(reading.selection, offers)
            if offer is not None and BOOK_HOTEL in self.offered:
                return self._book(offer, searched)
        found = data.get("found") if isinstance(data, Mapping) else None
        total = found if isinstance(found, int) and found > len(offers) else len(offers)
        return Decision(text=self._offers_text(offers, searched, total))

    def _offers_text(self, offers: Sequence[Mapping[str, Any]], searched: Mapping[str, Any], total: int) -> str:
        """The offers shown (``total``: how many were found, when the tool showed fewer)."""
        city = searched.get("city") or "that city"
        guests = searched.get("guests")
        when = ""
        try:
            checkin = date.fromisoformat(str(searched.get("checkin")))
            checkout = date.fromisoformat(str(searched.get("checkout")))
            nights = (checkout - checkin).days
            when = f" from {_span(checkin, checkout)} ({_plural(nights, 'night')}"
            when += f", {_plural(int(guests), 'guest')})" if isinstance(guests, int) else ")"
        except ValueError:
            pass
        limit = searched.get("max_price_per_night")
        under = f" under {_money(limit, offers[0].get('currency') if offers else 'EUR')} a night" if limit else ""
        if not offers:
            return (
                f"I found no hotel in {city} with rooms{when}{under}. Shall I try other dates, another city or a "
                "higher price limit?"
            )
        shown = "cheapest first" if total == len(offers) else f"the {len(offers)} cheapest"
        lines = [f"I found {_plural(total, 'hotel')} in {city}{when}{under}, {shown}:"]
        for number, offer in enumerate(offers, 1):
            stars = f", {offer['stars']} stars" if isinstance(offer.get("stars"), int) else ""
            price = _money(offer.get("price_per_night"), offer.get("currency"))
            lines.append(f"{number}. {offer.get('name')}{stars}: {price} a night")
        lines.append('Which one should I book? Say "book the first", "book the cheapest" or its name.')
        return "\n".join(lines)

    def _hotel_name(self, step: _Step) -> str:
        arguments = step.arguments or {}
        found = self._last_search()
        if found is not None:
            for offer in found[1]:
                if offer.get("hotel_id") == arguments.get("hotel_id"):
                    return str(offer.get("name"))
        return str(arguments.get("hotel_id") or "the hotel")

    def _booked_text(self, step: _Step, data: Any) -> str:
        name = self._hotel_name(step)
        booking = _booking_of(data) or {}
        booking_id = booking.get("booking_id", "?")
        status = str(booking.get("status") or "unknown")
        name = str(booking.get("hotel_name") or name)
        if status == "failed":
            found = booking.get("error")
            error: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
            why = _explain(error.get("code"), error.get("message"))
            return f"The booking of {name} failed (booking {booking_id}): {why}."
        total = booking.get("total_price")
        cost = f" Total {_money(total, booking.get('currency'))}." if isinstance(total, int | float) else ""
        return f"Booked: {name}, booking {booking_id}, {status}.{cost}"

    @staticmethod
    def _status_text(data: Any) -> str:
        booking = _booking_of(data) or {}
        booking_id = booking.get("booking_id", "?")
        parts = [f"Booking {booking_id}: {booking.get('status', 'unknown')}"]
        if booking.get("hotel_name"):
            parts.append(str(booking["hotel_name"]))
        if booking.get("checkin") and booking.get("checkout"):
            parts.append(f"{booking['checkin']} to {booking['checkout']}")
        if isinstance(booking.get("guests"), int):
            parts.append(_plural(booking["guests"], "guest"))
        if isinstance(booking.get("total_price"), int | float):
            parts.append(f"total {_money(booking['total_price'], booking.get('currency'))}")
        return ", ".join(parts) + "."

    @staticmethod
    def _cancel_text(data: Any) -> str:
        booking = _booking_of(data) or {}
        booking_id = booking.get("booking_id", "?")
        status = booking.get("status", "unknown")
        if status == "cancelled":
            return f"Booking {booking_id} is cancelled."
        return f"Cancel requested for booking {booking_id}; it is {status} now and stops at its next step."

    def _after_error(self, step: _Step, error: Mapping[str, Any], turn: Sequence[_Step]) -> Decision:
        """Retry once with corrected arguments when the error names one it can fix; otherwise explain."""
        earlier = [s for s in turn if s.name == step.name and s.error is not None]
        if len(earlier) < 2 and self._fixable(step, error):
            corrected = self._corrected(step)
            if corrected is not None and corrected != step.arguments:
                return self._call(step.name, corrected, otherwise=HELP)
        return Decision(text=self._failure_text(step, error))

    def _fixable(self, step: _Step, error: Mapping[str, Any]) -> bool:
        if step.arguments is None:
            return True  # not even JSON: worth writing again
        named = error.get("field")
        fields = {named} if isinstance(named, str) else set(named) if isinstance(named, list) else set()
        message = str(error.get("message") or "")
        fields |= {name for name in step.arguments if re.search(rf"\b{re.escape(name)}\b", message)}
        return bool(fields & set(step.arguments))

    def _corrected(self, step: _Step) -> dict[str, Any] | None:
        """The arguments the conversation gives for this call, as if made now."""
        if step.name == SEARCH_HOTELS:
            return self.search_arguments()
        if step.name == BOOK_HOTEL:
            found = self._last_search()
            if found is None:
                return None
            hotel_id = (step.arguments or {}).get("hotel_id")
            offer = next((o for o in found[1] if o.get("hotel_id") == hotel_id), None)
            if offer is None and self.reading is not None:
                offer = select_offer(self.reading.selection, found[1])
            return None if offer is None else self._book(offer, found[0].arguments or {}).call.arguments  # type: ignore[union-attr]
        booking_id = (self.reading.booking_id if self.reading else None) or self._last_booking_id()
        return None if booking_id is None else {"booking_id": booking_id}

    def _failure_text(self, step: _Step, error: Mapping[str, Any]) -> str:
        what = {
            SEARCH_HOTELS: "search for hotels",
            BOOK_HOTEL: f"book {self._hotel_name(step)}",
            GET_BOOKING: "look up the booking",
            CANCEL_BOOKING: "cancel the booking",
        }.get(step.name, f"run {step.name}")
        return f"I could not {what}: {_explain(error.get('code'), error.get('message'))}."


_EXPLANATIONS = {
    "no_availability": "there are no rooms left for that stay",
    "payment_declined": "the card was declined",
    "provider_unavailable": "the service behind it is not answering right now; please try again in a moment",
    "timeout": "it took too long; please try again",
    "already_final": "the booking is already final and can no longer be cancelled",
    "approval_expired": "the approval expired before it was given",
}


def _explain(code: object, message: object) -> str:
    known = _EXPLANATIONS.get(str(code)) if code else None
    detail = str(message).strip().rstrip(".") if message else ""
    if known and detail:
        return f"{known} ({detail})"
    if known:
        return known
    if detail and code:
        return f"{detail} ({code})"
    return detail or str(code or "an unknown error")
