"""The concierge's tools, one record each: what the model is offered, what it may send, what runs, and what needs
the person's approval. Adding a tool is adding a record here.

The model is data: its arguments are checked like a request body (a pydantic model, from which the offered JSON
schema is derived, plus the stay rules of ``domain.booking``), and a booking id it names must be one of the person's
(booking-agent answers for the chat's owner only, ``acting_for``): another person's is the same ``unknown_booking``
as an id nobody made.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from langchain_core.messages import BaseMessage, ToolMessage
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from agents.concierge import booking as effects
from agents.concierge.context import ConciergeDeps, Peer
from agents.concierge.state import Done, Pending
from agents.concierge.views import booking_view, offer_view, policy_view, third_party_text, tool_error
from domain.booking import (
    ISO_DATE_PATTERN,
    MAX_GUESTS,
    MIN_GUESTS,
    BookingStatus,
    check_checkin,
    parse_iso_date,
    validate_stay,
)
from domain.cancellation import CancellationPolicy, CancellationRefusedError, quote_refund
from domain.chat import InvalidToolCallError
from domain.errors import ErrorCode
from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, LIST_BOOKINGS, SEARCH_HOTELS
from infra.error_table import answer_for
from resilience import policy_for

__all__ = [
    "MAX_OFFERS_SHOWN",
    "REPEATED_NOTE",
    "TOOLS",
    "TOOLS_BY_NAME",
    "TOOL_RECORDS",
    "Approved",
    "BookingOut",
    "BookingsOut",
    "NotCancellableError",
    "NotOfferedError",
    "SearchOut",
    "Tool",
    "ToolContext",
    "ToolOffer",
    "UnknownBookingError",
    "answer_error",
    "has_offers",
    "offer_for",
    "repeat_answer",
    "tool_named",
    "validate_tool_args",
]

MAX_OFFERS_SHOWN: Final = 5
"""Offers a search result shows the model: the cheapest few are what a person chooses from."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may reach: the peers (booking-agent answering for the chat's owner), and the chat's bookings."""

    deps: ConciergeDeps
    chat_id: str
    bookings: frozenset[str]

    async def persons_booking(self, booking_id: str) -> dict[str, Any]:
        """The booking, if it is the person's (from any chat); otherwise the same error as for an id nobody made."""
        try:
            booking: dict[str, Any] = await policy_for("booking_agent").call(
                self.deps.booking_agent.call, "get_booking", {"booking_id": booking_id}
            )
        except Exception as exc:
            if answer_for(exc).code == ErrorCode.NOT_FOUND:  # another person's, or none: booking-agent cannot tell
                raise UnknownBookingError(booking_id) from None
            raise
        return booking


class UnknownBookingError(InvalidToolCallError):
    """A booking id that is not the person's: the answer says nothing about it, as for an id nobody made."""

    code: str = ErrorCode.UNKNOWN_BOOKING

    def __init__(self, booking_id: str) -> None:
        super().__init__(f"booking_id: no booking {booking_id} of yours")


