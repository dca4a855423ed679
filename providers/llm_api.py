"""llm-api: a simulated model provider on the OpenAI wire (``providers.llm_api:app``; docs/llm-api.md).

::

    POST /v1/chat/completions     OpenAI Chat Completions: whole, or streamed (``stream: true``, SSE) with
                                  ``stream_options.include_usage``; tool calls as OpenAI sends them
    GET  /v1/models · GET /v1/models/{model}

Deterministic and offline: a rule-based reading of English (``providers.llm.conversation``) answers with one tool
call or with words, and counts usage with its own tokenizer (``providers.llm.tokens``). ``/v1`` needs
``Authorization: Bearer <key>`` (``infra.auth.llm_api_key``); errors come in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL, SIMULATED_MODELS
from infra.auth import llm_api_key
from infra.service.openapi import Answer, document
from providers.base import create_provider_app
from providers.inventory import CITIES
from providers.llm.conversation import Conversation
from providers.llm.reply import Reply, render
from providers.llm.tokens import prompt_tokens
from providers.llm.wire import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkWriter,
    ModelCard,
    ModelList,
    OpenAIErrorBody,
    history_error,
    openai_error,
)

__all__ = ["CONTEXT_WINDOWS", "PROVIDER", "app", "create_app"]

PROVIDER = "llm-api"
V1 = "/v1"
MAX_BODY_BYTES = 1024 * 1024
"""A conversation with its tools grows past the shell's 64 KiB; OpenAI's own limit is far above this."""
CONTEXT_WINDOWS = {PRIMARY_MODEL: 32_768, FALLBACK_MODEL: 16_384}
"""Prompt tokens each model takes; a longer prompt is refused (400 ``context_length_exceeded``)."""
MODELS_CREATED = 1_767_225_600
"""``created`` of both models (2026-01-01)."""
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class OpenAIApiError(Exception):
    """Answered as ``status`` with OpenAI's error body (and ``headers``)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = openai_error(message, type_, param=param, code=code)
        self.headers = headers or {}


def _invalid(message: str, param: str | None = None, code: str | None = None) -> OpenAIApiError:
    return OpenAIApiError(400, message, "invalid_request_error", param=param, code=code)


# --------------------------------------------------------------------------------------------------- the API key


async def _send_json(send: Send, status: int, body: object) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


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
        expected = llm_api_key()
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
        await _send_json(send, 401, openai_error(message, "invalid_request_error", code="invalid_api_key"))


def _same(presented: str, expected: str) -> bool:
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8"))


# ----------------------------------------------------------------------------------------------------- answering


class AnswerStream(Response):
    """An answer sent piece by piece; ``parts`` may end the connection early (``CutStream``), the way a broken
    upstream does: no end of body, so the client sees a broken stream rather than a short one."""

    def __init__(self, parts: AsyncIterator[bytes], headers: list[tuple[bytes, bytes]], status: int = 200) -> None:
        super().__init__(status_code=status)
        self.parts = parts
        self.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        finished = False
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for part in self.parts:
                if gone.is_set():
                    break
                await send({"type": "http.response.body", "body": part, "more_body": True})
            else:
                finished = True
            if finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except CutStream:
            pass  # returning without the end of the body: the server drops the connection
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            with contextlib.suppress(Exception):
                await self.parts.aclose()  # type: ignore[attr-defined]


