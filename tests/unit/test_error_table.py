"""One answer per exception: every class raised across a boundary, the code, HTTP status and retryable it gets.

The HTTP edge, the A2A skill errors and the booking saga all read ``infra.error_table``; this test pins the table
and checks that no other module keeps an exception → code mapping of its own.
"""

from __future__ import annotations

import re
import tomllib
from enum import StrEnum
from pathlib import Path

import httpx
import pytest
from psycopg import OperationalError as PostgresOperationalError
from pydantic import BaseModel, ValidationError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from domain.booking import BookingFinalError, InvalidStayError, PriceChangedError
from domain.cancellation import CancelInProgressError, CancellationRefusedError, FeeExceedsLimitError
from domain.chat import ApprovalExpiredError, ApprovalPendingError, TurnInProgressError
from domain.errors import ErrorCode, add_codes, status_of
from identity.people import (
    IdempotencyKeyReusedError,
    InvalidPersonTokenError,
    JwksUnavailableError,
    QuotaExceededError,
    UnauthenticatedError,
)
from infra.a2a import (
    A2AError,
    A2AProtocolError,
    A2ASkillError,
    A2ATimeoutError,
    A2AUnauthorizedError,
    A2AUnavailableError,
    SkillFailure,
)
from infra.clients import (
    IdempotencyMismatchError,
    InvalidProviderRequestError,
    NoAvailabilityError,
    PaymentDeclinedError,
    ProviderAuthError,
    ProviderConflictError,
    ProviderError,
    ProviderNotFoundError,
    ProviderUnavailableError,
)
from infra.error_table import TABLE, answer_for, is_outage, may_have_reached, skill_failure_from
from infra.llm import (
    ModelAuthError,
    ModelBadRequestError,
    ModelCapacityError,
    ModelContextTooLongError,
    ModelError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelStreamBrokenError,
    ModelTimeoutError,
    ModelUnavailableError,
    TokenBudgetExhausted,
)
from process.signals import ShuttingDownError
from resilience import (
    AttemptTimeoutError,
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    InvalidBudgetHeaderError,
    NonRetryableError,
    OverloadedError,
    ResilienceError,
)
from resilience.errors import keep_earlier_attempts

ROOT = Path(__file__).resolve().parents[2]


