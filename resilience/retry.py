"""Retry with capped exponential backoff and full jitter, inside the timeout budget.

The wait before attempt n+1 (n = 0-based index of the attempt that just failed) is uniform in
``[0, min(base_delay * exponential_base**n, max_delay)]`` (``jitter=False``: exactly that cap). Full jitter spreads
the retries of many clients over the whole window instead of synchronising them into waves.

Stops at once, without sleeping, on:

- ``CircuitOpenError`` (the breaker says the dependency is down; more attempts only add pressure) — from the
  breaker passed in or from anywhere inside ``fn``; when an attempt's failure opens the breaker, the loop raises
  ``CircuitOpenError`` (chained to that failure) instead of sleeping only to be refused;
- business errors: ``NonRetryableError`` and the config's ``non_retryable_exceptions`` (nor do they count against
  the breaker), and anything outside ``retryable_exceptions``;
- ``BudgetExhaustedError`` from inside ``fn`` (nothing left to retry with);
- cancellation.

It never sleeps into a spent budget: when the next wait would take all of ``remaining_budget()``, it raises
``BudgetExhaustedError`` chained (``from``) to the last error. After ``max_attempts`` it re-raises the last error.
Every scheduled retry and every give-up is an event (a WARNING log line, a span event, the hooks).

Tests: ``set_testing(True)`` removes the backoff waits (everything else, delays and events included, is unchanged),
or pass ``sleep=`` (e.g. a recorder) and ``rng=`` (a seeded ``random.Random``) to ``with_retry``.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from resilience.budget import remaining_budget
from resilience.circuit_breaker import CircuitBreaker, CircuitState
from resilience.dependencies import LayerView
from resilience.errors import BudgetExhaustedError, CircuitOpenError, NonRetryableError, keep_earlier_attempts
from resilience.events import RetryGaveUp, RetryScheduled, emit
from resilience.switches import Restore

__all__ = [
    "NO_RETRY",
    "RETRY_CONFIGS",
    "RetryConfig",
    "Sleep",
    "backoff_delay",
    "call_with_retry",
    "is_testing",
    "set_testing",
    "with_retry",
]

T = TypeVar("T")

Sleep = Callable[[float], Awaitable[object]]


def _check_types(field: str, value: object) -> None:
    if not isinstance(value, tuple) or not all(isinstance(t, type) and issubclass(t, BaseException) for t in value):
        raise ValueError(f"{field} must be a tuple of exception classes, got {value!r}")


def _check_seconds(field: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a non-negative, finite number of seconds, got {value!r}")


@dataclass(frozen=True, slots=True)
class RetryConfig:
    max_attempts: int = 3
    """Attempts in total, the first included (1 = no retry)."""
    base_delay: float = 1.0
    max_delay: float = 30.0
    exponential_base: float = 2.0
    jitter: bool = True
    retryable_exceptions: tuple[type[BaseException], ...] = (Exception,)
    non_retryable_exceptions: tuple[type[BaseException], ...] = ()
    """Business errors for this dependency: never retried and never counted as breaker failures."""
    server_hints: bool = False
    """Obey what the failure says of itself: ``exc.retryable is False`` ends the loop (a provider's
    ``x-should-retry: false``), ``exc.retry_after`` seconds are waited, never less, jitter on top (up to
    ``RETRY_AFTER_JITTER`` of it more); a wait that does not fit the budget re-raises ``exc`` at once, with its wait,
    so the caller can fall back or tell its own caller when to come back. The model's endpoints use it."""

    def __post_init__(self) -> None:
        n = self.max_attempts
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {n!r}")
        _check_seconds("base_delay", self.base_delay)
        _check_seconds("max_delay", self.max_delay)
        base = self.exponential_base
        if not isinstance(base, int | float) or isinstance(base, bool) or not math.isfinite(base) or base < 1:
            raise ValueError(f"exponential_base must be a finite number >= 1, got {base!r}")
        _check_types("retryable_exceptions", self.retryable_exceptions)
        _check_types("non_retryable_exceptions", self.non_retryable_exceptions)


RETRY_CONFIGS: Mapping[str, RetryConfig] = LayerView(lambda row: row.retry)
"""The retry configs: the installed dependency table's ``retry`` column (``resilience.dependencies``)."""

RETRY_AFTER_JITTER = 0.1
"""A provider's ``retry-after`` is waited plus up to this fraction more (and up to ``base_delay``), spreading the
clients it told the same instant."""

NO_RETRY = RetryConfig(max_attempts=1)
"""One attempt: what a policy without a retry config uses."""

_DEFAULT = RetryConfig()

# Errors that end the loop whatever the config says.
_STOP: tuple[type[BaseException], ...] = (NonRetryableError, CircuitOpenError, BudgetExhaustedError)

_testing = False


def set_testing(enabled: bool) -> Restore[bool]:
    """Testing mode: retries happen (delays computed, events emitted, budget checked) but nobody waits.

    In effect at once; ``with set_testing(True): ...`` turns it back off (to what it was) on exit.
    """
    global _testing
    previous, _testing = _testing, enabled
    return Restore(previous, _put_testing)


def _put_testing(enabled: bool) -> None:
    global _testing
    _testing = enabled


