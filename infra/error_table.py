"""The one table: which exception gets which answer (error code, HTTP status, retryable), everywhere.

The HTTP edge (``infra.service``), the A2A skill errors (``infra.a2a.server``) and the booking saga
(``agents.booking.graph``) all ask ``answer_for(exc)``; none keeps a mapping of its own. Rows are tried in order and the
first whose class matches wins, so a subclass comes before its base. A row without a code takes the exception's
own: a business error raised on purpose (``SkillFailure``, a peer's ``A2ASkillError``, any ``NonRetryableError``
with a ``code`` attribute). The HTTP status is the code's (``domain.errors.status_of``).

``retryable`` tells a caller whether the same request may succeed later; over A2A it decides how the client
raises (``docs/a2a.md``): not retryable → a business error, ``timeout`` → a timeout, otherwise unavailable.
"""

from __future__ import annotations

import abc
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic import ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from domain.booking import BookingFinalError, InvalidStayError, PriceChangedError
from domain.cancellation import CancelInProgressError, CancellationRefusedError, FeeExceedsLimitError
from domain.chat import ChatConflictError
from domain.errors import ErrorCode, status_of
from errors.causes import causes
from errors.connection_errors import never_connected
from identity.people import (
    IdempotencyKeyReusedError,
    InvalidPersonTokenError,
    JwksUnavailableError,
    QuotaExceededError,
    UnauthenticatedError,
    www_authenticate,
)
from infra.a2a.errors import A2AError, A2ASkillError, A2AUnavailableError, SkillFailure
from infra.clients.errors import (
    NoAvailabilityError,
    PaymentDeclinedError,
    ProviderAuthError,
    ProviderError,
    ProviderRejectedError,
)
from infra.llm.errors import (
    ModelAuthError,
    ModelBadRequestError,
    ModelContextTooLongError,
    ModelError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    TokenBudgetExhausted,
)
from process.signals import ShuttingDownError
from resilience.errors import (
    AttemptTimeoutError,
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    InvalidBudgetHeaderError,
    NonRetryableError,
    OverloadedError,
    ResilienceError,
    earlier_attempts,
)

__all__ = [
    "RETRY_AFTER_S",
    "TABLE",
    "ErrorAnswer",
    "PostgresUnavailableError",
    "answer_for",
    "answer_response",
    "error_body",
    "is_outage",
    "may_have_reached",
    "skill_failure_from",
]


RETRY_AFTER_S: Final = 1.0
"""What a retryable 503 tells a client to wait when the exception does not say (an open circuit does)."""


@dataclass(frozen=True)
class ErrorAnswer:
    code: str
    """An ``ErrorCode`` value; a business error raised on purpose may carry a code of its own."""
    status: int
    retryable: bool
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    """More for the error body, from the exception (the circuit's name, the header at fault)."""
    wait_s: float | None = None
    """How long the exception says to wait (an open circuit knows)."""
    challenge: str | None = None
    """``WWW-Authenticate`` of a 401 for a person's token (RFC 6750)."""

    @property
    def retry_after(self) -> float | None:
        """Seconds for a ``Retry-After`` header: on every retryable 429 or 503, ``None`` otherwise."""
        if not self.retryable or self.status not in (429, 503):
            return None
        return self.wait_s if self.wait_s is not None else RETRY_AFTER_S


class PostgresUnavailableError(Exception, metaclass=abc.ABCMeta):
    """psycopg's ``OperationalError`` (Postgres unreachable, a connection lost), named without importing psycopg.

    Its row must not load psycopg (0.1 s) into every service that answers errors, most of which never talk to
    Postgres (SQLite checkpoints, or none): ``isinstance(exc, PostgresUnavailableError)`` holds for psycopg's class
    and its subclasses through ``__subclasshook__`` (``abc``), looked up in ``sys.modules``. A process that has not
    imported psycopg cannot hold one of its exceptions, so nothing is missed; a "no" cached by ``ABCMeta`` before the
    import is about a class that cannot be psycopg's either. Starlette finds an exception handler by the raised
    class's ``__mro__``, where a virtual base is not: a service's error boundary (``infra.service.middleware``)
    answers such an error instead, from this table, with the same status, body and ``Retry-After``.
    """

    @classmethod
    def __subclasshook__(cls, subclass: type) -> bool:
        psycopg = sys.modules.get("psycopg")
        if psycopg is not None and issubclass(subclass, psycopg.OperationalError):
            return True
        return NotImplemented  # the usual checks: a class of ours subclassing this one


