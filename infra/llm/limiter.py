"""One rate limiter for every replica: the provider's published ``LLM_RPM`` / ``LLM_TPM``, kept in Redis by one
Lua script (GCRA), tightened by what the provider's ``x-ratelimit-*`` headers say is left.

Requests: GCRA with a burst of ``b = ceil(rpm / 10)`` and an emission interval of ``60 s / (rpm - b + 1)``, so no
rolling minute ever holds more than ``rpm`` requests (the provider counts a rolling minute; a plain bucket of
``rpm`` would let ``2 × rpm`` through across a minute's edge). Tokens: GCRA whose cost is the request's reserved
tokens (prompt estimate + ``max_tokens``), settled to what the provider reported once it answers. The provider's
``x-ratelimit-remaining-requests: r`` with ``x-ratelimit-reset-requests: d`` (and the tokens' pair) caps the next
``d`` seconds to ``r`` more requests, whoever sends them; a 429's ``retry-after`` caps them to none. A request reserves the earliest slot (the script moves
the arrival time on, so waiters form a queue in Redis, served in order, and the door's peek sees the queue) and
waits for it when it comes within the turn's budget; one that would not raises ``ModelCapacityError``
(``retry_after``, nothing reserved), and ``ChatModel.check_capacity`` lets the door answer 429 ``overloaded``.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping

from infra.llm.errors import ModelRateLimitedError
from infra.redis import Redis, RedisScript
from infra.settings import Settings
from resilience import remaining_budget
from resilience.errors import NonRetryableError

__all__ = ["ModelCapacityError", "RateLimiter", "parse_reset"]

MIN_CALL_S = 0.2


class ModelCapacityError(NonRetryableError, ModelRateLimitedError):
    """Our own limiter has no room within the budget: nothing was sent (no breaker failure, no retry)."""


# KEYS[1] the model's limiter hash. ARGV: mode ('take' | 'peek' | 'settle') · request interval ms (0: no rpm) · request
# burst · token interval µs per token (0: no tpm) · token burst · cost (tokens) · the longest wait to reserve (ms) ·
# settle delta (tokens). Fields: rt (requests' theoretical arrival time, ms), tt (tokens', µs), cr / cru (the
# provider's cap on requests and when it ends, ms), ct / ctu (the same for tokens). Time is the server's (TIME), so
# every replica counts alike. 'take' reserves the earliest slot (a queue: waiters are served in order, and the door's
# 'peek' sees them) when it starts within the longest wait. Returns {reserved (1/0), wait ms until the slot}.
_LIMIT = RedisScript("""
local mode = ARGV[1]
local r_int = tonumber(ARGV[2])
local r_burst = tonumber(ARGV[3])
local t_int = tonumber(ARGV[4])
local t_burst = tonumber(ARGV[5])
local cost = tonumber(ARGV[6])
local max_wait = tonumber(ARGV[7])
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local h = redis.call('HMGET', KEYS[1], 'rt', 'tt', 'cr', 'cru', 'ct', 'ctu')
local rt = math.max(tonumber(h[1] or '0'), now)
local tt = math.max(tonumber(h[2] or '0'), now_us)
if mode == 'settle' then
  if t_int > 0 then
    tt = math.max(tt + tonumber(ARGV[8]) * t_int, now_us)
    redis.call('HSET', KEYS[1], 'tt', tt)
  end
  return {1, 0}
end
local start = now
if r_int > 0 then start = math.max(start, rt - (r_burst - 1) * r_int) end
if t_int > 0 then start = math.max(start, math.ceil((tt + (cost - t_burst) * t_int) / 1000)) end
local cr = tonumber(h[3] or '-1')
local cru = tonumber(h[4] or '0')
local capped_r = cr >= 0 and now < cru
if capped_r and cr < 1 then start = math.max(start, cru) end
local ct = tonumber(h[5] or '-1')
local ctu = tonumber(h[6] or '0')
local capped_t = ct >= 0 and now < ctu
if capped_t and ct < cost then start = math.max(start, ctu) end
local wait = start - now
if mode == 'peek' or wait > max_wait then
  return {0, wait}
end
redis.call('HSET', KEYS[1], 'rt', math.max(rt, start) + r_int, 'tt', math.max(tt, start * 1000) + cost * t_int)
if capped_r and start < cru then redis.call('HSET', KEYS[1], 'cr', cr - 1) end
if capped_t and start < ctu then redis.call('HSET', KEYS[1], 'ct', ct - cost) end
redis.call('PEXPIRE', KEYS[1], 120000 + wait)
return {1, wait}
""")

# KEYS[1] the model's limiter hash. ARGV: remaining requests (-1: not said) · its reset ms · remaining tokens · reset ms.
# A cap only ever tightens: a later answer saying more is left does not lift a cap another one set. A 429's
# ``retry-after`` is the cap "0 requests" for that long (``hold``).
_OBSERVE = RedisScript("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function cap(field, until_field, remaining, reset)
  if remaining < 0 then return end
  local old = tonumber(redis.call('HGET', KEYS[1], field) or '-1')
  local old_until = tonumber(redis.call('HGET', KEYS[1], until_field) or '0')
  if old >= 0 and now < old_until and old <= remaining then
    -- the same cap for longer is tighter still (a second retry-after past the first)
    if old == remaining and now + reset > old_until then redis.call('HSET', KEYS[1], until_field, now + reset) end
    return
  end
  redis.call('HSET', KEYS[1], field, remaining, until_field, now + reset)
end
cap('cr', 'cru', tonumber(ARGV[1]), tonumber(ARGV[2]))
cap('ct', 'ctu', tonumber(ARGV[3]), tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[1], 120000)
return 1
""")

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def parse_reset(value: str | None) -> float | None:
    """OpenAI's reset durations (``1s``, ``6m0s``, ``250ms``, ``1.5s``) in milliseconds; ``None`` when unreadable."""
    if not value:
        return None
    total = 0.0
    matched = 0
    for number, unit in _DURATION.findall(value.strip()):
        total += float(number) * _UNIT_MS[unit]
        matched += 1
    return total if matched else None