def is_testing() -> bool:
    return _testing


async def _no_wait(_: float) -> None:
    return None


def backoff_delay(attempt: int, cfg: RetryConfig, rng: random.Random | None = None) -> float:
    """The wait after the failure of 0-based attempt ``attempt``: full jitter over the capped exponential."""
    try:
        cap = min(cfg.base_delay * cfg.exponential_base**attempt, cfg.max_delay)
    except OverflowError:
        cap = cfg.max_delay
    if not cfg.jitter:
        return cap
    return (rng or random).uniform(0.0, cap)


def _retry_delay(
    exc: BaseException,
    attempt: int,
    cfg: RetryConfig,
    service: str,
    rng: random.Random | None,
    breaker: CircuitBreaker | None,
) -> float | None:
    """How long to wait before the next attempt, or None to re-raise ``exc``; raises when the breaker or the budget
    forbids another attempt."""
    if (
        not isinstance(exc, Exception)
        or isinstance(exc, (_STOP, cfg.non_retryable_exceptions))
        or not isinstance(exc, cfg.retryable_exceptions)
    ):
        return None
    attempts = attempt + 1
    asked: float | None = None
    if cfg.server_hints:
        if getattr(exc, "retryable", None) is False:
            emit(RetryGaveUp(service, attempts, "not_retryable", exc))
            return None
        wait = getattr(exc, "retry_after", None)
        if isinstance(wait, int | float) and not isinstance(wait, bool) and math.isfinite(wait) and wait >= 0:
            asked = float(wait)
    if attempts >= cfg.max_attempts:
        emit(RetryGaveUp(service, attempts, "attempts_exhausted", exc))
        return None
    delay = backoff_delay(attempt, cfg, rng)
    if asked is not None:
        delay = asked + (rng or random).uniform(0.0, min(asked * RETRY_AFTER_JITTER, cfg.base_delay) or 0.0)
        if delay >= remaining_budget():
            emit(RetryGaveUp(service, attempts, "retry_after_exceeds_budget", exc))
            return None
    if breaker is not None and breaker.state is CircuitState.OPEN:
        # This failure (or a concurrent one) opened the breaker: sleeping only to be refused helps nobody.
        retry_after = breaker.seconds_until_retry()
        if retry_after > delay:
            emit(RetryGaveUp(service, attempts, "circuit_open", exc))
            raise CircuitOpenError(breaker.name, retry_after) from exc
    left = remaining_budget()
    if delay >= left:
        emit(RetryGaveUp(service, attempts, "budget_exhausted", exc))
        raise BudgetExhaustedError(
            f"[retry:{service}] not retrying: the next attempt would start after {delay:.3f}s "
            f"with {left:.3f}s of budget left"
        ) from exc
    emit(RetryScheduled(service, attempts, delay, exc))
    return delay


async def call_with_retry(
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    config: RetryConfig | None = None,
    circuit_breaker: CircuitBreaker | None = None,
    service_name: str = "unknown",
    *,
    sleep: Sleep | None = None,
    rng: random.Random | None = None,
) -> T:
    """The retry loop with ``fn``'s arguments passed as a tuple and a dict (what ``ResiliencePolicy`` calls)."""
    cfg = config or _DEFAULT
    attempt = 0
    last: BaseException | None = None
    failed: list[BaseException] = []  # every attempt's failure: kept on what is raised (``earlier_attempts``)
    while True:
        ticket = 0
        if circuit_breaker is not None:
            try:
                ticket = circuit_breaker.admit()
            except CircuitOpenError as refused:
                if last is None:
                    raise
                emit(RetryGaveUp(service_name, attempt, "circuit_open", last))
                keep_earlier_attempts(refused, failed)
                raise refused from last
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            if circuit_breaker is not None:
                circuit_breaker.record_exception(exc, ticket, cfg.non_retryable_exceptions)
            try:
                delay = _retry_delay(exc, attempt, cfg, service_name, rng, circuit_breaker)
            except Exception as stopped:  # the breaker or the budget forbids another attempt
                keep_earlier_attempts(stopped, [*failed, exc])
                raise
            if delay is None:
                keep_earlier_attempts(exc, failed)
                raise
            last = exc
            failed.append(exc)
        else:
            if circuit_breaker is not None:
                circuit_breaker.record_success(ticket)
            return result
        await (sleep or (_no_wait if _testing else asyncio.sleep))(delay)
        attempt += 1


async def with_retry(
    fn: Callable[..., Awaitable[T]],
    *args: Any,
    config: RetryConfig | None = None,
    circuit_breaker: CircuitBreaker | None = None,
    service_name: str = "unknown",
    sleep: Sleep | None = None,
    rng: random.Random | None = None,
    **kwargs: Any,
) -> T:
    """``await fn(*args, **kwargs)`` with retries; every attempt goes through ``circuit_breaker`` when given.

    ``config`` defaults to ``RetryConfig()``; ``service_name`` labels logs, events and metrics; ``sleep`` and ``rng``
    replace ``asyncio.sleep`` and the ``random`` module (tests). These names are therefore not passed on to ``fn``.
    """
    return await call_with_retry(fn, args, kwargs, config, circuit_breaker, service_name, sleep=sleep, rng=rng)
