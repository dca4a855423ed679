"""ResiliencePolicy: the composition order and what it guarantees as a whole; policy_for."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from resilience import (
    CIRCUIT_CONFIGS,
    OUTBOUND_BULKHEAD_CONFIGS,
    RETRY_CONFIGS,
    BudgetExhaustedError,
    Bulkhead,
    BulkheadConfig,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitOpenError,
    CircuitRejected,
    CircuitState,
    NonRetryableError,
    ResilienceEvent,
    ResiliencePolicy,
    RetryConfig,
    add_hook,
    budget_scope,
    bulkhead_registry,
    circuit_registry,
    outbound_bulkhead_name,
    policy_for,
    remaining_budget,
    remove_hook,
    wait_out_outages,
)
from tests.fakes import FakeClock


class Flaky(ConnectionError):
    pass


class DeclinedCard(NonRetryableError):
    pass


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    circuit_registry.clear()
    bulkhead_registry.clear()
    yield
    circuit_registry.clear()
    bulkhead_registry.clear()


def open_breaker(name: str = "hotel_api", clock: FakeClock | None = None) -> CircuitBreaker:
    cb = CircuitBreaker(
        name, CircuitBreakerConfig(failure_threshold=1, recovery_timeout=30.0), clock=clock or FakeClock()
    )
    cb.record_exception(Flaky(), cb.admit())
    assert cb.state is CircuitState.OPEN
    return cb


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


INSTANT_RETRY = RetryConfig(max_attempts=3, base_delay=0.0)


# ------------------------------------------------------------------------------------------------ order


async def test_an_open_breaker_refuses_before_any_slot_is_taken() -> None:
    bulkhead = Bulkhead("hotel", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=5.0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(gate.wait))
    await settle()
    assert bulkhead.available_slots == 0
    policy = ResiliencePolicy("hotel_api", circuit=open_breaker(), bulkhead=bulkhead, retry=INSTANT_RETRY)
    called = False

    async def never() -> None:
        nonlocal called
        called = True

    with pytest.raises(CircuitOpenError):
        await policy.call(never)
    assert not called
    assert bulkhead.stats()["waiting"] == 0, "never queued for the (full) bulkhead, where it would wait up to 5 s"
    assert bulkhead.stats()["rejected"] == 0
    gate.set()
    await holder


async def test_a_refusal_is_reported_once() -> None:
    policy = ResiliencePolicy("hotel_api", circuit=open_breaker(), retry=INSTANT_RETRY)
    seen: list[ResilienceEvent] = []
    add_hook(seen.append)
    try:
        with pytest.raises(CircuitOpenError):
            await policy.call(asyncio.sleep, 0)
    finally:
        remove_hook(seen.append)
    assert seen == [CircuitRejected("hotel_api", "open")]


async def test_a_full_bulkhead_never_calls_fn_nor_feeds_the_breaker() -> None:
    bulkhead = Bulkhead("hotel", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0.05))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(gate.wait))
    await settle()
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=1))
    policy = ResiliencePolicy("hotel_api", circuit=cb, bulkhead=bulkhead, retry=INSTANT_RETRY)
    called = False

    async def never() -> None:
        nonlocal called
        called = True

    with pytest.raises(BulkheadFullError):
        await policy.call(never)
    assert not called
    assert cb.state is CircuitState.CLOSED
    assert cb.stats()["calls"] == 0
    gate.set()
    await holder


async def test_retries_happen_inside_one_slot_and_through_the_breaker() -> None:
    bulkhead = Bulkhead("hotel", BulkheadConfig(max_concurrent=5, timeout=5.0))
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=5))
    policy = ResiliencePolicy("hotel_api", circuit=cb, bulkhead=bulkhead, retry=INSTANT_RETRY)
    slots_seen: list[int] = []

    async def flaky_then_ok(hotel_id: str, *, nights: int) -> str:
        slots_seen.append(bulkhead.in_use)
        if len(slots_seen) < 3:
            raise Flaky("reset by peer")
        return f"{hotel_id}:{nights}"

    assert await policy.call(flaky_then_ok, "h1", nights=2) == "h1:2"
    assert slots_seen == [1, 1, 1]
    assert bulkhead.in_use == 0
    assert cb.stats()["calls"] == 3
    assert cb.stats()["consecutive_failures"] == 0


async def test_retries_stop_when_the_breaker_opens() -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=2, recovery_timeout=30.0))
    policy = ResiliencePolicy(
        "hotel_api",
        circuit=cb,
        bulkhead=Bulkhead("hotel", BulkheadConfig(5, 5.0)),
        retry=RetryConfig(max_attempts=5, base_delay=0.0),
    )
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise Flaky("down")

    with pytest.raises(CircuitOpenError):
        await policy.call(down)
    assert calls == 2


async def test_business_errors_pass_through_untouched() -> None:
    cb = CircuitBreaker("payment_api", CircuitBreakerConfig(failure_threshold=1))
    policy = ResiliencePolicy(
        "payment_api",
        circuit=cb,
        bulkhead=Bulkhead("payment", BulkheadConfig(5, 5.0)),
        retry=RETRY_CONFIGS["payment_api"],
    )
    declined = DeclinedCard("insufficient funds")
    bad_amount = ValueError("amount must be positive")
    for error in (declined, bad_amount, declined):
        calls = 0

        async def refuse(error: Exception = error) -> None:
            nonlocal calls
            calls += 1
            raise error

        with pytest.raises(type(error)) as info:
            await policy.call(refuse)
        assert info.value is error
        assert calls == 1
    assert cb.state is CircuitState.CLOSED
    assert cb.stats()["failures"] == 0


async def test_half_open_through_the_policy_admits_one_probe_of_many() -> None:
    clock = FakeClock()
    cb = open_breaker(clock=clock)
    clock.now += 30
    policy = ResiliencePolicy("hotel_api", circuit=cb, bulkhead=Bulkhead("hotel", BulkheadConfig(50, 5.0)))
    gate = asyncio.Event()
    executions = 0

    async def probe() -> str:
        nonlocal executions
        executions += 1
        await gate.wait()
        return "ok"

    tasks = [asyncio.create_task(policy.call(probe)) for _ in range(30)]
    await settle()
    assert executions == 1
    assert sum(t.done() for t in tasks) == 29
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results.count("ok") == 1
    assert all(isinstance(r, CircuitOpenError) for r in results if r != "ok")


# ------------------------------------------------------------------------------------------------ bounds


async def test_the_bulkhead_bound_covers_the_whole_retry_sequence() -> None:
    policy = ResiliencePolicy(
        "hotel_api",
        circuit=CircuitBreaker("hotel_api"),
        bulkhead=Bulkhead("hotel", BulkheadConfig(max_concurrent=1, timeout=0.1)),
        retry=INSTANT_RETRY,
    )
    with pytest.raises(BulkheadTimeoutError):
        await policy.call(asyncio.sleep, 30)  # a 30 s sleep that ran out would raise nothing
    assert policy.bulkhead is not None and policy.bulkhead.in_use == 0


async def test_retry_sees_the_bulkhead_bound_as_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = ResiliencePolicy(
        "hotel_api",
        bulkhead=Bulkhead("hotel", BulkheadConfig(max_concurrent=1, timeout=0.5)),
        retry=RetryConfig(max_attempts=3, base_delay=1.0, jitter=False),
    )
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise Flaky("down")

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def recording_sleep(delay: float, result: object = None) -> object:
        slept.append(delay)
        return await real_sleep(delay, result)

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    with budget_scope(30), pytest.raises(BudgetExhaustedError) as info:
        await policy.call(down)
    # it did not sleep 1 s into a 0.5 s bound only to be cut off: it stopped at once with the real cause attached
    assert 1.0 not in slept, slept
    assert calls == 1
    assert isinstance(info.value.__cause__, Flaky)


async def test_without_a_bulkhead_the_budget_bounds_execution() -> None:
    policy = ResiliencePolicy("hotel_api", circuit=CircuitBreaker("hotel_api"), retry=INSTANT_RETRY)
    with budget_scope(0.1), pytest.raises(BudgetExhaustedError):
        await policy.call(asyncio.sleep, 30)  # a 30 s sleep that ran out would raise nothing


async def test_a_bare_policy_just_calls() -> None:
    async def budget_inside() -> float:
        return remaining_budget()

    with budget_scope(5):
        assert 0 < await ResiliencePolicy("plain").call(budget_inside) <= 5


# ------------------------------------------------------------------------------------------------ policy_for


def test_policy_for_uses_the_registries_and_is_cached() -> None:
    policy = policy_for("hotel_api")
    assert policy_for("hotel_api") is policy
    assert policy.circuit is circuit_registry.get("hotel_api")
    assert policy.circuit.cfg == CIRCUIT_CONFIGS["hotel_api"]
    assert policy.retry == RETRY_CONFIGS["hotel_api"]
    assert policy.bulkhead is bulkhead_registry.get(outbound_bulkhead_name("hotel_api"))
    assert policy.bulkhead.cfg == OUTBOUND_BULKHEAD_CONFIGS["hotel_api"]
    assert "hotel_api" in circuit_registry.stats()
    assert "outbound:hotel_api" in bulkhead_registry.stats()
    # outbound bulkheads never share slots with the agents' inbound ones
    assert policy_for("search_agent").bulkhead is not bulkhead_registry.get("search_agent")


def test_policy_for_follows_registry_resets_and_configuration() -> None:
    policy = policy_for("payment_api")
    circuit_registry.configure("payment_api", recovery_timeout=0.2)
    assert policy_for("payment_api") is policy
    assert policy.circuit is not None and policy.circuit.cfg.recovery_timeout == 0.2

    circuit_registry.clear()
    rebuilt = policy_for("payment_api")
    assert rebuilt is not policy
    assert rebuilt.circuit is circuit_registry.get("payment_api")
    bulkhead_registry.clear()
    assert policy_for("payment_api").bulkhead is bulkhead_registry.get("outbound:payment_api")


async def test_policy_for_every_service_and_an_unknown_one() -> None:
    for name in ("hotel_api", "payment_api", "search_agent", "somewhere_else"):
        policy = policy_for(name)
        assert await policy.call(asyncio.sleep, 0, name) == name
        assert policy.circuit is circuit_registry.get(name)
    assert policy_for("somewhere_else").retry == RetryConfig()


# ------------------------------------------------------------------------------------- the layers switched off


async def test_with_the_layers_off_an_open_breaker_and_a_full_bulkhead_stop_nothing() -> None:
    from resilience import calls_in_flight, set_layers

    bulkhead = Bulkhead("hotel", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0.0))
    policy = ResiliencePolicy("hotel_api", circuit=open_breaker(), bulkhead=bulkhead, retry=INSTANT_RETRY)
    gate = asyncio.Event()
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await gate.wait()
        return "ok"

    with set_layers(False):
        first = asyncio.create_task(policy.call(slow))
        second = asyncio.create_task(policy.call(slow))
        await settle()
        assert calls == 2  # neither the open breaker nor the one slot held them back
        assert bulkhead.in_use == 0
        assert policy.in_flight == 2
        gate.set()
        assert await asyncio.gather(first, second) == ["ok", "ok"]
    assert policy.in_flight == 0
    assert all(n == 0 for n in calls_in_flight().values())
    with pytest.raises(CircuitOpenError):
        await policy.call(slow)  # the switch restored: the breaker refuses again


async def test_with_the_layers_off_every_attempt_is_made_and_none_feeds_the_breaker() -> None:
    from resilience import set_layers

    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=1, recovery_timeout=30.0))
    policy = ResiliencePolicy("hotel_api", circuit=cb, retry=INSTANT_RETRY)
    attempts = 0

    async def failing() -> None:
        nonlocal attempts
        attempts += 1
        raise Flaky("down")

    with set_layers(False), budget_scope(0.5):
        with pytest.raises(Flaky):
            await policy.call(failing)
        inside = remaining_budget()
    assert attempts == INSTANT_RETRY.max_attempts
    assert cb.state is CircuitState.CLOSED
    assert inside <= 0.5  # the caller's scope stands; only the calls ran under the default timeout


async def test_each_attempt_gets_its_share_of_the_budget_left() -> None:
    seen: list[float] = []

    async def attempt() -> None:
        seen.append(remaining_budget())
        if len(seen) < 2:
            raise Flaky("slow")

    policy = ResiliencePolicy("hotel_api", retry=INSTANT_RETRY, share=0.25)
    with budget_scope(4.0), wait_out_outages():  # an accepted run's call
        await policy.call(attempt)
        left = remaining_budget()
    assert len(seen) == 2
    assert all(0 < s <= 1.0 for s in seen)  # a quarter of the 4 s, each attempt
    assert left > 3.0  # the caller keeps the rest


async def test_a_request_spends_the_budget_it_was_sent_without_taking_a_share() -> None:
    seen: list[float] = []

    async def attempt() -> None:
        seen.append(remaining_budget())

    policy = ResiliencePolicy("hotel_api", retry=INSTANT_RETRY, share=0.25)
    with budget_scope(4.0):  # a request: its caller already cut its budget
        await policy.call(attempt)
    assert seen and seen[0] > 3.0


async def test_an_attempt_past_its_share_is_retried_while_the_budget_has_more() -> None:
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BudgetExhaustedError("hotel_api: the share ran out")  # what a client raises at its deadline
        return "ok"

    policy = ResiliencePolicy("hotel_api", retry=INSTANT_RETRY, share=0.25)
    with budget_scope(4.0), wait_out_outages():
        assert await policy.call(attempt) == "ok"
    assert calls == 2


def test_a_share_outside_zero_to_one_is_refused() -> None:
    for share in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="share"):
            ResiliencePolicy("x", share=share)


def test_policy_for_gives_the_configured_shares() -> None:
    from resilience import CALL_SHARES

    for name, share in CALL_SHARES.items():
        assert policy_for(name).share == share
