"""The recovery queue: bounded, deduplicated, reliable (at-least-once), with a dead-letter queue.

Keys (all under the ``{recovery}`` hash tag, so every script may touch them together in a cluster)::

    {recovery}:queue             LIST  waiting thread ids, FIFO (its length is the capped depth)
    {recovery}:queue:items       HASH  thread id → {"e": enqueued ms, "a": deliveries, "c": consumer} for every
                                       id waiting, in flight or delayed: the dedup set and the delivery counter
    {recovery}:queue:inflight    ZSET  thread id → visibility deadline (ms); redelivered when it passes
    {recovery}:queue:delayed     ZSET  thread id → when a nacked id may be taken again (ms)
    {recovery}:dlq               HASH  thread id → DLQ entry (JSON)
    {recovery}:dlq:index         ZSET  thread id → first dead-lettering (ms), for a stable listing order
    {recovery}:stats             HASH  counters shared by every replica: enqueued, recovered, dead_lettered,
                                       redelivered totals

An id is in exactly one place at a time: waiting, in flight, delayed, or the DLQ. The cap (``RECOVERY_QUEUE_MAX_SIZE``)
bounds the waiting list; an id that does not fit goes to the DLQ (reason ``queue_full``) in the same script that
measured the depth, so concurrent producers cannot overshoot it. Ids already taken by a consumer do not count
against the cap: they were admitted once, and a nack puts them in the delayed set rather than back in the list.

Delivery is at-least-once: ``take`` moves an id into the in-flight set with a deadline on the server clock. An ack
removes it for good; a consumer that dies leaves the deadline to pass, and the next ``take`` (same script)
delivers it again with ``attempts`` + 1. An id delivered ``max_deliveries`` times without an ack goes to the DLQ
(reason ``max_deliveries``) instead of a further delivery, so a run that crashes its consumer cannot loop forever.
A delivery is identified by (thread id, attempts, consumer); ack/nack/extend of a superseded delivery are refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from redis.asyncio import Redis

from infra.redis import RedisScript, key, text
from infra.settings import Settings, get_settings
from recovery.errors import redis_errors
from runs.leases import RECOVERY_TAG, active_index_key, run_key

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[object]]
Clock = Callable[[], float]


@dataclass(frozen=True)
class QueueConfig:
    max_size: int = 100
    """Cap on waiting ids (``RECOVERY_QUEUE_MAX_SIZE``)."""
    warn_threshold: float = 0.7
    """Fraction of ``max_size`` from which every enqueue logs a warning (``RECOVERY_QUEUE_WARN_THRESHOLD``)."""
    visibility_timeout_s: float = 30.0
    """How long a taken id stays invisible without an ack or extend (``RECOVERY_VISIBILITY_TIMEOUT``)."""
    max_deliveries: int = 3
    """Deliveries of one id without an ack before it is dead-lettered (``RECOVERY_MAX_ATTEMPTS``)."""

    def __post_init__(self) -> None:
        if self.max_size <= 0:
            raise ValueError(f"max_size must be positive, got {self.max_size!r}")
        if not 0 < self.warn_threshold <= 1:
            raise ValueError(f"warn_threshold must be in (0, 1], got {self.warn_threshold!r}")
        if self.visibility_timeout_s <= 0:
            raise ValueError(f"visibility_timeout_s must be positive, got {self.visibility_timeout_s!r}")
        if self.max_deliveries <= 0:
            raise ValueError(f"max_deliveries must be positive, got {self.max_deliveries!r}")

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> QueueConfig:
        settings = settings or get_settings()
        return cls(
            max_size=settings.recovery_queue_max_size,
            warn_threshold=settings.recovery_queue_warn_threshold,
            visibility_timeout_s=settings.recovery_visibility_timeout_s,
            max_deliveries=settings.recovery_max_attempts,
        )


@dataclass(frozen=True)
class _Keys:
    queue: str
    items: str
    inflight: str
    delayed: str
    dlq: str
    dlq_index: str
    stats: str

    @classmethod
    def for_prefix(cls, prefix: str) -> _Keys:
        def k(*parts: str) -> str:
            return key(RECOVERY_TAG, *parts, prefix=prefix)

        return cls(
            queue=k("queue"),
            items=k("queue", "items"),
            inflight=k("queue", "inflight"),
            delayed=k("queue", "delayed"),
            dlq=k("dlq"),
            dlq_index=k("dlq", "index"),
            stats=k("stats"),
        )

    def all(self) -> list[str]:
        """In the order the Lua library expects them (KEYS[1..7])."""
        return [self.queue, self.items, self.inflight, self.delayed, self.dlq, self.dlq_index, self.stats]


# Every queue script starts with this library; KEYS[1..7] are always _Keys.all().
_LIB = """
local Q, ITEMS, INFLIGHT, DELAYED, DLQ, DLQ_INDEX, STATS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local FINAL = {done = true, failed = true, dead_lettered = true}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function dead_letter(id, reason, err, attempts, now)
  local raw = redis.call('HGET', DLQ, id)
  local entry
  if raw then
    entry = cjson.decode(raw)
    entry.count = entry.count + 1
  else
    entry = {thread_id = id, first_at = now, count = 1}
    redis.call('ZADD', DLQ_INDEX, now, id)
  end
  entry.reason = reason
  entry.error = err
  entry.attempts = attempts
  entry.last_at = now
  redis.call('HSET', DLQ, id, cjson.encode(entry))
  redis.call('HINCRBY', STATS, 'dead_lettered_total', 1)
