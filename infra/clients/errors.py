"""What the provider clients raise; every httpx error is converted here, at the boundary.

::

    Exception
     ├── ProviderError                       a provider call did not give the answer asked for
     │    ├── ProviderUnavailableError       transport error, timeout, 408/425/429, 5xx (injected faults too):
     │    │                                  retryable, counts against the provider's breaker
     │    └── ProviderRejectedError          the provider answered "no"; also ``NonRetryableError``: never
     │         │                             retried, never opens a breaker
     │         ├── ProviderConflictError     409: the resource's state forbids it (confirming a cancelled hold)
     │         │    └── NoAvailabilityError  409 ``no_availability``: no rooms for at least one night
     │         ├── PaymentDeclinedError      402: .reason, .payment_id (the declined charge is in the ledger)
     │         ├── IdempotencyMismatchError  422 ``idempotency_key_reused``: same key, different request
     │         ├── ProviderNotFoundError     404
     │         └── InvalidProviderRequestError   any other 4xx
     │              └── ProviderAuthError    401, 403: the provider refused our client key (a configuration to fix)
     └── resilience.errors.NonRetryableError

A call that times out because the request's budget ran out raises ``resilience.errors.BudgetExhaustedError``
(chained from the httpx error) instead of ``ProviderUnavailableError``: the provider may be fine, we are late.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resilience.errors import NonRetryableError

__all__ = [
    "IdempotencyMismatchError",
    "InvalidProviderRequestError",
    "NoAvailabilityError",
    "PaymentDeclinedError",
    "ProviderAuthError",
    "ProviderConflictError",
    "ProviderError",
    "ProviderNotFoundError",
    "ProviderRejectedError",
    "ProviderUnavailableError",
]


class ProviderError(Exception):
    """Base class. ``provider`` and ``status_code`` are ``None`` when unknown (e.g. no answer at all);
    ``code`` is the provider's ``error`` string and ``body`` its decoded JSON answer; ``sent`` is False only when the
    request never left (no connection opened): the provider cannot have acted on it."""

    def __init__(
        self,
        message: str,
        *,
        provider: str | None = None,
        status_code: int | None = None,
        code: str | None = None,
        body: Mapping[str, Any] | None = None,
        sent: bool = True,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sent = sent
        self.provider = provider
        self.status_code = status_code
        self.code = code
        self.body: Mapping[str, Any] = body or {}


class ProviderUnavailableError(ProviderError):
    """No usable answer: worth retrying (mutations carry idempotency keys, so a retry cannot double-book)."""


class ProviderRejectedError(ProviderError, NonRetryableError):
    """A definite answer that retrying cannot change; says nothing about the provider's health."""


class ProviderConflictError(ProviderRejectedError):
    pass


class NoAvailabilityError(ProviderConflictError):
    pass


class PaymentDeclinedError(ProviderRejectedError):
    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        payment_id: str | None = None,
        provider: str | None = None,
        status_code: int | None = None,
        code: str | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status_code=status_code, code=code, body=body)
        self.reason = reason
        self.payment_id = payment_id


class IdempotencyMismatchError(ProviderRejectedError):
    pass


class ProviderNotFoundError(ProviderRejectedError):
    pass


class InvalidProviderRequestError(ProviderRejectedError):
    pass


class ProviderAuthError(InvalidProviderRequestError):
    """401/403: the provider refused our client key (``HOTEL_API_KEY`` / ``PAYMENT_API_KEY``, or a secret that is
    not the provider's); waiting does not help."""
