"""Idempotency-Key handling for the providers: check, execute and record in ONE Lua script.

Every mutating route requires ``Idempotency-Key`` (missing → 400). A key names one operation: its record holds a
fingerprint of the request (route template, path parameters, validated body) and the response first given.

- same key, same request → the recorded response again (status and body), header ``Idempotent-Replayed: true``,
  and nothing changes;
- same key, different request → 422 ``idempotency_key_reused``. The route is part of the fingerprint, so a key
  reused on another endpoint is a different request too (one key per operation, as at Stripe): a caller bug is
  reported, never silently executed;
- business refusals (409 no rooms, 402 declined, 404 unknown id) are recorded like successes: the answer to a
  request does not change when it is replayed. Injected faults (503) happen before the script and are not.

Why one script: two concurrent requests with the same key must not both execute. Checking the record, doing the
work and writing the record in one ``EVALSHA`` makes that atomic without locks. Each operation's Lua body follows
``_PRELUDE`` and ends with ``return finish(status, body_json)``. Keys always come in through ``KEYS``, record
first, and all of one provider's keys share a hash tag (one Cluster slot). Records expire after
``RECORD_TTL_S``. The answer waits for a replica to have the record (``durable``, docs/redis-ha.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from fastapi import Request, Response
from redis.asyncio import Redis

from infra.clients.wire import IDEMPOTENCY_HEADER, MAX_IDEMPOTENCY_KEY_LENGTH, REPLAYED_HEADER
from infra.redis import RedisScript, text

__all__ = [
    "RECORD_TTL_S",
    "IdempotencyKeyReusedError",
    "IdempotentOutcome",
    "IdempotentScript",
    "MissingIdempotencyKeyError",
    "fingerprint",
    "require_idempotency_key",
]

RECORD_TTL_S = 24 * 3600


class MissingIdempotencyKeyError(Exception):
    """No (or an unusable) ``Idempotency-Key`` on a mutating call: 400."""


class IdempotencyKeyReusedError(Exception):
    """The key was first used for a different request: 422."""


async def require_idempotency_key(request: Request) -> str:
    """FastAPI dependency: the request's key (1–255 visible ASCII characters) or ``MissingIdempotencyKeyError``."""
    value = request.headers.get(IDEMPOTENCY_HEADER)
    if value is None or not value.strip():
        raise MissingIdempotencyKeyError(f"the {IDEMPOTENCY_HEADER} header is required on this route")
    value = value.strip()
    if len(value) > MAX_IDEMPOTENCY_KEY_LENGTH or not value.isascii() or not value.isprintable():
        raise MissingIdempotencyKeyError(
            f"the {IDEMPOTENCY_HEADER} header must be 1-{MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters"
        )
    return value


def fingerprint(operation: str, payload: Mapping[str, Any]) -> str:
    """Stable digest of an operation (``"POST /reservations"``) and its validated parameters."""
    canonical = json.dumps({"op": operation, "payload": payload}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def record_suffix(idempotency_key: str) -> str:
    """The key's part of the record's Redis key: hashed, so any header value makes a short, safe key."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


@dataclass(frozen=True)
class IdempotentOutcome:
    kind: Literal["done", "replay"]
    status: int
    body: str
    """The JSON body, exactly as first sent."""

    def to_response(self) -> Response:
        headers = {REPLAYED_HEADER: "true"} if self.kind == "replay" else None
        return Response(self.body, status_code=self.status, media_type="application/json", headers=headers)

    def json(self) -> Any:
        return json.loads(self.body)


# KEYS[1] idempotency record · ARGV[1] fingerprint · ARGV[2] record TTL (s); operation ARGV start at 3.
_PRELUDE = """
local record = redis.call('GET', KEYS[1])
if record then
  local saved = cjson.decode(record)
  if saved.fp ~= ARGV[1] then
    return {'mismatch', 0, ''}
  end
  return {'replay', saved.status, saved.body}
end
local function finish(status, body)
  redis.call('SET', KEYS[1], cjson.encode({fp = ARGV[1], status = status, body = body}), 'EX', ARGV[2])
  return {'done', status, body}
end
"""


class IdempotentScript:
    """One operation: ``_PRELUDE`` + ``body``, run as a ``RedisScript`` (by SHA, loaded when the server lacks it)."""

    def __init__(self, body: str) -> None:
        self.script = RedisScript(_PRELUDE + body)

    async def run(
        self,
        redis: Redis,
        *,
        record_key: str,
        request_fingerprint: str,
        keys: Sequence[str] = (),
        args: Sequence[str | int | float] = (),
        ttl_s: int = RECORD_TTL_S,
    ) -> IdempotentOutcome:
        # durable: the side effect and its record reach a replica before the caller hears of them, so a failover
        # cannot forget a charge the caller was told about (a retry would charge again)
        keys = [record_key, *keys]
        reply = await self.script(redis, keys=keys, args=[request_fingerprint, ttl_s, *args], durable=True)
        kind, status, body = text(reply[0]), int(reply[1]), text(reply[2])
        if kind == "mismatch":
            raise IdempotencyKeyReusedError(
                f"this {IDEMPOTENCY_HEADER} was already used for a different request; use a new key"
            )
        return IdempotentOutcome(cast(Literal["done", "replay"], kind), status, body)