end

-- removes an id from wherever it waits in the queue
local function forget(id)
  if redis.call('HDEL', ITEMS, id) == 1 then
    redis.call('LREM', Q, 0, id)
    redis.call('ZREM', INFLIGHT, id)
    redis.call('ZREM', DELAYED, id)
  end
end

-- → outcome, depth after the call
local function enqueue(id, now, max_size, full_error)
  if redis.call('HEXISTS', ITEMS, id) == 1 then return 'duplicate', redis.call('LLEN', Q) end
  if redis.call('HEXISTS', DLQ, id) == 1 then return 'in_dlq', redis.call('LLEN', Q) end
  local depth = redis.call('LLEN', Q)
  if depth >= max_size then
    dead_letter(id, 'queue_full', full_error, 0, now)
    return 'dead_lettered', depth
  end
  redis.call('RPUSH', Q, id)
  redis.call('HSET', ITEMS, id, cjson.encode({e = now, a = 0}))
  redis.call('HINCRBY', STATS, 'enqueued_total', 1)
  return 'queued', depth + 1
end

-- the in-flight item if (attempts, consumer) still names the current delivery, else nil
local function current(id, attempts, consumer)
  local raw = redis.call('HGET', ITEMS, id)
  if not raw then return nil end
  local item = cjson.decode(raw)
  if item.a ~= tonumber(attempts) or item.c ~= consumer then return nil end
  if not redis.call('ZSCORE', INFLIGHT, id) then return nil end
  return item
end
"""

# ARGV: max_size, full_error, thread_id
_ENQUEUE = RedisScript(
    _LIB
    + """
local outcome, depth = enqueue(ARGV[3], now_ms(), tonumber(ARGV[1]), ARGV[2])
return {outcome, depth}
"""
)

# KEYS[8]: active index, KEYS[9..]: run records | ARGV: max_size, full_error, thread ids (same order as the runs)
# Claims each run that is still an orphan (lease expired, not final, not yet handed over for this expiry) and
# enqueues it in the same step, so a scanner dying in between cannot leave a claimed run outside the queue.
_ENQUEUE_ORPHANS = RedisScript(
    _LIB
    + """