def _fields(exc: BaseException) -> dict[str, Any]:
    # what the body says besides code and message: presentation, not a second mapping
    if isinstance(exc, CircuitOpenError):
        return {"circuit": exc.name, "retry_after": exc.retry_after}
    if isinstance(exc, InvalidBudgetHeaderError):
        return {"header": exc.header}
    if isinstance(exc, OverloadedError):
        return {"limit": exc.max_concurrent, "retry_after": exc.retry_after}
    if isinstance(exc, BookingFinalError):
        return {"status": exc.status}
    if isinstance(exc, FeeExceedsLimitError):
        return {"fee": exc.fee, "max_fee": exc.max_fee, "currency": exc.currency}
    if isinstance(exc, CancelInProgressError):
        return {"fee": exc.fee, "currency": exc.currency}
    if isinstance(exc, PriceChangedError):
        return {
            "held_total": exc.held_total,
            "currency": exc.currency,
            "allowed_total": exc.allowed_total,
            "allowed_currency": exc.allowed_currency,
        }
    if isinstance(exc, TokenBudgetExhausted):
        return {"budget": exc.budget, "limit": exc.limit, "spent": exc.spent}
    if isinstance(exc, ModelError):
        extra: dict[str, Any] = {"model": exc.model} if exc.model else {}
        if exc.retry_after is not None:
            extra["retry_after"] = exc.retry_after
        return extra
    return {}


