"""The wire contract between our clients and the providers: header names, the error body, hotel-api's offers.

The only thing agents and the simulated providers share; both sides import it from here, so the simulators are
never imported by an agent. Provider errors are flat, as a third-party API would answer:
``{"error": "<code>"[, "message": ...][, extra fields]}`` (our own services nest: ``{"error": {"code": ...}}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

__all__ = [
    "IDEMPOTENCY_HEADER",
    "MAX_IDEMPOTENCY_KEY_LENGTH",
    "REPLAYED_HEADER",
    "Cancellation",
    "Offer",
    "Offers",
    "error_fields",
    "provider_error",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
"""``true`` on an answer served from the stored result of an earlier request with the same key."""
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def provider_error(code: str, message: str | None = None, **extra: Any) -> dict[str, Any]:
    """A provider's error body: ``{"error": code[, "message": message], **extra}``."""
    body: dict[str, Any] = {"error": code}
    if message is not None:
        body["message"] = message
    body.update(extra)
    return body


def error_fields(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(code, message)`` from either error shape: ``{"error": "x"}`` or ``{"error": {"code": "x"}}``."""
    error = body.get("error")
    if isinstance(error, str):
        message = body.get("message")
        return error, message if isinstance(message, str) else None
    if isinstance(error, Mapping):
        code, message = error.get("code"), error.get("message")
        return (code if isinstance(code, str) else None), (message if isinstance(message, str) else None)
    return None, None


class Cancellation(BaseModel):
    """A stay's cancellation policy as offers, holds and bookings carry it (``CancellationPolicy.to_wire``)."""

    free_until: str
    """ISO 8601 UTC: 48 hours before 00:00 UTC of the check-in date; until then cancelling costs nothing."""
    fee: float
    """From ``free_until`` until check-in: the first night (every room of it). From check-in: no cancel at all."""
    currency: str
    refundable: bool = True
    """False: a non-refundable rate, never cancelled."""


class Offer(BaseModel):
    """One hotel with rooms for the party: what hotel-api's ``GET /hotels`` lists and search-agent passes on."""

    hotel_id: str
    name: str
    city: str
    stars: int
    price_per_night: float
    currency: str
    available_rooms: int
    refundable: bool = True
    cancellation: Cancellation | None = None
    """The stay's policy (``domain.cancellation``): free until ``free_until``, then ``fee``."""


class Offers(BaseModel):
    offers: list[Offer]
