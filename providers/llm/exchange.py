"""One chat completion from its body to its log entry: the checks, the faults and limits in their order, the
answer whole or streamed, and what the request log keeps of it (docs/llm-api.md).

A fault that breaks a stream drops the connection without the end of the body (``AnswerStream``), so the client
sees a broken stream, not a short one; uvicorn logs one ERROR line for it ("ASGI callable returned without completing
response"), which ``CUT_IS_NOT_AN_ERROR`` turns into a WARNING saying it was on purpose (an ERROR line is a defect).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, date, datetime
from typing import Any, Final

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from redis.asyncio import Redis
from starlette.types import Receive, Scope, Send

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL, SEARCH_HOTELS, SIMULATED_MODELS
from providers.faults import ClientGoneError, fault_metrics, hold
from providers.inventory import CITIES
from providers.llm.conversation import Conversation, Decision, PlannedCall
from providers.llm.faults import (
    NO_FAULTS,
    Admission,
    ModelFaults,
    admit,
    injected_error,
    load_faults,
    malformed,
    refusal,
    take_error,
)
from providers.llm.log import LoggedCall, LoggedRequest, Outcome, cut, record
from providers.llm.reply import FINGERPRINT, Reply, render
from providers.llm.script import next_step, scripted_reply, take_step
from providers.llm.tokens import prompt_tokens
from providers.llm.wire import (
    ChatCompletionRequest,
    ChunkWriter,
    OpenAIApiError,
    UserMessage,
    history_error,
    invalid_request,
    model_not_found,
    parse_request,
    text_of,
)

__all__ = ["CONTEXT_WINDOWS", "CUT_IS_NOT_AN_ERROR", "PROVIDER", "AnswerStream", "CutStream", "Exchange"]

PROVIDER = "llm-api"
CONTEXT_WINDOWS = {PRIMARY_MODEL: 32_768, FALLBACK_MODEL: 16_384}
"""Prompt tokens each model takes; a longer prompt is refused (400 ``context_length_exceeded``)."""
SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


class CutStream(Exception):
    """Raised by an answer's parts to drop the connection where it stands."""


class _CutIsNotAnError(logging.Filter):
    """uvicorn's ERROR for a response its app left unfinished is, in llm-api, a fault doing its job: a WARNING."""

    MESSAGE: Final = "ASGI callable returned without completing response"

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().startswith(self.MESSAGE):
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.msg, record.args = f"{self.MESSAGE}: a stream cut on purpose (the cut fault)", ()
        return True


CUT_IS_NOT_AN_ERROR: Final = _CutIsNotAnError()
"""Added to uvicorn's ``uvicorn.error`` logger by llm-api's app (``addFilter`` keeps one however often)."""


class AnswerStream(Response):
    """An answer sent piece by piece while its client is there; ``parts(gone)`` may end it early (``CutStream``)
    without the end of the body, the way a broken upstream does."""

    def __init__(
        self, parts: Callable[[asyncio.Event], AsyncIterator[bytes]], headers: list[tuple[bytes, bytes]]
    ) -> None:
        super().__init__(status_code=200)
        self.parts = parts
        self.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        parts = self.parts(gone)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for part in parts:
                if gone.is_set():
                    return
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except CutStream:
            pass  # returning without the end of the body: the server drops the connection
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await parts.aclose()  # type: ignore[attr-defined]