TABLE: Final[tuple[tuple[type[Exception], ErrorCode | None, bool], ...]] = (
    # exception                   code (None: its own)              retryable
    (SkillFailure, None, False),
    (A2ASkillError, None, False),
    (InvalidStayError, ErrorCode.INVALID_REQUEST, False),
    # people (identity.people): who is calling, and their fair share
    (UnauthenticatedError, ErrorCode.UNAUTHENTICATED, False),
    (InvalidPersonTokenError, ErrorCode.INVALID_TOKEN, False),
    (JwksUnavailableError, ErrorCode.DEPENDENCY_UNAVAILABLE, True),  # nobody's token can be checked now
    (QuotaExceededError, ErrorCode.QUOTA_EXCEEDED, True),  # its retry_after: the Retry-After header
    (IdempotencyKeyReusedError, ErrorCode.IDEMPOTENCY_KEY_REUSED, False),
    # the model's answers (infra.llm.errors classifies the provider's statuses into these)
    (TokenBudgetExhausted, ErrorCode.TOKEN_BUDGET_EXHAUSTED, False),
    (ModelContextTooLongError, ErrorCode.MODEL_CONTEXT_TOO_LONG, False),
    (ModelBadRequestError, ErrorCode.MODEL_BAD_REQUEST, False),
    (ModelAuthError, ErrorCode.MODEL_AUTH, False),
    (ModelQuotaExceededError, ErrorCode.MODEL_QUOTA_EXCEEDED, False),  # billing: waiting does not help
    (ModelRateLimitedError, ErrorCode.MODEL_RATE_LIMITED, True),  # its retry_after: the Retry-After header
    (ModelError, ErrorCode.MODEL_UNAVAILABLE, True),
    (BookingFinalError, ErrorCode.ALREADY_FINAL, False),  # a cancel that came too late
    (CancellationRefusedError, None, False),  # its own code: stay_started, not_refundable
    (FeeExceedsLimitError, ErrorCode.FEE_EXCEEDS_LIMIT, False),  # the fee rose above the cancel's max_fee
    (CancelInProgressError, ErrorCode.CANCEL_IN_PROGRESS, False),  # another cancel won, on other terms
    (ChatConflictError, None, False),  # its own code: turn_in_progress, approval_pending, approval_expired
    (ValidationError, ErrorCode.INVALID_REQUEST, False),  # a model built from a request's data
    (InvalidBudgetHeaderError, ErrorCode.INVALID_HEADER, False),
    (NoAvailabilityError, ErrorCode.NO_AVAILABILITY, False),
    (PriceChangedError, ErrorCode.PRICE_CHANGED, False),  # a hold above the booking's max_total_price
    (PaymentDeclinedError, ErrorCode.PAYMENT_DECLINED, False),
    (ProviderAuthError, ErrorCode.PROVIDER_AUTH, False),  # our client key refused: a configuration to fix
    (ProviderRejectedError, ErrorCode.REJECTED, False),
    (BudgetExhaustedError, ErrorCode.TIMEOUT, False),  # A2ATimeoutError too: it is one
    (AttemptTimeoutError, ErrorCode.TIMEOUT, True),  # too slow for its share; another attempt may fit
    (BulkheadTimeoutError, ErrorCode.TIMEOUT, True),
    (RedisConnectionError, ErrorCode.DEPENDENCY_UNAVAILABLE, True),  # before TimeoutError: redis' is one too
    (RedisTimeoutError, ErrorCode.DEPENDENCY_UNAVAILABLE, True),
    (PostgresUnavailableError, ErrorCode.DEPENDENCY_UNAVAILABLE, True),
    (TimeoutError, ErrorCode.TIMEOUT, True),
    (ShuttingDownError, ErrorCode.SHUTTING_DOWN, True),  # a stopping process: 503 with Retry-After
    (OverloadedError, ErrorCode.OVERLOADED, True),  # admission control: 429, nothing recorded
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
    status = status_of(code)  # an ErrorCode's, or one an agent added (domain.errors.add_codes)
    # a peer's or a handler's own code nobody declared: a refusal of the request
    return status if status is not None else ErrorCode.REJECTED.http_status


def _row_answer(exc: BaseException) -> ErrorAnswer:
    for cls, code, retryable in TABLE:
        if isinstance(exc, cls):
            answer = code if code is not None else _own_code(exc)
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            wait = getattr(exc, "retry_after", None)
            wait_s = float(wait) if isinstance(wait, int | float) and not isinstance(wait, bool) else None
            challenge = (
                www_authenticate(exc) if isinstance(exc, UnauthenticatedError | InvalidPersonTokenError) else None
            )
            return ErrorAnswer(str(answer), _status(answer), retryable, message, _fields(exc), wait_s, challenge)
    raise TypeError(f"not an Exception: {exc!r}")  # BaseException (CancelledError, KeyboardInterrupt) is never answered


def answer_for(exc: BaseException) -> ErrorAnswer:
    """The one answer for ``exc`` (the last row catches every ``Exception``: ``internal``).

    A package's own error converted at its boundary (``raise RunStoreError(...) from redis_error``) has no row of its
    own; when the infrastructure that failed underneath can be named, the answer is that: ``dependency_unavailable``.
    """
    answer = _row_answer(exc)
    if answer.code == ErrorCode.INTERNAL:
        for cause in causes(exc):
            underneath = _row_answer(cause)
            if underneath.code == ErrorCode.DEPENDENCY_UNAVAILABLE:
                return ErrorAnswer(underneath.code, underneath.status, underneath.retryable, answer.message)
    return answer


_PEER_OUTAGE_CODES: Final = frozenset(
    {
        ErrorCode.PROVIDER_UNAVAILABLE,
        ErrorCode.DEPENDENCY_UNAVAILABLE,
        ErrorCode.UNAVAILABLE,
        ErrorCode.BULKHEAD_FULL,
        ErrorCode.OVERLOADED,
    }
)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says something the work needs is down, rather than the work failing: worth waiting out.

    That is every retryable answer but ``internal`` and, besides, a peer's skill error with an unavailability code:
    a peer answers its own dependency's outage as a business error (``skill_failure_from``) so that the caller's
    retry layer does not multiply the load, yet for whoever decides whether a run is hopeless it is still an
    outage. A peer's ``timeout`` is not: it is the caller's own budget running out.
    """
    answer = answer_for(exc)
    if answer.code == ErrorCode.INTERNAL:
        return False
    if answer.retryable:
        return True
    return isinstance(exc, A2ASkillError) and answer.code in _PEER_OUTAGE_CODES


def may_have_reached(exc: BaseException) -> bool:
    """Whether a call that raised ``exc`` may have reached the one it called, so its effect may have happened.

    Not when every attempt was refused here (an open breaker, a full bulkhead), never connected, or was refused by a peer that says its own request never left (``sent`` in its skill error). Any
    other failure after sending (a read timeout, a reset, a 5xx, a cancelled call) may have: then the side effect is
    "attempted" and is compensated by its idempotency key.
    """
    return any(_attempt_may_have_reached(seen) for seen in (exc, *earlier_attempts(exc)))


def _attempt_may_have_reached(exc: BaseException) -> bool:
    if isinstance(exc, ProviderError | A2AError):
        return exc.sent  # the client boundary knows (``sent``)
    cause = exc.__cause__
    if isinstance(exc, CircuitOpenError | BulkheadFullError):
        # refused here; chained (``from``) to the failure of the attempt that stopped the retries, if any
        return cause is not None and _attempt_may_have_reached(cause)
    if isinstance(exc, BudgetExhaustedError | BulkheadTimeoutError):
        # out of time: what it stopped decides; stopped with nothing to say, it may have been in flight
        return cause is None or _attempt_may_have_reached(cause)
    return not never_connected(exc)


def error_body(code: str, message: str | None = None, **extra: Any) -> dict[str, Any]:
    """Our services' error shape: ``{"error": {"code": ..., "message": ..., **extra}}``."""
    error: dict[str, Any] = {"code": str(code)}
    if message is not None:
        error["message"] = message
    error.update(extra)
    return {"error": error}


def answer_response(answer: ErrorAnswer) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` of an HTTP answer: our error body and, when there is one, ``Retry-After``."""
    retry_after = answer.retry_after
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else {}
    if answer.challenge is not None:
        headers["WWW-Authenticate"] = answer.challenge
    return answer.status, error_body(answer.code, answer.message, **answer.fields), headers


def skill_failure_from(exc: BaseException) -> BaseException:
    """What a skill answers when its own dependency failed: the table's code as a business error.

    The agent already retried its dependency; a caller retrying too would multiply the load on a provider that is
    down, so the failure goes back as not retryable. Its data say when our breaker may probe again
    (``retry_after``) and whether our request may have reached the provider (``sent``): a run waits on the one, and
    compensates only on the other. ``internal`` errors are returned unchanged, to be re-raised.
    """
    if isinstance(exc, SkillFailure):
        return exc
    answer = answer_for(exc)
    if answer.code == ErrorCode.INTERNAL:
        return exc
    # what a waiting caller needs: when our breaker may probe again, and whether our request may have left
    data: dict[str, Any] = {"sent": may_have_reached(exc)}
    if answer.wait_s is not None:
        data["retry_after"] = answer.wait_s
    return SkillFailure(answer.code, answer.message, data)