class CutStream(Exception):
    """Raised by an answer's parts to drop the connection where it stands."""


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def _stream(reply: Reply, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
    writer = ChunkWriter(request.model, include_usage=request.include_usage, fingerprint="fp_concierge_sim_1")
    for _is_token, chunk in reply.chunks(writer):
        yield _event(chunk)
    yield b"data: [DONE]\n\n"


async def _whole(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _prompt_tokens(request: ChatCompletionRequest) -> int:
    return prompt_tokens(
        [m.model_dump(exclude_none=True) for m in request.messages],
        [t.model_dump(exclude_none=True) for t in request.tools or ()],
    )


def _decide(request: ChatCompletionRequest, tokens: int, today: date) -> Reply:
    decision = Conversation(request.messages, request.offered_tools(), today, CITIES).decide()
    return render(decision, prompt_tokens=tokens, limit=request.answer_limit)


def _parse(raw: bytes) -> ChatCompletionRequest:
    """The body, validated; 400 ``invalid_request_error`` naming the parameter at fault (as OpenAI answers)."""
    try:
        return ChatCompletionRequest.model_validate_json(raw or b"null")
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = first.get("loc", ())
        param = ".".join(str(part) if isinstance(part, str) else f"[{part}]" for part in location) or None
        if first["type"] == "json_invalid":
            raise _invalid(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
                "HTTP library correctly. The OpenAI API expects a JSON payload.)"
            ) from None
        if first["type"] == "extra_forbidden":
            raise _invalid(f"Unrecognized request argument supplied: {location[-1]}", param) from None
        if first["type"] == "missing":
            raise _invalid(f"Missing required parameter: '{param}'.", param) from None
        raise _invalid(f"Invalid value for '{param}': {first['msg']}.", param) from None


def _check(request: ChatCompletionRequest, reply_prompt_tokens: int) -> None:
    if request.model not in SIMULATED_MODELS:
        raise OpenAIApiError(
            404,
            f"The model `{request.model}` does not exist or you do not have access to it.",
            "invalid_request_error",
            param="model",
            code="model_not_found",
        )
    problem = history_error(request.messages)
    if problem is not None:
        raise _invalid(problem, "messages")
    window = CONTEXT_WINDOWS[request.model]
    if reply_prompt_tokens > window:
        raise _invalid(
            f"This model's maximum context length is {window} tokens. However, your messages resulted in "
            f"{reply_prompt_tokens} tokens. Please reduce the length of the messages.",
            "messages",
            "context_length_exceeded",
        )


# --------------------------------------------------------------------------------------------------------- routes

_ERROR_STATUSES = {
    400: "The body is not a valid request (`invalid_request_error`, `param` names the argument), the history has a "
    "tool call without its result, or the prompt is longer than the model's context (`context_length_exceeded`).",
    404: "No such model (`model_not_found`).",
}

business = APIRouter(tags=["llm-api"])
admin = APIRouter(prefix="/admin", tags=["admin"])


def _error_answers(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": OpenAIErrorBody, "description": _ERROR_STATUSES[status]} for status in statuses}


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
            "`chat.completion.chunk` events (`data: {chunk}` … `data: [DONE]`; see ChatCompletionChunk).",
            "content": {
                "text/event-stream": {
                    "schema": {"type": "string", "description": "Server-sent events, one ChatCompletionChunk each."}
                }
            },
        },
        **_error_answers(400, 404),
    },
)
async def chat_completions(request: Request) -> Response:
    """Answer the conversation: one tool call or words, whole or streamed."""
    body = _parse(await request.body())
    tokens = _prompt_tokens(body)
    _check(body, tokens)
    reply = _decide(body, tokens, date.today())
    if body.streaming:
        return AnswerStream(_stream(reply, body), list(_SSE_HEADERS))
    return JSONResponse(reply.completion(body.model))


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": MODELS_CREATED, "owned_by": "concierge-simulator"}


@business.get(f"{V1}/models", response_model=ModelList)
async def list_models() -> dict[str, Any]:
    """The primary model and the fallback."""
    return {"object": "list", "data": [_card(m) for m in SIMULATED_MODELS]}


@business.get(f"{V1}/models/{{model}}", response_model=ModelCard, responses=_error_answers(404))
async def get_model(model: str) -> dict[str, Any]:
    if model not in SIMULATED_MODELS:
        raise OpenAIApiError(
            404,
            f"The model '{model}' does not exist",
            "invalid_request_error",
            param="model",
            code="model_not_found",
        )
    return _card(model)


def create_app() -> FastAPI:
    app = create_provider_app(PROVIDER, business, admin, own_faults=True, max_body_bytes=MAX_BODY_BYTES)

    async def openai_answer(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIApiError)
        return JSONResponse(exc.body, status_code=exc.status, headers=exc.headers)

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
