"""Every answer a model provider gives, as openai-python raises it, becomes one ``ModelError`` with one code:
which retry, which carry their wait, which the provider's ``x-should-retry`` overrides."""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from infra.error_table import answer_for
from infra.llm.classify import classify, retry_after_of
from infra.llm.errors import (
    ModelAuthError,
    ModelBadRequestError,
    ModelContextTooLongError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelTimeoutError,
    ModelUnavailableError,
)
from infra.llm.limiter import parse_reset

REQUEST = httpx2.Request("POST", "http://127.0.0.1:8012/v1/chat/completions")


def status_error(status: int, code: str | None = None, **headers: str) -> openai.APIStatusError:
    body: dict[str, Any] = {"error": {"message": "m", "type": "t", "code": code}}
    response = httpx2.Response(status, headers=headers, json=body, request=REQUEST)
    cls = {400: openai.BadRequestError, 401: openai.AuthenticationError, 429: openai.RateLimitError}.get(
        status, openai.APIStatusError
    )
    return cls("m", response=response, body=body["error"])


# (status, OpenAI code, headers, class, our code, retryable)
CASES: list[tuple[int, str | None, dict[str, str], type[Exception], str, bool]] = [
    (400, "invalid_request_error", {}, ModelBadRequestError, "model_bad_request", False),
    (400, "context_length_exceeded", {}, ModelContextTooLongError, "model_context_too_long", False),
    (401, "invalid_api_key", {}, ModelAuthError, "model_auth", False),
    (403, None, {}, ModelAuthError, "model_auth", False),
    (404, "model_not_found", {}, ModelBadRequestError, "model_bad_request", False),
    (422, None, {}, ModelBadRequestError, "model_bad_request", False),
    (408, None, {}, ModelUnavailableError, "model_unavailable", True),
    (409, None, {}, ModelUnavailableError, "model_unavailable", True),
    (429, "rate_limit_exceeded", {"retry-after": "2"}, ModelRateLimitedError, "model_rate_limited", True),
    (429, "insufficient_quota", {"retry-after": "2"}, ModelQuotaExceededError, "model_quota_exceeded", False),
    (429, "insufficient_quota", {"x-should-retry": "true"}, ModelQuotaExceededError, "model_quota_exceeded", False),
    (500, None, {}, ModelUnavailableError, "model_unavailable", True),
    (502, "bad_gateway", {}, ModelUnavailableError, "model_unavailable", True),
    (503, "service_unavailable", {}, ModelUnavailableError, "model_unavailable", True),
    (529, "overloaded", {}, ModelUnavailableError, "model_unavailable", True),
    (503, None, {"x-should-retry": "false"}, ModelUnavailableError, "model_unavailable", False),
    (400, None, {"x-should-retry": "true"}, ModelUnavailableError, "model_unavailable", True),
    (429, "rate_limit_exceeded", {"x-should-retry": "false"}, ModelRateLimitedError, "model_rate_limited", False),
]


@pytest.mark.parametrize(("status", "code", "headers", "cls", "ours", "retryable"), CASES)
def test_each_provider_answer_gets_one_error_and_code(
    status: int, code: str | None, headers: dict[str, str], cls: type[Exception], ours: str, retryable: bool
) -> None:
    error = classify(status_error(status, code, **headers), "sim-large")
    assert type(error) is cls
    assert error.retryable is retryable and error.status == status and error.model == "sim-large"
    assert answer_for(error).code == ours


def test_transport_failures_are_retryable_unavailability() -> None:
    timeout = classify(openai.APITimeoutError(request=REQUEST), "m")
    assert isinstance(timeout, ModelTimeoutError) and timeout.retryable
    refused = classify(openai.APIConnectionError(request=REQUEST), "m")
    assert type(refused) is ModelUnavailableError and refused.retryable
    assert classify(ValueError("ours"), "m") is None  # not the provider's: not converted


def test_retry_after_ms_is_preferred_and_nonsense_is_ignored() -> None:
    assert retry_after_of({"retry-after": "2", "retry-after-ms": "1500"}) == 1.5
    assert retry_after_of({"retry-after": "3"}) == 3.0
    assert retry_after_of({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_of({"retry-after": "-1"}) is None and retry_after_of({"retry-after": "inf"}) is None
    error = classify(status_error(429, "rate_limit_exceeded", **{"retry-after-ms": "250"}), "m")
    assert error is not None and error.retry_after == 0.25


@pytest.mark.parametrize(
    ("value", "ms"), [("1s", 1000.0), ("6m0s", 360_000.0), ("250ms", 250.0), ("1.5s", 1500.0), ("1h2m", 3_720_000.0)]
)
def test_openai_reset_durations(value: str, ms: float) -> None:
    assert parse_reset(value) == ms


def test_an_unreadable_reset_is_none() -> None:
    assert parse_reset("soon") is None and parse_reset(None) is None