class NotCancellableError(InvalidToolCallError):
    """A confirmed stay that cannot be cancelled (``stay_started``, ``not_refundable``): nobody is asked to approve."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message}; nothing was cancelled")
        self.code = code


class NotOfferedError(InvalidToolCallError):
    """``book_hotel`` for a hotel search does not offer for the stay: the error carries the offers that search does
    (``offers``, as ``search_hotels`` shows them), so a model that reads data can pick a real one."""

    code: str = ErrorCode.NOT_OFFERED


Run = Callable[[ToolContext, dict[str, Any]], Awaitable[str]]
"""A read-only tool: its result (JSON text)."""
Terms = Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]
"""What the person is asked to approve (the ``Approval`` fields but its id, action and expiry)."""
Effect = Callable[[ConciergeDeps, str, Pending], Awaitable[Done]]
"""The approved side effect, run by the ``book`` step (once per approval)."""


@dataclass(frozen=True)
class Approved:
    """A tool that needs the person's approval: its terms are asked first, its effect made once after a yes."""

    action: Literal["book", "cancel"]
    terms: Terms
    effect: Effect
    once: str
    """How the effect is made once (beside the ``book`` step's own record per approval)."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    arguments: type[BaseModel]
    """Everything the model may send: an argument this model does not define is refused, naming it."""
    run: Run | None = None
    approval: Approved | None = None
    answers_repeats: bool = False
    """A repeat of a call in one turn (same arguments) is answered from the earlier result, not run again: a small
    model often asks the same thing twice. Only for reads; each approval tool call asks its own approval."""
    offered_once: Literal["offers", "booking"] | None = None
    """With guided tools (LLM_GUIDED_TOOLS), offered only once the chat has search offers, or a booking: before
    that, the call cannot succeed, and a small model that is offered it calls it instead of searching."""
    output: type[BaseModel] | None = None
    """What a result holds when it is not an error: the output schema an MCP host is shown (``output_schema``)."""

    def call_key(self, args: Mapping[str, Any]) -> str:
        """What makes two calls the same: the tool and its validated arguments as canonical JSON."""
        return f"{self.name}:{json.dumps(args, sort_keys=True, separators=(',', ':'))}"

    @property
    def spec(self) -> dict[str, Any]:
        """The OpenAI tool specification the model is offered (derived from ``arguments``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }

    @property
    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (what ``spec`` offers the model, and MCP's ``inputSchema``)."""
        schema: dict[str, Any] = _untitled(self.arguments.model_json_schema())
        return schema

    @property
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON schema of a result that is not an error (MCP's ``outputSchema``), from ``output``."""
        return None if self.output is None else _untitled(self.output.model_json_schema())

    def validate(self, args: object) -> dict[str, Any]:
        """The clean arguments, or ``InvalidToolCallError`` naming the first bad one."""
        if not isinstance(args, dict):
            raise InvalidToolCallError("arguments: must be a JSON object")
        known = self.arguments.model_fields
        given = {name: value for name, value in args.items() if value is not None or name not in known}
        try:
            model = self.arguments.model_validate(given)
        except ValidationError as exc:
            raise InvalidToolCallError(_first_error(self.name, exc)) from None
        clean = model.model_dump(exclude_none=True)
        if "checkin" in clean:
            try:
                validate_stay(clean["checkin"], clean["checkout"], clean["guests"])
            except ValueError as exc:
                raise InvalidToolCallError(str(exc)) from None
            try:  # as booking-agent would refuse it, but before anything is quoted or asked
                check_checkin(parse_iso_date(clean["checkin"]), dt.datetime.now(dt.UTC).date())
            except ValueError as exc:
                raise InvalidToolCallError(f"checkin: {exc}") from None
        return clean


def _untitled(schema: Any) -> Any:
    """pydantic's schema without its ``title`` and ``default: null`` keys (noise in a prompt)."""
    if isinstance(schema, dict):
        return {
            key: _untitled(value)
            for key, value in schema.items()
            if key != "title" and not (key == "default" and value is None)
        }
    if isinstance(schema, list):
        return [_untitled(value) for value in schema]
    return schema


def _first_error(tool: str, exc: ValidationError) -> str:
    error = exc.errors()[0]
    name = ".".join(str(part) for part in error["loc"]) or "arguments"
    if error["type"] == "extra_forbidden":
        return f"{name}: not an argument of {tool}"
    if error["type"] == "missing":
        return f"{name}: required"
    return f"{name}: {error['msg']}"


# ------------------------------------------------------------------------------------------------- arguments


def _whole_number(value: object) -> object:
    if isinstance(value, bool | str):
        raise ValueError("must be a whole number")
    return value


def _no_limit_if_zero(value: float) -> float | None:
    """A small model fills every argument it is shown: 0 for a price limit it was never given means none."""
    return value or None


_Strict = ConfigDict(extra="forbid", str_strip_whitespace=True)
_Date = Annotated[str, Field(description="YYYY-MM-DD", pattern=ISO_DATE_PATTERN)]
_Guests = Annotated[int, Field(ge=MIN_GUESTS, le=MAX_GUESTS), BeforeValidator(_whole_number)]
_BookingId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class StayArgs(BaseModel):
    model_config = _Strict

    city: str = Field(min_length=1, max_length=80, description="The city, e.g. Lisbon.")
    checkin: _Date
    checkout: _Date
    guests: _Guests


class SearchArgs(StayArgs):
    max_price_per_night: Annotated[float, AfterValidator(_no_limit_if_zero)] = Field(  # type: ignore[assignment]
        None, ge=0, allow_inf_nan=False, description="0 or absent: no limit."
    )


class BookArgs(StayArgs):
    hotel_id: str = Field(min_length=1, max_length=64)


class BookingIdArgs(BaseModel):
    model_config = _Strict

    booking_id: _BookingId


class NoArgs(BaseModel):
    model_config = _Strict


# ------------------------------------------------------------------------------------------------- results


class _Result(BaseModel):
    """A result's schema names what it holds; a field it does not name may still come (a provider's extra)."""

    model_config = ConfigDict(extra="allow")


class OfferOut(_Result):
    hotel_id: str
    name: str | None = None
    stars: float | None = None
    price_per_night: float
    total_price: float = Field(description="For the whole stay: every room, every night.")
    currency: str
    cancellation: dict[str, Any] | None = None


class SearchOut(_Result):
    offers: list[OfferOut] = Field(description="The cheapest few, cheapest first.")
    found: int


class BookingOut(_Result):
    """A booking as booking-agent has it (``views.booking_view``), or what became of an approval: ``declined``,
    ``pending`` (its ``booking_id`` to follow), ``awaiting_approval`` (decide it elsewhere)."""

    booking_id: str | None = None
    status: str | None = None
    hotel_id: str | None = None
    hotel_name: str | None = None
    city: str | None = None
    checkin: str | None = None
    checkout: str | None = None
    guests: int | None = None
    total_price: float | None = None
    currency: str | None = None
    cancellation: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    message: str | None = None


class BookingsOut(_Result):
    bookings: list[BookingOut] = Field(description="Newest first.")
    found: int


# ------------------------------------------------------------------------------------------------- runners


async def _search(search_agent: Peer, query: Mapping[str, Any]) -> list[dict[str, Any]]:
    result = await policy_for("search_agent").call(search_agent.call, "search_hotels", dict(query))
    offers = result.get("offers", [])
    return [offer for offer in offers if isinstance(offer, dict)]


async def search_hotels(ctx: ToolContext, args: dict[str, Any]) -> str:
    nights = validate_stay(args["checkin"], args["checkout"], args["guests"])
    offers = await _search(ctx.deps.search_agent, args)
    shown = [offer_view(offer, nights, args["guests"]) for offer in offers[:MAX_OFFERS_SHOWN]]
    return json.dumps({"offers": shown, "found": len(offers)})


async def get_booking(ctx: ToolContext, args: dict[str, Any]) -> str:
    return json.dumps(booking_view(await ctx.persons_booking(args["booking_id"])))


async def list_bookings(ctx: ToolContext, args: dict[str, Any]) -> str:
    found = await policy_for("booking_agent").call(ctx.deps.booking_agent.call, "list_bookings", {})
    bookings = [booking_view(b) for b in found.get("bookings", []) if isinstance(b, dict)]
    return json.dumps({"bookings": bookings, "found": len(bookings)})


_STAY_TERMS: Final = ("city", "checkin", "checkout", "guests")


async def quote(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """``book_hotel``'s terms: the hotel's current price for the stay, from a search of the stay through search-agent.
    A hotel that search does not offer for it (made up, or full) is ``NotOfferedError`` with the offers it does."""
    nights = validate_stay(args["checkin"], args["checkout"], args["guests"])
    offers = await _search(ctx.deps.search_agent, {name: args[name] for name in _STAY_TERMS})
    offer = next((o for o in offers if o.get("hotel_id") == args["hotel_id"]), None)
    if offer is None:
        shown = [offer_view(o, nights, args["guests"]) for o in offers[:MAX_OFFERS_SHOWN]]
        raise NotOfferedError(
            f"hotel_id: {args['hotel_id']} is not offered in {args['city']} for this stay; nothing was booked. "
            "Book one of these offers by its hotel_id, or tell the person.",
            offers=shown,
            found=len(offers),
        )
    view = offer_view(offer, nights, args["guests"])
    return {
        "hotel_id": args["hotel_id"],
        "hotel_name": view["name"],
        **{name: args[name] for name in _STAY_TERMS},
        "total_price": view["total_price"],
        "price_per_night": view["price_per_night"],
        "currency": view["currency"],
        "cancellation": view["cancellation"],
    }


async def cancel_terms(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """``cancel_booking``'s terms: the person's booking as booking-agent has it now (hotel, stay, total) and, for a
    confirmed one, the refund and fee its policy gives at this moment: the cancel's ``max_fee`` once approved."""
    booking_id = str(args["booking_id"])
    booking = await ctx.persons_booking(booking_id)
    terms: dict[str, Any] = {"booking_id": booking_id}
    for name in ("hotel_id", "hotel_name", "city", "checkin", "checkout", "guests", "total_price", "currency"):
        value = booking.get(name)
        terms[name] = third_party_text(value) if isinstance(value, str) else value
    terms["cancellation"] = policy_view(booking.get("cancellation"))
    if booking.get("status") == BookingStatus.CONFIRMED:
        terms["refund"] = _refund_now(booking)
    return terms


def _refund_now(booking: Mapping[str, Any]) -> dict[str, Any]:
    """What cancelling the confirmed ``booking`` now gives back (``domain.cancellation``, as booking-agent works it
    out); ``NotCancellableError`` when it cannot be."""
    wire = booking.get("cancellation")
    try:
        if not isinstance(wire, dict):
            raise CancellationRefusedError("not_refundable", "this booking has no cancellation policy recorded")
        policy = CancellationPolicy.from_wire(wire, dt.date.fromisoformat(str(booking["checkin"])))
        quote = quote_refund(policy, float(booking["total_price"]), dt.datetime.now(dt.UTC))
    except CancellationRefusedError as exc:
        raise NotCancellableError(exc.code, exc.message) from None
    return quote.to_wire()


# ------------------------------------------------------------------------------------------------- the records

TOOL_RECORDS: Final[tuple[Tool, ...]] = (
    Tool(
        SEARCH_HOTELS,
        "Hotels with rooms for the stay, cheapest first.",
        SearchArgs,
        run=search_hotels,
        answers_repeats=True,
        output=SearchOut,
    ),
    Tool(
        BOOK_HOTEL,
        "Book a hotel found by search_hotels. The person is asked to approve the hotel, stay and total price "
        "before anything is charged.",
        BookArgs,
        offered_once="offers",
        output=BookingOut,
        approval=Approved(
            "book",
            quote,
            effects.book,
            once="booking-agent's Idempotency-Key = sha256(chat id, tool call id); the approved total its ceiling",
        ),
    ),
    Tool(
        LIST_BOOKINGS,
        "The person's bookings, newest first, from any chat: status, hotel, dates, total and cancellation policy.",
        NoArgs,
        run=list_bookings,
        offered_once="booking",
        output=BookingsOut,
    ),
    Tool(
        GET_BOOKING,
        "One of the person's bookings (from any chat): its status.",
        BookingIdArgs,
        run=get_booking,
        answers_repeats=True,
        offered_once="booking",
        output=BookingOut,
    ),
    Tool(
        CANCEL_BOOKING,
        "Cancel one of the person's bookings. The person is asked to approve the cancel first; a confirmed stay is "
        "cancelled under its policy, its refund and fee named in the approval.",
        BookingIdArgs,
        offered_once="booking",
        output=BookingOut,
        approval=Approved(
            "cancel",
            cancel_terms,
            effects.cancel,
            once="a cancel of a cancelled booking changes nothing; the approved fee is the cancel's max_fee",
        ),
    ),
)
TOOLS_BY_NAME: Final[Mapping[str, Tool]] = {tool.name: tool for tool in TOOL_RECORDS}
TOOLS: Final[tuple[dict[str, Any], ...]] = tuple(tool.spec for tool in TOOL_RECORDS)
"""The OpenAI tool specifications the model is offered."""


@dataclass(frozen=True)
class ToolOffer:
    """The tools one model call is offered, and whether it must call one (``tool_choice``)."""

    tools: tuple[dict[str, Any], ...]
    tool_choice: Literal["required"] | None = None


_EVERY_TOOL: Final = ToolOffer(TOOLS)


@functools.cache
def _offer(names: frozenset[str], required: bool) -> ToolOffer:
    """One ``ToolOffer`` per set of tools (the model client binds each once)."""
    specs = tuple(tool.spec for tool in TOOL_RECORDS if tool.name in names)
    return ToolOffer(specs, "required" if required else None)


def has_offers(messages: Sequence[BaseMessage]) -> bool:
    """Whether a tool result in the history shows hotels (a search's, or a ``not_offered`` refusal's)."""
    for message in messages:
        if isinstance(message, ToolMessage) and '"offers"' in str(message.content):
            try:
                content = json.loads(str(message.content))
            except ValueError:
                continue
            if not isinstance(content, dict):
                continue
            refusal = content.get("error")
            if content.get("offers") or (isinstance(refusal, dict) and refusal.get("offers")):
                return True
    return False


def offer_for(messages: Sequence[BaseMessage], has_booking: bool, *, guided: bool, first_call: bool) -> ToolOffer:
    """What a model call is offered: every tool; or, guided (LLM_GUIDED_TOOLS), the tools that can succeed in the
    chat as it stands (``has_booking``: the person has a booking, from any chat), with a tool call required on a
    turn's first call until a search has offered hotels (a small model asked to book then searches instead of
    inventing a ``hotel_id``), unless the person has bookings: a question about them is not forced into a search."""
    if not guided:
        return _EVERY_TOOL
    offers = has_offers(messages)
    ready = {"offers": offers, "booking": has_booking, None: True}
    names = frozenset(tool.name for tool in TOOL_RECORDS if ready[tool.offered_once])
    return _offer(names, first_call and not offers and not has_booking)


def tool_named(name: str) -> Tool:
    """The record of the tool ``name``, or ``InvalidToolCallError`` listing the tools."""
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        raise InvalidToolCallError(f"unknown tool {name!r}; the tools are {', '.join(TOOLS_BY_NAME)}")
    return tool


def validate_tool_args(name: str, args: object) -> dict[str, Any]:
    """The clean arguments of a call of ``name`` (``InvalidToolCallError`` naming the argument)."""
    return tool_named(name).validate(args)


def answer_error(exc: InvalidToolCallError) -> str:
    """A refused call's result: ``unknown_booking`` for another person's booking, ``not_offered`` (with the offers) for
    a hotel search does not offer, ``invalid_request`` otherwise."""
    return tool_error(str(exc), exc.code, **exc.details)


REPEATED_NOTE: Final = (
    "you already called {tool} with these arguments in this turn; this is the same result. Use it, or answer the "
    "person."
)


def repeat_answer(tool: str, earlier: str) -> str:
    """A repeated call's result: the earlier result's content, marked ``repeated`` with a note telling the model so."""
    try:
        content: Any = json.loads(earlier)
    except ValueError:
        content = earlier
    body = content if isinstance(content, dict) else {"result": content}
    return json.dumps({**body, "repeated": True, "note": REPEATED_NOTE.format(tool=tool)})
