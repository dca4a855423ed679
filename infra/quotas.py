"""A fair share per person, held in Redis for every replica: requests a minute on the public APIs
(``PERSON_REQUESTS_PER_MIN``) and journal streams open at once (``PERSON_MAX_STREAMS``). Over either:
``QuotaExceededError`` (429 ``quota_exceeded`` with ``Retry-After``). The operator (the admin token) has no quota.

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

from infra.people import QuotaExceededError, person_key
from infra.redis import RedisScript, key

__all__ = ["STREAM_CLAIM_S", "PersonQuotas", "Release"]

STREAM_CLAIM_S: Final = 600
"""How long an open stream counts without being closed: what a killed process's streams cost at most."""

# KEYS: the minute's counter | ARGV: ttl_s. The count after this request.
_COUNT = RedisScript("""
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
return n
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

    def __init__(self, redis: Any, *, requests_per_min: int | None, max_streams: int | None) -> None:
        self._redis = redis
        self.requests_per_min = requests_per_min
        self.max_streams = max_streams

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

    async def open_stream(self, person: str) -> Release:
        """Count one open stream (``QuotaExceededError`` when ``max_streams`` are open); await what it returns when
        the stream ends."""
        if self.max_streams is None:
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


async def _nothing() -> None:
    return None
