"""Accepted work waits out an outage within its budget (issue 24): the booking saga run by ``execute_run`` on real
Redis leases, hotel-api behind ``httpx.MockTransport`` and the peers as the in-process fakes of
``test_booking_saga``; breakers are the registry's, on the real clock.

- a run meeting an open breaker that closes within its budget pauses (one WARNING line, no ERROR) and confirms;
- one whose outage outlasts its budget fails within it, compensated, and a resumed one pauses only within the
  booking's own deadline, not its fresh attempt's budget;
- a charge refused before it left (our breaker, payment-agent's breaker) fails at once with nothing refunded, while
  one that may have left is refunded even when its re-run is refused;
- a breaker's open duration grows with each failed probe and resets when it closes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from redis.asyncio import Redis

from agents.booking.graph import BookingDeps, booking_input, build_booking_graph
from infra.a2a import A2ASkillError, A2AUnavailableError
from infra.bookings import BookingStore
from infra.clients.errors import ProviderUnavailableError
from infra.clients.providers import HotelApiClient
from infra.payment_tokens import PaymentTokens
from resilience import (
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitOpenError,
    CircuitState,
    ResiliencePolicy,
    bulkhead_registry,
    circuit_registry,
    set_testing,
)
from runs.leases import RunStore
from runs.runner import RunOutcome, execute_run
from tests.integration.test_booking_saga import CHECKIN, CHECKOUT, HotelApi, PaymentAgent, SearchAgent, offer


@pytest.fixture(autouse=True)
def fresh_layers() -> Any:
    """No breaker or bulkhead state from another test; retries without their waits (the pauses are real)."""
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


def open_breaker(name: str, *, open_for: float) -> CircuitBreaker:
    """``name``'s breaker, OPEN for ``open_for`` seconds (one failure opens it, one good probe closes it)."""
    breaker = circuit_registry.configure(
        name, CircuitBreakerConfig(failure_threshold=1, success_threshold=1, recovery_timeout=open_for)
    )
    breaker.record_exception(ConnectionError(f"{name} down"), breaker.admit())
    assert breaker.state is CircuitState.OPEN
    return breaker


async def run_booking(
    redis: Redis,
    hotels: HotelApiClient,
    search: SearchAgent,
    payment: PaymentAgent,
    *,
    budget_s: float,
    promised_until: float | None = None,
) -> tuple[dict[str, Any], float]:
    """Accept one booking and run it as booking-agent does (``execute_run``); its record and how long it took."""
    store, tokens = BookingStore(redis), PaymentTokens(redis)
    deps = BookingDeps(
        redis=redis, bookings=store, payment_tokens=tokens, hotels=hotels, search_agent=search, payment_agent=payment
    )
    graph = build_booking_graph(deps, InMemorySaver())
    booking_id = uuid.uuid4().hex
    request = {"city": "Lisbon", "checkin": CHECKIN, "checkout": CHECKOUT, "guests": 2, "payment_token": "tok_visa"}
    run_input = dict(booking_input(booking_id, request))
    await tokens.put(booking_id, request["payment_token"])
    lease = await RunStore(redis, ttl=5).create(booking_id, "booking", run_input, "test-owner")
    assert lease is not None
    await store.create(booking_id, request)
    started = time.monotonic()
    result = await execute_run(graph, lease, run_input, budget_s=budget_s, promised_until=promised_until)
    elapsed = time.monotonic() - started
    assert result.outcome is RunOutcome.DONE, result.error
    record = await store.get(booking_id)
    assert record is not None
    return record, elapsed


def charged(data: dict[str, Any]) -> dict[str, Any]:
    return {"payment_id": f"pay-{data['reference'][:6]}", "status": "captured"}


def pauses(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "runs.runner" and "paused" in r.getMessage()]


