"""Provider exceptions (openai's, httpx's, langchain's) into ``infra.llm.errors``: the one place that reads the
provider's status, error code, ``x-should-retry`` and ``retry-after`` headers.

``openai`` is not imported here: it loads with the first model call (``infra.llm.model``), and before that no
exception can be one of its own, so a service's start-up does not pay for it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx
from langchain_core.exceptions import ContextOverflowError

from infra.llm.errors import (
    ModelAuthError,
    ModelBadRequestError,
    ModelContextTooLongError,
    ModelError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelTimeoutError,
    ModelUnavailableError,
)

if TYPE_CHECKING:
    import openai

__all__ = ["classify", "retry_after_of"]


def retry_after_of(headers: Mapping[str, str] | None) -> float | None:
    """``retry-after-ms`` (OpenAI's, precise) or ``retry-after`` in seconds; an HTTP date is not honoured (no
    provider sends one and clocks differ)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            continue
        if value >= 0 and value == value and value != float("inf"):
            return value
    return None


def _should_retry(headers: Mapping[str, str] | None) -> bool | None:
    raw = headers.get("x-should-retry") if headers is not None else None
    if raw == "true":
        return True
    if raw == "false":
        return False
    return None


def _code_of(error: openai.APIStatusError) -> str | None:
    code = getattr(error, "code", None)
    if isinstance(code, str):
        return code
    body: Any = error.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("code"), str):
            return str(inner["code"])
    return None


def classify(exc: BaseException, model: str) -> ModelError | None:
    """The ``ModelError`` for a provider's exception (``None``: not a provider error, let it through)."""
    if isinstance(exc, ModelError):
        return exc
    loaded = sys.modules.get("openai")  # not loaded: not an openai exception
    if loaded is not None and isinstance(exc, loaded.APIStatusError):
        status = exc.status_code
        headers = exc.response.headers
        hint = _should_retry(headers)
        wait = retry_after_of(headers)
        code = _code_of(exc)
        message = f"{model}: {status} {code or ''} {exc.message}".replace("  ", " ")
        kwargs: dict[str, Any] = {"model": model, "status": status, "retry_after": wait}
        if status == 429 and code == "insufficient_quota":
            return ModelQuotaExceededError(message, **kwargs)  # x-should-retry cannot make billing wait it out
        if status == 429:
            return ModelRateLimitedError(message, retryable=hint, **kwargs)
        if status in (401, 403):
            return ModelAuthError(message, **kwargs)
        if status == 400 and code == "context_length_exceeded":
            return ModelContextTooLongError(message, **kwargs)
        if status in (408, 409) or status >= 500:
            return ModelUnavailableError(message, retryable=hint, **kwargs)
        if hint:  # a 4xx the provider itself says to retry
            return ModelUnavailableError(message, retryable=True, **kwargs)
        return ModelBadRequestError(message, **kwargs)
    if isinstance(exc, ContextOverflowError):  # langchain-openai's in-stream variant has no status
        return ModelContextTooLongError(f"{model}: {exc}", model=model, status=400)
    if isinstance(exc, _transport("TimeoutException")) or (
        loaded is not None and isinstance(exc, loaded.APITimeoutError)
    ):
        return ModelTimeoutError(f"{model}: the model did not answer in time ({exc})", model=model)
    if isinstance(exc, _transport("TransportError")) or (loaded is not None and isinstance(exc, loaded.APIError)):
        return ModelUnavailableError(f"{model}: {type(exc).__name__}: {exc}", model=model)
    return None


def _transport(name: str) -> tuple[type[BaseException], ...]:
    """httpx's exception class ``name``, and httpx2's when it is loaded: openai ≥ 3.63 reads its streams with httpx2,
    whose errors (a stream cut mid-answer) reach us unwrapped."""
    modules = (httpx, sys.modules.get("httpx2"))
    return tuple(getattr(module, name) for module in modules if module is not None and hasattr(module, name))
