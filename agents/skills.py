"""How an agent answers a skill call that cannot succeed.

A ``SkillFailure`` is a business answer with a code (``payment_declined``, ``provider_unavailable``, ``timeout``,
``invalid_request``...). The A2A adapter sends it back as a failed task carrying ``{"error": {code, message}}`` and
the caller gets ``A2ASkillError``: not retried, not counted by its breaker. The agent already retried its own
dependency; making the caller retry too would multiply the load on a provider that is down.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from infra.providers.errors import ProviderError, ProviderRejectedError
from resilience import BudgetExhaustedError, NonRetryableError, ResilienceError, remaining_budget

_HTTP_STATUS = {"invalid_request": 422, "no_availability": 409, "payment_declined": 402, "timeout": 504}


class SkillFailure(NonRetryableError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def skill_failure_from(exc: BaseException) -> BaseException:
    """The ``SkillFailure`` for a dependency error; unexpected errors are returned unchanged (to be re-raised)."""
    if isinstance(exc, SkillFailure):
        return exc
    if isinstance(exc, BudgetExhaustedError | TimeoutError) or remaining_budget() <= 0:
        return SkillFailure("timeout", "the caller's timeout budget ran out")
    if isinstance(exc, ProviderRejectedError):
        return SkillFailure("invalid_request", str(exc))
    if isinstance(exc, ResilienceError | ProviderError):
        return SkillFailure("provider_unavailable", str(exc))
    return exc


def install_skill_failure_handler(app: FastAPI) -> None:
    """Plain HTTP routes of an agent answer a ``SkillFailure`` with a matching status instead of a 500."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SkillFailure)
        status = _HTTP_STATUS.get(exc.code, 503)
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=status)

    app.add_exception_handler(SkillFailure, handle)
