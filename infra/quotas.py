"""A fair share per person, held in Redis for every replica: requests a minute on the public APIs
(``PERSON_REQUESTS_PER_MIN``), journal streams open at once (``PERSON_MAX_STREAMS``) and model tokens a (UTC) day
(``PERSON_TOKENS_PER_DAY``). Over any: ``QuotaExceededError`` (429 ``quota_exceeded`` with ``Retry-After``). The
operator (the admin token) has no quota.

Every key has a TTL: a minute's counter lives two minutes, a person's open streams (a zset of stream ids scored by
when their claim runs out) live as long as the last claim, so a process killed with streams open frees them within
``STREAM_CLAIM_S``.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

from identity.people import QuotaExceededError, person_key
from infra.redis import RedisScript, key
from infra.settings import Settings

__all__ = ["STREAM_CLAIM_S", "PersonQuotas", "Release"]

STREAM_CLAIM_S: Final = 600
"""How long an open stream counts without being closed: what a killed process's streams cost at most."""

# KEYS: the minute's counter | ARGV: ttl_s. The count after this request.
_COUNT = RedisScript("""
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
""")

# KEYS: the day's counter | ARGV: tokens, ttl_s
_SPEND = RedisScript("""
redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
""")

# KEYS: the person's open streams | ARGV: now, claim until, limit, stream id. 1 if opened, 0 if at the limit.
_OPEN = RedisScript("""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(ARGV[2])))
return 1
""")


class PersonQuotas:
    """Counts one person's use against the limits (``None``: that quota is off)."""

    def __init__(
        self,
        redis: Any,
        *,
        requests_per_min: int | None,
        max_streams: int | None,
        tokens_per_day: int | None = None,
    ) -> None:
        self._redis = redis
        self.requests_per_min = requests_per_min
        self.max_streams = max_streams
        self.tokens_per_day = tokens_per_day

    @classmethod
    def from_settings(cls, redis: Any, settings: Settings) -> PersonQuotas:
        return cls(
            redis,
            requests_per_min=settings.person_requests_per_min,
            max_streams=settings.person_max_streams,
            tokens_per_day=settings.person_tokens_per_day,
        )

    async def check_tokens(self, person: str) -> None:
        """``QuotaExceededError`` once the person's chats spent ``tokens_per_day`` model tokens today (UTC)."""
        if self.tokens_per_day is None:
            return
        day, wait = _today()
        spent = await self._redis.get(key("people", "tokens", person_key(person), day))
        if spent is not None and int(spent) >= self.tokens_per_day:
            raise QuotaExceededError(
                "tokens",
                f"the model tokens of today are spent ({self.tokens_per_day}, PERSON_TOKENS_PER_DAY): "
                f"more after midnight UTC, in {wait:g}s",
                wait,
            )

    async def spend_tokens(self, person: str, tokens: int) -> None:
        """Count ``tokens`` the model spent for the person today."""
        if self.tokens_per_day is None or tokens <= 0:
            return
        day, _ = _today()
        await _SPEND(self._redis, keys=[key("people", "tokens", person_key(person), day)], args=[tokens, 2 * 86400])

    async def count_request(self, person: str) -> None:
        """One more request this minute (``QuotaExceededError`` past ``requests_per_min``)."""
        if self.requests_per_min is None:
            return
        now = time.time()
        minute = int(now // 60)
        count = await _COUNT(self._redis, keys=[key("people", "rpm", person_key(person), str(minute))], args=[120])
        if int(count) > self.requests_per_min:
            wait = max(1.0, math.ceil((minute + 1) * 60 - now))
            raise QuotaExceededError(
                "requests",
                f"more than {self.requests_per_min} requests this minute (PERSON_REQUESTS_PER_MIN): "
                f"try again in {wait:g}s",
                wait,
            )

    async def open_stream(self, person: str | None) -> Release:
        """Count one open stream of ``person`` (``None``: the operator's, not counted); ``QuotaExceededError`` when
        ``max_streams`` are open. Await what it returns when the stream ends."""
        if self.max_streams is None or person is None:
            return _nothing
        streams = key("people", "streams", person_key(person))
        stream_id = uuid.uuid4().hex
        now = time.time()
        args = [now, now + STREAM_CLAIM_S, self.max_streams, stream_id]
        if not await _OPEN(self._redis, keys=[streams], args=args):
            raise QuotaExceededError(
                "streams",
                f"{self.max_streams} journal streams are open already (PERSON_MAX_STREAMS): close one, or try again",
                5.0,
            )

        async def release() -> None:
            with contextlib.suppress(Exception):  # the claim runs out by itself if Redis is gone now
                await self._redis.zrem(streams, stream_id)

        return release


Release = Callable[[], Awaitable[None]]


def _today() -> tuple[str, float]:
    """Today's UTC date, and the seconds until it ends."""
    now = time.time()
    day = int(now // 86400)
    return str(day), float(max(1, math.ceil((day + 1) * 86400 - now)))


async def _nothing() -> None:
    return None
