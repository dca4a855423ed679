"""Every error code and its HTTP status, in a table of its own (both are HTTP contracts): ``ErrorCode``, the
codes an agent adds (``add_codes``), ``status_of`` for either. A code means one thing: declared again with another
status, it is refused. How an agent adds its codes: docs/new-agent.md#registering-it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

__all__ = ["ErrorCode", "add_codes", "status_of"]


class ErrorCode(StrEnum):
    """Every code an error answer carries (HTTP bodies, A2A skill errors, a failed booking's ``error.code``).

    Which exception gets which code is decided once, in ``infra.error_table``; each code has one HTTP status. The
    string values and statuses are HTTP contracts: never change one.
    """

    INVALID_REQUEST = "invalid_request"
    """The request breaks a rule; the message names the field."""
    UNKNOWN_SKILL = "unknown_skill"
    REJECTED = "rejected"
    """Refused for a reason the refusing side did not name."""
    NO_AVAILABILITY = "no_availability"
    PRICE_CHANGED = "price_changed"
    """The hold cost more than the booking's ``max_total_price``, or another currency: released, nothing charged."""
    PAYMENT_DECLINED = "payment_declined"
    TIMEOUT = "timeout"
    """The time budget ran out (or a wait for capacity outlasted it)."""
    PROVIDER_UNAVAILABLE = "provider_unavailable"
    """A dependency (a provider or a peer agent) failed, or its circuit is open."""
    PROVIDER_AUTH = "provider_auth"
    """A provider refused our client key (401/403): a configuration to fix (``HOTEL_API_KEY``, ``PAYMENT_API_KEY``,
    the deployment's secret), not a moment to wait out."""
    DEPENDENCY_UNAVAILABLE = "dependency_unavailable"
    """Our own infrastructure (Redis, Postgres) cannot be reached right now; nothing was lost, try again shortly."""
    OVERLOADED = "overloaded"
    """Admission refused: this service has as much work in flight as it takes; nothing was recorded, come back."""
    BULKHEAD_FULL = "bulkhead_full"
    """This service is at capacity; try again shortly."""
    UNAVAILABLE = "unavailable"
    """This service cannot serve right now (its own store or a resilience limit)."""
    SHUTTING_DOWN = "shutting_down"
    """This process is stopping and takes nothing new: send it again (a replica, or after the restart)."""
    ALREADY_FINAL = "already_final"
    """A cancel of a booking that is final already (or being confirmed): nothing changed."""
    STAY_STARTED = "stay_started"
    """A cancel of a confirmed stay on or after its check-in date: nothing changed."""
    NOT_REFUNDABLE = "not_refundable"
    """A cancel of a confirmed stay at a non-refundable rate: nothing changed."""
    FEE_EXCEEDS_LIMIT = "fee_exceeds_limit"
    """A cancel whose fee now is above the ``max_fee`` it allowed (the clock passed ``free_until``): nothing changed."""
    CANCEL_IN_PROGRESS = "cancel_in_progress"
    """Another cancel of the booking won, on terms this one did not allow: it goes on; this one changed nothing."""
    INVALID_HEADER = "invalid_header"
    HOST_NOT_ALLOWED = "host_not_allowed"
    """The request's ``Host`` is not a name of this service (a DNS-rebinding page, or a name to allow)."""
    BODY_TOO_LARGE = "body_too_large"
    HEADERS_TOO_LARGE = "headers_too_large"
    """The request line and headers are over 32 KiB: refused before more of them was read."""
    REQUEST_TIMEOUT = "request_timeout"
    """The request's headers or body did not arrive in time (``HEADER_READ_TIMEOUT_S``, ``BODY_READ_TIMEOUT_S``)."""
    UNAUTHENTICATED = "unauthenticated"
    """A public route without a person's bearer token (``WWW-Authenticate: Bearer``)."""
    INVALID_TOKEN = "invalid_token"
    """A person's token refused: signature, algorithm, issuer, audience, expiry or key id (RFC 6750)."""
    QUOTA_EXCEEDED = "quota_exceeded"
    """A person used their share (requests a minute, streams open, model tokens a day): ``Retry-After``."""
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    """The person used this ``Idempotency-Key`` before with a different body."""
    UNAUTHORIZED = "unauthorized"
    """A service credential missing or refused (``WWW-Authenticate: Bearer``): a service token over A2A, the admin
    token at ``/admin``, a client key at a provider's business routes."""
    FORBIDDEN = "forbidden"
    """The caller is known but may not do this: a skill it is not allowed to call, a refund of a confirmed booking."""
    NOT_FOUND = "not_found"
    """No such thing (a booking an A2A skill was asked about)."""
    UNKNOWN_BOOKING = "unknown_booking"
    """A concierge tool named a booking that is not its chat's: the same answer as for an id nobody made."""
    TURN_IN_PROGRESS = "turn_in_progress"
    """A chat's turn is running: its next message waits until it ends (``domain.chat``)."""
    APPROVAL_PENDING = "approval_pending"
    """A chat waits for the person's approval of a booking: decide it before the next message."""
    APPROVAL_EXPIRED = "approval_expired"
    """The approval is older than ``APPROVAL_TTL_S``: nothing was booked."""
    NOT_OFFERED = "not_offered"
    """A concierge ``book_hotel`` named a hotel that search does not offer for the stay: its error lists the offers."""
    MODEL_CALLS_EXHAUSTED = "model_calls_exhausted"
    """A turn asked the model ``LLM_MAX_CALLS_PER_TURN`` times without an answer: it ends ``failed`` (only a turn
    checkpointed before the last allowed call answered in words; since then that call ends the turn ``answered``)."""
    MODEL_UNAVAILABLE = "model_unavailable"
    """The language model (and its fallback) failed, timed out or broke off; nothing it said was used."""
    MODEL_RATE_LIMITED = "model_rate_limited"
    """The model's provider asked for a wait that does not fit the turn's budget (``retry_after`` says how long)."""
    MODEL_QUOTA_EXCEEDED = "model_quota_exceeded"
    """The provider's billing quota is spent (a 429 ``insufficient_quota``): waiting does not help."""
    MODEL_AUTH = "model_auth"
    """The provider refused our key (401/403): a configuration to fix, not a moment to wait out."""
    MODEL_BAD_REQUEST = "model_bad_request"
    """The provider refused the request as sent (400, 404 unknown model, 422)."""
    MODEL_CONTEXT_TOO_LONG = "model_context_too_long"
    """The conversation no longer fits the model's context."""
    TOKEN_BUDGET_EXHAUSTED = "token_budget_exhausted"
    """The turn or the chat has spent its tokens or its model calls; the next call was not made."""
    INTERNAL = "internal"
    """A bug or an unexpected failure: logged with its traceback, never sent."""

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]


