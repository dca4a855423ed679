"""The booking saga in process: ``build_booking_graph`` against real Redis, hotel-api behind ``httpx.MockTransport``
and the two peer agents as in-process fakes. No service process is started.

Each test drives one branch of the saga and checks what the providers were asked to do, the booking record and
the final state: a 409 moves on to the next candidate; a declined card releases the hold and charges nothing; a
budget that runs out during the charge answers ``timeout`` and compensates (refund by reference, hold cancelled).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from redis.asyncio import Redis

from agents.booking.graph import BookingDeps, booking_input, build_booking_graph
from infra.a2a import A2ASkillError
from infra.bookings import BookingStore
from infra.clients.providers import HotelApiClient
from infra.payment_tokens import PaymentTokens
from resilience import BudgetExhaustedError, budget_scope, bulkhead_registry, circuit_registry, set_testing
from tests.booking_fakes import CHECKIN, CHECKOUT, HotelApi, PaymentAgent, SearchAgent, offer


@pytest.fixture(autouse=True)
def fresh_layers() -> Any:
    """No breaker or bulkhead state from another test; retries without their waits."""
    circuit_registry.clear()
    bulkhead_registry.clear()
    with set_testing(True):
        yield
    circuit_registry.clear()
    bulkhead_registry.clear()


@pytest.fixture
async def hotel_api() -> AsyncIterator[tuple[HotelApi, HotelApiClient]]:
    api = HotelApi()
    http = httpx.AsyncClient(transport=httpx.MockTransport(api.handle), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as client:
        yield api, client
    await http.aclose()


async def book(
    redis: Redis,
    hotels: HotelApiClient,
    search: SearchAgent,
    payment: PaymentAgent,
    *,
    budget_s: float = 10.0,
    **fields: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one booking through the saga (``fields``: more of the request); its final graph state and its record."""
    store, tokens = BookingStore(redis), PaymentTokens(redis)
    deps = BookingDeps(
        redis=redis, bookings=store, payment_tokens=tokens, hotels=hotels, search_agent=search, payment_agent=payment
    )
    saver = InMemorySaver()
    graph = build_booking_graph(deps, saver)
    booking_id = uuid.uuid4().hex
    request = {"city": "Lisbon", "checkin": CHECKIN, "checkout": CHECKOUT, "guests": 2, "payment_token": "tok_visa"}
    request |= fields
    await tokens.put(booking_id, request["payment_token"])  # what booking-agent does when it accepts
    await store.create(booking_id, request)
    with budget_scope(budget_s):
        state = await graph.ainvoke(
            booking_input(booking_id, request), {"configurable": {"thread_id": booking_id}}, durability="sync"
        )
    record = await store.get(booking_id)
    assert record is not None
    # the card token reached the charge, and nothing kept it: no checkpoint, no state, no token left waiting
    assert await tokens.get(booking_id) is None
    assert "tok_visa" not in repr([c async for c in saver.alist({"configurable": {"thread_id": booking_id}})])
    assert "tok_visa" not in repr(state) and "tok_visa" not in repr(record)
    return state, record


async def test_a_full_hotel_moves_the_booking_to_the_next_candidate(redis: Redis, hotel_api: Any) -> None:
    api, hotels = hotel_api
    api.full = {"h1"}
    payment = PaymentAgent(lambda data: {"payment_id": "pay-1", "status": "captured"})
    state, record = await book(redis, hotels, SearchAgent([offer("h1", 90), offer("h2", 100)]), payment)

    assert record["status"] == "confirmed" and record["hotel_id"] == "h2"
    assert state["reservation_id"] == "res-h2"
    assert api.requests == [("reserve", "h1"), ("reserve", "h2"), ("confirm", "res-h2")]
    assert [(c["reference"], c["payment_token"]) for c in payment.charges] == [(record["booking_id"], "tok_visa")]
    assert payment.refunds == []


async def test_a_declined_card_releases_the_hold_and_refunds_nothing(redis: Redis, hotel_api: Any) -> None:
    api, hotels = hotel_api

    def decline(data: dict[str, Any]) -> dict[str, Any]:
        raise A2ASkillError("payment_declined", "card declined: insufficient funds")

    payment = PaymentAgent(decline)
    _state, record = await book(redis, hotels, SearchAgent([offer("h1", 90)]), payment)

    assert record["status"] == "failed"
    assert record["error"]["code"] == "payment_declined"
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]
    assert payment.refunds == []  # declined: nothing was captured


