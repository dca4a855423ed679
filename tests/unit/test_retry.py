"""Retry: full-jitter bounds, when it stops, the budget, the breaker, events. Sleeps are injected and recorded."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilience import (
    RETRY_CONFIGS,
    BudgetExhaustedError,
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitOpenError,
    CircuitState,
    NonRetryableError,
    ResilienceEvent,
    RetryConfig,
    RetryGaveUp,
    RetryScheduled,
    add_hook,
    backoff_delay,
    budget_scope,
    configure_budget,
    is_testing,
    remove_hook,
    set_testing,
    with_retry,
)
from tests.fakes import FakeClock


class Flaky(ConnectionError):
    pass


class DeclinedCard(NonRetryableError):
    pass


class Recorder:
    """An injected sleep: records the delays; advances a fake clock when given one."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.delays: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.clock is not None:
            self.clock.now += seconds


class Script:
    """An async callable that raises the given errors in turn, then returns ``result``."""

    def __init__(self, *errors: BaseException, result: str = "ok") -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


@pytest.fixture
def events() -> Iterator[list[ResilienceEvent]]:
    seen: list[ResilienceEvent] = []

    def hook(event: ResilienceEvent) -> None:
        seen.append(event)

    add_hook(hook)
    yield seen
    remove_hook(hook)


NO_JITTER = RetryConfig(max_attempts=4, base_delay=1.0, max_delay=30.0, jitter=False)


# ------------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 0),
        ("max_attempts", 2.0),
        ("base_delay", -1.0),
        ("base_delay", math.nan),
        ("max_delay", math.inf),
        ("exponential_base", 0.5),
        ("exponential_base", math.nan),
        ("retryable_exceptions", Exception),
        ("non_retryable_exceptions", (ValueError, "KeyError")),
    ],
)
def test_invalid_config_raises_value_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RetryConfig(**{field: value})  # type: ignore[arg-type]


def test_service_configs() -> None:
    hotel, payment, search = RETRY_CONFIGS["hotel_api"], RETRY_CONFIGS["payment_api"], RETRY_CONFIGS["search_agent"]
    assert (hotel.max_attempts, hotel.base_delay, hotel.non_retryable_exceptions) == (3, 1.0, (ValueError, KeyError))
    assert (payment.max_attempts, payment.base_delay, payment.non_retryable_exceptions) == (2, 2.0, (ValueError,))
    assert (search.max_attempts, search.base_delay) == (4, 0.5)


# ------------------------------------------------------------------------------------------------ backoff


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(min_value=0, max_value=2000),
    base=st.floats(min_value=0, max_value=100),
    cap=st.floats(min_value=0, max_value=1000),
    exp_base=st.floats(min_value=1, max_value=10),
    seed=st.integers(),
)
def test_full_jitter_stays_within_the_capped_exponential(
    attempt: int, base: float, cap: float, exp_base: float, seed: int
) -> None:
    cfg = RetryConfig(base_delay=base, max_delay=cap, exponential_base=exp_base, jitter=True)
    try:
        window = min(base * exp_base**attempt, cap)
    except OverflowError:
        window = cap
    delay = backoff_delay(attempt, cfg, random.Random(seed))
    assert 0.0 <= delay <= window
    assert (
        backoff_delay(attempt, RetryConfig(base_delay=base, max_delay=cap, exponential_base=exp_base, jitter=False))
        == window
    )


def test_jitter_spreads_over_the_whole_window() -> None:
    cfg = RetryConfig(base_delay=1.0, max_delay=30.0)
    rng = random.Random(7)
    delays = [backoff_delay(2, cfg, rng) for _ in range(2000)]
    assert max(delays) <= 4.0
    # full jitter, not equal jitter: a good share lands in the lower half
    assert sum(d < 2.0 for d in delays) > 800
    assert min(delays) < 0.1 and max(delays) > 3.9


async def test_recorded_waits_follow_the_schedule() -> None:
    sleep = Recorder()
    fn = Script(Flaky(), Flaky(), Flaky())
    assert await with_retry(fn, config=NO_JITTER, sleep=sleep) == "ok"
    assert fn.calls == 4
    assert sleep.delays == [1.0, 2.0, 4.0]

    jittered = Recorder()
    cfg = RetryConfig(max_attempts=4, base_delay=1.0, max_delay=3.0)
    assert await with_retry(Script(Flaky(), Flaky(), Flaky()), config=cfg, sleep=jittered, rng=random.Random(1)) == "ok"
    assert [0 <= d <= cap for d, cap in zip(jittered.delays, [1.0, 2.0, 3.0], strict=True)] == [True] * 3


# ------------------------------------------------------------------------------------------------ when it stops


