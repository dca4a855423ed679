"""llm-api's faults and published rate limits, per model, kept in Redis so every replica obeys the same ones.

``PUT /admin/faults {"model": <name> | null, ...}`` replaces one model's faults (``null``: every model's),
``GET`` shows them all with what is left of each ``error_count``, ``DELETE [?model=]`` clears them (and the rate
windows). A request meets them in this order (docs/llm-api.md): the rate limits (``rpm``, ``tpm`` over a rolling
minute, 429 ``rate_limit_exceeded``), an injected error (``error_count``: the next N requests; ``error_rate``: that
fraction, of them when both are set), ``context_length_exceeded``, ``hang``; then the answer, delayed by ``first_token_latency_s`` and
``token_delay_s`` per token, cut after ``cut_after_tokens``, its tool call arguments broken by ``malformed_tool_args``,
or replaced by another search when ``loop_tool``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from domain.llm import SIMULATED_MODELS
from infra.redis import RedisScript
from providers.keys import provider_key
from providers.llm.wire import WHOLE, openai_error

__all__ = [
    "ERROR_STATUSES",
    "NO_FAULTS",
    "Admission",
    "FaultsUpdate",
    "FaultsView",
    "ModelFaults",
    "admit",
    "clear_faults",
    "injected_error",
    "load_faults",
    "malformed",
    "put_faults",
    "ratelimit_headers",
    "refusal",
    "retry_headers",
    "take_error",
    "view_faults",
]

PROVIDER = "llm-api"
ERROR_STATUSES = (429, 500, 502, 503, 529)
WINDOW_MS = 60_000
"""The rate limits' rolling window."""
ModelName = Literal["sim-large", "sim-small"]
assert tuple(ModelName.__args__) == SIMULATED_MODELS  # type: ignore[attr-defined]


class ModelFaults(BaseModel):
    """One model's faults and limits; a field left out of a PUT is "no fault". Strict, as hotel-api's are."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    first_token_latency_s: float = Field(0.0, ge=0, le=300, allow_inf_nan=False, description="Before the first token.")
    token_delay_s: float = Field(0.0, ge=0, le=10, allow_inf_nan=False, description="Between two tokens.")
    error_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="This fraction of the requests answers `error_status` (of the next `error_count`, when set).",
    )
    error_count: Annotated[int, Field(ge=1, le=1_000_000), WHOLE] | None = Field(
        None,
        description="Only the next N requests (across every replica) may fail: all of them, or `error_rate` of them.",
    )
    error_status: Literal[429, 500, 502, 503, 529] = 503
    error_code: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_]{0,63}$",
        description="The error's OpenAI `code` (default: `rate_limit_exceeded` for a 429, the status's own else); "
        "a 429 `insufficient_quota` is the billing one (its `type` too).",
    )
    retry_after_s: float | None = Field(
        None,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Sent as `retry-after` (whole seconds, rounded up) and `retry-after-ms`.",
    )
    should_retry: bool | None = Field(None, description="Sent as `x-should-retry: true|false`.")
    context_length_exceeded: bool = Field(False, description="Answer 400 `context_length_exceeded`.")
    hang: bool = Field(False, description="Hold every request until its client leaves.")
    cut_after_tokens: Annotated[int, Field(ge=0, le=100_000), WHOLE] | None = Field(
        None, description="Drop the connection after this many tokens (no `[DONE]`)."
    )
    malformed_tool_args: Literal["invalid_json", "bad_stay"] | None = Field(
        None, description="A tool call's arguments: not JSON, or a stay that breaks the rules."
    )
    loop_tool: bool = Field(False, description="Call `search_hotels` on every request, never answer in words.")
    rpm: Annotated[int, Field(ge=1, le=1_000_000), WHOLE] | None = Field(
        None, description="Requests per rolling minute."
    )
    tpm: Annotated[int, Field(ge=1, le=100_000_000), WHOLE] | None = Field(
        None, description="Tokens (prompt + answer) per rolling minute."
    )

    @property
    def injects_errors(self) -> bool:
        return self.error_rate > 0 or self.error_count is not None

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None


NO_FAULTS = ModelFaults()


class FaultsUpdate(ModelFaults):
    """``PUT /admin/faults``: these faults for ``model``, or for every model when it is ``null``."""

    model: ModelName | None = None

    def faults(self) -> ModelFaults:
        return ModelFaults.model_validate(self.model_dump(exclude={"model"}))


class FaultsView(BaseModel):
    """Every model's faults, and what is left of each ``error_count`` (``null``: none set)."""

    models: dict[str, ModelFaults]
    errors_left: dict[str, int | None]


def _faults_key() -> str:
    return provider_key(PROVIDER, "faults")


def _errors_key(model: str) -> str:
    return provider_key(PROVIDER, "errors-left", model)


