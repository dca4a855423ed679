"""The booking saga's peers as in-process fakes: search-agent, payment-agent, and hotel-api's reservation routes
behind ``httpx.MockTransport``; shared by the saga's tests and the recorder of its checkpoints (tests/checkpoints.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

CHECKIN, CHECKOUT = "2031-03-10", "2031-03-12"


def offer(hotel_id: str, price: float) -> dict[str, Any]:
    return {"hotel_id": hotel_id, "name": f"Hotel {hotel_id}", "price_per_night": price, "available_rooms": 3}


class SearchAgent:
    """search-agent's ``search_hotels``, answering with fixed offers (already ranked, as the real one does)."""

    def __init__(self, offers: list[dict[str, Any]]) -> None:
        self.offers = offers
        self.calls: list[dict[str, Any]] = []

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        assert skill == "search_hotels"
        self.calls.append(data)
        return {"offers": self.offers}


class PaymentAgent:
    """payment-agent: ``charge`` decides the answer to ``charge_payment``; refunds are recorded."""

    def __init__(
        self, charge: Callable[[dict[str, Any]], Any], cancel_refund: Callable[[dict[str, Any]], Any] | None = None
    ) -> None:
        self.charge = charge
        self.cancel_refund = cancel_refund
        """Decides the answer to ``refund_cancellation`` (default: refunded)."""
        self.charges: list[dict[str, Any]] = []
        self.refunds: list[dict[str, Any]] = []
        self.cancel_refunds: list[dict[str, Any]] = []

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        if skill == "refund_payment":
            self.refunds.append(data)
            return {"refunded": [], "reference": data["reference"]}
        if skill == "refund_cancellation":
            self.cancel_refunds.append(data)
            if self.cancel_refund is not None:
                answer = self.cancel_refund(data)
                return await answer if asyncio.iscoroutine(answer) else answer
            return {"reference": data["reference"], "refunded": ["pay-1"], "refund_id": "re-1"}
        assert skill == "charge_payment"
        self.charges.append(data)
        result = self.charge(data)
        return await result if asyncio.iscoroutine(result) else result


class HotelApi:
    """hotel-api's reservation routes over ``httpx.MockTransport``; ``full`` hotels answer 409 no_availability."""

    def __init__(self) -> None:
        self.full: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.total_price = 200.0
        self.currency = "EUR"

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == "/reservations":
            body = json.loads(request.content)
            self.requests.append(("reserve", body["hotel_id"]))
            if body["hotel_id"] in self.full:
                return httpx.Response(409, json={"error": "no_availability", "message": "not enough rooms"})
            return httpx.Response(
                201,
                json={
                    "reservation_id": f"res-{body['hotel_id']}",
                    "status": "held",
                    "total_price": self.total_price,
                    "currency": self.currency,
                },
            )
        reservation_id, _, action = path.removeprefix("/reservations/").partition("/")
        self.requests.append((action, reservation_id))
        return httpx.Response(200, json={"reservation_id": reservation_id, "status": action})