async def _paused(gone: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` unless the client leaves first; ``True`` when it left."""
    if seconds <= 0:
        return gone.is_set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(gone.wait(), timeout=seconds)
    return gone.is_set()


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _count_prompt(request: ChatCompletionRequest) -> int:
    return prompt_tokens(
        [m.model_dump(exclude_none=True) for m in request.messages],
        [t.model_dump(exclude_none=True) for t in request.tools or ()],
    )


def _check(request: ChatCompletionRequest, tokens: int) -> None:
    """What OpenAI refuses besides the body's shape: an unknown model, a broken history, a prompt too long."""
    if request.model not in SIMULATED_MODELS:
        raise model_not_found(request.model)
    problem = history_error(request.messages)
    if problem is not None:
        raise invalid_request(problem, "messages")
    window = CONTEXT_WINDOWS[request.model]
    if tokens > window:
        raise _context_exceeded(window, tokens)


def _context_exceeded(window: int, tokens: int) -> OpenAIApiError:
    return invalid_request(
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} "
        "tokens. Please reduce the length of the messages.",
        "messages",
        "context_length_exceeded",
    )


class Exchange:
    """One request: ``await Exchange(request, redis).answer()``. ``rng`` and ``today`` are injectable."""

    def __init__(
        self,
        request: Request,
        redis: Redis,
        *,
        rng: Callable[[], float] = random.random,
        today: Callable[[], date] = date.today,
    ) -> None:
        self.request = request
        self.redis = redis
        self.rng = rng
        self.today = today
        self.request_id = f"req_{uuid.uuid4().hex}"
        self.started = time.monotonic()
        self.at = datetime.now(UTC).isoformat()
        self.body: ChatCompletionRequest | None = None
        self.faults: ModelFaults = NO_FAULTS
        self.fault: str | None = None
        self.headers: dict[str, str] = {"x-request-id": self.request_id}
        self.first_token_at: float | None = None

    # ------------------------------------------------------------------------------------------------ the log

    async def _log(
        self,
        status: int,
        outcome: Outcome,
        *,
        reply: Reply | None = None,
        error: dict[str, Any] | None = None,
        sent: int = 0,
        usage_reported: bool = False,
    ) -> None:
        body = self.body
        last_user = None
        if body is not None:
            users = [m for m in body.messages if isinstance(m, UserMessage)]
            last_user = cut(text_of(users[-1].content)) if users else None
        usage = None
        if reply is not None:
            usage = reply.usage if outcome != "cut" or not body or not body.streaming else _partial(reply, sent)
        calls = [LoggedCall(name=call.name, arguments=call.arguments) for call in reply.calls] if reply else []
        entry = LoggedRequest(
            request_id=self.request_id,
            at=self.at,
            instance=self.request.app.state.service.instance_id,
            model=body.model if body else "",
            stream=bool(body and body.streaming),
            messages=len(body.messages) if body else 0,
            tools=[t.function.name for t in body.tools or ()] if body else [],
            tool_choice=body.tool_choice_name if body else None,
            last_user=last_user,
            status=status,
            outcome=outcome,
            tool_calls=calls,
            text=cut(reply.text) if reply else None,
            finish_reason=reply.finish_reason if reply and outcome in ("text", "tool_calls") else None,
            error=error,
            usage=usage,
            usage_reported=usage_reported,
            tokens_sent=sent,
            fault=self.fault,
            scripted=bool(reply and reply.scripted),
            first_token_ms=None
            if self.first_token_at is None
            else round((self.first_token_at - self.started) * 1000, 1),
            duration_ms=round((time.monotonic() - self.started) * 1000, 1),
        )
        await record(self.redis, entry)

    def _injected(self, kind: str) -> None:
        self.fault = kind if self.fault is None else f"{self.fault}+{kind}"
        fault_metrics().injected.labels(PROVIDER, kind).inc()

    async def _refuse(self, status: int, body: dict[str, Any], headers: dict[str, str], outcome: Outcome) -> Response:
        await self._log(status, outcome, error=body.get("error"))
        return JSONResponse(body, status_code=status, headers={**self.headers, **headers})

    # ---------------------------------------------------------------------------------------------- answering

    async def answer(self) -> Response:
        try:
            self.body = parse_request(await self.request.body())
            tokens = _count_prompt(self.body)
            _check(self.body, tokens)
        except OpenAIApiError as exc:
            return await self._refuse(exc.status, exc.body, exc.headers, "error")
        body = self.body
        self.faults = await load_faults(self.redis, body.model)
        step = await next_step(self.redis, body.model)
        reply = self._reply(body, tokens) if step is None else scripted_reply(step, **self._limits(body, tokens))
        admission = await admit(self.redis, body.model, self.faults, reply.usage["total_tokens"], self.request_id)
        self.headers.update(admission.headers)
        if not admission.admitted:
            return await self._refuse(*self._over_limits(admission, body, reply), "rate_limited")
        refused = await self._inject_refusal(body, tokens)
        if refused is not None:
            return refused
        if self.faults.hang:
            await self._hang()
        if step is not None:
            reply = await self._play(body, tokens)
        if body.streaming:
            return AnswerStream(lambda gone: self._stream(reply, body, gone), self._stream_headers())
        return await self._whole(reply, body)

    def _over_limits(
        self, admission: Admission, body: ChatCompletionRequest, reply: Reply
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        fault_metrics().injected.labels(PROVIDER, "rate_limit").inc()
        return refusal(admission, self.faults, body.model, reply.usage["total_tokens"])

    @staticmethod
    def _limits(body: ChatCompletionRequest, tokens: int) -> dict[str, int]:
        return {"prompt_tokens": tokens, "limit": body.answer_limit}

    async def _play(self, body: ChatCompletionRequest, tokens: int) -> Reply:
        """The script's next step, taken now that a 200 answer starts (the one peeked may have gone to another
        replica: then the step after it; when none is left, the rules answer)."""
        step = await take_step(self.redis, body.model)
        return self._reply(body, tokens) if step is None else scripted_reply(step, **self._limits(body, tokens))

    def _reply(self, body: ChatCompletionRequest, tokens: int) -> Reply:
        offered = body.offered_tools()
        conversation = Conversation(body.messages, offered, self.today(), CITIES)
        decision = conversation.decide()
        if self.faults.loop_tool and SEARCH_HOTELS in offered:
            self._injected("loop_tool")
            decision = Decision(call=PlannedCall(SEARCH_HOTELS, conversation.runaway_search()))
        arguments = None
        if self.faults.malformed_tool_args and decision.call is not None:
            self._injected("malformed_tool_args")
            arguments = malformed(decision.call.arguments, self.faults.malformed_tool_args)
        return render(decision, **self._limits(body, tokens), arguments=arguments)

    async def _inject_refusal(self, body: ChatCompletionRequest, tokens: int) -> Response | None:
        faults = self.faults
        if faults.injects_errors:
            hit = faults.error_count is None or await take_error(self.redis, body.model)
            if hit and (faults.error_count is None or faults.error_rate > 0):
                hit = self.rng() < faults.error_rate
            if hit:
                self._injected(f"error_{faults.error_status}")
                return await self._refuse(*injected_error(faults, body.model), "error")
        if faults.context_length_exceeded:
            self._injected("context_length_exceeded")
            window = CONTEXT_WINDOWS[body.model]
            exc = _context_exceeded(window, max(tokens, window + 1))
            return await self._refuse(exc.status, exc.body, exc.headers, "error")
        return None

    async def _hang(self) -> None:
        self._injected("hang")
        gauge = fault_metrics().hanging.labels(PROVIDER)
        gauge.inc()
        try:
            await hold(self.request, None)
        except ClientGoneError:
            await self._log(499, "hang")
            raise
        finally:
            gauge.dec()

    async def _whole(self, reply: Reply, body: ChatCompletionRequest) -> Response:
        faults = self.faults
        delay = faults.first_token_latency_s + faults.token_delay_s * reply.completion_tokens
        if delay > 0:
            self._injected("latency")
            try:
                await hold(self.request, delay)
            except ClientGoneError:
                await self._log(499, "client_gone", reply=reply)
                raise
        payload = json.dumps(reply.completion(body.model)).encode()
        self.first_token_at = time.monotonic()  # a whole answer's tokens go out together
        if faults.cut_after_tokens is not None:
            self._injected("cut")
            await self._log(200, "cut", reply=reply)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            return AnswerStream(lambda gone: _cut_after(payload[: len(payload) // 2]), headers + self._raw_headers())
        await self._log(
            200,
            "tool_calls" if reply.calls else "text",
            reply=reply,
            sent=reply.completion_tokens,
            usage_reported=True,
        )
        return Response(payload, media_type="application/json", headers=self.headers)

    def _raw_headers(self) -> list[tuple[bytes, bytes]]:
        return [(k.encode(), v.encode()) for k, v in self.headers.items()]

    def _stream_headers(self) -> list[tuple[bytes, bytes]]:
        return [*SSE_HEADERS, *self._raw_headers()]

    async def _stream(self, reply: Reply, body: ChatCompletionRequest, gone: asyncio.Event) -> AsyncIterator[bytes]:
        faults = self.faults
        writer = ChunkWriter(body.model, include_usage=body.include_usage, fingerprint=FINGERPRINT)
        sent = 0
        logged = False
        started = False
        try:
            if faults.first_token_latency_s > 0:
                self._injected("latency")
                if await _paused(gone, faults.first_token_latency_s):
                    return
            for is_token, chunk in reply.chunks(writer):
                if (is_token or started) and faults.cut_after_tokens is not None and sent >= faults.cut_after_tokens:
                    self._injected("cut")
                    logged = True
                    await self._log(200, "cut", reply=reply, sent=sent)
                    raise CutStream
                if is_token:
                    if sent and faults.token_delay_s > 0 and await _paused(gone, faults.token_delay_s):
                        return
                    sent += 1
                    self.first_token_at = self.first_token_at or time.monotonic()
                started = True
                yield _event(chunk)
            logged = True
            outcome: Outcome = "tool_calls" if reply.calls else "text"
            await self._log(200, outcome, reply=reply, sent=sent, usage_reported=body.include_usage)
            yield b"data: [DONE]\n\n"
        finally:
            if not logged:
                await self._log(200, "client_gone", reply=reply, sent=sent)


def _partial(reply: Reply, sent: int) -> dict[str, int]:
    """The usage of a stream cut after ``sent`` tokens."""
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": sent, "total_tokens": reply.prompt_tokens + sent}


async def _cut_after(part: bytes) -> AsyncIterator[bytes]:
    yield part
    raise CutStream