async def test_after_max_attempts_the_last_error_is_reraised() -> None:
    sleep = Recorder()
    errors = [Flaky("1"), Flaky("2"), Flaky("3")]
    fn = Script(*errors)
    with pytest.raises(Flaky) as info:
        await with_retry(fn, config=RetryConfig(max_attempts=3), sleep=sleep)
    assert info.value is errors[2]
    assert fn.calls == 3
    assert len(sleep.delays) == 2


@pytest.mark.parametrize(
    "error",
    [DeclinedCard("card declined"), ValueError("bad hotel id"), KeyError("checkin")],
    ids=["NonRetryableError", "configured ValueError", "configured KeyError"],
)
async def test_business_errors_propagate_at_once(error: Exception) -> None:
    sleep = Recorder()
    fn = Script(error)
    with pytest.raises(type(error)) as info:
        await with_retry(fn, config=RETRY_CONFIGS["hotel_api"], sleep=sleep)
    assert info.value is error
    assert fn.calls == 1
    assert sleep.delays == []


async def test_errors_outside_retryable_exceptions_propagate_at_once() -> None:
    sleep = Recorder()
    fn = Script(RuntimeError("bug"))
    with pytest.raises(RuntimeError):
        await with_retry(fn, config=RetryConfig(retryable_exceptions=(ConnectionError,)), sleep=sleep)
    assert fn.calls == 1
    assert sleep.delays == []


async def test_cancellation_is_not_retried() -> None:
    sleep = Recorder()
    fn = Script(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await with_retry(fn, sleep=sleep)
    assert fn.calls == 1
    assert sleep.delays == []


async def test_cancellation_during_a_backoff_wait_propagates() -> None:
    fn = Script(Flaky(), Flaky())
    task = asyncio.create_task(with_retry(fn, config=RetryConfig(base_delay=10.0, jitter=False)))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fn.calls == 1


# ------------------------------------------------------------------------------------------------ the breaker


async def test_every_attempt_goes_through_the_breaker() -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=3))
    fn = Script(Flaky(), Flaky(), Flaky())
    with pytest.raises(Flaky):
        await with_retry(fn, config=RetryConfig(max_attempts=3), circuit_breaker=cb, sleep=Recorder())
    assert cb.stats()["calls"] == 3
    assert cb.state is CircuitState.OPEN


async def test_a_success_after_failures_resets_the_breaker_count() -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=3))
    assert await with_retry(Script(Flaky(), Flaky()), circuit_breaker=cb, sleep=Recorder()) == "ok"
    assert cb.stats()["consecutive_failures"] == 0


async def test_an_open_breaker_stops_retrying_at_once_without_calling_or_sleeping() -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=1, recovery_timeout=30.0))
    cb.record_exception(Flaky(), cb.admit())
    sleep = Recorder()
    fn = Script()
    with pytest.raises(CircuitOpenError):
        await with_retry(fn, config=RetryConfig(max_attempts=5), circuit_breaker=cb, sleep=sleep)
    assert fn.calls == 0
    assert sleep.delays == []


async def test_the_failure_that_opens_the_breaker_ends_the_retries(events: list[ResilienceEvent]) -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=2, recovery_timeout=30.0))
    sleep = Recorder()
    second = Flaky("second")
    fn = Script(Flaky("first"), second, Flaky("third"))
    with pytest.raises(CircuitOpenError) as info:
        await with_retry(fn, config=RetryConfig(max_attempts=5), circuit_breaker=cb, sleep=sleep, service_name="hotel")
    assert info.value.__cause__ is second
    assert fn.calls == 2
    assert len(sleep.delays) == 1  # after the first failure only: no sleeping into an open breaker
    gave_up = [e for e in events if isinstance(e, RetryGaveUp)]
    assert [(e.service, e.attempts, e.reason) for e in gave_up] == [("hotel", 2, "circuit_open")]


async def test_circuit_open_from_inside_fn_stops_at_once() -> None:
    sleep = Recorder()
    fn = Script(CircuitOpenError("payment_api", 12.0))
    with pytest.raises(CircuitOpenError):
        await with_retry(fn, config=RetryConfig(max_attempts=5), sleep=sleep)
    assert fn.calls == 1
    assert sleep.delays == []


async def test_business_errors_do_not_count_against_the_breaker() -> None:
    cb = CircuitBreaker("hotel_api", CircuitBreakerConfig(failure_threshold=2))
    for _ in range(5):
        with pytest.raises(ValueError):
            await with_retry(Script(ValueError("bad")), config=RETRY_CONFIGS["hotel_api"], circuit_breaker=cb)
        with pytest.raises(DeclinedCard):
            await with_retry(Script(DeclinedCard("no")), circuit_breaker=cb)
    assert cb.state is CircuitState.CLOSED
    assert cb.stats()["failures"] == 0


