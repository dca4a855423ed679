"""The one model client (``ChatModel``) and its errors; ``docs/model-dependency.md`` says why it is built so.

The errors are imported at once (every service's error table needs them); the client, its limiter and telemetry
only when first used, so a service or a CLI command that never calls a model never imports openai or langchain.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from infra.llm.errors import (
    ModelAuthError,
    ModelBadRequestError,
    ModelContextTooLongError,
    ModelError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelStreamBrokenError,
    ModelTimeoutError,
    ModelUnavailableError,
    TokenBudgetExhausted,
)

if TYPE_CHECKING:
    from infra.llm.limiter import ModelCapacityError, RateLimiter
    from infra.llm.model import Budget, ChatModel, ModelEvents, ModelReply, Usage, estimate_tokens
    from infra.metrics import llm_metrics

_LAZY = {
    "ModelCapacityError": "infra.llm.limiter",
    "RateLimiter": "infra.llm.limiter",
    "Budget": "infra.llm.model",
    "ChatModel": "infra.llm.model",
    "ModelEvents": "infra.llm.model",
    "ModelReply": "infra.llm.model",
    "Usage": "infra.llm.model",
    "estimate_tokens": "infra.llm.model",
    "llm_metrics": "infra.metrics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'infra.llm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Budget",
    "ChatModel",
    "ModelAuthError",
    "ModelBadRequestError",
    "ModelCapacityError",
    "ModelContextTooLongError",
    "ModelError",
    "ModelEvents",
    "ModelQuotaExceededError",
    "ModelRateLimitedError",
    "ModelReply",
    "ModelStreamBrokenError",
    "ModelTimeoutError",
    "ModelUnavailableError",
    "RateLimiter",
    "TokenBudgetExhausted",
    "Usage",
    "estimate_tokens",
    "llm_metrics",
]