async def test_a_run_meeting_an_open_breaker_that_closes_within_its_budget_confirms(
    redis: Redis, hotel_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api, hotels = hotel_api
    breaker = open_breaker("hotel_api", open_for=1.0)
    payment = PaymentAgent(charged)
    with caplog.at_level(logging.INFO):
        record, elapsed = await run_booking(redis, hotels, SearchAgent([offer("h1", 90)]), payment, budget_s=10)

    assert record["status"] == "confirmed", record["error"]
    assert api.requests == [("reserve", "h1"), ("confirm", "res-h1")], "one hold, taken once the breaker let it"
    assert breaker.state is CircuitState.CLOSED
    assert elapsed >= 1.0, "it waited for the breaker's probe, not a moment less"
    # quiet logs: one WARNING line per pause naming the dependency and the wait, no ERROR, no traceback
    paused = pauses(caplog)
    assert len(paused) == 1 and paused[0].levelno == logging.WARNING
    assert "hotel_api" in paused[0].getMessage() and "pause 1" in paused[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_resumed_run_pauses_only_within_the_bookings_own_deadline_not_its_fresh_budget(
    redis: Redis, hotel_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A resumed attempt's budget starts afresh; the booking's promise does not. With 0.5 s of it left, the second
    that hotel-api's breaker stays open is more than it may wait: the booking fails now, not a budget later."""
    api, hotels = hotel_api
    open_breaker("hotel_api", open_for=1.0)
    with caplog.at_level(logging.INFO):
        record, _ = await run_booking(
            redis,
            hotels,
            SearchAgent([offer("h1", 90)]),
            PaymentAgent(charged),
            budget_s=10,
            promised_until=time.time() + 0.5,
        )

    assert record["status"] == "failed" and record["error"]["code"] == "provider_unavailable"
    assert not pauses(caplog), "ended at once, without waiting out the breaker's second"
    assert api.requests == []


async def test_an_outage_that_outlasts_the_budget_fails_the_booking_within_it_compensated(
    redis: Redis, hotel_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api, hotels = hotel_api

    def payment_api_down(data: dict[str, Any]) -> Any:
        # payment-agent's own breaker is open after requests that may have reached payment-api
        raise A2ASkillError("provider_unavailable", "payment_api: circuit open", {"sent": True, "retry_after": 0.5})

    payment = PaymentAgent(payment_api_down)
    budget_s = 5.0
    with caplog.at_level(logging.INFO):
        # a hang guard only: an outage that never ends would keep a budget-blind run pausing forever
        record, _ = await asyncio.wait_for(
            run_booking(redis, hotels, SearchAgent([offer("h1", 90)]), payment, budget_s=budget_s), 60
        )

    assert record["status"] == "failed" and record["error"]["code"] == "provider_unavailable"
    paused_s = sum(float(m.group(1)) for r in pauses(caplog) if (m := re.search(r"again in ([\d.]+)s", r.getMessage())))
    assert paused_s <= budget_s, f"the booking ends within its budget: it paused {paused_s:.1f}s of its {budget_s}s"
    assert len(payment.charges) >= 2, "the charge was tried again after each pause"
    # one pause between two charges; once a pause no longer fits, the step may run once more without one and take
    # the outage as its answer (runs.runner), or find the budget spent before it sends
    assert len(payment.charges) - 2 <= len(pauses(caplog)) <= len(payment.charges) - 1
    # compensated: the hold released, and the charge that may have left refunded by reference
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]
    assert payment.refunds == [{"reference": record["booking_id"], "payment_id": None}]


async def test_a_charge_refused_by_the_breaker_fails_at_once_and_is_not_compensated(
    redis: Redis, hotel_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api, hotels = hotel_api
    open_breaker("payment_api", open_for=60.0)  # far beyond the budget: no pause fits
    payment = PaymentAgent(charged)
    with caplog.at_level(logging.INFO):
        record, _ = await run_booking(redis, hotels, SearchAgent([offer("h1", 90)]), payment, budget_s=5)

    assert record["status"] == "failed" and record["error"]["code"] == "provider_unavailable"
    assert not pauses(caplog), "a charge that never left fails at once, without a pause"
    assert payment.charges == [] and payment.refunds == [], "nothing left, nothing to refund"
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")], "the hold is released all the same"


async def test_a_charge_refused_by_payment_agents_breaker_is_not_refunded(
    redis: Redis, hotel_api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    api, hotels = hotel_api

    def refused_there(data: dict[str, Any]) -> Any:
        raise A2ASkillError("provider_unavailable", "payment_api: circuit open", {"sent": False, "retry_after": 60.0})

    payment = PaymentAgent(refused_there)
    with caplog.at_level(logging.INFO):
        record, _ = await run_booking(redis, hotels, SearchAgent([offer("h1", 90)]), payment, budget_s=5)

    assert record["status"] == "failed" and record["error"]["code"] == "provider_unavailable"
    assert not pauses(caplog), "a charge that never left fails at once, without a pause"
    assert len(payment.charges) == 1 and payment.refunds == []
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]


async def test_a_charge_that_may_have_left_is_refunded_even_when_its_re_run_is_refused(
    redis: Redis, hotel_api: Any
) -> None:
    """The first attempt timed out after sending (it may be captured); the run paused, and the re-run was refused
    before it left: the booking still refunds, because the mark written before the first attempt stays."""
    api, hotels = hotel_api
    answers: list[Callable[[], Any]] = [
        lambda: A2AUnavailableError("charge_payment: read timeout"),
        lambda: A2AUnavailableError("charge_payment: read timeout"),
    ]

    def flaky(data: dict[str, Any]) -> Any:
        if answers:
            raise answers.pop(0)()
        raise A2ASkillError("provider_unavailable", "payment_api: circuit open", {"sent": False, "retry_after": 60.0})

    payment = PaymentAgent(flaky)
    record, _elapsed = await run_booking(redis, hotels, SearchAgent([offer("h1", 90)]), payment, budget_s=5)

    assert record["status"] == "failed" and record["error"]["code"] == "provider_unavailable"
    assert len(payment.charges) == 3, "two attempts (a retry), a pause, then the refused re-run"
    assert payment.refunds == [{"reference": record["booking_id"], "payment_id": None}]
    assert api.requests == [("reserve", "h1"), ("cancel", "res-h1")]


async def test_the_breakers_open_duration_grows_with_each_failed_probe_and_resets_when_it_closes() -> None:
    """hotel_api over HTTP (a MockTransport answering 503, then 200) through the registry's breaker, on the real
    clock; no retry layer, so each call is one request and one outcome for the breaker."""
    healthy = False

    def handle(request: httpx.Request) -> httpx.Response:
        if healthy:
            return httpx.Response(200, json={"reservation_id": "r1", "status": "held"})
        return httpx.Response(503, json={"error": "unavailable"})

    circuit_registry.configure(
        "hotel_api",
        CircuitBreakerConfig(
            failure_threshold=1, success_threshold=1, recovery_timeout=0.8, initial_recovery_timeout=0.2
        ),
    )
    breaker = circuit_registry.get("hotel_api")
    policy = ResiliencePolicy("hotel_api", circuit=breaker)
    http = httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as hotels:

        async def probe() -> None:
            # wait for the breaker to let a probe through, then make the call it lets through
            while True:
                try:
                    await policy.call(hotels.reservation, "r1")
                    return
                except CircuitOpenError as refused:
                    await asyncio.sleep(refused.retry_after + 0.01)

        with pytest.raises(ProviderUnavailableError):
            await probe()
        durations = [breaker.open_duration]
        for _ in range(3):
            with pytest.raises(ProviderUnavailableError):
                await probe()
            durations.append(breaker.open_duration)
        assert durations == [0.2, 0.4, 0.8, 0.8], "doubling from the initial duration up to the maximum"

        healthy = True
        await probe()
        assert breaker.state is CircuitState.CLOSED
        assert breaker.open_duration == 0.2, "closing resets it"
        healthy = False
        with pytest.raises(ProviderUnavailableError):
            await probe()
        assert breaker.state is CircuitState.OPEN and breaker.seconds_until_retry() <= 0.2
    await http.aclose()