# ------------------------------------------------------------------------------------------------ the budget


async def test_never_sleeps_past_the_budget() -> None:
    sleep = Recorder()
    last = Flaky("last")
    fn = Script(last)
    with budget_scope(0.5), pytest.raises(BudgetExhaustedError) as info:
        await with_retry(fn, config=NO_JITTER, sleep=sleep)
    assert info.value.__cause__ is last
    assert fn.calls == 1
    assert sleep.delays == []


@settings(max_examples=150, deadline=None)
@given(
    budget=st.floats(min_value=0.01, max_value=60),
    attempts=st.integers(min_value=1, max_value=8),
    base=st.floats(min_value=0, max_value=10),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_total_sleep_never_exceeds_the_budget(budget: float, attempts: int, base: float, seed: int) -> None:
    clock = FakeClock()
    with configure_budget(clock=clock):
        sleep = Recorder(clock)
        cfg = RetryConfig(max_attempts=attempts, base_delay=base, max_delay=20.0)
        fn = Script(*(Flaky() for _ in range(attempts)))

        async def run() -> None:
            with budget_scope(budget), pytest.raises((Flaky, BudgetExhaustedError)):
                await with_retry(fn, config=cfg, sleep=sleep, rng=random.Random(seed))

        asyncio.run(run())
        assert sum(sleep.delays) < budget
        assert len(sleep.delays) == fn.calls - 1


async def test_budget_running_out_midway_stops_before_the_wait_that_would_outlast_it() -> None:
    clock = FakeClock()
    with configure_budget(clock=clock):
        sleep = Recorder(clock)
        fn = Script(Flaky(), Flaky(), Flaky())
        with budget_scope(2.5), pytest.raises(BudgetExhaustedError):
            await with_retry(fn, config=NO_JITTER, sleep=sleep)
        # waited 1 s (1.5 s left), then a 2 s wait would have outlasted the budget
        assert sleep.delays == [1.0]
        assert fn.calls == 2


async def test_budget_exhausted_from_inside_fn_is_not_retried() -> None:
    sleep = Recorder()
    fn = Script(BudgetExhaustedError("no time left for the downstream call"))
    with pytest.raises(BudgetExhaustedError):
        await with_retry(fn, sleep=sleep)
    assert fn.calls == 1
    assert sleep.delays == []


# ------------------------------------------------------------------------------------------------ observability


async def test_each_retry_is_a_log_line_and_an_event(
    events: list[ResilienceEvent], caplog: pytest.LogCaptureFixture
) -> None:
    first, second, third = Flaky("one"), Flaky("two"), Flaky("three")
    with caplog.at_level(logging.WARNING, logger="resilience"), pytest.raises(Flaky):
        await with_retry(
            Script(first, second, third),
            config=RetryConfig(max_attempts=3, base_delay=1.0, jitter=False),
            service_name="search_agent",
            sleep=Recorder(),
        )
    assert events == [
        RetryScheduled("search_agent", 1, 1.0, first),
        RetryScheduled("search_agent", 2, 2.0, second),
        RetryGaveUp("search_agent", 3, "attempts_exhausted", third),
    ]
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[retry:search_agent]")]
    assert messages == [
        "[retry:search_agent] attempt 1 failed (Flaky: one); retrying in 1.000s",
        "[retry:search_agent] attempt 2 failed (Flaky: two); retrying in 2.000s",
        "[retry:search_agent] giving up after 3 attempt(s) (attempts_exhausted); last error Flaky: three",
    ]


async def test_testing_mode_removes_the_waits_but_keeps_the_retries(
    events: list[ResilienceEvent], monkeypatch: pytest.MonkeyPatch
) -> None:
    slept: list[float] = []

    async def recording_sleep(delay: float, result: object = None) -> object:
        slept.append(delay)
        return result

    monkeypatch.setattr(asyncio, "sleep", recording_sleep)
    with set_testing(True):
        fn = Script(Flaky(), Flaky())
        assert await with_retry(fn, config=RetryConfig(max_attempts=3, base_delay=10.0, jitter=False)) == "ok"
        assert slept == [], "no backoff wait was slept"
        assert fn.calls == 3
        assert [e.delay for e in events if isinstance(e, RetryScheduled)] == [10.0, 20.0]
    assert not is_testing()  # put back on leaving the block


async def test_kwargs_reach_fn() -> None:
    async def book(hotel_id: str, *, nights: int) -> str:
        return f"{hotel_id}x{nights}"

    assert await with_retry(book, "h1", nights=2, config=RetryConfig()) == "h1x2"