def _window_key(model: str) -> str:
    return provider_key(PROVIDER, "window", model)


async def load_faults(redis: Redis, model: str) -> ModelFaults:
    raw = await redis.hget(_faults_key(), model)
    return NO_FAULTS if raw is None else ModelFaults.model_validate_json(raw)


async def view_faults(redis: Redis) -> FaultsView:
    raws = await redis.hmget(_faults_key(), list(SIMULATED_MODELS))
    left = await redis.mget([_errors_key(m) for m in SIMULATED_MODELS])
    models = {
        m: NO_FAULTS if raw is None else ModelFaults.model_validate_json(raw)
        for m, raw in zip(SIMULATED_MODELS, raws, strict=True)
    }
    errors = {
        m: (max(0, int(n)) if n is not None else None) if models[m].error_count is not None else None
        for m, n in zip(SIMULATED_MODELS, left, strict=True)
    }
    return FaultsView(models=models, errors_left=errors)


async def put_faults(redis: Redis, update: FaultsUpdate) -> FaultsView:
    """Replace the faults of ``update.model`` (every model when ``None``); an ``error_count`` starts afresh."""
    faults = update.faults()
    models = [update.model] if update.model else list(SIMULATED_MODELS)
    async with redis.pipeline(transaction=True) as pipe:
        for model in models:
            pipe.hset(_faults_key(), model, faults.model_dump_json())
            if faults.error_count is None:
                pipe.delete(_errors_key(model))
            else:
                pipe.set(_errors_key(model), faults.error_count)
        await pipe.execute()
    return await view_faults(redis)


async def clear_faults(redis: Redis, model: str | None = None) -> FaultsView:
    """No faults for ``model`` (every model when ``None``): its error budget and rate window go too."""
    models = [model] if model else list(SIMULATED_MODELS)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(_faults_key(), *models)
        pipe.delete(*[_errors_key(m) for m in models], *[_window_key(m) for m in models])
        await pipe.execute()
    return await view_faults(redis)


# KEYS[1] the model's errors left: one taken atomically, however many replicas ask at once
_TAKE_ERROR = RedisScript("""
local left = tonumber(redis.call('GET', KEYS[1]) or '0')
if left <= 0 then
  return 0
end
redis.call('DECR', KEYS[1])
return 1
""")


async def take_error(redis: Redis, model: str) -> bool:
    """One of the next N requests, if any is left (counted across every replica)."""
    return bool(await _TAKE_ERROR(redis, keys=[_errors_key(model)]))


# KEYS[1] the model's window: members "<request id>:<tokens>", scored by their time in ms (the server's clock, so
# every replica counts the same minute). ARGV: rpm (0: none) · tpm (0: none) · this request's tokens · its id.
# Returns {admitted, refused by ('requests' | 'tokens' | ''), wait ms (-1: never), requests in the window,
# tokens in the window, ms until the oldest request leaves it, ms until the tokens free enough for one token}.
_ADMIT = RedisScript("""
local rpm = tonumber(ARGV[1])
local tpm = tonumber(ARGV[2])
local tokens = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 60000)
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local count = #entries / 2
local used = 0
for i = 1, #entries, 2 do
  used = used + tonumber(string.match(entries[i], ':(%d+)$'))
end
local function leaves(i)
  return tonumber(entries[i + 1]) + 60000 - now
end
local oldest = 0
if count > 0 then oldest = leaves(1) end
if rpm > 0 and count + 1 > rpm then
  return {0, 'requests', oldest, count, used, oldest, oldest}
end
if tpm > 0 and used + tokens > tpm then
  if tokens > tpm then
    return {0, 'tokens', -1, count, used, oldest, oldest}
  end
  local freed = 0
  for i = 1, #entries, 2 do
    freed = freed + tonumber(string.match(entries[i], ':(%d+)$'))
    if used - freed + tokens <= tpm then
      return {0, 'tokens', leaves(i), count, used, oldest, leaves(i)}
    end
  end
end
redis.call('ZADD', KEYS[1], now, ARGV[4] .. ':' .. tokens)
redis.call('PEXPIRE', KEYS[1], 61000)
if count == 0 then oldest = 60000 end
return {1, '', 0, count + 1, used + tokens, oldest, oldest}
""")


@dataclass(frozen=True)
class Admission:
    """The rate limits' verdict on one request, and the headers every answer then carries."""

    admitted: bool
    refused_by: str
    wait_s: float | None
    """How long until it would fit; ``None``: never (one request over the whole ``tpm``)."""
    headers: Mapping[str, str]


