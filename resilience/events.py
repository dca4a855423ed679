"""What the protection layers report, and who hears it (stamina-style instrumentation hooks).

Every layer reports through ``emit(event)``. With no application code at all, an event becomes:

- a log line on the ``resilience`` logger: WARNING for state changes, retries and bulkhead rejections/timeouts;
  DEBUG for ``CircuitRejected``, which happens once per refused call and would flood the log under load (count it
  with a metric instead, see ``infra.metrics``);
- an event on the current OpenTelemetry span, when that span is recording.

Then every hook added with ``add_hook`` is called with the event. Hooks run synchronously on the request path, so
they must be cheap (bump a counter; never do I/O). A hook that raises is logged and skipped: instrumentation never
breaks a call.

Events are small frozen dataclasses; ``CircuitRejected`` instances are shared (one per breaker and state) so a
refused call allocates nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

__all__ = [
    "BudgetExpired",
    "BulkheadRejected",
    "BulkheadTimedOut",
    "CircuitRejected",
    "CircuitTransition",
    "Hook",
    "ResilienceEvent",
    "RetryGaveUp",
    "RetryScheduled",
    "add_hook",
    "emit",
    "hooks",
    "remove_hook",
]

logger = logging.getLogger("resilience")

# bound once: emit() runs on every refused call, where each attribute lookup shows in the benchmark
_get_current_span = trace.get_current_span
_is_enabled_for = logger.isEnabledFor


class ResilienceEvent:
    """Base of every event. Subclasses say how they are logged and what they add to the span."""

    __slots__ = ()
    level: ClassVar[int] = logging.WARNING
    span_event: ClassVar[str] = "resilience"

    def log(self, log: logging.Logger) -> None:
        raise NotImplementedError

    def attributes(self) -> dict[str, AttributeValue]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class CircuitTransition(ResilienceEvent):
    """A breaker changed state; ``old``/``new`` are ``CircuitState`` members (a ``StrEnum``: "closed", ...)."""

    name: str
    old: str
    new: str
    span_event: ClassVar[str] = "circuit.transition"

    def log(self, log: logging.Logger) -> None:
        log.warning("[CB:%s] %s → %s", self.name, self.old.upper(), self.new.upper())

    def attributes(self) -> dict[str, AttributeValue]:
        return {"circuit.name": self.name, "circuit.from": str(self.old), "circuit.to": str(self.new)}


@dataclass(frozen=True, slots=True)
class CircuitRejected(ResilienceEvent):
    """A call was refused without being made (``state`` is OPEN, or HALF_OPEN with every probe taken)."""

    name: str
    state: str
    level: ClassVar[int] = logging.DEBUG
    span_event: ClassVar[str] = "circuit.rejected"

    def log(self, log: logging.Logger) -> None:
        log.debug("[CB:%s] call rejected (%s)", self.name, self.state.upper())

    def attributes(self) -> dict[str, AttributeValue]:
        return {"circuit.name": self.name, "circuit.state": str(self.state)}


@dataclass(frozen=True, slots=True)
class BulkheadRejected(ResilienceEvent):
    """No slot came free within the bulkhead's ``acquire_timeout`` (or within the remaining budget)."""

    name: str
    max_concurrent: int
    waited: float
    span_event: ClassVar[str] = "bulkhead.rejected"

    def log(self, log: logging.Logger) -> None:
        log.warning("[BH:%s] full: %d in use, waited %.3fs", self.name, self.max_concurrent, self.waited)

    def attributes(self) -> dict[str, AttributeValue]:
        return {"bulkhead.name": self.name, "bulkhead.max": self.max_concurrent, "bulkhead.waited": self.waited}