async def test_a_budget_that_runs_out_during_the_charge_answers_timeout_and_compensates(
    redis: Redis, hotel_api: Any
) -> None:
    api, hotels = hotel_api

    def out_of_time(data: dict[str, Any]) -> dict[str, Any]:
        raise BudgetExhaustedError("payment-agent did not answer within the budget")

    payment = PaymentAgent(out_of_time)
    _state, record = await book(redis, hotels, SearchAgent([offer("h1", 90)]), payment)

    assert record["status"] == "failed"
    assert record["error"]["code"] == "timeout"
    # the charge may have been captured without an answer: refund by reference, then release the hold
    assert payment.refunds == [{"reference": record["booking_id"], "payment_id": None}]
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]


def approve(data: dict[str, Any]) -> dict[str, Any]:
    return {"payment_id": "pay-1", "status": "captured"}


async def test_a_hold_above_the_ceiling_is_released_and_nothing_is_charged(redis: Redis, hotel_api: Any) -> None:
    api, hotels = hotel_api
    api.total_price = 260.0  # the hotel repriced between the search and the hold
    payment = PaymentAgent(approve)
    state, record = await book(
        redis, hotels, SearchAgent([offer("h1", 100), offer("h2", 110)]), payment, max_total_price=200.0
    )

    assert record["status"] == "failed"
    assert record["error"] == {
        "code": "price_changed",
        "message": record["error"]["message"],
        "held_total": 260.0,
        "currency": "EUR",
        "allowed_total": 200.0,
        "allowed_currency": None,
    }
    assert "260.00 EUR" in record["error"]["message"] and "200.00" in record["error"]["message"]
    assert payment.charges == [] and payment.refunds == []
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")], "released; no other hotel tried"
    # the record says what was held, so a reader sees the two totals side by side
    assert record["reservation_id"] == "res-h1" and record["total_price"] == 260.0
    assert state["error"]["code"] == "price_changed"


@pytest.mark.parametrize(
    ("held", "ceiling"),
    [(200.0, 200.0), (200.0, 200.001), (199.99, 200), (200.00000000001, 200.0), (0.3, 0.1 + 0.2)],
)
async def test_a_hold_within_the_ceiling_is_charged_compared_in_cents(
    redis: Redis, hotel_api: Any, held: float, ceiling: float
) -> None:
    api, hotels = hotel_api
    api.total_price = held
    payment = PaymentAgent(approve)
    _state, record = await book(
        redis, hotels, SearchAgent([offer("h1", 100)]), payment, max_total_price=ceiling, currency="EUR"
    )

    assert record["status"] == "confirmed", record["error"]
    assert [c["amount"] for c in payment.charges] == [held]


@pytest.mark.parametrize(("held", "ceiling"), [(200.01, 200.0), (200.0, 199.994)])
async def test_one_cent_above_the_ceiling_is_a_price_change(
    redis: Redis, hotel_api: Any, held: float, ceiling: float
) -> None:
    api, hotels = hotel_api
    api.total_price = held
    payment = PaymentAgent(approve)
    _state, record = await book(redis, hotels, SearchAgent([offer("h1", 100)]), payment, max_total_price=ceiling)

    assert record["status"] == "failed" and record["error"]["code"] == "price_changed"
    assert payment.charges == []


async def test_a_hold_in_another_currency_is_a_price_change_even_without_a_ceiling(
    redis: Redis, hotel_api: Any
) -> None:
    api, hotels = hotel_api
    payment = PaymentAgent(approve)
    _state, record = await book(redis, hotels, SearchAgent([offer("h1", 100)]), payment, currency="USD")

    assert record["status"] == "failed"
    assert record["error"]["code"] == "price_changed"
    assert (record["error"]["currency"], record["error"]["allowed_currency"]) == ("EUR", "USD")
    assert record["error"]["allowed_total"] is None
    assert payment.charges == []
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]


async def test_no_offer_fails_the_booking_without_touching_a_provider(redis: Redis, hotel_api: Any) -> None:
    api, hotels = hotel_api
    payment = PaymentAgent(lambda data: {"payment_id": "never", "status": "captured"})
    _state, record = await book(redis, hotels, SearchAgent([]), payment)

    assert record["status"] == "failed" and record["error"]["code"] == "no_availability"
    assert api.requests == [] and payment.charges == []


async def test_a_peer_whose_own_store_is_down_pauses_the_run_instead_of_failing_the_booking(
    redis: Redis, hotel_api: Any
) -> None:
    """payment-agent cannot reach its Redis: not an answer about the booking, so the step raises (the runner pauses
    the run and runs the step again when the stores answer) and nothing is compensated."""
    api, hotels = hotel_api

    def store_down(data: dict[str, Any]) -> Any:
        raise A2ASkillError("dependency_unavailable", "the idempotency store cannot be reached")

    payment = PaymentAgent(store_down)
    with pytest.raises(A2ASkillError) as raised:
        await book(redis, hotels, SearchAgent([offer("h1", 100.0)]), payment)

    assert raised.value.code == "dependency_unavailable"
    assert api.requests == [("reserve", "h1")], "the hold stays: the run goes on from here"
    assert payment.refunds == []
