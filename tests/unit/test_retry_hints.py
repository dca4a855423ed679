"""``RetryConfig(server_hints=True)``: the failure's own ``retry_after`` is waited (never less, a little jitter on
top), one past the budget ends the loop at once with that failure, and ``retryable=False`` is obeyed."""

from __future__ import annotations

import random

import pytest

from resilience import budget_scope, with_retry
from resilience.retry import RETRY_AFTER_JITTER, RetryConfig

HINTED = RetryConfig(max_attempts=3, base_delay=0.25, server_hints=True)


class Hinted(Exception):
    def __init__(self, retry_after: float | None = None, retryable: bool | None = None) -> None:
        super().__init__("hinted")
        self.retry_after = retry_after
        self.retryable = retryable


class Recorder:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def failing(*errors: Exception) -> tuple[list[int], object]:
    calls: list[int] = []

    async def fn() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return calls, fn


async def test_the_asked_wait_is_waited_with_jitter_above_it() -> None:
    sleep = Recorder()
    calls, fn = failing(Hinted(retry_after=2.0), Hinted(retry_after=1.0))
    with budget_scope(30):
        assert await with_retry(fn, config=HINTED, sleep=sleep, rng=random.Random(7)) == "ok"  # type: ignore[arg-type]
    assert len(calls) == 3
    first, second = sleep.waits
    assert 2.0 <= first <= 2.0 + min(2.0 * RETRY_AFTER_JITTER, 0.25)
    assert 1.0 <= second <= 1.0 + min(1.0 * RETRY_AFTER_JITTER, 0.25)


async def test_a_wait_past_the_budget_raises_the_failure_at_once_with_its_wait() -> None:
    sleep = Recorder()
    calls, fn = failing(Hinted(retry_after=120.0))
    with budget_scope(30), pytest.raises(Hinted) as caught:
        await with_retry(fn, config=HINTED, sleep=sleep)  # type: ignore[arg-type]
    assert caught.value.retry_after == 120.0 and len(calls) == 1 and sleep.waits == []


async def test_not_retryable_is_obeyed() -> None:
    calls, fn = failing(Hinted(retryable=False))
    with pytest.raises(Hinted):
        await with_retry(fn, config=HINTED, sleep=Recorder())  # type: ignore[arg-type]
    assert len(calls) == 1


async def test_without_hints_the_backoff_alone_decides() -> None:
    sleep = Recorder()
    calls, fn = failing(Hinted(retry_after=120.0, retryable=False))
    plain = RetryConfig(max_attempts=2, base_delay=0.25, jitter=False)
    with budget_scope(30):
        assert await with_retry(fn, config=plain, sleep=sleep) == "ok"  # type: ignore[arg-type]
    assert sleep.waits == [0.25] and len(calls) == 2