@dataclass(frozen=True, slots=True)
class BulkheadTimedOut(ResilienceEvent):
    """A call held its slot past min(bulkhead timeout, remaining budget) and was cancelled."""

    name: str
    timeout: float
    span_event: ClassVar[str] = "bulkhead.timeout"

    def log(self, log: logging.Logger) -> None:
        log.warning("[BH:%s] call exceeded %.3fs and was cancelled", self.name, self.timeout)

    def attributes(self) -> dict[str, AttributeValue]:
        return {"bulkhead.name": self.name, "bulkhead.timeout": self.timeout}


@dataclass(frozen=True, slots=True)
class BudgetExpired(ResilienceEvent):
    """A call guarded only by the timeout budget (no bulkhead) ran out of it and was cancelled."""

    name: str
    seconds: float
    span_event: ClassVar[str] = "budget.expired"

    def log(self, log: logging.Logger) -> None:
        log.warning("[budget:%s] call cancelled after %.3fs: the timeout budget ran out", self.name, self.seconds)

    def attributes(self) -> dict[str, AttributeValue]:
        return {"resilience.name": self.name, "budget.seconds": self.seconds}


@dataclass(frozen=True, slots=True)
class RetryScheduled(ResilienceEvent):
    """Attempt number ``attempt`` (1-based) failed with ``error``; the next starts after ``delay`` seconds."""

    service: str
    attempt: int
    delay: float
    error: BaseException
    span_event: ClassVar[str] = "retry.scheduled"

    def log(self, log: logging.Logger) -> None:
        log.warning(
            "[retry:%s] attempt %d failed (%s: %s); retrying in %.3fs",
            self.service,
            self.attempt,
            type(self.error).__name__,
            self.error,
            self.delay,
        )

    def attributes(self) -> dict[str, AttributeValue]:
        return {
            "retry.service": self.service,
            "retry.attempt": self.attempt,
            "retry.delay": self.delay,
            "retry.error": type(self.error).__name__,
        }


@dataclass(frozen=True, slots=True)
class RetryGaveUp(ResilienceEvent):
    """Retrying stopped after ``attempts`` failed attempts.

    ``reason``: ``"attempts_exhausted"``, ``"budget_exhausted"`` (the next wait would outlast the budget) or
    ``"circuit_open"`` (the breaker refused the next attempt).
    """

    service: str
    attempts: int
    reason: str
    error: BaseException
    span_event: ClassVar[str] = "retry.gave_up"

    def log(self, log: logging.Logger) -> None:
        log.warning(
            "[retry:%s] giving up after %d attempt(s) (%s); last error %s: %s",
            self.service,
            self.attempts,
            self.reason,
            type(self.error).__name__,
            self.error,
        )

    def attributes(self) -> dict[str, AttributeValue]:
        return {
            "retry.service": self.service,
            "retry.attempts": self.attempts,
            "retry.reason": self.reason,
            "retry.error": type(self.error).__name__,
        }


Hook = Callable[[ResilienceEvent], None]

# A tuple replaced on change (copy-on-write): emit() iterates it without copying or locking.
_hooks: tuple[Hook, ...] = ()


def add_hook(hook: Hook) -> None:
    """Call ``hook(event)`` for every event from now on. Adding the same hook twice installs it once."""
    global _hooks
    if hook not in _hooks:
        _hooks = (*_hooks, hook)


def remove_hook(hook: Hook) -> None:
    """Stop calling ``hook``; removing a hook that is not installed does nothing."""
    global _hooks
    _hooks = tuple(h for h in _hooks if h != hook)


def hooks() -> tuple[Hook, ...]:
    """The installed hooks, in call order."""
    return _hooks


def emit(event: ResilienceEvent) -> None:
    """Log ``event``, add it to the current span and hand it to every hook; never raises."""
    try:
        if _is_enabled_for(event.level):
            event.log(logger)
        span = _get_current_span()
        if span.is_recording():
            span.add_event(event.span_event, event.attributes())
    except Exception:
        logger.exception("resilience: reporting %r failed", event)
    for hook in _hooks:
        try:
            hook(event)
        except Exception:
            logger.exception("resilience: hook %r failed on %r", hook, event)
