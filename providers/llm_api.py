"""llm-api: a simulated model provider on the OpenAI wire (``providers.llm_api:app``; docs/llm-api.md).

::

    POST /v1/chat/completions     OpenAI Chat Completions: whole, or streamed (``stream: true``, SSE) with
                                  ``stream_options.include_usage``; tool calls as OpenAI sends them
    GET  /v1/models · GET /v1/models/{model}
    PUT/GET/DELETE /admin/faults  faults and rate limits, per model (``providers.llm.faults``)
    PUT/GET/DELETE /admin/script  the next answers, scripted: a compromised model for tests (``providers.llm.script``)
    GET/DELETE /admin/requests    the request log (``providers.llm.log``)

Deterministic and offline: a rule-based reading of English (``providers.llm.conversation``) answers with one tool
call or with words, and counts usage with its own tokenizer (``providers.llm.tokens``). ``/v1`` needs
``Authorization: Bearer <key>`` (``identity.auth.llm_api_key``); its errors come in OpenAI's shape.
"""

from __future__ import annotations

import hmac
import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.llm import SIMULATED_MODELS
from identity.auth import llm_api_key
from infra.service import get_redis
from infra.service.openapi import Answer, document
from infra.settings import get_settings
from providers.base import create_provider_app, send_json
from providers.llm.exchange import CONTEXT_WINDOWS, CUT_IS_NOT_AN_ERROR, PROVIDER, Exchange
from providers.llm.faults import (
    ERROR_STATUSES,
    FaultsUpdate,
    FaultsView,
    ModelName,
    clear_faults,
    put_faults,
    view_faults,
)
from providers.llm.log import MAX_ENTRIES, RequestLog, clear_log, read_log
from providers.llm.script import ScriptUpdate, ScriptView, clear_script, put_script, view_script
from providers.llm.wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ModelCard,
    ModelList,
    OpenAIApiError,
    OpenAIErrorBody,
    model_not_found,
    openai_error,
)

__all__ = ["CONTEXT_WINDOWS", "PROVIDER", "app", "create_app"]

V1 = "/v1"
MAX_BODY_BYTES = 1024 * 1024
"""A conversation with its tools grows past the shell's 64 KiB; OpenAI's own limit is far above this."""
MODELS_CREATED = 1_767_225_600
"""``created`` of both models (2026-01-01)."""

RedisDep = Annotated[Redis, Depends(get_redis)]


# --------------------------------------------------------------------------------------------------- the API key


def _mask(key: str) -> str:
    return f"{key[:3]}...{key[-4:]}" if len(key) > 8 else "***"


class ApiKeyGuard:
    """Pure ASGI: ``/v1`` and below need ``Authorization: Bearer <the key>``, checked before routing or parsing,
    as OpenAI checks it (401 ``invalid_api_key``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == V1 or path.startswith(f"{V1}/")):
            await self.app(scope, receive, send)
            return
        header = next((bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
        scheme, _, presented = header.partition(" ")
        presented = presented.strip() if scheme.lower() == "bearer" else ""
        expected = llm_api_key(get_settings())
        if presented and expected is not None and _same(presented, expected):
            await self.app(scope, receive, send)
            return
        if expected is None:
            message = "This simulator has no API key configured (set LLM_API_KEY or CONCIERGE_SERVICE_SECRET)."
        elif not presented:
            message = (
                "You didn't provide an API key. You need to provide your API key in an Authorization header using "
                "Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
            )
        else:
            message = f"Incorrect API key provided: {_mask(presented)}."
        await send_json(send, 401, openai_error(message, "invalid_request_error", code="invalid_api_key"))


def _same(presented: str, expected: str) -> bool:
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8"))


# ---------------------------------------------------------------------------------- OpenAPI (describes, changes nothing)

_RATE_HEADERS = {
    f"x-ratelimit-{what}-{unit}": {
        "description": f"When `{'rpm' if unit == 'requests' else 'tpm'}` is set for the model: {meaning}",
        "required": False,
        "schema": {"type": "string"},
    }
    for unit in ("requests", "tokens")
    for what, meaning in (
        ("limit", "the limit per rolling minute."),
        ("remaining", "what is left of it now."),
        ("reset", "until the oldest request in the window leaves it (`250ms`, `12s`, `1m0s`)."),
    )
}
_RETRY_HEADERS = {
    "retry-after": {"description": "Seconds to wait (rounded up).", "required": False, "schema": {"type": "string"}},
    "retry-after-ms": {"description": "Milliseconds to wait.", "required": False, "schema": {"type": "string"}},
    "x-should-retry": {
        "description": "Whether a retry can help (injected with `should_retry`).",
        "required": False,
        "schema": {"type": "string", "enum": ["true", "false"]},
    },
}
_REQUEST_ID = {
    "x-request-id": {
        "description": "This request's id (as in the request log).",
        "required": True,
        "schema": {"type": "string"},
    }
}
_ERROR_MEANINGS = {
    400: "The body is not a valid request (`invalid_request_error`, `param` names the argument), the history has a "
    "tool call without its result (or a result without its call), or the prompt is longer than the model's "
    "context (`context_length_exceeded`, also injected).",
    404: "No such model (`model_not_found`).",
    429: "Over the model's published limits (`rate_limit_exceeded`, with `retry-after` unless the request can never "
    "fit), or injected: `rate_limit_exceeded` or `insufficient_quota`.",
    500: "Injected (`server_error`).",
    502: "Injected (`bad_gateway`).",
    503: "Injected (`service_unavailable`).",
    529: "Injected: overloaded (`overloaded_error`, as Anthropic answers it).",
}


def _openai_answers(*statuses: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        headers = {**_REQUEST_ID, **_RATE_HEADERS, **(_RETRY_HEADERS if status >= 429 else {})}
        out[status] = {"model": OpenAIErrorBody, "description": _ERROR_MEANINGS[status], "headers": headers}
    return out


# --------------------------------------------------------------------------------------------------------- routes

business = APIRouter(tags=["llm-api"])
admin = APIRouter(prefix="/admin", tags=["admin"])


@business.post(
    f"{V1}/chat/completions",
    response_model=None,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}},
        }
    },
    responses={
        200: {
            "model": ChatCompletion,
            "description": "The answer: a `chat.completion` (JSON), or with `stream: true` a stream of "
            "`chat.completion.chunk` events (`data: {ChatCompletionChunk}` … `data: [DONE]`). A stream cut by a "
            "fault (`cut_after_tokens`) ends without `[DONE]` and without the end of the body.",
            "headers": {**_REQUEST_ID, **_RATE_HEADERS},
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "description": "One server-sent event: `data:` only, no `event:` or `id:`.",
                        "required": ["data"],
                        "properties": {
                            "data": {
                                "type": "string",
                                "description": "A ChatCompletionChunk as JSON; the last event's is `[DONE]`.",
                            }
                        },
                    }
                }
            },
        },
        **_openai_answers(400, 404, *ERROR_STATUSES),
    },
)
async def chat_completions(request: Request, redis: RedisDep) -> Response:
    """Answer the conversation so far with one tool call or with words, whole or streamed."""
    return await Exchange(request, redis).answer()


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": MODELS_CREATED, "owned_by": "concierge-simulator"}


@business.get(f"{V1}/models", response_model=ModelList)
async def list_models() -> dict[str, Any]:
    """The primary model and the fallback."""
    return {"object": "list", "data": [_card(m) for m in SIMULATED_MODELS]}


ModelPath = Annotated[
    str, Path(description="A model's id; any other answers 404.", json_schema_extra={"enum": list(SIMULATED_MODELS)})
]


@business.get(f"{V1}/models/{{model}}", response_model=ModelCard, responses=_openai_answers(404))
async def get_model(model: ModelPath) -> dict[str, Any]:
    if model not in SIMULATED_MODELS:
        raise model_not_found(model)
    return _card(model)


@admin.get("/faults", response_model=FaultsView)
async def get_faults(redis: RedisDep) -> FaultsView:
    """Every model's faults and limits, and what is left of each `error_count`."""
    return await view_faults(redis)


