"""The exceptions the resilience layers raise.

::

    Exception
     ├── ResilienceError                the call was refused or stopped by a protection layer
     │    ├── CircuitOpenError          the breaker is OPEN (or HALF_OPEN with its probes taken): name, retry_after
     │    ├── BulkheadFullError         no slot within ``acquire_timeout``
     │    │    └── OverloadedError      admission control: no room for new work now (nothing recorded); retry_after
     │    ├── BulkheadTimeoutError      the call ran past min(bulkhead timeout, remaining budget); it was cancelled
     │    └── BudgetExhaustedError      the request's timeout budget is spent (also a ``TimeoutError``)
     ├── NonRetryableError              a business error (bad input, declined card): never retried, never counted
     │                                  as a failure by a breaker. Applications subclass it.
     └── ValueError
          └── InvalidBudgetHeaderError  an ``X-Timeout-Budget`` that is not a positive, finite number of seconds

Every ``ResilienceError`` means "the dependency was not (fully) tried", so callers can map the whole family to
one answer (503 / ``provider_unavailable``) and single out ``BudgetExhaustedError`` (``timeout``).
"""

from __future__ import annotations


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


class BudgetExhaustedError(ResilienceError, TimeoutError):
    """The timeout budget ran out; raised instead of starting (or sleeping into) work that cannot finish."""


class NonRetryableError(Exception):
    """A business error: retrying cannot help and it says nothing about the dependency's health."""


class InvalidBudgetHeaderError(ValueError):
    """A caller sent a timeout budget we cannot use; ``header`` names the header (the HTTP edge answers 400)."""

    def __init__(self, message: str, header: str) -> None:
        super().__init__(message)
        self.header = header
