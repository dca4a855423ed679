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

from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, LIST_BOOKINGS, SEARCH_HOTELS
from providers.llm.language import (
    Intent,
    Reading,
    StaySlots,
    find_booking_id,
    read,
    select_offer,
)
from providers.llm.phrasing import (
    HELP,
    ask_for_search,
    booked_text,
    bookings_text,
    cancel_text,
    failure_text,
    offers_text,
    refused_text,
    status_text,
)
from providers.llm.results import arguments_of, booking_of, declined, error_of, offers_of, parse_content, unwrap
from providers.llm.wire import AssistantMessage, SystemMessage, ToolMessage, UserMessage, text_of

__all__ = ["Conversation", "Decision", "PlannedCall", "today_from_prompt"]

AnyMessage = SystemMessage | UserMessage | AssistantMessage | ToolMessage

_TODAY = re.compile(
    r"\b(?:today is|today's date is|current date(?: is)?:?|the date is|date today:?)\s*(\d{4}-\d{2}-\d{2})", re.I
)
_BARE_NUMBER = re.compile(r"^\s*(\d{1,2}|one|two|three|four|five|six|seven|eight)\s*[.!]?\s*$", re.I)
_WORD_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
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
        return arguments_of(self.raw_arguments)

    @property
    def error(self) -> dict[str, Any] | None:
        """The tool's error; a booking that failed is a result (its ``error`` is the booking's), not one."""
        data = unwrap(self.result)
        if not self.answered or (isinstance(data, Mapping) and "booking_id" in data and "status" in data):
            return None
        return error_of(data)


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
                    step.index,
                    step.call_id,
                    step.name,
                    step.raw_arguments,
                    parse_content(text_of(message.content)),
                    True,
                )
        return steps

    @property
    def reading(self) -> Reading | None:
        return self.readings[-1] if self.readings else None

    def _last_search(self) -> tuple[_Step, list[dict[str, Any]]] | None:
        for step in reversed(self.steps):
            if step.name == SEARCH_HOTELS and step.answered and step.error is None:
                offers = offers_of(unwrap(step.result))
                if offers is not None:
                    return step, offers
        return None

    def _last_booking_id(self) -> str | None:
        """The booking the conversation is about: the newest id said by anyone."""
        for message in reversed(self.messages):
            if isinstance(message, ToolMessage):
                booking = booking_of(unwrap(parse_content(text_of(message.content))))
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
        if reading.intent is Intent.LIST:
            return self._call(LIST_BOOKINGS, {}, otherwise="I can't list your bookings here.")
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
                return Decision(text=ask_for_search(self.slots.missing(), "Before I can book, I need to search."))
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

    def _search(self) -> Decision:
        arguments = self.search_arguments()
        if arguments is None:
            return Decision(text=ask_for_search(self.slots.missing()))
        return self._call(SEARCH_HOTELS, arguments, otherwise="I can't search for hotels here (no search tool).")

    def _about_booking(self, reading: Reading, tool: str, verb: str) -> Decision:
        booking_id = reading.booking_id or self._last_booking_id()
        if booking_id is None and LIST_BOOKINGS in self.offered:
            return self._call(LIST_BOOKINGS, {}, otherwise=HELP)  # which ones there are, to choose from
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
        data = unwrap(step.result)
        if step.name == BOOK_HOTEL and declined(data):
            return Decision(text=refused_text(self._hotel_name(step)))
        error = step.error
        if error is not None:
            return self._after_error(step, error, turn)
        if step.name == SEARCH_HOTELS:
            return self._after_search(step, data)
        if step.name == BOOK_HOTEL:
            return Decision(text=booked_text(self._hotel_name(step), booking_of(data) or {}))
        if step.name == GET_BOOKING:
            return Decision(text=status_text(booking_of(data) or {}))
        if step.name == CANCEL_BOOKING:
            return Decision(text=cancel_text(booking_of(data) or {}))
        if step.name == LIST_BOOKINGS:
            listed = data.get("bookings") if isinstance(data, Mapping) else None
            return Decision(text=bookings_text([b for b in listed or [] if isinstance(b, Mapping)]))
        return Decision(text=f"Done: {json.dumps(data)[:300]}")

    def _after_search(self, step: _Step, data: Any) -> Decision:
        offers = offers_of(data) or []
        searched = step.arguments or {}
        reading = self.reading
        if offers and reading is not None and reading.wants_booking:
            offer = select_offer(reading.selection, offers)
            if offer is not None and BOOK_HOTEL in self.offered:
                return self._book(offer, searched)
        found = data.get("found") if isinstance(data, Mapping) else None
        total = found if isinstance(found, int) and found > len(offers) else len(offers)
        return Decision(text=offers_text(offers, searched, total))

    def _hotel_name(self, step: _Step) -> str:
        arguments = step.arguments or {}
        found = self._last_search()
        if found is not None:
            for offer in found[1]:
                if offer.get("hotel_id") == arguments.get("hotel_id"):
                    return str(offer.get("name"))
        return str(arguments.get("hotel_id") or "the hotel")

    def _after_error(self, step: _Step, error: Mapping[str, Any], turn: Sequence[_Step]) -> Decision:
        """Retry once with corrected arguments when the error names one it can fix; otherwise explain."""
        earlier = [s for s in turn if s.name == step.name and s.error is not None]
        if len(earlier) < 2 and self._fixable(step, error):
            corrected = self._corrected(step)
            if corrected is not None and corrected != step.arguments:
                return self._call(step.name, corrected, otherwise=HELP)
        return Decision(text=failure_text(self._what(step), error))

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

    def _what(self, step: _Step) -> str:
        """What the call was doing, in words."""
        return {
            SEARCH_HOTELS: "search for hotels",
            BOOK_HOTEL: f"book {self._hotel_name(step)}",
            GET_BOOKING: "look up the booking",
            CANCEL_BOOKING: "cancel the booking",
            LIST_BOOKINGS: "list your bookings",
        }.get(step.name, f"run {step.name}")