@admin.put("/faults", response_model=FaultsView)
async def set_faults(update: FaultsUpdate, redis: RedisDep) -> FaultsView:
    """Replace one model's faults (`model`), or every model's (`model` null or left out)."""
    return await put_faults(redis, update)


@admin.delete("/faults", response_model=FaultsView)
async def delete_faults(redis: RedisDep, model: Annotated[ModelName | None, Query()] = None) -> FaultsView:
    """No faults for `model` (every model without it): its `error_count` and rate window go too."""
    return await clear_faults(redis, model)


@admin.get("/script", response_model=ScriptView)
async def get_script(redis: RedisDep) -> ScriptView:
    """What is left of the script: its model (null: any) and the steps not yet answered."""
    return await view_script(redis)


@admin.put("/script", response_model=ScriptView)
async def set_script(update: ScriptUpdate, redis: RedisDep) -> ScriptView:
    """Answer the next requests for `model` (any model when null) with `steps`, one per request, in order, whatever
    they ask; then the rules again. Replaces any script there is. A step is taken only by a request answered 200."""
    return await put_script(redis, update)


@admin.delete("/script", response_model=ScriptView)
async def delete_script(redis: RedisDep) -> ScriptView:
    """No script: the rules answer every request."""
    return await clear_script(redis)


@admin.get("/requests", response_model=RequestLog)
async def get_requests(
    redis: RedisDep,
    model: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int | None, Query(ge=0, le=MAX_ENTRIES)] = None,
) -> RequestLog:
    """The chat completions that passed the key check, oldest first (the newest 2000 are kept); `model` keeps one
    model's, `limit` the newest N."""
    return await read_log(redis, model=model, limit=limit)


@admin.delete("/requests", response_model=RequestLog)
async def delete_requests(redis: RedisDep) -> RequestLog:
    """Forget every logged request."""
    return await clear_log(redis)


def create_app() -> FastAPI:
    app = create_provider_app(PROVIDER, business, admin, own_faults=True, max_body_bytes=MAX_BODY_BYTES)
    logging.getLogger("uvicorn.error").addFilter(CUT_IS_NOT_AN_ERROR)

    async def openai_answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIApiError)
        headers = {"x-request-id": f"req_{uuid.uuid4().hex}", **exc.headers}
        return JSONResponse(exc.body, status_code=exc.status, headers=headers)

    app.add_exception_handler(OpenAIApiError, openai_answer)
    app.add_middleware(ApiKeyGuard)
    document(
        app,
        prefix=V1,
        answers=[
            Answer(
                401,
                "No `Authorization: Bearer <key>`, or another key (`invalid_api_key`).",
                {"$ref": "#/components/schemas/OpenAIErrorBody"},
            )
        ],
        security=[{"llmApiKey": []}],
        security_schemes={
            "llmApiKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "`LLM_API_KEY`, or the key derived from `CONCIERGE_SERVICE_SECRET` (docs/llm-api.md).",
            }
        },
    )
    _document_request(app)
    return app


def _document_request(app: FastAPI) -> None:
    """The request body's schema and the stream's chunk in the components (the route reads the body itself, to
    answer a bad one in OpenAI's shape)."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        schema = original()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ChatCompletionRequest, ChatCompletionChunk):
            definition = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, inner in definition.pop("$defs", {}).items():
                components.setdefault(name, inner)
            components.setdefault(model.__name__, definition)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


app = create_app()
