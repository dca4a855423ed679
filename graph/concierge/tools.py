"""The concierge's tools: their JSON schemas (what the model is offered) and the calls behind them.

``search_hotels`` asks search-agent; ``get_booking`` and ``cancel_booking`` ask booking-agent, each over A2A with
the run's budget, trace context and this service's token (``infra.a2a.client``). ``book_hotel`` is not run here: it
only gets its quote (the hotel's current price, through search-agent), and the graph asks the person before
booking-agent's ``book_hotel`` runs (``graph.concierge.graph``). Every argument was validated first
(``domain.chat.validate_tool_args``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final, Protocol

from domain.booking import ErrorCode, rooms_for, validate_stay
from domain.chat import InvalidToolCallError
from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, SEARCH_HOTELS
from infra.bookings import PUBLIC_FIELDS
from infra.error_table import answer_for
from resilience import policy_for

__all__ = [
    "MAX_OFFERS_SHOWN",
    "TOOLS",
    "Peer",
    "booking_key_for",
    "booking_view",
    "quote",
    "run_tool",
    "tool_error",
]

MAX_OFFERS_SHOWN: Final = 5
"""Offers a search result shows the model: the cheapest few are what a person chooses from."""

_DATE = {"type": "string", "description": "YYYY-MM-DD", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
_STAY = {
    "city": {"type": "string", "description": "The city, e.g. Lisbon."},
    "checkin": _DATE,
    "checkout": _DATE,
    "guests": {"type": "integer", "minimum": 1, "maximum": 8},
}


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS: Final[tuple[dict[str, Any], ...]] = (
    _function(
        SEARCH_HOTELS,
        "Hotels with rooms for the stay, cheapest first.",
        {**_STAY, "max_price_per_night": {"type": "number", "exclusiveMinimum": 0}},
        ["city", "checkin", "checkout", "guests"],
    ),
    _function(
        BOOK_HOTEL,
        "Book a hotel found by search_hotels. The person is asked to approve the price before anything is charged.",
        {"hotel_id": {"type": "string"}, **_STAY},
        ["hotel_id", "city", "checkin", "checkout", "guests"],
    ),
    _function(GET_BOOKING, "A booking's status.", {"booking_id": {"type": "string"}}, ["booking_id"]),
    _function(CANCEL_BOOKING, "Cancel a booking.", {"booking_id": {"type": "string"}}, ["booking_id"]),
)
"""The OpenAI tool specifications the model is offered."""


class Peer(Protocol):
    """Another agent, as the concierge calls it (``infra.a2a.client.A2AClient``, or a fake in a test)."""

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]: ...


def tool_error(message: str, code: str = ErrorCode.INVALID_REQUEST) -> str:
    """A tool's result that says it failed: the model reads it and answers (or calls again, within its limit)."""
    return json.dumps({"error": {"code": str(code), "message": message}})


def booking_key_for(chat_id: str, tool_call_id: str) -> str:
    """booking-agent's ``Idempotency-Key`` for one approved ``book_hotel`` call: the same on every replay, replica
    and recovery, so however often the step runs there is one booking."""
    return "concierge-" + hashlib.sha256(f"{chat_id}\x00{tool_call_id}".encode()).hexdigest()[:32]


def _offer_view(offer: dict[str, Any], nights: int, guests: int) -> dict[str, Any]:
    total = round(float(offer["price_per_night"]) * rooms_for(guests) * nights, 2)
    return {
        "hotel_id": offer["hotel_id"],
        "name": offer["name"],
        "stars": offer.get("stars"),
        "price_per_night": offer["price_per_night"],
        "total_price": total,
        "currency": offer["currency"],
    }


async def _search(search_agent: Peer, args: dict[str, Any], hotel_id: str | None = None) -> list[dict[str, Any]]:
    query = {**args, "hotel_id": hotel_id} if hotel_id is not None else dict(args)
    result = await policy_for("search_agent").call(search_agent.call, "search_hotels", query)
    offers = result.get("offers", [])
    return [offer for offer in offers if isinstance(offer, dict)]


async def run_tool(name: str, args: dict[str, Any], *, search_agent: Peer, booking_agent: Peer) -> str:
    """The result (JSON text) of a validated ``search_hotels``, ``get_booking`` or ``cancel_booking`` call.

    A failure that answers the call (no such booking, a peer down after its retries) is the tool's result, as an
    error; a failure of our own stores (``dependency_unavailable``) raises: the run pauses and the step runs again.
    """
    try:
        if name == SEARCH_HOTELS:
            nights = validate_stay(args["checkin"], args["checkout"], args["guests"])
            offers = await _search(search_agent, args)
            shown = [_offer_view(offer, nights, args["guests"]) for offer in offers[:MAX_OFFERS_SHOWN]]
            return json.dumps({"offers": shown, "found": len(offers)})
        if name == GET_BOOKING:
            booking = await policy_for("booking_agent").call(booking_agent.call, "get_booking", args)
            return json.dumps(booking_view(booking))
        if name == CANCEL_BOOKING:
            booking = await policy_for("booking_agent").call(booking_agent.call, "cancel_booking", args)
            return json.dumps(booking_view(booking))
    except Exception as exc:
        answer = answer_for(exc)
        if answer.code in (ErrorCode.INTERNAL, ErrorCode.DEPENDENCY_UNAVAILABLE):
            raise
        return tool_error(answer.message, answer.code)
    raise InvalidToolCallError(f"{name} is not run as a plain tool")


async def quote(args: dict[str, Any], *, search_agent: Peer) -> dict[str, Any]:
    """``book_hotel``'s quote: the hotel's name and current price for the stay (``InvalidToolCallError`` when the
    hotel has no room for it, which the model is told)."""
    if args.get("hotel_id") is None or not isinstance(args["hotel_id"], str):
        raise InvalidToolCallError("hotel_id: required")
    nights = validate_stay(args["checkin"], args["checkout"], args["guests"])
    offers = await _search(
        search_agent, {k: args[k] for k in ("city", "checkin", "checkout", "guests")}, args["hotel_id"]
    )
    offer = next((o for o in offers if o.get("hotel_id") == args["hotel_id"]), None)
    if offer is None:
        raise InvalidToolCallError(f"hotel_id: {args['hotel_id']} has no room in {args['city']} for this stay")
    return _offer_view(offer, nights, args["guests"])


_NOT_FOR_THE_MODEL: Final = frozenset(
    {"reservation_id", "payment_id", "cancel_requested_at", "created_at", "updated_at"}
)
_BOOKING_FIELDS: Final = tuple(name for name in PUBLIC_FIELDS if name not in _NOT_FOR_THE_MODEL)


def booking_view(booking: dict[str, Any]) -> dict[str, Any]:
    """What the model (and the chat) reads of a booking: booking-agent's public view without payment or reservation
    references."""
    return {name: booking.get(name) for name in _BOOKING_FIELDS if booking.get(name) is not None}
