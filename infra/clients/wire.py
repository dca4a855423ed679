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


class Offer(BaseModel):
    """One hotel with rooms for the party: what hotel-api's ``GET /hotels`` lists and search-agent passes on."""

    hotel_id: str
    name: str
    city: str
    stars: int
    price_per_night: float
    currency: str
    available_rooms: int


class Offers(BaseModel):
    offers: list[Offer]