local now = now_ms()
local max_size = tonumber(ARGV[1])
local results = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local run = KEYS[i + 6]
  local outcome, depth = 'not_orphan', redis.call('LLEN', Q)
  if redis.call('EXISTS', run) == 0 then
    redis.call('ZREM', KEYS[8], id)
  else
    local status, lease_until, claimed = unpack(redis.call('HMGET', run, 'status', 'lease_until', 'claimed'))
    if FINAL[status] then
      redis.call('ZREM', KEYS[8], id)
    elseif (tonumber(lease_until) or 0) > now then
      redis.call('ZADD', KEYS[8], lease_until, id)
    elseif claimed then
      redis.call('ZADD', KEYS[8], '+inf', id)
    else
      redis.call('HSET', run, 'claimed', '1')
      redis.call('ZADD', KEYS[8], '+inf', id)
      outcome, depth = enqueue(id, now, max_size, ARGV[2])
    end
  end
  results[#results + 1] = id
  results[#results + 1] = outcome
  results[#results + 1] = depth
end
return results
"""
)

# ARGV: consumer, visibility_ms, max_deliveries → false, or {id, attempts, deadline, enqueued_at, now}
_TAKE = RedisScript(
    _LIB
    + """
local consumer, visibility, max_deliveries = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
while true do
  local id, redelivery = nil, false
  local due = redis.call('ZRANGEBYSCORE', INFLIGHT, '-inf', now, 'LIMIT', 0, 1)
  if #due > 0 then
    id, redelivery = due[1], true
    redis.call('ZREM', INFLIGHT, id)
  else
    due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 1)
    if #due > 0 then
      id = due[1]
      redis.call('ZREM', DELAYED, id)
    else
      id = redis.call('LPOP', Q)
    end
  end
  if not id then return false end
  local raw = redis.call('HGET', ITEMS, id)
  local item = raw and cjson.decode(raw) or {e = now, a = 0}
  item.a = item.a + 1
  if item.a > max_deliveries then
    redis.call('HDEL', ITEMS, id)
    local delivered = item.a - 1
    dead_letter(id, 'max_deliveries', 'delivered ' .. delivered .. ' times without an ack', delivered, now)
  else
    if redelivery then redis.call('HINCRBY', STATS, 'redelivered_total', 1) end
    item.c = consumer
    local deadline = now + visibility
    redis.call('HSET', ITEMS, id, cjson.encode(item))
    redis.call('ZADD', INFLIGHT, deadline, id)
    return {id, item.a, deadline, item.e, now}
  end
end
"""
)

# ARGV: thread_id, attempts, consumer, outcome → 1 acked, 0 not the current delivery
_ACK = RedisScript(
    _LIB
    + """
if not current(ARGV[1], ARGV[2], ARGV[3]) then return 0 end
redis.call('HDEL', ITEMS, ARGV[1])
redis.call('ZREM', INFLIGHT, ARGV[1])
redis.call('HINCRBY', STATS, ARGV[4] .. '_total', 1)
return 1
"""
)

# ARGV: thread_id, attempts, consumer, delay_ms → 1 or 0
_NACK = RedisScript(
    _LIB
    + """
local item = current(ARGV[1], ARGV[2], ARGV[3])
if not item then return 0 end
item.c = nil
redis.call('HSET', ITEMS, ARGV[1], cjson.encode(item))
redis.call('ZREM', INFLIGHT, ARGV[1])
redis.call('ZADD', DELAYED, now_ms() + tonumber(ARGV[4]), ARGV[1])
return 1
"""
)

# ARGV: thread_id, attempts, consumer, visibility_ms → new deadline (ms) or 0
_EXTEND = RedisScript(
    _LIB
    + """
if not current(ARGV[1], ARGV[2], ARGV[3]) then return 0 end
local deadline = now_ms() + tonumber(ARGV[4])
redis.call('ZADD', INFLIGHT, deadline, ARGV[1])
return deadline
"""
)

# ARGV: thread_id, attempts, consumer, reason, error → 1 or 0
_DEAD_LETTER_DELIVERY = RedisScript(
    _LIB
    + """
local item = current(ARGV[1], ARGV[2], ARGV[3])
if not item then return 0 end
forget(ARGV[1])
dead_letter(ARGV[1], ARGV[4], ARGV[5], item.a, now_ms())
return 1
"""
)

# ARGV: thread_id, reason, error, attempts
_SEND_TO_DLQ = RedisScript(
    _LIB
    + """
forget(ARGV[1])
dead_letter(ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), now_ms())
return 1
"""
)

# KEYS[8]: the run record, KEYS[9]: active index | ARGV: thread_id, max_size, full_error
# → {outcome, depth}: outcome 'unknown' (not in the DLQ), 'full' (left in the DLQ), 'duplicate' or 'queued'
_REQUEUE = RedisScript(
    _LIB
    + """
local id, max_size = ARGV[1], tonumber(ARGV[2])
if redis.call('HEXISTS', DLQ, id) == 0 then return {'unknown', redis.call('LLEN', Q)} end
local depth = redis.call('LLEN', Q)
if redis.call('HEXISTS', ITEMS, id) == 0 and depth >= max_size then return {'full', depth} end
redis.call('HDEL', DLQ, id)
redis.call('ZREM', DLQ_INDEX, id)
local now = now_ms()
local outcome
outcome, depth = enqueue(id, now, max_size, ARGV[3])
-- An operator's requeue is a fresh chance: a dead-lettered run becomes recoverable again (attempts reset), and a
-- run whose lease lapsed is marked as handed to the queue so the scanner does not enqueue it a second time.
local run, active = KEYS[8], KEYS[9]
if redis.call('EXISTS', run) == 1 then
  local status, lease_until = unpack(redis.call('HMGET', run, 'status', 'lease_until'))
  if status == 'dead_lettered' then
    redis.call('HSET', run, 'status', 'pending', 'attempts', 0, 'owner', '', 'lease_until', now, 'updated_at', now,
      'claimed', '1')
    redis.call('PERSIST', run)
    redis.call('ZADD', active, '+inf', id)
  elseif not FINAL[status] and (tonumber(lease_until) or 0) <= now then
    redis.call('HSET', run, 'claimed', '1')
    redis.call('ZADD', active, '+inf', id)
  end
end
return {outcome, depth}
"""
)

_PURGE = RedisScript(
    _LIB
    + """
local n = redis.call('HLEN', DLQ)
redis.call('DEL', DLQ, DLQ_INDEX)
return n
"""
)

# → JSON object
_STATS = RedisScript(
    _LIB
    + """
local now = now_ms()
local oldest = 0
local head = redis.call('LINDEX', Q, 0)
if head then
  local raw = redis.call('HGET', ITEMS, head)
  if raw then oldest = now - cjson.decode(raw).e end
end
local counters = redis.call('HGETALL', STATS)
local out = {
  depth = redis.call('LLEN', Q),
  in_flight = redis.call('ZCARD', INFLIGHT),
  delayed = redis.call('ZCARD', DELAYED),
  dlq_depth = redis.call('HLEN', DLQ),
  oldest_age_ms = oldest,
}
for i = 1, #counters, 2 do out[counters[i]] = tonumber(counters[i + 1]) end
return cjson.encode(out)
"""
)


class EnqueueOutcome(StrEnum):
    QUEUED = "queued"
    """Newly added to the waiting list."""
    DUPLICATE = "duplicate"
    """Already waiting, in flight or delayed: not added twice, but it is in the queue."""
    DEAD_LETTERED = "dead_lettered"
    """The queue was full: the id went to the DLQ (reason ``queue_full``)."""
    IN_DLQ = "in_dlq"
    """The id is parked in the DLQ; only ``DeadLetterQueue.requeue`` brings it back."""
    NOT_ORPHAN = "not_orphan"
    """(orphan enqueue only) the run has a live lease, is final, is gone, or was already handed over."""

    @property
    def accepted(self) -> bool:
        """True when the id is now in the queue (new or already there)."""
        return self in (EnqueueOutcome.QUEUED, EnqueueOutcome.DUPLICATE)


@dataclass(frozen=True)
class EnqueueResult:
    thread_id: str
    outcome: EnqueueOutcome
    depth: int
    """Waiting-list length right after the call."""


class AckOutcome(StrEnum):
    RECOVERED = "recovered"
    """A consumer took the run over (holds its lease from here on): counts in ``recovered_total``."""
    SKIPPED = "skipped"
    """Nothing to do (already final, leased by a live owner, no record): counts in ``skipped_total``."""


@dataclass(frozen=True)
class Delivery:
    thread_id: str
    consumer_id: str
    attempts: int
    """1 on the first delivery, +1 on every redelivery or retake after a nack."""
    deadline: float
    """Visibility deadline, epoch seconds on the Redis server clock."""
    enqueued_at: float
    """When the id entered the queue (server clock)."""
    taken_at: float


@dataclass(frozen=True)
class DLQEntry:
    thread_id: str
    reason: str
    error: str
    attempts: int
    count: int
    """How many times this id was dead-lettered."""
    first_at: float
    last_at: float


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _full_error(max_size: int) -> str:
    return f"recovery queue reached its cap of {max_size} waiting runs"


class DeadLetterQueue:
    """Runs the system gave up on, kept with the reason until an operator requeues or purges them.

    ``config`` defaults to the settings; ``requeue`` honours its ``max_size``, so build the DLQ with the same
    config as the ``QueueGuard``.
    """

    def __init__(self, redis: Redis, *, config: QueueConfig | None = None) -> None:
        settings = get_settings()
        self.config = config or QueueConfig.from_settings(settings)
        self.prefix = settings.key_prefix
        self.keys = _Keys.for_prefix(self.prefix)
        self._redis = redis

    async def send_to_dlq(self, thread_id: str, reason: str, error: str, attempts: int = 0) -> None:
        """Dead-letter an id (taking it out of the queue if it waits there). A second time updates the entry:
        reason, error, attempts and ``last_at`` change, ``count`` goes up, ``first_at`` stays."""
        with redis_errors(f"dead-lettering {thread_id!r}"):
            await _SEND_TO_DLQ(self._redis, keys=self.keys.all(), args=[thread_id, reason, error, attempts])
        logger.error("run %s dead-lettered (%s): %s", thread_id, reason, error)

    async def list(self) -> list[DLQEntry]:
        """Every entry, first dead-lettered first."""
        with redis_errors("listing the DLQ"):
            raw = await self._redis.hgetall(self.keys.dlq)
        entries = [_entry(json.loads(value)) for value in raw.values()]
        return sorted(entries, key=lambda e: (e.first_at, e.thread_id))

    async def get(self, thread_id: str) -> DLQEntry | None:
        with redis_errors(f"reading DLQ entry {thread_id!r}"):
            raw = await self._redis.hget(self.keys.dlq, thread_id)
        return None if raw is None else _entry(json.loads(raw))

    async def requeue(self, thread_id: str) -> bool:
        """Move an id from the DLQ back into the recovery queue, within the cap.

        False if the id is not in the DLQ or the queue is full (it then stays in the DLQ, unchanged). A
        ``dead_lettered`` run record becomes ``pending`` again with its attempts reset.
        """
        outcome, _depth = await self._requeue(thread_id)
        return outcome in ("queued", "duplicate")

    async def requeue_all(self) -> int:
        """Requeue entries oldest first until the DLQ is empty or the queue is full; returns how many moved."""
        with redis_errors("listing the DLQ"):
            ids = [text(member) for member in await self._redis.zrange(self.keys.dlq_index, 0, -1)]
        moved = 0
        for thread_id in ids:
            outcome, _depth = await self._requeue(thread_id)
            if outcome == "full":
                break
            if outcome in ("queued", "duplicate"):
                moved += 1
        return moved

    async def purge(self) -> int:
        """Drop every entry; returns how many there were. The run records are left as they are."""
        with redis_errors("purging the DLQ"):
            return int(await _PURGE(self._redis, keys=self.keys.all()))

    async def depth(self) -> int:
        with redis_errors("measuring the DLQ"):
            return int(await self._redis.hlen(self.keys.dlq))

    async def _requeue(self, thread_id: str) -> tuple[str, int]:
        with redis_errors(f"requeueing {thread_id!r}"):
            outcome, depth = await _REQUEUE(
                self._redis,
                keys=[
                    *self.keys.all(),
                    run_key(thread_id, prefix=self.prefix),
                    active_index_key(prefix=self.prefix),
                ],
                args=[thread_id, self.config.max_size, _full_error(self.config.max_size)],
            )
        return text(outcome), int(depth)


def _entry(data: dict[str, Any]) -> DLQEntry:
    return DLQEntry(
        thread_id=str(data["thread_id"]),
        reason=str(data.get("reason", "")),
        error=str(data.get("error", "")),
        attempts=int(data.get("attempts", 0)),
        count=int(data.get("count", 1)),
        first_at=int(data["first_at"]) / 1000.0,
        last_at=int(data["last_at"]) / 1000.0,
    )


class QueueGuard:
    """The producer side: admits ids into the bounded queue, or into the DLQ when it is full.

    ``max_size``/``warn_threshold`` override the DLQ's config (which defaults to the settings).
    """

    def __init__(
        self,
        redis: Redis,
        dlq: DeadLetterQueue,
        *,
        max_size: int | None = None,
        warn_threshold: float | None = None,
    ) -> None:
        config = dlq.config
        if max_size is not None:
            config = replace(config, max_size=max_size)
        if warn_threshold is not None:
            config = replace(config, warn_threshold=warn_threshold)
        self.config = config
        self.dlq = dlq
        self.keys = dlq.keys
        self._prefix = dlq.prefix
        self._redis = redis
        self._full_error = _full_error(config.max_size)

    async def safe_enqueue(self, thread_id: str) -> bool:
        """Queue a run for recovery. True when it is in the queue (newly or already); False when it went to (or
        already sits in) the DLQ. The depth check, the dedup and the push (or the dead-lettering) are one script."""
        return (await self.enqueue(thread_id)).outcome.accepted

    async def enqueue(self, thread_id: str) -> EnqueueResult:
        """``safe_enqueue`` with the details: outcome and depth."""
        with redis_errors(f"enqueueing {thread_id!r}"):
            outcome, depth = await _ENQUEUE(
                self._redis, keys=self.keys.all(), args=[self.config.max_size, self._full_error, thread_id]
            )
        result = EnqueueResult(thread_id, EnqueueOutcome(text(outcome)), int(depth))
        self._report(result)
        return result

    async def enqueue_orphans(self, thread_ids: Sequence[str]) -> list[EnqueueResult]:
        """Claim and enqueue runs that are still orphans, atomically per batch (used by the orphan scanner).

        A run is an orphan when its lease expired, it is not final and it was not already handed to the queue
        since its last lease; anything else comes back ``NOT_ORPHAN``. Claiming and enqueueing in one script means
        any number of scanners enqueue each orphan once, and a scanner killed mid-scan loses nothing.
        """
        if not thread_ids:
            return []
        runs = [run_key(thread_id, prefix=self._prefix) for thread_id in thread_ids]
        with redis_errors("enqueueing orphaned runs"):
            flat = await _ENQUEUE_ORPHANS(
                self._redis,
                keys=[*self.keys.all(), active_index_key(prefix=self._prefix), *runs],
                args=[self.config.max_size, self._full_error, *thread_ids],
            )
        results = [
            EnqueueResult(text(flat[i]), EnqueueOutcome(text(flat[i + 1])), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]
        for result in results:
            self._report(result)
        return results

    def _report(self, result: EnqueueResult) -> None:
        if result.outcome is EnqueueOutcome.DEAD_LETTERED:
            logger.error(
                "recovery queue full (%d/%d): run %s sent to the DLQ (queue_full)",
                result.depth,
                self.config.max_size,
                result.thread_id,
            )
        elif result.outcome is EnqueueOutcome.IN_DLQ:
            logger.warning("run %s is in the DLQ; not enqueued (requeue it from the DLQ)", result.thread_id)
        elif (
            result.outcome is EnqueueOutcome.QUEUED
            and result.depth >= self.config.warn_threshold * self.config.max_size
        ):
            logger.warning(
                "recovery queue at %.0f%% of capacity (%d/%d)",
                100 * result.depth / self.config.max_size,
                result.depth,
                self.config.max_size,
            )


class RecoveryQueue:
    """The consumer side: reliable take/ack with visibility timeouts and redelivery, plus the health stats.

    ``dlq`` supplies the keys and default config; ``visibility_timeout``/``max_deliveries`` override it.
    ``clock``/``sleep`` drive ``take``'s polling (never a blocking Redis command: a half-dead connection would
    hang it).
    """

    def __init__(
        self,
        redis: Redis,
        dlq: DeadLetterQueue | None = None,
        *,
        visibility_timeout: float | None = None,
        max_deliveries: int | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        dlq = dlq or DeadLetterQueue(redis)
        config = dlq.config
        if visibility_timeout is not None:
            config = replace(config, visibility_timeout_s=visibility_timeout)
        if max_deliveries is not None:
            config = replace(config, max_deliveries=max_deliveries)
        self.config = config
        self.dlq = dlq
        self.keys = dlq.keys
        self._redis = redis
        self._clock = clock
        self._sleep = sleep

    async def take(self, consumer_id: str, *, wait: float = 0.0, poll_interval: float = 0.05) -> Delivery | None:
        """The next id to recover, now invisible to others until ``ack`` or the visibility deadline.

        Redeliveries (deadline passed) come first, then due nacked ids, then the waiting list in FIFO order.
        Waits up to ``wait`` seconds, polling every ``poll_interval``; ``None`` if nothing came.
        """
        deadline = self._clock() + wait
        while True:
            with redis_errors("taking from the recovery queue"):
                row = await _TAKE(
                    self._redis,
                    keys=self.keys.all(),
                    args=[consumer_id, _ms(self.config.visibility_timeout_s), self.config.max_deliveries],
                )
            if row:
                thread_id, attempts, visible_at, enqueued_at, now = row
                return Delivery(
                    thread_id=text(thread_id),
                    consumer_id=consumer_id,
                    attempts=int(attempts),
                    deadline=int(visible_at) / 1000.0,
                    enqueued_at=int(enqueued_at) / 1000.0,
                    taken_at=int(now) / 1000.0,
                )
            remaining = deadline - self._clock()
            if remaining <= 0:
                return None
            await self._sleep(min(poll_interval, remaining))

    async def ack(self, delivery: Delivery, outcome: AckOutcome | str = AckOutcome.RECOVERED) -> bool:
        """Done with it for good. False if the delivery was superseded (redelivered to someone else)."""
        outcome = AckOutcome(outcome)
        return await self._call(_ACK, "acking", delivery, outcome.value) == 1

    async def nack(self, delivery: Delivery, delay: float = 0.0) -> bool:
        """Give it back, to be taken again after ``delay`` seconds (counts as a delivery when retaken)."""
        return await self._call(_NACK, "nacking", delivery, _ms(delay)) == 1

    release = nack

    async def extend(self, delivery: Delivery, visibility_timeout: float | None = None) -> bool:
        """Heartbeat for long work: push the visibility deadline ``visibility_timeout`` (default the config's)
        ahead of now. False if the delivery was superseded."""
        seconds = self.config.visibility_timeout_s if visibility_timeout is None else visibility_timeout
        return await self._call(_EXTEND, "extending", delivery, _ms(seconds)) > 0

    async def dead_letter(self, delivery: Delivery, reason: str, error: str) -> bool:
        """Move the delivered id to the DLQ (with its delivery count) instead of acking it; one atomic step."""
        moved = await self._call(_DEAD_LETTER_DELIVERY, "dead-lettering", delivery, reason, error) == 1
        if moved:
            logger.error("run %s dead-lettered (%s): %s", delivery.thread_id, reason, error)
        return moved

    async def stats(self) -> dict[str, int | float]:
        """Numbers for ``GET /health/queue``: ``depth``, ``max_size``, ``dlq_depth``, ``oldest_age_s``,
        ``in_flight``, ``delayed``, and the shared counters ``enqueued_total``, ``recovered_total``,
        ``skipped_total``, ``redelivered_total``, ``dead_lettered_total``."""
        with redis_errors("reading recovery queue stats"):
            raw = await _STATS(self._redis, keys=self.keys.all())
        data = json.loads(raw)
        result: dict[str, int | float] = {
            "depth": int(data["depth"]),
            "max_size": self.config.max_size,
            "dlq_depth": int(data["dlq_depth"]),
            "oldest_age_s": max(0, int(data["oldest_age_ms"])) / 1000.0,
            "in_flight": int(data["in_flight"]),
            "delayed": int(data["delayed"]),
        }
        for counter in (
            "enqueued_total",
            "recovered_total",
            "skipped_total",
            "redelivered_total",
            "dead_lettered_total",
        ):
            result[counter] = int(data.get(counter, 0))
        return result

    async def _call(self, script: RedisScript, action: str, delivery: Delivery, *extra: str | int) -> int:
        with redis_errors(f"{action} {delivery.thread_id!r}"):
            result = await script(
                self._redis,
                keys=self.keys.all(),
                args=[delivery.thread_id, delivery.attempts, delivery.consumer_id, *extra],
            )
        return int(result)