class RateLimiter:
    """``acquire`` before each request, ``observe`` its headers, ``settle`` its reported usage."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._prefix = f"{settings.key_prefix}:llm:limit"
        rpm, tpm = settings.llm_rpm, settings.llm_tpm
        self.rpm, self.tpm = rpm, tpm
        if rpm is not None:
            self._r_burst = max(1, math.ceil(rpm / 10))
            self._r_int = math.ceil(60_000 / (rpm - self._r_burst + 1))
        else:
            self._r_burst, self._r_int = 0, 0
        if tpm is not None:
            self._t_burst = max(1, math.ceil(tpm / 10))
            self._t_int = math.ceil(60_000_000 / max(1, tpm - self._t_burst + 1))
        else:
            self._t_burst, self._t_int = 0, 0

    def _key(self, model: str) -> str:
        return f"{self._prefix}:{model}"

    async def _run(
        self, mode: str, model: str, cost: int, max_wait_s: float = 0.0, delta: int = 0
    ) -> tuple[bool, float]:
        max_wait_ms = max(0, int(max_wait_s * 1000))
        args = [mode, self._r_int, self._r_burst, self._t_int, self._t_burst, cost, max_wait_ms, delta]
        reserved, wait_ms = await _LIMIT(self._redis, keys=[self._key(model)], args=args)
        return bool(int(reserved)), max(0, int(wait_ms)) / 1000

    async def wait_for(self, model: str, cost: int = 1) -> float:
        """Seconds until a request of ``cost`` tokens would get its slot, behind every one reserved; takes nothing."""
        _, wait = await self._run("peek", model, cost)
        return wait

    async def acquire(self, model: str, cost: int, need_s: float = MIN_CALL_S) -> float:
        """Reserve the next slot for one request of ``cost`` tokens and wait for it, when it comes early enough to
        leave ``need_s`` (what such a call takes) of the budget; the seconds waited. ``ModelCapacityError`` (its
        ``retry_after``) when it would not: nothing is reserved."""
        from infra.llm.telemetry import observe_limiter_wait

        left = remaining_budget()
        reserved, wait = await self._run("take", model, cost, left - max(MIN_CALL_S, need_s))
        if not reserved:
            observe_limiter_wait(model, wait, refused=True)
            raise ModelCapacityError(
                f"{model}: the shared rate limit has room in {wait:.2f}s, past this turn's budget ({left:.2f}s)",
                model=model,
                retry_after=wait,
                retryable=False,
            )
        if wait > 0:
            await asyncio.sleep(wait)
            observe_limiter_wait(model, wait)
        return wait

    async def settle(self, model: str, reserved: int, used: int) -> None:
        """Give back (or take more of) the tokens reserved, now that the provider said what the call cost."""
        if self._t_int and used != reserved:
            await self._run("settle", model, 0, 0.0, used - reserved)

    async def observe(self, model: str, headers: Mapping[str, str]) -> None:
        """Tighten to what the provider says is left (``x-ratelimit-remaining-*`` until ``x-ratelimit-reset-*``)."""
        requests, requests_reset = _remaining(headers, "requests")
        tokens, tokens_reset = _remaining(headers, "tokens")
        if requests < 0 and tokens < 0:
            return
        args = [requests, requests_reset, tokens, tokens_reset]
        await _OBSERVE(self._redis, keys=[self._key(model)], args=args)

    async def hold(self, model: str, seconds: float) -> None:
        """The provider said ``retry-after``: no request to ``model`` from any replica before it has passed, a turn
        resumed elsewhere after a crash included (it would otherwise ask at once, and be refused again)."""
        if seconds > 0:
            await _OBSERVE(self._redis, keys=[self._key(model)], args=[0, math.ceil(seconds * 1000), -1, 0])


def _remaining(headers: Mapping[str, str], kind: str) -> tuple[int, int]:
    raw = headers.get(f"x-ratelimit-remaining-{kind}")
    reset = parse_reset(headers.get(f"x-ratelimit-reset-{kind}"))
    if raw is None or reset is None:
        return -1, 0
    try:
        remaining = int(float(raw))
    except ValueError:
        return -1, 0
    return max(0, remaining), math.ceil(reset)