def _duration(ms: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``250ms``."""
    if ms < 1000:
        return f"{max(0, int(ms))}ms"
    tenths = round(ms / 100)
    if tenths < 600:
        return f"{tenths / 10:g}s"
    minutes, rest = divmod(math.ceil(tenths / 10), 60)
    return f"{minutes}m{rest}s"


def ratelimit_headers(
    faults: ModelFaults, requests: int, tokens: int, requests_reset_ms: float, tokens_reset_ms: float
) -> dict[str, str]:
    headers: dict[str, str] = {}
    if faults.rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(faults.rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, faults.rpm - requests))
        headers["x-ratelimit-reset-requests"] = _duration(requests_reset_ms)
    if faults.tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(faults.tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, faults.tpm - tokens))
        headers["x-ratelimit-reset-tokens"] = _duration(tokens_reset_ms)
    return headers


async def admit(redis: Redis, model: str, faults: ModelFaults, tokens: int, request_id: str) -> Admission:
    """Count this request against the model's ``rpm``/``tpm``, or refuse it without counting it."""
    if not faults.limited:
        return Admission(True, "", 0.0, {})
    answer = await _ADMIT(redis, keys=[_window_key(model)], args=[faults.rpm or 0, faults.tpm or 0, tokens, request_id])
    admitted, refused_by, wait_ms, requests, used, requests_reset, tokens_reset = answer
    refused = refused_by.decode() if isinstance(refused_by, bytes) else str(refused_by)
    headers = ratelimit_headers(faults, int(requests), int(used), float(requests_reset), float(tokens_reset))
    wait = None if int(wait_ms) < 0 else int(wait_ms) / 1000
    return Admission(bool(admitted), refused, wait, headers)


def retry_headers(retry_after_s: float | None, should_retry: bool | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if retry_after_s is not None:
        headers["retry-after"] = str(max(0, math.ceil(retry_after_s)))
        headers["retry-after-ms"] = str(round(retry_after_s * 1000))
    if should_retry is not None:
        headers["x-should-retry"] = "true" if should_retry else "false"
    return headers


_ERRORS: Mapping[int, tuple[str, str, str | None]] = {
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", "bad_gateway"),
    503: ("The engine is currently overloaded, please try again later.", "server_error", "service_unavailable"),
    529: ("The model is overloaded. Please try again later.", "overloaded_error", "overloaded"),
}


def injected_error(faults: ModelFaults, model: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``(status, body, headers)`` of the error ``faults`` inject, as OpenAI (or, for 529, Anthropic) answers it."""
    headers = retry_headers(faults.retry_after_s, faults.should_retry)
    if faults.error_status == 429:
        if faults.error_code == "insufficient_quota":
            message = "You exceeded your current quota, please check your plan and billing details."
            return 429, openai_error(message, "insufficient_quota", code="insufficient_quota"), headers
        wait = f" Please try again in {faults.retry_after_s:g}s." if faults.retry_after_s is not None else ""
        message = f"Rate limit reached for {model} on requests per min (RPM).{wait}"
        return 429, openai_error(message, "requests", code=faults.error_code or "rate_limit_exceeded"), headers
    message, type_, code = _ERRORS[faults.error_status]
    return faults.error_status, openai_error(message, type_, code=faults.error_code or code), headers


def refusal(
    admission: Admission, faults: ModelFaults, model: str, tokens: int
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The 429 a request over the published limits gets, with ``retry-after`` (none when it can never fit)."""
    headers = dict(admission.headers)
    if admission.wait_s is not None:
        headers.update(retry_headers(admission.wait_s, None))
    if admission.refused_by == "requests":
        limit = f"Limit {faults.rpm}, Used {faults.rpm}, Requested 1."
        message = f"Rate limit reached for {model} on requests per min (RPM): {limit}"
        kind = "requests"
    else:
        remaining = headers.get("x-ratelimit-remaining-tokens", "0")
        used = (faults.tpm or 0) - int(remaining)
        message = f"Rate limit reached for {model} on tokens per min (TPM): Limit {faults.tpm}, Used {used}, Requested {tokens}."
        kind = "tokens"
    if admission.wait_s is not None:
        message += f" Please try again in {admission.wait_s:.3g}s."
    return 429, openai_error(message, kind, code="rate_limit_exceeded"), headers


def bad_stay(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments with a stay that breaks the rules (check-out the day before check-in), or an empty id."""
    broken = dict(arguments)
    if "checkin" in broken and "checkout" in broken:
        broken["checkout"], broken["checkin"] = broken["checkin"], broken["checkout"]
    elif "booking_id" in broken:
        broken["booking_id"] = ""
    return broken


def malformed(arguments: Mapping[str, Any], kind: str) -> str:
    """The JSON a model with ``malformed_tool_args`` writes."""
    if kind == "bad_stay":
        return json.dumps(bad_stay(arguments), separators=(",", ":"))
    return repr(dict(arguments))  # a model writing Python instead of JSON: no partial-JSON parser mends it
