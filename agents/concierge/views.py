"""What the model reads of the world: tool results as JSON, third-party text in them cut short and cleaned.

A hotel's name or a booking's message is a provider's text, not ours: ``domain.third_party`` is the one place it is
made safe to show (at most ``MAX_THIRD_PARTY_CHARS``, no control or bidi characters).
"""

from __future__ import annotations

import json
from datetime import date
from typing import Any, Final

from domain import CancellationPolicy
from domain.booking import rooms_for
from domain.errors import ErrorCode
from domain.third_party import MAX_THIRD_PARTY_CHARS, third_party_text
from infra.bookings import PUBLIC_FIELDS

__all__ = [
    "MAX_THIRD_PARTY_CHARS",
    "booking_view",
    "offer_view",
    "policy_view",
    "third_party_text",
    "tool_error",
]


def tool_error(message: str, code: str = ErrorCode.INVALID_REQUEST, **details: Any) -> str:
    """A tool's result that says it failed: the model reads it and answers (or calls again, within its limit)."""
    return json.dumps({"error": {"code": str(code), "message": message, **details}})


def offer_view(offer: dict[str, Any], nights: int, guests: int) -> dict[str, Any]:
    """One search offer: its price for the whole stay (every room, every night) beside the hotel's name, and what
    cancelling it would cost."""
    total = round(float(offer["price_per_night"]) * rooms_for(guests) * nights, 2)
    return {
        "hotel_id": third_party_text(offer["hotel_id"]),
        "name": third_party_text(offer.get("name")),
        "stars": offer.get("stars") if isinstance(offer.get("stars"), int | float) else None,
        "price_per_night": float(offer["price_per_night"]),
        "total_price": total,
        "currency": third_party_text(offer["currency"]),
        "cancellation": policy_view(offer.get("cancellation")),
    }


def policy_view(wire: object) -> dict[str, Any] | None:
    """A provider's cancellation policy as the model and the person read it: re-built from its parsed fields (no
    text of the provider's passes), ``None`` when it is not one."""
    if not isinstance(wire, dict):
        return None
    try:
        return CancellationPolicy.from_wire(wire, date.min).to_wire()
    except ValueError:
        return None


_NOT_FOR_THE_MODEL: Final = frozenset(
    {"reservation_id", "payment_id", "cancel_requested_at", "created_at", "updated_at"}
)
_BOOKING_FIELDS: Final = tuple(name for name in PUBLIC_FIELDS if name not in _NOT_FOR_THE_MODEL)


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return third_party_text(value)
    if isinstance(value, dict):
        return {str(key): _clean(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def booking_view(booking: dict[str, Any]) -> dict[str, Any]:
    """What the model (and the chat) reads of a booking: booking-agent's public view without payment or reservation
    references, every text in it third-party text."""
    view = {name: _clean(booking.get(name)) for name in _BOOKING_FIELDS if booking.get(name) is not None}
    if "cancellation" in view:
        view["cancellation"] = policy_view(booking["cancellation"])
    return view