class _Model(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Model.model_validate({"n": "x"})
    except ValidationError as exc:
        return exc
    raise AssertionError("expected a ValidationError")


def _wrapped(exc: BaseException, cause: BaseException) -> BaseException:
    """``exc`` raised ``from cause``, as a package converts a library error at its boundary."""
    exc.__cause__ = cause
    return exc


class _Coded(NonRetryableError):
    code = "payment_declined"


# (exception, code, HTTP status, retryable)
CASES: list[tuple[BaseException, str, int, bool]] = [
    # business answers: said once, never retried
    (SkillFailure("payment_declined", "card declined"), "payment_declined", 402, False),
    (SkillFailure("unknown_thing", "a code of the handler's own"), "unknown_thing", 422, False),
    (A2ASkillError("no_availability", "full"), "no_availability", 409, False),
    (InvalidStayError("checkout", "must be after checkin"), "invalid_request", 422, False),
    (_validation_error(), "invalid_request", 422, False),
    (BookingFinalError("b1", "confirmed", "booking b1 is confirmed"), "already_final", 409, False),
    (PriceChangedError(145.6, "EUR", 112.0, None), "price_changed", 409, False),
    (CancellationRefusedError("stay_started", "the stay started"), "stay_started", 409, False),
    (CancellationRefusedError("not_refundable", "non-refundable"), "not_refundable", 409, False),
    (FeeExceedsLimitError(80.0, 0.0, "EUR"), "fee_exceeds_limit", 409, False),
    (CancelInProgressError("b1", 80.0, "EUR"), "cancel_in_progress", 409, False),
    (TurnInProgressError("a turn runs"), "turn_in_progress", 409, False),
    (ApprovalPendingError("an approval waits"), "approval_pending", 409, False),
    (ApprovalExpiredError("too late"), "approval_expired", 409, False),
    # people: who is calling, and their share
    (UnauthenticatedError("no bearer token"), "unauthenticated", 401, False),
    (InvalidPersonTokenError("exp: expired"), "invalid_token", 401, False),
    (JwksUnavailableError("the issuer's keys could not be read"), "dependency_unavailable", 503, True),
    (QuotaExceededError("requests", "too many", 12.0), "quota_exceeded", 429, True),
    (IdempotencyKeyReusedError("Idempotency-Key: used before"), "idempotency_key_reused", 422, False),
    (InvalidBudgetHeaderError("X-Timeout-Budget must be a number", "X-Timeout-Budget"), "invalid_header", 400, False),
    (NoAvailabilityError("full", provider="hotel-api", status_code=409), "no_availability", 409, False),
    (PaymentDeclinedError("declined", provider="payment-api", status_code=402), "payment_declined", 402, False),
    (ProviderAuthError("401 unauthorized", provider="hotel-api", status_code=401), "provider_auth", 502, False),
    (ProviderConflictError("cancelled", provider="hotel-api", status_code=409), "rejected", 422, False),
    (ProviderNotFoundError("no such hotel", provider="hotel-api", status_code=404), "rejected", 422, False),
    (InvalidProviderRequestError("bad", provider="hotel-api", status_code=400), "rejected", 422, False),
    (IdempotencyMismatchError("reused", provider="hotel-api", status_code=422), "rejected", 422, False),
    (_Coded("declined"), "payment_declined", 402, False),
    (NonRetryableError("no code"), "rejected", 422, False),
    # the model's answers (infra.llm.errors)
    (TokenBudgetExhausted("spent", budget="turn_tokens", limit=10, spent=9), "token_budget_exhausted", 422, False),
    (ModelContextTooLongError("too long", model="m", status=400), "model_context_too_long", 422, False),
    (ModelBadRequestError("404 model_not_found", model="m", status=404), "model_bad_request", 502, False),
    (ModelAuthError("401", model="m", status=401), "model_auth", 502, False),
    (ModelQuotaExceededError("billing", model="m", status=429), "model_quota_exceeded", 503, False),
    (ModelCapacityError("our limiter", model="m", retry_after=3.0), "model_rate_limited", 429, True),
    (ModelRateLimitedError("429", model="m", status=429, retry_after=2.0), "model_rate_limited", 429, True),
    (ModelStreamBrokenError("cut", model="m", tokens=20), "model_unavailable", 503, True),
    (ModelTimeoutError("no first token", model="m", limit="first_token"), "model_unavailable", 503, True),
    (ModelUnavailableError("503", model="m", status=503), "model_unavailable", 503, True),
    (ModelError("anything else", model="m"), "model_unavailable", 503, True),
    # out of time
    (BudgetExhaustedError("spent"), "timeout", 504, False),
    (A2ATimeoutError("late"), "timeout", 504, False),
    (BulkheadTimeoutError("search_agent", 2.0), "timeout", 504, True),
    (AttemptTimeoutError("an attempt ran past its share of the budget (0.50s)"), "timeout", 504, True),
    (TimeoutError("slow"), "timeout", 504, True),
    # a dependency or our capacity: worth another try later
    (ShuttingDownError("booking-agent"), "shutting_down", 503, True),
    (OverloadedError("booking_runs", 40, "40 bookings in flight"), "overloaded", 429, True),
    (BulkheadFullError("booking_agent", 10, 0.1), "bulkhead_full", 503, True),
    (CircuitOpenError("hotel_api", 3.0), "provider_unavailable", 503, True),
    (A2AUnavailableError("connection refused"), "provider_unavailable", 503, True),
    (A2AUnauthorizedError("token refused", status_code=401), "provider_unavailable", 503, False),
    (A2AProtocolError("bad reply"), "provider_unavailable", 503, False),
    (A2AError("no result"), "provider_unavailable", 503, False),
    (ProviderUnavailableError("503", provider="hotel-api", status_code=503), "provider_unavailable", 503, True),
    (ProviderError("odd answer", provider="hotel-api"), "provider_unavailable", 503, True),
    (ResilienceError("some layer"), "unavailable", 503, True),
    # our own infrastructure: nothing lost, try again shortly
    (RedisConnectionError("Connection refused"), "dependency_unavailable", 503, True),
    (RedisTimeoutError("Timeout reading from socket"), "dependency_unavailable", 503, True),
    (PostgresOperationalError("server closed the connection"), "dependency_unavailable", 503, True),
    (_wrapped(RuntimeError("store failed"), RedisConnectionError("refused")), "dependency_unavailable", 503, True),
    # everything else is a bug: logged, never sent
    (RuntimeError("boom"), "internal", 500, True),
    (KeyError("x"), "internal", 500, True),
]


@pytest.mark.parametrize(("exc", "code", "status", "retryable"), CASES, ids=lambda v: type(v).__name__)
def test_each_exception_gets_one_answer(exc: BaseException, code: str, status: int, retryable: bool) -> None:
    answer = answer_for(exc)
    assert (answer.code, answer.status, answer.retryable) == (code, status, retryable)


def test_a_models_wait_is_the_retry_after_header() -> None:
    answer = answer_for(ModelRateLimitedError("429", model="sim-large", status=429, retry_after=2.4))
    assert answer.retry_after == 2.4 and answer.fields == {"model": "sim-large", "retry_after": 2.4}
    budget = answer_for(TokenBudgetExhausted("spent", budget="turn_calls", limit=8, spent=8))
    assert budget.retry_after is None and budget.fields == {"budget": "turn_calls", "limit": 8, "spent": 8}


def test_a_price_change_carries_the_held_and_the_allowed_totals() -> None:
    answer = answer_for(PriceChangedError(145.6, "EUR", 112.0, "EUR"))
    assert answer.fields == {"held_total": 145.6, "currency": "EUR", "allowed_total": 112.0, "allowed_currency": "EUR"}
    assert "145.60 EUR" in answer.message and "112.00 EUR" in answer.message


def test_every_row_of_the_table_is_exercised_above() -> None:
    covered = {type(exc) for exc, *_ in CASES}
    for cls, _code, _retryable in TABLE:
        assert any(issubclass(c, cls) for c in covered), f"{cls.__name__} has no case"


def test_a_subclass_row_is_never_shadowed_by_an_earlier_base() -> None:
    for i, (cls, *_rest) in enumerate(TABLE):
        for earlier, *_ in TABLE[:i]:
            assert not issubclass(cls, earlier), f"{cls.__name__} comes after its base {earlier.__name__}"


def test_a_retryable_503_says_when_to_come_back_and_nothing_else_does() -> None:
    assert answer_for(RedisConnectionError("refused")).retry_after == 1.0
    assert answer_for(BulkheadFullError("booking_agent", 10, 0.1)).retry_after == 1.0
    assert answer_for(OverloadedError("booking_runs", 40, "full", retry_after=2.0)).retry_after == 2.0
    assert answer_for(BudgetExhaustedError("spent")).retry_after is None
    assert answer_for(RuntimeError("bug")).retry_after is None


def test_a_bug_raised_from_another_bug_stays_internal() -> None:
    assert answer_for(_wrapped(RuntimeError("outer"), KeyError("inner"))).code == "internal"


def test_every_code_has_one_http_status() -> None:
    assert {code: code.http_status for code in ErrorCode}  # raises KeyError if a code has none


def test_a_skill_answers_dependency_trouble_as_a_business_error_and_lets_bugs_through() -> None:
    failure = skill_failure_from(CircuitOpenError("hotel_api", 1.0))
    assert isinstance(failure, SkillFailure) and failure.code == "provider_unavailable"
    # what a waiting caller needs: when our breaker may probe, and that our request never left
    assert failure.data == {"sent": False, "retry_after": 1.0}
    assert A2ASkillError(failure.code, failure.message, failure.data).sent is False
    sent = skill_failure_from(ProviderUnavailableError("read timeout", provider="payment-api"))
    assert isinstance(sent, SkillFailure) and sent.data == {"sent": True}
    bug = RuntimeError("bug")
    assert skill_failure_from(bug) is bug


@pytest.mark.parametrize(
    ("exc", "outage"),
    [
        (RedisConnectionError("down"), True),
        (CircuitOpenError("payment_api", 30.0), True),
        # a peer reporting its own provider or store down: an outage for whoever judges the run
        (A2ASkillError("provider_unavailable", "payment_api is unavailable"), True),
        (A2ASkillError("dependency_unavailable", "redis is unreachable"), True),
        (A2ASkillError("bulkhead_full", "at capacity"), True),
        # a peer's business answer, its budget running out, and our own bugs are not
        (A2ASkillError("payment_declined", "declined"), False),
        (A2ASkillError("timeout", "budget spent"), False),
        (A2ASkillError("forbidden", "a confirmed booking"), False),
        (SkillFailure("provider_unavailable", "our own skill's answer, not a peer's"), False),
        (RuntimeError("bug"), False),
    ],
)
def test_an_outage_is_something_needed_being_down_whoever_reports_it(exc: Exception, outage: bool) -> None:
    assert is_outage(exc) is outage


def _chained(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


def _after(exc: BaseException, *earlier: BaseException) -> BaseException:
    keep_earlier_attempts(exc, list(earlier))
    return exc


@pytest.mark.parametrize(
    ("exc", "reached"),
    [
        # refused here, before anything was sent
        (CircuitOpenError("payment_api", 30.0), False),
        (BulkheadFullError("outbound:payment_api", 20, 1.0), False),
        (_chained(ProviderUnavailableError("refused", sent=False), httpx.ConnectError("refused")), False),
        (_chained(A2AUnavailableError("connect timeout", sent=False), httpx.ConnectTimeout("slow")), False),
        (A2ASkillError("provider_unavailable", "payment_api: circuit open", {"sent": False}), False),
        # a refusal chained to an attempt that never connected either
        (_chained(CircuitOpenError("payment_api", 30.0), ProviderUnavailableError("refused", sent=False)), False),
        # sent, or its outcome unknown
        (ProviderUnavailableError("read timeout", provider="payment-api"), True),
        (A2AUnavailableError("reset by peer"), True),
        (A2ASkillError("provider_unavailable", "payment_api: timed out"), True),
        (_chained(BudgetExhaustedError("ran out while waiting"), httpx.ReadTimeout("slow")), True),
        (BulkheadTimeoutError("outbound:payment_api", 30.0), True),
        (RuntimeError("something else"), True),
        # the retry loop's refusal after an attempt that may have reached, or after several attempts
        (_chained(CircuitOpenError("payment_api", 30.0), ProviderUnavailableError("read timeout")), True),
        (_after(ProviderUnavailableError("refused", sent=False), ProviderUnavailableError("read timeout")), True),
    ],
)
def test_a_side_effect_was_attempted_only_if_its_request_may_have_reached_the_provider(
    exc: BaseException, reached: bool
) -> None:
    assert may_have_reached(exc) is reached


# Code that turns an exception into an error code on its own: ``isinstance(exc, X)`` or ``except X`` next to a
# code literal.
_CODE = (
    r"(\"(timeout|\w+_unavailable|unavailable|circuit_open|bulkhead_\w+|invalid_request|no_availability)\"|ErrorCode\.)"
)
_SECOND_MAPPING = re.compile(
    r"(isinstance\(\w+, [^)]*(Error|Exception)[^)]*\)|except [\w. |(),]*(Error|Exception)\b[^\n]*)[^\n]*\n"
    r"[^\n]*(return|raise)[^\n]*" + _CODE
)


def test_no_second_exception_to_code_mapping_in_the_code() -> None:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    offenders = [
        str(path.relative_to(ROOT))
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if path.name != "error_table.py" and _SECOND_MAPPING.search(path.read_text())
    ]
    assert offenders == []


def test_a_refused_person_is_challenged_as_rfc_6750_says() -> None:
    from infra.error_table import answer_response

    _, body, headers = answer_response(answer_for(UnauthenticatedError("no bearer token")))
    assert headers["WWW-Authenticate"] == "Bearer" and body["error"]["code"] == "unauthenticated"
    _, _, headers = answer_response(answer_for(InvalidPersonTokenError("aud: not for this service")))
    assert headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    _, _, headers = answer_response(answer_for(QuotaExceededError("requests", "too many", 12.0)))
    assert headers == {"Retry-After": "12"}


class _TableCode(StrEnum):
    TABLE_TAKEN = "table_taken_in_the_error_table_test"


def test_an_agent_adds_its_codes_and_the_table_answers_them_with_their_status() -> None:
    add_codes({_TableCode.TABLE_TAKEN: 409})
    add_codes({_TableCode.TABLE_TAKEN: 409})  # the same declaration again (a module imported twice) is no change
    assert status_of(_TableCode.TABLE_TAKEN) == 409 and status_of("nobody_declared_this") is None
    taken = NonRetryableError("taken")
    taken.code = _TableCode.TABLE_TAKEN  # type: ignore[attr-defined]
    answer = answer_for(taken)
    assert (answer.code, answer.status) == ("table_taken_in_the_error_table_test", 409)


def test_a_code_means_one_thing_an_agent_cannot_give_it_another_status() -> None:
    with pytest.raises(ValueError, match="already answered with 503"):
        add_codes({ErrorCode.SHUTTING_DOWN: 409})
    with pytest.raises(ValueError, match="not an error status"):
        add_codes({"fine_in_the_error_table_test": 200})
    assert status_of(ErrorCode.SHUTTING_DOWN) == 503 and status_of("fine_in_the_error_table_test") is None
