"""Circuit breaker: the state machine, what counts as a failure, HALF_OPEN under concurrency, the registry."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator

import pytest

from resilience import (
    CIRCUIT_CONFIGS,
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitBreakerRegistry,
    CircuitOpenError,
    CircuitState,
    NonRetryableError,
    circuit_registry,
)
from tests.fakes import FakeClock


class Down(ConnectionError):
    """The dependency failing."""


class InvalidHotel(NonRetryableError):
    """A business error: the user asked for something that does not exist."""


async def ok() -> str:
    return "ok"


async def down() -> str:
    raise Down("connection refused")


async def fail(cb: CircuitBreaker, times: int = 1) -> None:
    for _ in range(times):
        with pytest.raises(Down):
            await cb.call(down)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def breaker(clock: FakeClock, **cfg: object) -> CircuitBreaker:
    return CircuitBreaker("hotel", CircuitBreakerConfig(**cfg), clock=clock)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    circuit_registry.clear()
    yield
    circuit_registry.clear()


# ------------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("failure_threshold", 0),
        ("failure_threshold", -1),
        ("failure_threshold", 1.5),
        ("failure_threshold", True),
        ("success_threshold", 0),
        ("half_open_max_calls", 0),
        ("recovery_timeout", -1.0),
        ("recovery_timeout", math.nan),
        ("recovery_timeout", "30"),
        ("expected_exception", "Exception"),
        ("expected_exception", (ValueError, int)),
    ],
)
def test_invalid_config_raises_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        CircuitBreakerConfig(**{field: value})  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    cfg = CircuitBreakerConfig()
    with pytest.raises(AttributeError):
        cfg.failure_threshold = 1  # type: ignore[misc]


def test_service_configs() -> None:
    def triple(name: str) -> tuple[int, int, float]:
        cfg = CIRCUIT_CONFIGS[name]
        return cfg.failure_threshold, cfg.success_threshold, cfg.recovery_timeout

    assert triple("hotel_api") == (5, 2, 30.0)
    assert triple("payment_api") == (3, 3, 60.0)
    assert triple("search_agent") == (10, 1, 15.0)


def test_state_values() -> None:
    assert [s.value for s in CircuitState] == ["closed", "open", "half_open"]


# ------------------------------------------------------------------------------------------------ state machine


async def test_opens_after_consecutive_failures_and_then_refuses_without_calling(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=3, recovery_timeout=30.0)
    await fail(cb, 2)
    assert cb.state is CircuitState.CLOSED
    await fail(cb)
    assert cb.state is CircuitState.OPEN

    calls = 0

    async def counted() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    clock.now += 10
    with pytest.raises(CircuitOpenError) as info:
        await cb.call(counted)
    assert calls == 0
    assert info.value.name == "hotel"
    assert info.value.retry_after == pytest.approx(20.0)
    stats = cb.stats()
    assert stats["short_circuits"] == 1
    assert stats["failures"] == 3
    assert stats["seconds_until_retry"] == pytest.approx(20.0)


async def test_a_success_resets_the_consecutive_failure_count(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=5)
    await fail(cb, 4)
    assert await cb.call(ok) == "ok"
    await fail(cb, 4)
    assert cb.state is CircuitState.CLOSED
    await fail(cb)
    assert cb.state is CircuitState.OPEN


async def test_half_open_closes_after_success_threshold_probe_successes(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=2, recovery_timeout=30.0)
    await fail(cb)
    clock.now += 29.9
    with pytest.raises(CircuitOpenError):
        await cb.call(ok)
    clock.now += 0.1
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.HALF_OPEN
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.CLOSED


async def test_a_probe_failure_reopens_and_restarts_the_timer(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=2, recovery_timeout=30.0)
    await fail(cb)
    clock.now += 30
    assert await cb.call(ok) == "ok"
    await fail(cb)
    assert cb.state is CircuitState.OPEN
    clock.now += 29
    with pytest.raises(CircuitOpenError) as info:
        await cb.call(ok)
    assert info.value.retry_after == pytest.approx(1.0)
    clock.now += 1
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.HALF_OPEN


@pytest.mark.parametrize("max_probes", [1, 3])
async def test_half_open_admits_at_most_max_probes_of_50_concurrent_callers(clock: FakeClock, max_probes: int) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=5.0, half_open_max_calls=max_probes)
    await fail(cb)
    clock.now += 5
    gate = asyncio.Event()
    executions = 0

    async def probe() -> str:
        nonlocal executions
        executions += 1
        await gate.wait()
        return "ok"

    tasks = [asyncio.create_task(cb.call(probe)) for _ in range(50)]
    for _ in range(3):
        await asyncio.sleep(0)
    # the probes are still blocked on the gate: every other caller has already been refused
    refused = [t for t in tasks if t.done()]
    assert len(refused) == 50 - max_probes
    assert all(isinstance(t.exception(), CircuitOpenError) for t in refused)
    assert executions == max_probes
    assert cb.state is CircuitState.HALF_OPEN
    assert cb.stats()["probes_in_flight"] == max_probes

    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert sum(r == "ok" for r in results) == max_probes
    assert executions == max_probes
    assert cb.state is CircuitState.CLOSED


async def test_no_lock_is_held_while_calls_run(clock: FakeClock) -> None:
    cb = breaker(clock)
    gate = asyncio.Event()
    running = 0

    async def slow() -> None:
        nonlocal running
        running += 1
        await gate.wait()

    tasks = [asyncio.create_task(cb.call(slow)) for _ in range(10)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert running == 10
    gate.set()
    await asyncio.gather(*tasks)


# ------------------------------------------------------------------------------------------------ what counts


async def test_business_errors_never_open_the_breaker(clock: FakeClock) -> None:
    async def invalid() -> None:
        raise InvalidHotel("no such hotel")

    cb = breaker(clock, failure_threshold=5)
    for _ in range(10):
        with pytest.raises(InvalidHotel):
            await cb.call(invalid)
    assert cb.state is CircuitState.CLOSED
    assert cb.stats()["failures"] == 0


async def test_ignored_exceptions_are_neutral(clock: FakeClock) -> None:
    async def bad_input() -> None:
        raise ValueError("bad date")

    cb = CircuitBreaker(
        "hotel", CircuitBreakerConfig(failure_threshold=2), clock=clock, ignored_exceptions=(ValueError,)
    )
    for _ in range(5):
        with pytest.raises(ValueError):
            await cb.call(bad_input)
    assert cb.state is CircuitState.CLOSED
    # neutral also means "not a success": the failure count is not reset by them
    await fail(cb)
    with pytest.raises(ValueError):
        await cb.call(bad_input)
    await fail(cb)
    assert cb.state is CircuitState.OPEN


def test_per_call_ignored_exceptions(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1)
    cb.record_exception(KeyError("missing"), cb.admit(), (KeyError,))
    assert cb.state is CircuitState.CLOSED
    cb.record_exception(KeyError("missing"), cb.admit())
    assert cb.state is CircuitState.OPEN


async def test_exceptions_outside_expected_exception_do_not_count(clock: FakeClock) -> None:
    async def bug() -> None:
        raise KeyError("our own bug")

    cb = breaker(clock, failure_threshold=1, expected_exception=ConnectionError)
    for _ in range(3):
        with pytest.raises(KeyError):
            await cb.call(bug)
    assert cb.state is CircuitState.CLOSED
    await fail(cb)
    assert cb.state is CircuitState.OPEN


async def test_cancellation_is_not_a_failure_and_is_reraised(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1)
    for _ in range(3):
        task = asyncio.create_task(cb.call(asyncio.sleep, 10))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert cb.state is CircuitState.CLOSED
    assert cb.stats()["failures"] == 0


async def test_cancellation_is_never_a_failure_even_when_every_exception_is_expected(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, expected_exception=BaseException)
    task = asyncio.create_task(cb.call(asyncio.sleep, 10))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cb.state is CircuitState.CLOSED
    await fail(cb)
    assert cb.state is CircuitState.OPEN


async def test_a_cancelled_probe_frees_its_slot(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=5.0)
    await fail(cb)
    clock.now += 5
    probe = asyncio.create_task(cb.call(asyncio.sleep, 10))
    await asyncio.sleep(0)
    assert cb.stats()["probes_in_flight"] == 1
    with pytest.raises(CircuitOpenError):
        await cb.call(ok)

    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert cb.state is CircuitState.HALF_OPEN
    assert cb.stats()["probes_in_flight"] == 0
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.CLOSED


async def test_a_business_error_from_a_probe_frees_its_slot(clock: FakeClock) -> None:
    async def invalid() -> None:
        raise InvalidHotel("no such hotel")

    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=5.0)
    await fail(cb)
    clock.now += 5
    with pytest.raises(InvalidHotel):
        await cb.call(invalid)
    assert cb.state is CircuitState.HALF_OPEN
    assert cb.stats()["probes_in_flight"] == 0
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.CLOSED


async def test_outcomes_of_calls_admitted_in_an_earlier_state_are_ignored(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=2, success_threshold=1, recovery_timeout=5.0)
    gate = asyncio.Event()

    async def slow_ok() -> str:
        await gate.wait()
        return "ok"

    slow = asyncio.create_task(cb.call(slow_ok))  # admitted while CLOSED
    await asyncio.sleep(0)
    await fail(cb, 2)
    clock.now += 5
    probe = asyncio.create_task(cb.call(asyncio.sleep, 10))
    await asyncio.sleep(0)
    assert cb.state is CircuitState.HALF_OPEN

    gate.set()
    assert await slow == "ok"
    # the old success neither closed the breaker nor freed the probe's slot
    assert cb.state is CircuitState.HALF_OPEN
    assert cb.stats()["probes_in_flight"] == 1
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe


# ------------------------------------------------------------------------------------------------ observability


async def test_every_transition_logs_one_warning_line(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="resilience"):
        await fail(cb)
        clock.now += 1
        await cb.call(ok)
    transitions = [r for r in caplog.records if r.getMessage().startswith("[CB:hotel]")]
    assert [r.getMessage() for r in transitions] == [
        "[CB:hotel] CLOSED → OPEN",
        "[CB:hotel] OPEN → HALF_OPEN",
        "[CB:hotel] HALF_OPEN → CLOSED",
    ]
    assert all(r.levelno == logging.WARNING for r in transitions)


async def test_refusals_are_not_logged_as_warnings(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    cb = breaker(clock, failure_threshold=1)
    await fail(cb)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="resilience"):
        for _ in range(100):
            with pytest.raises(CircuitOpenError):
                await cb.call(ok)
    assert caplog.records == []


def test_stats_report_what_health_endpoints_need(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, recovery_timeout=10.0)
    assert cb.stats() == {
        "state": "closed",
        "failures": 0,
        "consecutive_failures": 0,
        "short_circuits": 0,
        "calls": 0,
        "probes_in_flight": 0,
        "seconds_until_retry": 0.0,
        "open_for_s": 10.0,
    }
    cb.record_exception(Down(), cb.admit())
    stats = cb.stats()
    assert stats["state"] == "open"
    assert stats["calls"] == 1
    assert stats["seconds_until_retry"] == pytest.approx(10.0)


# ------------------------------------------------------------------------------------------------ open duration


async def probe_fails(cb: CircuitBreaker, clock: FakeClock) -> None:
    """Wait out the open duration, then let the probe fail."""
    clock.now += cb.seconds_until_retry()
    await fail(cb)


async def test_open_duration_doubles_with_each_failed_probe_up_to_the_maximum(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=10.0, initial_recovery_timeout=2.0)
    await fail(cb)
    seen = [cb.seconds_until_retry()]
    for _ in range(4):
        await probe_fails(cb, clock)
        seen.append(cb.seconds_until_retry())
    assert seen == [2.0, 4.0, 8.0, 10.0, 10.0]
    clock.now += 9.9
    with pytest.raises(CircuitOpenError) as refused:
        await cb.call(ok)
    assert refused.value.retry_after == pytest.approx(0.1)


async def test_closing_resets_the_open_duration(clock: FakeClock) -> None:
    cb = breaker(clock, failure_threshold=1, success_threshold=1, recovery_timeout=10.0, initial_recovery_timeout=2.0)
    await fail(cb)
    await probe_fails(cb, clock)
    assert cb.open_duration == 4.0
    clock.now += cb.seconds_until_retry()
    assert await cb.call(ok) == "ok"
    assert cb.state is CircuitState.CLOSED and cb.open_duration == 2.0
    await fail(cb)
    assert cb.seconds_until_retry() == 2.0


def test_without_an_initial_duration_the_open_duration_is_fixed(clock: FakeClock) -> None:
    cb = breaker(clock, recovery_timeout=7.0)
    assert cb.open_duration == 7.0
    # an initial duration longer than the maximum is cut to it (CONCIERGE_CIRCUITS may shorten only the maximum)
    assert breaker(clock, recovery_timeout=1.0, initial_recovery_timeout=2.0).open_duration == 1.0


def test_the_table_starts_every_breaker_short() -> None:
    for name, cfg in CIRCUIT_CONFIGS.items():
        assert cfg.initial_recovery_timeout is not None and cfg.initial_recovery_timeout <= 2.0, name
        assert cfg.recovery_timeout >= 15.0, name


# ------------------------------------------------------------------------------------------------ registry


def test_registry_gives_one_breaker_per_name_with_service_defaults() -> None:
    hotel = circuit_registry.get("hotel_api")
    assert circuit_registry.get("hotel_api") is hotel
    assert hotel.cfg == CIRCUIT_CONFIGS["hotel_api"]
    assert circuit_registry.get("payment_api").cfg.failure_threshold == 3
    assert circuit_registry.get("elsewhere").cfg == CircuitBreakerConfig()
    custom = CircuitBreakerConfig(failure_threshold=7)
    assert circuit_registry.get("custom", custom).cfg is custom
    assert circuit_registry.get("custom", CircuitBreakerConfig(failure_threshold=9)).cfg is custom
    assert set(circuit_registry.stats()) == {"hotel_api", "payment_api", "elsewhere", "custom"}
    assert circuit_registry.stats()["hotel_api"]["state"] == "closed"


async def test_configure_resets_in_place_so_holders_see_the_new_config() -> None:
    clock = FakeClock()
    registry = CircuitBreakerRegistry(clock=clock)
    hotel = registry.get("hotel_api")
    await fail(hotel, 5)
    assert hotel.state is CircuitState.OPEN

    assert registry.configure("hotel_api", recovery_timeout=0.5) is hotel
    assert hotel.state is CircuitState.CLOSED
    assert hotel.cfg.recovery_timeout == 0.5
    assert hotel.cfg.failure_threshold == 5  # fields not given are kept
    await fail(hotel, 5)
    clock.now += 0.5
    assert await hotel.call(ok) == "ok"
    assert hotel.state is CircuitState.HALF_OPEN


def test_configure_before_first_use_and_clear() -> None:
    circuit_registry.configure("payment_api", CircuitBreakerConfig(failure_threshold=1, recovery_timeout=0.1))
    assert circuit_registry.get("payment_api").cfg.recovery_timeout == 0.1
    generation = circuit_registry.generation
    circuit_registry.clear()
    assert "payment_api" not in circuit_registry
    assert circuit_registry.generation == generation + 1
    assert circuit_registry.get("payment_api").cfg == CIRCUIT_CONFIGS["payment_api"]
