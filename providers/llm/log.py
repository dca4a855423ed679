"""llm-api's request log (admin): one entry per chat completion that passed the key check, newest last, capped.

``GET /admin/requests[?model=&limit=]`` · ``DELETE /admin/requests``. Kept in Redis (one list for every replica),
so a test counts what reached the model whichever replica served it. An entry says when, which model, streamed or
not, how many messages, the tools offered, the person's last words, and the outcome: the status, the tool calls or
the text (``scripted`` when a script's step gave them), a cut stream or a hang, and the usage counted (what the
answer cost, whether or not the client got it).
"""

from __future__ import annotations

import json
from typing import Any, Literal, cast

from pydantic import BaseModel
from redis.asyncio import Redis

from providers.keys import provider_key

__all__ = ["MAX_ENTRIES", "LoggedCall", "LoggedRequest", "Outcome", "RequestLog", "clear_log", "read_log", "record"]

MAX_ENTRIES = 2000
"""The log keeps the newest this many."""
TEXT_CHARS = 2000
"""Longer texts are kept cut to this many characters."""

Outcome = Literal["tool_calls", "text", "error", "rate_limited", "cut", "hang", "client_gone"]


class LoggedCall(BaseModel):
    name: str
    arguments: str


class LoggedRequest(BaseModel):
    request_id: str
    at: str
    """ISO 8601, UTC."""
    instance: str
    model: str
    stream: bool
    messages: int
    tools: list[str]
    tool_choice: str | None = None
    """The request's ``tool_choice``: ``auto``, ``none``, ``required``, a tool's name, or None when it sent none."""
    last_user: str | None
    status: int
    """The HTTP status (200 also for a stream cut or left mid-way)."""
    outcome: Outcome
    tool_calls: list[LoggedCall]
    text: str | None
    finish_reason: str | None
    error: dict[str, Any] | None
    """OpenAI's error (``message``, ``type``, ``param``, ``code``) when one was answered."""
    usage: dict[str, int] | None
    """Prompt and completion tokens counted (for a cut stream, the tokens sent); ``None`` for an error."""
    usage_reported: bool
    """Whether the client was sent the usage (a whole answer, or a stream asked for it and finished)."""
    tokens_sent: int
    fault: str | None
    """The fault that shaped the answer, if one did (``latency``, ``cut``, ``malformed_tool_args``...)."""
    scripted: bool = False
    """Answered with a step of ``PUT /admin/script`` (``providers.llm.script``), not by the rules."""
    first_token_ms: float | None
    """From the request's arrival to its first token going out (``None``: none did): the simulator's own time to
    first token, which a client's measure can subtract."""
    duration_ms: float


class RequestLog(BaseModel):
    requests: list[LoggedRequest]
    """Oldest first."""
    count: int


def _key() -> str:
    return provider_key("llm-api", "requests")


def cut(text: str | None) -> str | None:
    return text if text is None or len(text) <= TEXT_CHARS else f"{text[:TEXT_CHARS]}…"


async def record(redis: Redis, entry: LoggedRequest) -> None:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.rpush(_key(), entry.model_dump_json())
        pipe.ltrim(_key(), -MAX_ENTRIES, -1)
        await pipe.execute()


async def read_log(redis: Redis, *, model: str | None = None, limit: int | None = None) -> RequestLog:
    raws = cast(list[str], await redis.lrange(_key(), 0, -1))
    entries = [LoggedRequest.model_validate(json.loads(raw)) for raw in raws]
    if model is not None:
        entries = [e for e in entries if e.model == model]
    if limit is not None:
        entries = entries[-limit:] if limit else []
    return RequestLog(requests=entries, count=len(entries))


async def clear_log(redis: Redis) -> RequestLog:
    await redis.delete(_key())
    return RequestLog(requests=[], count=0)
