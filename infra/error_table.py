"""The one table: which exception gets which answer (error code, HTTP status, retryable), everywhere.

The HTTP edge (``infra.service``), the A2A skill errors (``infra.a2a.server``) and the booking saga
(``graph.booking``) all ask ``answer_for(exc)``; none keeps a mapping of its own. Rows are tried in order and the
first whose class matches wins, so a subclass comes before its base. A row without a code takes the exception's
own: a business error raised on purpose (``SkillFailure``, a peer's ``A2ASkillError``, any ``NonRetryableError``
with a ``code`` attribute). The HTTP status is the code's (``domain.booking.ErrorCode.http_status``).

``retryable`` tells a caller whether the same request may succeed later; over A2A it decides how the client
raises (``docs/a2a.md``): not retryable → a business error, ``timeout`` → a timeout, otherwise unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from domain.booking import ErrorCode, InvalidStayError
from infra.a2a.errors import A2AError, A2ASkillError, A2AUnavailableError, SkillFailure
from infra.clients.errors import NoAvailabilityError, PaymentDeclinedError, ProviderError, ProviderRejectedError
from resilience.errors import (
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    NonRetryableError,
    ResilienceError,
)

__all__ = ["TABLE", "ErrorAnswer", "answer_for", "error_body", "skill_failure_from"]


@dataclass(frozen=True)
class ErrorAnswer:
    code: str
    """An ``ErrorCode`` value; a business error raised on purpose may carry a code of its own."""
    status: int
    retryable: bool
    message: str


TABLE: Final[tuple[tuple[type[Exception], ErrorCode | None, bool], ...]] = (
    # exception                   code (None: its own)              retryable
    (SkillFailure, None, False),
    (A2ASkillError, None, False),
    (InvalidStayError, ErrorCode.INVALID_REQUEST, False),
    (ValidationError, ErrorCode.INVALID_REQUEST, False),  # a model built from a request's data
    (NoAvailabilityError, ErrorCode.NO_AVAILABILITY, False),
    (PaymentDeclinedError, ErrorCode.PAYMENT_DECLINED, False),
    (ProviderRejectedError, ErrorCode.REJECTED, False),
    (BudgetExhaustedError, ErrorCode.TIMEOUT, False),  # A2ATimeoutError too: it is one
    (BulkheadTimeoutError, ErrorCode.TIMEOUT, True),
    (TimeoutError, ErrorCode.TIMEOUT, True),
    (BulkheadFullError, ErrorCode.BULKHEAD_FULL, True),
    (CircuitOpenError, ErrorCode.PROVIDER_UNAVAILABLE, True),
    (A2AUnavailableError, ErrorCode.PROVIDER_UNAVAILABLE, True),
    (A2AError, ErrorCode.PROVIDER_UNAVAILABLE, False),  # our token or request refused by a peer
    (ProviderError, ErrorCode.PROVIDER_UNAVAILABLE, True),
    (ResilienceError, ErrorCode.UNAVAILABLE, True),
    (NonRetryableError, None, False),
    (Exception, ErrorCode.INTERNAL, True),
)


def _own_code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else ErrorCode.REJECTED


def _status(code: str) -> int:
    try:
        return ErrorCode(code).http_status
    except ValueError:  # a peer's or a handler's own code: a refusal of the request
        return ErrorCode.REJECTED.http_status


def answer_for(exc: BaseException) -> ErrorAnswer:
    """The one answer for ``exc`` (the last row catches every ``Exception``: ``internal``)."""
    for cls, code, retryable in TABLE:
        if isinstance(exc, cls):
            answer = code if code is not None else _own_code(exc)
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            return ErrorAnswer(str(answer), _status(answer), retryable, message)
    raise TypeError(f"not an Exception: {exc!r}")  # BaseException (CancelledError, KeyboardInterrupt) is never answered


def error_body(code: str, message: str | None = None, **extra: Any) -> dict[str, Any]:
    """Our services' error shape: ``{"error": {"code": ..., "message": ..., **extra}}``."""
    error: dict[str, Any] = {"code": str(code)}
    if message is not None:
        error["message"] = message
    error.update(extra)
    return {"error": error}


def skill_failure_from(exc: BaseException) -> BaseException:
    """What a skill answers when its own dependency failed: the table's code as a business error.

    The agent already retried its dependency; a caller retrying too would multiply the load on a provider that is
    down, so the failure goes back as not retryable. ``internal`` errors are returned unchanged, to be re-raised.
    """
    if isinstance(exc, SkillFailure):
        return exc
    answer = answer_for(exc)
    if answer.code == ErrorCode.INTERNAL:
        return exc
    return SkillFailure(answer.code, answer.message)