_HTTP_STATUS: Final = {
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.UNKNOWN_SKILL: 404,
    ErrorCode.REJECTED: 422,
    ErrorCode.NO_AVAILABILITY: 409,
    ErrorCode.PRICE_CHANGED: 409,
    ErrorCode.PAYMENT_DECLINED: 402,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.PROVIDER_UNAVAILABLE: 503,
    ErrorCode.PROVIDER_AUTH: 502,
    ErrorCode.DEPENDENCY_UNAVAILABLE: 503,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.BULKHEAD_FULL: 503,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.ALREADY_FINAL: 409,
    ErrorCode.STAY_STARTED: 409,
    ErrorCode.NOT_REFUNDABLE: 409,
    ErrorCode.FEE_EXCEEDS_LIMIT: 409,
    ErrorCode.CANCEL_IN_PROGRESS: 409,
    ErrorCode.INVALID_HEADER: 400,
    ErrorCode.HOST_NOT_ALLOWED: 421,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.INVALID_TOKEN: 401,
    ErrorCode.QUOTA_EXCEEDED: 429,
    ErrorCode.IDEMPOTENCY_KEY_REUSED: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNKNOWN_BOOKING: 404,
    ErrorCode.TURN_IN_PROGRESS: 409,
    ErrorCode.APPROVAL_PENDING: 409,
    ErrorCode.APPROVAL_EXPIRED: 409,
    ErrorCode.NOT_OFFERED: 409,
    ErrorCode.MODEL_CALLS_EXHAUSTED: 502,
    ErrorCode.MODEL_UNAVAILABLE: 503,
    ErrorCode.MODEL_RATE_LIMITED: 429,
    ErrorCode.MODEL_QUOTA_EXCEEDED: 503,
    ErrorCode.MODEL_AUTH: 502,
    ErrorCode.MODEL_BAD_REQUEST: 502,
    ErrorCode.MODEL_CONTEXT_TOO_LONG: 422,
    ErrorCode.TOKEN_BUDGET_EXHAUSTED: 422,
    ErrorCode.INTERNAL: 500,
}


_ADDED: dict[str, int] = {}
"""The codes agents added (``add_codes``), with their statuses."""


def add_codes(statuses: Mapping[str, int]) -> None:
    """Make each code of ``statuses`` (an agent's enum members, or strings) answer with its HTTP status."""
    for code, status in statuses.items():
        value = str(code)
        known = status_of(value)
        if known is not None and known != status:
            raise ValueError(f"error code {value!r} is already answered with {known}, not {status}")
        if not 400 <= status <= 599:
            raise ValueError(f"error code {value!r}: {status} is not an error status")
        _ADDED[value] = status


def status_of(code: str) -> int | None:
    """The HTTP status of ``code``: an ``ErrorCode``'s, or one an agent added; ``None`` for a code nobody declared."""
    try:
        return ErrorCode(code).http_status
    except ValueError:
        return _ADDED.get(code)
