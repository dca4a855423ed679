"""The exceptions the resilience layers raise.

::

    Exception
     ├── ResilienceError                the call was refused or stopped by a protection layer
     │    ├── CircuitOpenError          the breaker is OPEN (or HALF_OPEN with its probes taken): name, retry_after
     │    ├── BulkheadFullError         no slot within ``acquire_timeout``
     │    │    └── OverloadedError      admission control: no room for new work now (nothing recorded); retry_after
     │    ├── BulkheadTimeoutError      the call ran past min(bulkhead timeout, remaining budget); it was cancelled
     │    ├── AttemptTimeoutError       one attempt ran past its share of the budget (``CALL_SHARES``) while the
     │    │                             budget has more: a failure of that attempt, retried within the budget
     │    ├── OutageWaitError           a run's step met an outage it may wait out: pause, then run it again
     │    └── BudgetExhaustedError      the request's timeout budget is spent (also a ``TimeoutError``)
     ├── NonRetryableError              a business error (bad input, declined card): never retried, never counted
     │                                  as a failure by a breaker. Applications subclass it.
     └── ValueError
          └── InvalidBudgetHeaderError  an ``X-Timeout-Budget`` that is not a positive, finite number of seconds

Every ``ResilienceError`` means "the dependency was not (fully) tried", so callers can map the whole family to
one answer (503 / ``provider_unavailable``) and single out ``BudgetExhaustedError`` (``timeout``).

The retry loop keeps the failures of a call's earlier attempts on the error it finally raises
(``earlier_attempts``): whether a request may have reached the dependency is a question about every attempt, not
only the last (``infra.error_table.may_have_reached``).
"""

from __future__ import annotations

_EARLIER = "_concierge_earlier_attempts"


def keep_earlier_attempts(exc: BaseException, earlier: list[BaseException]) -> None:
    """Record on ``exc`` the failures of the attempts made before the one that raised it (the retry loop)."""
    if earlier:
        setattr(exc, _EARLIER, (*earlier_attempts(exc), *(e for e in earlier if e is not exc)))


def earlier_attempts(exc: BaseException) -> tuple[BaseException, ...]:
    """The failures of the attempts a call made before the one that raised ``exc`` (empty: none, or no retry)."""
    found = getattr(exc, _EARLIER, ())
    return found if isinstance(found, tuple) else ()


class ResilienceError(Exception):
    """Base class of every error a protection layer raises."""


class CircuitOpenError(ResilienceError):
    # The message is formatted only when someone reads it: a rejection is the hot path of an outage.
    def __init__(self, name: str, retry_after: float) -> None:
        super().__init__(name, retry_after)
        self.name = name
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"circuit {self.name!r} is open; retry in {self.retry_after:.1f}s"


class BulkheadFullError(ResilienceError):
    def __init__(self, name: str, max_concurrent: int, waited: float) -> None:
        super().__init__(f"bulkhead {name!r} is full ({max_concurrent} in use, waited {waited:.2f}s)")
        self.name = name
        self.max_concurrent = max_concurrent
        self.waited = waited


class OverloadedError(BulkheadFullError):
    """Admission control refused new work because the compartment that holds it is full (e.g. booking runs in flight).

    Raised before anything was recorded, so sending the same request again after ``retry_after`` is safe. A
    ``BulkheadFullError`` for whoever does not know it (the error table: ``bulkhead_full``, retryable); the door that
    raises it answers 429.
    """

    def __init__(self, name: str, max_concurrent: int, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(name, max_concurrent, 0.0)
        self.message = message
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.message


class BulkheadTimeoutError(ResilienceError):
    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(f"bulkhead {name!r}: call exceeded {timeout:.2f}s and was cancelled")
        self.name = name
        self.timeout = timeout


class AttemptTimeoutError(ResilienceError):
    """One attempt used up its share of the budget; the budget itself has time left, so the retry loop may try again
    (the dependency is slow: its breaker counts it)."""


class OutageWaitError(ResilienceError):
    """A step of an accepted run met an outage (``dependency`` down, an open breaker): the run pauses ``retry_after``
    seconds (``None``: unknown) and runs the step again (``resilience.outages``). Chained to what the step met."""

    def __init__(self, dependency: str, retry_after: float | None, reason: str) -> None:
        super().__init__(f"{dependency} is unavailable ({reason}); waiting it out")
        self.dependency = dependency
        self.retry_after = retry_after
        self.reason = reason


class BudgetExhaustedError(ResilienceError, TimeoutError):
    """The timeout budget ran out; raised instead of starting (or sleeping into) work that cannot finish."""


class NonRetryableError(Exception):
    """A business error: retrying cannot help and it says nothing about the dependency's health."""


class InvalidBudgetHeaderError(ValueError):
    """A caller sent a timeout budget we cannot use; ``header`` names the header (the HTTP edge answers 400)."""

    def __init__(self, message: str, header: str) -> None:
        super().__init__(message)
        self.header = header
