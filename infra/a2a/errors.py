"""What a call to another agent raises; SDK and httpx errors are converted here, at the boundary.

::

    Exception
     ├── A2AError                       a call to another agent produced no result: .code, .message
     │    ├── A2AUnavailableError       transport error, 5xx, remote bulkhead full/timeout, remote circuit open,
     │    │    │                        remote crash (code ``internal``): retryable, counts against breakers
     │    │    └── A2ATimeoutError      the budget ran out (before sending, while waiting, or on the remote side);
     │    │                             also a ``BudgetExhaustedError`` so the booking flow answers ``timeout``
     │    ├── A2AUnauthorizedError      401/403: our token was refused (also ``NonRetryableError``)
     │    ├── A2AProtocolError          the peer refused the request as malformed (other 4xx, JSON-RPC client
     │    │                             errors, unknown task state); also ``NonRetryableError``
     │    └── A2ASkillError             the remote skill failed with a business error (``payment_declined``,
     │                                  ``unknown_skill``, ``invalid_request``): .code, .message, .data;
     │                                  also ``NonRetryableError``
     ├── resilience.errors.NonRetryableError
     │    └── SkillFailure              raised by a skill handler to answer with a business error: .code, .message,
     │                                  .data (the server side; the caller receives it as ``A2ASkillError``)
     └── SkillInputRequired             raised by a skill handler that needs more from the client before it acts:
                                        the task waits (``input-required``) with .message and .data; not an error

Which code and HTTP status each of these means to a caller: ``infra.error_table``.
"""

from __future__ import annotations

from typing import Any

from resilience.errors import (
    BudgetExhaustedError,
    NonRetryableError,
)


class A2AError(Exception):
    """A call to another agent produced no result. ``sent`` is False only when the request never left (no
    connection opened): the peer cannot have acted on it."""

    default_code = "a2a_error"

    def __init__(self, message: str, *, code: str | None = None, sent: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.sent = sent


class A2AUnavailableError(A2AError):
    """The peer could not be reached or could not do the work now; retryable, counts against breakers."""

    default_code = "unavailable"


class A2ATimeoutError(A2AUnavailableError, BudgetExhaustedError):
    """The timeout budget ran out before the peer answered (or the peer ran out of it)."""

    default_code = "budget_exhausted"


class A2AUnauthorizedError(A2AError, NonRetryableError):
    """The peer refused our service token (401/403). Retrying with the same token cannot help."""

    default_code = "unauthorized"

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class A2AProtocolError(A2AError, NonRetryableError):
    """The peer refused the request as malformed, or answered outside the protocol we speak."""

    default_code = "protocol_error"


class A2ASkillError(A2AError, NonRetryableError):
    """The remote skill failed with a business error; ``code`` says which (e.g. ``payment_declined``)."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        # the peer says whether its own requests may have reached its provider (``sent``, see skill_failure_from)
        super().__init__(message, code=code, sent=not (isinstance(data, dict) and data.get("sent") is False))
        self.data = data


class SkillFailure(NonRetryableError):
    """A skill's business answer (``payment_declined``, ``invalid_request``...): not retried by the caller."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class SkillInputRequired(Exception):
    """A skill's "not yet: send this first" (a decision that names no approval, or not the pending one): the task
    waits in ``input-required`` with ``message`` (text) and ``data`` (a data part) instead of failing."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.data = data
