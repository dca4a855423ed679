"""The model client's exceptions, each with its code in ``infra.error_table``; provider errors become these at the
boundary (``infra.llm.classify``), so nothing above ``infra.llm`` sees an ``openai`` exception. No provider library is
imported here: every service's error table imports these.

::

    ModelError                          (code, model, status, retryable, retry_after)
     ├── ModelUnavailableError          model_unavailable: 408/409/5xx/529, a connection or read timeout; retryable
     │    ├── ModelTimeoutError         no first token within LLM_FIRST_TOKEN_TIMEOUT_S, or the call past its limit
     │    └── ModelStreamBrokenError    the stream broke after tokens went out: never retried as if nothing was sent
     ├── ModelRateLimitedError          model_rate_limited: 429 rate_limit_exceeded (or our limiter); retry_after
     └── (NonRetryableError: never retried, never a breaker failure)
          ├── ModelQuotaExceededError   model_quota_exceeded: 429 insufficient_quota (billing; waiting cannot help)
          ├── ModelAuthError            model_auth: 401/403
          ├── ModelBadRequestError      model_bad_request: 400/404/422
          │    └── ModelContextTooLongError   model_context_too_long
          └── TokenBudgetExhausted      token_budget_exhausted: raised before the call that would pass a budget

``x-should-retry`` overrides ``retryable`` either way (the provider knows, e.g. a 409 lock or a 503 that will not
pass); the retry loop reads ``retryable`` and ``retry_after`` (``RetryConfig(server_hints=True)``).
"""

from __future__ import annotations

from typing import ClassVar

from domain.errors import ErrorCode
from resilience.errors import NonRetryableError

__all__ = [
    "ModelAuthError",
    "ModelBadRequestError",
    "ModelContextTooLongError",
    "ModelError",
    "ModelQuotaExceededError",
    "ModelRateLimitedError",
    "ModelStreamBrokenError",
    "ModelTimeoutError",
    "ModelUnavailableError",
    "TokenBudgetExhausted",
]


class ModelError(Exception):
    """Base of every error ``ChatModel.respond`` raises."""

    code: ClassVar[str] = ErrorCode.MODEL_UNAVAILABLE
    default_retryable: ClassVar[bool] = True

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status: int | None = None,
        retry_after: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.status = status
        self.retry_after = retry_after
        """Seconds the provider (or our limiter) asked to wait, when it said."""
        self.retryable = self.default_retryable if retryable is None else retryable


class ModelUnavailableError(ModelError):
    code = ErrorCode.MODEL_UNAVAILABLE


class ModelTimeoutError(ModelUnavailableError):
    def __init__(self, message: str, *, model: str | None = None, limit: str = "call") -> None:
        super().__init__(message, model=model)
        self.limit = limit
        """``first_token`` or ``call``: which limit ran out."""


class ModelStreamBrokenError(ModelUnavailableError):
    default_retryable = False  # its tokens went out: a new attempt is a switch the chat must see, not a retry

    def __init__(self, message: str, *, model: str | None = None, tokens: int = 0) -> None:
        super().__init__(message, model=model)
        self.tokens = tokens
        """Chunks that had streamed before it broke."""


class ModelRateLimitedError(ModelError):
    code = ErrorCode.MODEL_RATE_LIMITED


class ModelQuotaExceededError(NonRetryableError, ModelError):
    code = ErrorCode.MODEL_QUOTA_EXCEEDED
    default_retryable = False


class ModelAuthError(NonRetryableError, ModelError):
    code = ErrorCode.MODEL_AUTH
    default_retryable = False


class ModelBadRequestError(NonRetryableError, ModelError):
    code = ErrorCode.MODEL_BAD_REQUEST
    default_retryable = False


class ModelContextTooLongError(ModelBadRequestError):
    code = ErrorCode.MODEL_CONTEXT_TOO_LONG


class TokenBudgetExhausted(NonRetryableError, ModelError):
    code = ErrorCode.TOKEN_BUDGET_EXHAUSTED
    default_retryable = False

    def __init__(self, message: str, *, budget: str, limit: int, spent: int) -> None:
        super().__init__(message)
        self.budget = budget
        """``turn_tokens``, ``chat_tokens`` or ``turn_calls``."""
        self.limit = limit
        self.spent = spent
