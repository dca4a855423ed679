"""Run records and fenced run leases in Redis.

A run is one execution of a graph for one thread id (a booking). Its record is a hash
``<prefix>:{recovery}:run:<thread_id>`` with the fields

    thread_id, graph, version (the graph's fingerprint, ``runs.versions``), input (JSON), owner, status, attempts,
    fence, created_at, updated_at, last_error, lease_until (ms, Redis server clock), claimed ("1" once the orphan
    scanner handed it to the queue)

Exactly one process may work on a run at a time: the one holding its lease. A lease is the pair (owner, fence)
plus an expiry on the *Redis server clock* (``TIME`` inside the scripts), so processes with skewed clocks agree on
when it ran out. Every acquisition increments ``fence``; a write carrying an older fence is refused, which stops a
paused-then-woken owner from overwriting the work of the process that took over.

Non-final runs are listed in the ZSET ``<prefix>:{recovery}:runs:active`` (thread id → lease expiry in ms) so the
orphan scanner reads expired leases with one range query instead of scanning the keyspace. A run the scanner has
handed to the recovery queue is scored ``+inf`` there until someone takes its lease again, so it is never handed
over twice for the same expiry. Parked runs are listed in the ZSET ``<prefix>:{recovery}:runs:waiting`` (thread id
→ when the wait ends, ms) from their park to their decision (or final status), so a sweeper finds ended waits with
one range query too (``due_waits``). A run no process here can resume (its graph version is gone) is
``awaiting_version``: out of the active index, listed in ``runs:awaiting`` (all of them) and ``runs:awaiting:<version>``
(what a process that runs that version wakes, ``wake``). Everything lives under the ``{recovery}`` hash tag: the queue's scripts touch
run records and queue keys together, which Redis Cluster allows only within one slot.

With presence on (``PRESENCE_ENABLED``, ``runs.presence``) a run taken by a registered, live process is *held* by
it: ``lease_until`` is ``HELD_MS``, the run is listed in its instance's SET, and nothing renews it; the process's one
instance lease and its named connection stand for all its runs, and the presence sweep ends the hold (``lease_until``
= now, as an expiry would) when the process is gone. The fence per acquisition is unchanged. Each process also
audits its own holds (``runs.audit``): a run it holds but no longer works on (its release met an outage) is released
the same way; ``runs.in_use`` is how the process knows which runs it works on.

Decisions worth knowing:

- ``create`` on an existing thread id changes nothing and returns ``None`` (a retried POST must not reset a run);
- a lease that expired but was not taken by anyone is still owned: ``renew`` revives it, ``ensure_owned`` passes.
  Fencing keeps this safe, and it spares a run that merely stalled past its TTL from a pointless hand-over;
- ``release`` ends the lease at once and sets the status back to ``pending``: the next scan recovers it;
- final statuses (``done``, ``failed``, ``dead_lettered``) end the lease, leave the active index, and never change
  again (except a dead-letter ``requeue``, which revives ``dead_lettered`` runs). ``done``/``failed`` records
  expire after ``retention_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from redis.asyncio import Redis

from infra.redis import RedisScript, key, text
from infra.settings import get_settings
from runs.errors import LeaseLostError, RunFinalError, RunNotFoundError, redis_errors
from runs.in_use import LeasesInUse, leases_in_use

logger = logging.getLogger(__name__)

RECOVERY_TAG = "{recovery}"
"""Redis Cluster hash tag shared by every recovery key (see the module docstring)."""

DEFAULT_RETENTION_S = 7 * 24 * 3600.0

Sleep = Callable[[float], Awaitable[object]]


class RunStatus(StrEnum):
    PENDING = "pending"
    """Accepted, nobody working on it (created, or released for recovery)."""
    RUNNING = "running"
    """A lease holder took responsibility for it."""
    PARKED = "parked"
    """Stopped at an ``interrupt()`` waiting for a person (a concierge approval): nobody holds it, no scan recovers
    it; ``RunStore.decide`` records the answer and takes it up again (``RunRecord.waiting`` says what it waits for)."""
    AWAITING_VERSION = "awaiting_version"
    """Its graph version is one no process here runs (a deploy changed the shape): nobody holds it, no scan recovers
    it; a process that runs that version takes it up again (``RunStore.wake``). Never resumed on another graph."""
    DONE = "done"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"

    @property
    def is_final(self) -> bool:
        return self in FINAL_RUN_STATUSES


FINAL_RUN_STATUSES = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.DEAD_LETTERED})


def run_key(thread_id: str, *, prefix: str | None = None) -> str:
    return key(RECOVERY_TAG, "run", thread_id, prefix=prefix)


def active_index_key(*, prefix: str | None = None) -> str:
    return key(RECOVERY_TAG, "runs", "active", prefix=prefix)


def waiting_index_key(*, prefix: str | None = None) -> str:
    """ZSET thread id → ``waiting_until`` (ms) of every parked run: what the approval sweeper reads."""
    return key(RECOVERY_TAG, "runs", "waiting", prefix=prefix)


def awaiting_index_key(*, prefix: str | None = None) -> str:
    """ZSET thread id → when it was set aside (ms) of every ``awaiting_version`` run: what status and verify list."""
    return key(RECOVERY_TAG, "runs", "awaiting", prefix=prefix)


def awaiting_version_key(version: str, *, prefix: str | None = None) -> str:
    """SET of the ``awaiting_version`` runs of one graph version: what a process that runs it wakes."""
    return key(RECOVERY_TAG, "runs", "awaiting", version, prefix=prefix)


HELD_MS = 2**53 - 1
"""``lease_until`` (and active-index score) of a run held by its owner's presence (``runs.presence``): later than
any clock, so nothing comparing lease expiries sees it expire; only the presence sweep ends it."""


def instances_key(*, prefix: str | None = None) -> str:
    """ZSET instance id → instance lease expiry (ms): the registered, live processes (``runs.presence``)."""
    return key(RECOVERY_TAG, "instances", prefix=prefix)


def instance_runs_key(instance: str, *, prefix: str | None = None) -> str:
    """SET of the runs an instance holds by its presence."""
    return key(RECOVERY_TAG, "instance", instance, "runs", prefix=prefix)


def instance_name(instance: str) -> str:
    """``instance`` as a valid ``CLIENT SETNAME`` name (no whitespace): the name of its presence connection and the
    owner it writes on runs, which must be the same string."""
    return re.sub(r"\s+", "_", instance.strip()) or "unnamed"


@dataclass(frozen=True)
class RunRecord:
    thread_id: str
    graph: str
    input: dict[str, Any]
    owner: str | None
    """The lease holder, or ``None`` once released or final. An expired, untaken lease still names its owner."""
    status: RunStatus
    attempts: int
    fence: int
    created_at: float
    """Epoch seconds on the Redis server clock, like every timestamp here."""
    updated_at: float
    last_error: str | None
    lease_expires_at: float | None
    """When the current lease runs out; ``None`` for final runs and runs held by their owner's presence."""
    held: bool = False
    """Held by its owner's presence (``runs.presence``): it ends when that process is gone, not at a set time."""
    hold_ended: str | None = None
    """Why the owner's own audit ended its hold (``runs.audit``), until the next owner takes it."""
    turn: str | None = None
    """The caller's name for this run of the thread (``RunStore.begin``: a chat's turn id)."""
    waiting: dict[str, Any] | None = None
    """A ``parked`` run's interrupt payload (what it waits for)."""
    waiting_until: float | None = None
    """When a ``parked`` run's wait expires (epoch seconds, Redis server clock)."""
    resume: Any = None
    """The answer a decided wait resumes with (``Command(resume=...)``) until the next run of the thread begins."""
    version: str | None = None
    """The fingerprint of the graph the run started on (``runs.versions``); ``None`` on records older than that."""

    @property
    def is_final(self) -> bool:
        return self.status.is_final


@dataclass(frozen=True)
class ActiveRun:
    thread_id: str
    lease_expires_at: float | None
    """``None`` while the run sits with the recovery queue (handed over by the scanner, not yet taken), or is held."""
    held: bool = False
    """Held by its owner's presence: no expiry of its own."""


# Shared Lua helpers. Timestamps are integer milliseconds from the server's TIME.
# A run's holder is listed in its instance's SET (``instance_runs_key``); the scripts that end or move a hold build
# that key from ``runs_of_prefix`` (ARGV) and the owner they read: every such key is under the {recovery} tag too.
_LUA_PRELUDE = (
    """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local FINAL = {done = true, failed = true, dead_lettered = true}
"""
    + f"local HELD = '{HELD_MS}'\n"
    + """
-- the lease expiry a new holder gets: HELD while its presence is registered and live, else a TTL lease
local function expiry_for(instances, owner, presence, ttl_ms, now)
  if presence == '1' and (tonumber(redis.call('ZSCORE', instances, owner)) or 0) > now then return HELD end
  return now + tonumber(ttl_ms)
end
local function drop_hold(runs_of_prefix, owner, id)
  if owner and owner ~= '' then redis.call('SREM', runs_of_prefix .. owner .. ':runs', id) end
end
local function take_hold(runs_of_prefix, owner, id, expiry)
  if expiry == HELD then redis.call('SADD', runs_of_prefix .. owner .. ':runs', id) end
end
"""
)

# KEYS: run, active, instances | ARGV: thread_id, graph, input, owner, ttl_ms, presence, runs_of_prefix, version
# → 0 exists, 1 created with a TTL lease, 2 created held by the owner's presence
_CREATE = RedisScript(
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local now = now_ms()
local expiry = expiry_for(KEYS[3], ARGV[4], ARGV[6], ARGV[5], now)
redis.call('HSET', KEYS[1], 'thread_id', ARGV[1], 'graph', ARGV[2], 'input', ARGV[3], 'owner', ARGV[4],
  'status', 'running', 'attempts', 0, 'fence', 1, 'created_at', now, 'updated_at', now, 'last_error', '',
  'lease_until', expiry)
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'version', ARGV[8]) end
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
take_hold(ARGV[7], ARGV[4], ARGV[1], expiry)
if expiry == HELD then return 2 end
return 1
"""
)

# KEYS: run, active, instances | ARGV: thread_id, owner, ttl_ms, presence, runs_of_prefix
# → {new fence, 1 if held by presence}; {0, 0} held or final; {-1, 0} no such run
_ACQUIRE = RedisScript(
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local status, lease_until, previous = unpack(redis.call('HMGET', KEYS[1], 'status', 'lease_until', 'owner'))
if FINAL[status] or status == 'parked' or status == 'awaiting_version' then return {0, 0} end
local now = now_ms()
if (tonumber(lease_until) or 0) > now then return {0, 0} end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local expiry = expiry_for(KEYS[3], ARGV[2], ARGV[4], ARGV[3], now)
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'status', 'running', 'lease_until', expiry, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'claimed', 'hold_ended')
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
drop_hold(ARGV[5], previous, ARGV[1])
take_hold(ARGV[5], ARGV[2], ARGV[1], expiry)
if expiry == HELD then return {fence, 1} end
return {fence, 0}
"""
)

# KEYS: run, active | ARGV: thread_id, owner, fence, ttl_ms → 1 renewed, 0 lost
_RENEW = RedisScript(
    _LUA_PRELUDE
    + """
local owner, fence, status = unpack(redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status'))
if owner ~= ARGV[2] or fence ~= ARGV[3] or FINAL[status] then return 0 end
local expiry = now_ms() + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'lease_until', expiry)
-- a renewal after an expiry starts a new lease period: if it lapses again the scanner must look again
redis.call('HDEL', KEYS[1], 'claimed')
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
return 1
"""
)

# KEYS: run, active | ARGV: thread_id, owner, fence, runs_of_prefix → 1 released, 0 not ours
_RELEASE = RedisScript(
    _LUA_PRELUDE
    + """
local owner, fence, status = unpack(redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status'))
if owner ~= ARGV[2] or fence ~= ARGV[3] or FINAL[status] then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], 'owner', '', 'status', 'pending', 'lease_until', now, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'claimed')
redis.call('ZADD', KEYS[2], now, ARGV[1])
drop_hold(ARGV[4], owner, ARGV[1])
return 1
"""
)

# KEYS: run, active, waiting, awaiting | ARGV: thread_id, status, fence ('' = unfenced), error, has_error ('1'/'0'), retention_ms,
# runs_of_prefix → 1 written, -1 no run, -2 stale fence, -3 already final (with another status); final status returned
# as 2nd
_SET_STATUS = RedisScript(
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, ''} end
local fence, current, owner = unpack(redis.call('HMGET', KEYS[1], 'fence', 'status', 'owner'))
if ARGV[3] ~= '' and fence ~= ARGV[3] then return {-2, fence} end
if FINAL[current] then
  if current == ARGV[2] then return {1, current} end
  return {-3, current}
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'updated_at', now)
if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'last_error', ARGV[4]) end
if FINAL[ARGV[2]] then
  redis.call('HSET', KEYS[1], 'owner', '', 'lease_until', now)
  redis.call('HDEL', KEYS[1], 'claimed')
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  drop_hold(ARGV[7], owner, ARGV[1])
  local retention = tonumber(ARGV[6])
  if ARGV[2] ~= 'dead_lettered' and retention > 0 then redis.call('PEXPIRE', KEYS[1], retention) end
end
return {1, ARGV[2]}
"""
)

# KEYS: run | ARGV: fence ('' = unfenced) → new count, -1 no run, -2 stale fence
_INCREMENT_ATTEMPTS = RedisScript(
    _LUA_PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then return -2 end
redis.call('HSET', KEYS[1], 'updated_at', now_ms())
return redis.call('HINCRBY', KEYS[1], 'attempts', ARGV[2])
"""
)


# KEYS: run, active, instances, waiting | ARGV: thread_id, graph, input, owner, ttl_ms, presence, runs_of_prefix,
# client_key ('' = none), turn, version → {1 started (fence), held} | {0, status} busy | {-1, turn} a repeat of client_key's
# turn. A thread's next run (a chat's next turn): starts when there is no run or the last one is final, like ``create``.
_BEGIN = RedisScript(
    _LUA_PRELUDE
    + """
if ARGV[8] ~= '' then
  local turn = redis.call('HGET', KEYS[1], 'key:' .. ARGV[8])
  if turn then return {-1, turn} end
end
local status = redis.call('HGET', KEYS[1], 'status')
if status and not FINAL[status] then return {0, status} end
local now = now_ms()
local expiry = expiry_for(KEYS[3], ARGV[4], ARGV[6], ARGV[5], now)
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], 'thread_id', ARGV[1], 'graph', ARGV[2], 'input', ARGV[3], 'owner', ARGV[4],
  'status', 'running', 'attempts', 0, 'updated_at', now, 'last_error', '', 'lease_until', expiry, 'turn', ARGV[9])
redis.call('HSETNX', KEYS[1], 'created_at', now)
redis.call('HDEL', KEYS[1], 'claimed', 'hold_ended', 'waiting', 'waiting_id', 'waiting_until', 'resume')
if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'key:' .. ARGV[8], ARGV[9]) end
if ARGV[10] ~= '' then redis.call('HSET', KEYS[1], 'version', ARGV[10]) else redis.call('HDEL', KEYS[1], 'version') end
redis.call('PERSIST', KEYS[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
take_hold(ARGV[7], ARGV[4], ARGV[1], expiry)
if expiry == HELD then return {fence, 1} end
return {fence, 0}
"""
)

# KEYS: run, active, waiting | ARGV: thread_id, owner, fence, runs_of_prefix, waiting (JSON), waiting_id,
# waiting_until_ms → 1 parked (and listed in the waiting index), 0 not ours
_PARK = RedisScript(
    _LUA_PRELUDE
    + """
local owner, fence, status = unpack(redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status'))
if owner ~= ARGV[2] or fence ~= ARGV[3] or FINAL[status] then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], 'owner', '', 'status', 'parked', 'lease_until', now, 'updated_at', now,
  'waiting', ARGV[5], 'waiting_id', ARGV[6], 'waiting_until', ARGV[7])
redis.call('HDEL', KEYS[1], 'claimed', 'resume')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
drop_hold(ARGV[4], owner, ARGV[1])
return 1
"""
)

# KEYS: run, active, instances, waiting | ARGV: thread_id, waiting_id, answer (JSON), expired answer (JSON), owner,
# ttl_ms, presence, runs_of_prefix → {fence, held, answer, 1 if expired} taken up with this answer | {0, 0, answer,
# expired} decided before (the first answer stands) | {-1, 0, '', 0} no such wait. The first answer wins: it is recorded
# and the run is taken up in one step, so two racing answers resume it once.
_DECIDE = RedisScript(
    _LUA_PRELUDE
    + """
local decided = redis.call('HGET', KEYS[1], 'decided:' .. ARGV[2])
if decided then
  return {0, 0, decided, tonumber(redis.call('HGET', KEYS[1], 'expired:' .. ARGV[2]) or '0')}
end
local status, waiting_id, waiting_until, previous =
  unpack(redis.call('HMGET', KEYS[1], 'status', 'waiting_id', 'waiting_until', 'owner'))
if status ~= 'parked' or waiting_id ~= ARGV[2] then return {-1, 0, '', 0} end
local now = now_ms()
local answer, expired = ARGV[3], 0
if now > (tonumber(waiting_until) or 0) then answer, expired = ARGV[4], 1 end
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local expiry = expiry_for(KEYS[3], ARGV[5], ARGV[7], ARGV[6], now)
redis.call('HSET', KEYS[1], 'decided:' .. ARGV[2], answer, 'expired:' .. ARGV[2], expired, 'resume', answer,
  'owner', ARGV[5], 'status', 'running', 'lease_until', expiry, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'waiting', 'waiting_id', 'waiting_until', 'claimed', 'hold_ended')
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
take_hold(ARGV[8], ARGV[5], ARGV[1], expiry)
if expiry == HELD then return {fence, 1, answer, expired} end
return {fence, 0, answer, expired}
"""
)

# KEYS: waiting | ARGV: limit → thread ids whose wait ended by the server clock (``now > waiting_until``, as in
# ``_DECIDE``), soonest first
_DUE_WAITS = RedisScript(
    _LUA_PRELUDE
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms() - 1, 'LIMIT', 0, tonumber(ARGV[1]))
"""
)

# KEYS: run, waiting | ARGV: thread_id → 1 dropped from the waiting index, 0 left (the run is parked)
_FORGET_WAIT = RedisScript("""
if redis.call('HGET', KEYS[1], 'status') == 'parked' then return 0 end
return redis.call('ZREM', KEYS[2], ARGV[1])
""")


# KEYS: run, active, awaiting, awaiting:<version> | ARGV: thread_id, owner, fence, runs_of_prefix, version
# → 1 set aside, 0 not ours. The lease ends and the run leaves the active index: no scan hands it to a process that
# would resume it on another graph.
_SET_ASIDE = RedisScript(
    _LUA_PRELUDE
    + """
local owner, fence, status = unpack(redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status'))
if owner ~= ARGV[2] or fence ~= ARGV[3] or FINAL[status] then return 0 end
local now = now_ms()
redis.call('HSET', KEYS[1], 'owner', '', 'status', 'awaiting_version', 'version', ARGV[5], 'lease_until', now,
  'updated_at', now)
redis.call('HDEL', KEYS[1], 'claimed')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
drop_hold(ARGV[4], owner, ARGV[1])
return 1
"""
)

# KEYS: run, active, instances, awaiting, awaiting:<version> | ARGV: thread_id, owner, ttl_ms, presence,
# runs_of_prefix, version → {fence, held} taken up | {0, 0} not awaiting this version (its entry is dropped)
_WAKE = RedisScript(
    _LUA_PRELUDE
    + """
local status, version = unpack(redis.call('HMGET', KEYS[1], 'status', 'version'))
if status ~= 'awaiting_version' or version ~= ARGV[6] then
  redis.call('SREM', KEYS[5], ARGV[1])
  if status ~= 'awaiting_version' then redis.call('ZREM', KEYS[4], ARGV[1]) end
  return {0, 0}
end
local now = now_ms()
local fence = redis.call('HINCRBY', KEYS[1], 'fence', 1)
local expiry = expiry_for(KEYS[3], ARGV[2], ARGV[4], ARGV[3], now)
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'status', 'running', 'lease_until', expiry, 'updated_at', now)
redis.call('HDEL', KEYS[1], 'claimed', 'hold_ended')
redis.call('ZADD', KEYS[2], expiry, ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
take_hold(ARGV[5], ARGV[2], ARGV[1], expiry)
if expiry == HELD then return {fence, 1} end
return {fence, 0}
"""
)


# KEYS: run | ARGV: owner, fence, version → 1 written, 0 not ours (a migrated run takes its new version)
_SET_VERSION = RedisScript(
    _LUA_PRELUDE
    + """
local owner, fence, status = unpack(redis.call('HMGET', KEYS[1], 'owner', 'fence', 'status'))
if owner ~= ARGV[1] or fence ~= ARGV[2] or FINAL[status] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[3], 'updated_at', now_ms())
return 1
"""
)


@dataclass(frozen=True)
class Begun:
    """What ``RunStore.begin`` did: started a run (``lease``), found the thread busy (``busy``: its status), or found
    the run a client key already started (``repeat``: that run's turn)."""

    lease: RunLease | None = None
    busy: RunStatus | None = None
    repeat: str | None = None


@dataclass(frozen=True)
class Decision:
    """What ``RunStore.decide`` did: ``answer`` is the one that stands (the first); ``lease`` is set only for the
    call that recorded it (it resumes the run); ``expired``: the wait had run out, ``answer`` is the expired one."""

    answer: Any
    expired: bool
    lease: RunLease | None


def _seconds(ms: str | None) -> float:
    return int(ms or 0) / 1000.0


class RunStore:
    """Run records and their leases.

    ``ttl`` (seconds, default ``RUN_LEASE_TTL``) is the lease length; ``retention_s`` how long ``done``/``failed``
    records stay readable after they end (``None`` keeps them). ``sleep`` is what heartbeats wait with.
    ``presence`` (default ``PRESENCE_ENABLED``): a run taken by an owner whose presence is registered is held by it
    (no per-run renewal, see ``runs.presence``); otherwise, or for an unregistered owner, it gets a TTL lease.
    Every lease taken is registered in ``in_use`` (default: the process's ``runs.in_use.leases_in_use``), which the
    owner's presence audit reads.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        ttl: float | None = None,
        retention_s: float | None = DEFAULT_RETENTION_S,
        sleep: Sleep = asyncio.sleep,
        presence: bool | None = None,
        in_use: LeasesInUse | None = None,
    ) -> None:
        settings = get_settings()
        self.presence = settings.presence_enabled if presence is None else presence
        self.in_use = leases_in_use if in_use is None else in_use
        self.ttl = float(ttl if ttl is not None else settings.run_lease_ttl_s)
        if self.ttl <= 0:
            raise ValueError(f"lease ttl must be positive, got {self.ttl!r}")
        self._ttl_ms = max(1, round(self.ttl * 1000))
        self._retention_ms = 0 if retention_s is None else max(1, round(retention_s * 1000))
        self._redis = redis
        self._prefix = settings.key_prefix
        self.sleep = sleep
        self.index_key = active_index_key(prefix=self._prefix)
        self.waiting_key = waiting_index_key(prefix=self._prefix)
        self.awaiting_key = awaiting_index_key(prefix=self._prefix)
        self.instances_key = instances_key(prefix=self._prefix)
        # instance_runs_key(owner) is this + owner + ":runs", built by the scripts from the owner they read
        self._runs_of_prefix = instance_runs_key("", prefix=self._prefix).removesuffix(":runs")
        self._presence_arg = "1" if self.presence else "0"

    @property
    def prefix(self) -> str:
        return self._prefix

    def run_key(self, thread_id: str) -> str:
        return run_key(thread_id, prefix=self._prefix)

    async def create(
        self, thread_id: str, graph: str, input: Mapping[str, Any], owner: str, *, version: str | None = None
    ) -> RunLease | None:
        """Record a new run of ``version`` of ``graph`` and take its lease (fence 1) in one step; ``None`` if the
        thread id already exists."""
        payload = json.dumps(dict(input), separators=(",", ":"))
        with self.in_use.expecting(owner, thread_id), redis_errors(f"creating run {thread_id!r}"):
            created = await _CREATE(
                self._redis,
                keys=[self.run_key(thread_id), self.index_key, self.instances_key],
                args=[
                    thread_id,
                    graph,
                    payload,
                    owner,
                    self._ttl_ms,
                    self._presence_arg,
                    self._runs_of_prefix,
                    version or "",
                ],
                durable=True,  # a run a failover forgot would never finish: on a replica before the 202
            )
            return self._track(RunLease(self, thread_id, owner, 1, held=created == 2)) if created else None

    async def begin(
        self,
        thread_id: str,
        graph: str,
        input: Mapping[str, Any],
        owner: str,
        *,
        turn: str,
        client_key: str | None = None,
        version: str | None = None,
    ) -> Begun:
        """Start the thread's next run (a chat's next turn) and take its lease, unless one is not final yet.

        ``turn`` names the run; ``client_key`` (a request's ``Idempotency-Key``) binds to it, and a repeat of the
        key returns the turn it started (whatever became of it) instead of starting another.
        """
        payload = json.dumps(dict(input), separators=(",", ":"))
        with self.in_use.expecting(owner, thread_id), redis_errors(f"beginning a run of {thread_id!r}"):
            code, detail = await _BEGIN(
                self._redis,
                keys=[self.run_key(thread_id), self.index_key, self.instances_key, self.waiting_key],
                args=[
                    thread_id,
                    graph,
                    payload,
                    owner,
                    self._ttl_ms,
                    self._presence_arg,
                    self._runs_of_prefix,
                    client_key or "",
                    turn,
                    version or "",
                ],
                durable=True,  # accepted before the 202: a failover must not forget it
            )
            if int(code) == -1:
                return Begun(repeat=text(detail))
            if int(code) == 0:
                return Begun(busy=RunStatus(text(detail)))
            return Begun(lease=self._track(RunLease(self, thread_id, owner, int(code), held=int(detail) == 1)))

    async def decide(self, thread_id: str, waiting_id: str, answer: Any, expired: Any, owner: str) -> Decision | None:
        """Answer a ``parked`` run's wait: the first answer is recorded and takes the run up (``Decision.lease``);
        a later one gets the first back without a lease. After ``waiting_until`` the recorded answer is ``expired``
        instead. ``None``: the run waits for no such thing (and never did)."""
        with self.in_use.expecting(owner, thread_id), redis_errors(f"deciding {waiting_id!r} of run {thread_id!r}"):
            fence, held, stored, was_expired = await _DECIDE(
                self._redis,
                keys=[self.run_key(thread_id), self.index_key, self.instances_key, self.waiting_key],
                args=[
                    thread_id,
                    waiting_id,
                    json.dumps(answer, separators=(",", ":")),
                    json.dumps(expired, separators=(",", ":")),
                    owner,
                    self._ttl_ms,
                    self._presence_arg,
                    self._runs_of_prefix,
                ],
                durable=True,  # the decision is durable before the 202
            )
            if int(fence) < 0:
                return None
            lease = None
            if int(fence) > 0:
                lease = self._track(RunLease(self, thread_id, owner, int(fence), held=int(held) == 1))
            return Decision(answer=json.loads(text(stored)), expired=int(was_expired) == 1, lease=lease)

    async def due_waits(self, limit: int = 100) -> list[str]:
        """Parked runs whose wait has ended by the Redis server clock (the one ``decide`` judges by), soonest first:
        one range query on the waiting index, never a keyspace scan."""
        with redis_errors("reading ended waits"):
            due = await _DUE_WAITS(self._redis, keys=[self.waiting_key], args=[limit])
        return [text(thread_id) for thread_id in due]

    async def forget_wait(self, thread_id: str) -> bool:
        """Drop a run from the waiting index unless it is parked (an entry left by a run that ended another way);
        True when dropped. A run parked again meanwhile keeps its entry."""
        with redis_errors(f"forgetting the wait of run {thread_id!r}"):
            dropped = await _FORGET_WAIT(
                self._redis, keys=[self.run_key(thread_id), self.waiting_key], args=[thread_id]
            )
        return bool(dropped == 1)

    async def _park_lease(self, lease: RunLease, waiting: Mapping[str, Any], waiting_id: str, until: float) -> bool:
        with redis_errors(f"parking run {lease.thread_id!r}"):
            parked = await _PARK(
                self._redis,
                keys=[self.run_key(lease.thread_id), self.index_key, self.waiting_key],
                args=[
                    lease.thread_id,
                    lease.owner,
                    str(lease.fence),
                    self._runs_of_prefix,
                    json.dumps(dict(waiting), separators=(",", ":"), default=str),
                    waiting_id,
                    str(round(until * 1000)),
                ],
                durable=True,
            )
        return bool(parked == 1)

    async def get(self, thread_id: str) -> RunRecord | None:
        with redis_errors(f"reading run {thread_id!r}"):
            reply = await self._redis.hgetall(self.run_key(thread_id))
        if not reply:
            return None
        raw = {text(name): text(value) for name, value in reply.items()}
        status = RunStatus(raw["status"])
        held = not status.is_final and raw.get("lease_until") == str(HELD_MS)
        return RunRecord(
            thread_id=raw["thread_id"],
            graph=raw["graph"],
            input=json.loads(raw["input"]),
            owner=raw.get("owner") or None,
            status=status,
            attempts=int(raw.get("attempts", 0)),
            fence=int(raw["fence"]),
            created_at=_seconds(raw.get("created_at")),
            updated_at=_seconds(raw.get("updated_at")),
            last_error=raw.get("last_error") or None,
            lease_expires_at=None if status.is_final or held else _seconds(raw.get("lease_until")),
            held=held,
            hold_ended=raw.get("hold_ended") or None,
            turn=raw.get("turn") or None,
            waiting=json.loads(raw["waiting"]) if raw.get("waiting") else None,
            waiting_until=_seconds(raw["waiting_until"]) if raw.get("waiting_until") else None,
            resume=json.loads(raw["resume"]) if raw.get("resume") else None,
            version=raw.get("version") or None,
        )

    async def wake(self, thread_id: str, version: str, owner: str) -> RunLease | None:
        """Take up an ``awaiting_version`` run of ``version`` (a process that runs it asks); ``None`` when it waits for
        no such version any more (taken up by another process, or never set aside). Fenced like ``acquire``."""
        with self.in_use.expecting(owner, thread_id), redis_errors(f"waking run {thread_id!r}"):
            fence, held = await _WAKE(
                self._redis,
                keys=[
                    self.run_key(thread_id),
                    self.index_key,
                    self.instances_key,
                    self.awaiting_key,
                    awaiting_version_key(version, prefix=self._prefix),
                ],
                args=[thread_id, owner, self._ttl_ms, self._presence_arg, self._runs_of_prefix, version],
            )
            return self._track(RunLease(self, thread_id, owner, int(fence), held=held == 1)) if int(fence) > 0 else None

    async def awaiting(self, version: str | None = None, limit: int = 100) -> list[str]:
        """The runs waiting for ``version`` (all of them when ``None``, longest waiting first)."""
        with redis_errors("listing runs awaiting a graph version"):
            if version is None:
                members: Any = await self._redis.zrange(self.awaiting_key, 0, limit - 1)
            else:
                members = await self._redis.srandmember(awaiting_version_key(version, prefix=self._prefix), limit)
        return [text(member) for member in members or []]

    async def _set_aside_lease(self, lease: RunLease, version: str) -> bool:
        with redis_errors(f"setting run {lease.thread_id!r} aside"):
            done = await _SET_ASIDE(
                self._redis,
                keys=[
                    self.run_key(lease.thread_id),
                    self.index_key,
                    self.awaiting_key,
                    awaiting_version_key(version, prefix=self._prefix),
                ],
                args=[lease.thread_id, lease.owner, str(lease.fence), self._runs_of_prefix, version],
                durable=True,
            )
        return bool(done == 1)

    async def _set_version_lease(self, lease: RunLease, version: str) -> bool:
        with redis_errors(f"recording the version of run {lease.thread_id!r}"):
            done = await _SET_VERSION(
                self._redis, keys=[self.run_key(lease.thread_id)], args=[lease.owner, str(lease.fence), version]
            )
        return bool(done == 1)

    async def acquire(self, thread_id: str, owner: str) -> RunLease | None:
        """Take the lease if it is free or expired and the run is not final; the new fence is the old one + 1.

        ``None`` when someone holds a live lease, the run is final, or there is no such run.
        """
        with self.in_use.expecting(owner, thread_id), redis_errors(f"acquiring run {thread_id!r}"):
            fence, held = await _ACQUIRE(
                self._redis,
                keys=[self.run_key(thread_id), self.index_key, self.instances_key],
                args=[thread_id, owner, self._ttl_ms, self._presence_arg, self._runs_of_prefix],
            )
            return self._track(RunLease(self, thread_id, owner, int(fence), held=held == 1)) if int(fence) > 0 else None

    def _track(self, lease: RunLease) -> RunLease:
        # registered before ``expecting`` ends: the run never looks unused to the audit in between
        self.in_use.add(lease)
        return lease

    async def set_status(
        self,
        thread_id: str,
        status: RunStatus | str,
        *,
        error: str | None = None,
        fence: int | None = None,
    ) -> None:
        """Change a run's status (and ``last_error`` when ``error`` is given).

        With ``fence`` the write is refused (``LeaseLostError``) unless it is the current fence. A final status
        behaves like ``finish``. Setting a final run to another status raises ``RunFinalError``; repeating its
        final status is a no-op.
        """
        status = RunStatus(status)
        with redis_errors(f"setting status of run {thread_id!r}"):
            code, detail = await _SET_STATUS(
                self._redis,
                keys=[self.run_key(thread_id), self.index_key, self.waiting_key, self.awaiting_key],
                args=[
                    thread_id,
                    status.value,
                    "" if fence is None else str(fence),
                    error or "",
                    "1" if error is not None else "0",
                    self._retention_ms,
                    self._runs_of_prefix,
                ],
            )
        if code == -1:
            raise RunNotFoundError(thread_id)
        if code == -2:
            raise LeaseLostError(thread_id, fence or 0, f"stale fence (current fence is {text(detail)})")
        if code == -3:
            raise RunFinalError(thread_id, text(detail))

    async def finish(self, thread_id: str, status: RunStatus | str, fence: int, *, error: str | None = None) -> None:
        """End a run with a final status: the lease ends and the run leaves the active index. Fenced."""
        status = RunStatus(status)
        if not status.is_final:
            raise ValueError(f"finish() needs a final status, got {status.value!r}")
        await self.set_status(thread_id, status, error=error, fence=fence)

    async def increment_attempts(self, thread_id: str, *, fence: int | None = None, by: int = 1) -> int:
        """Count one more recovery attempt (``by=-1``: take one back); returns the new count. Fenced when ``fence``
        is given."""
        with redis_errors(f"counting an attempt of run {thread_id!r}"):
            result = int(
                await _INCREMENT_ATTEMPTS(
                    self._redis, keys=[self.run_key(thread_id)], args=["" if fence is None else str(fence), by]
                )
            )
        if result == -1:
            raise RunNotFoundError(thread_id)
        if result == -2:
            raise LeaseLostError(thread_id, fence or 0, "stale fence")
        return result

    async def active_runs(self) -> list[ActiveRun]:
        """Every non-final run, soonest lease expiry first."""
        with redis_errors("listing active runs"):
            rows = cast(list[tuple[Any, float]], await self._redis.zrange(self.index_key, 0, -1, withscores=True))
        return [
            ActiveRun(
                thread_id=text(member),
                lease_expires_at=None if score in (float("inf"), HELD_MS) else score / 1000.0,
                held=score == HELD_MS,
            )
            for member, score in rows
        ]

    # The lease's round trips live here so RunLease stays a thin handle.

    async def _renew_lease(self, lease: RunLease) -> bool:
        with redis_errors(f"renewing the lease on run {lease.thread_id!r}"):
            renewed = await _RENEW(
                self._redis,
                keys=[self.run_key(lease.thread_id), self.index_key],
                args=[lease.thread_id, lease.owner, str(lease.fence), self._ttl_ms],
            )
        return bool(renewed == 1)

    async def _release_lease(self, lease: RunLease) -> bool:
        with redis_errors(f"releasing the lease on run {lease.thread_id!r}"):
            released = await _RELEASE(
                self._redis,
                keys=[self.run_key(lease.thread_id), self.index_key],
                args=[lease.thread_id, lease.owner, str(lease.fence), self._runs_of_prefix],
            )
        return bool(released == 1)

    async def _holder(self, thread_id: str) -> tuple[str | None, str | None, str | None]:
        with redis_errors(f"checking the lease on run {thread_id!r}"):
            values = await self._redis.hmget(self.run_key(thread_id), ["owner", "fence", "status"])
        owner, fence, status = (None if value is None else text(value) for value in values)
        return owner, fence, status


class RunLease:
    """The right to work on one run, proven by (owner, fence). Get one from ``RunStore.create``/``acquire``."""

    def __init__(self, store: RunStore, thread_id: str, owner: str, fence: int, *, held: bool = False) -> None:
        self.store = store
        self.thread_id = thread_id
        self.owner = owner
        self.fence = fence
        self.held = held
        """Held by the owner's presence: nothing to renew, the process's one instance lease stands for it."""
        self._lost_reason: str | None = None
        self._abandoned = False

    def __repr__(self) -> str:
        return (
            f"RunLease(thread_id={self.thread_id!r}, owner={self.owner!r}, fence={self.fence}, held={self.held}, "
            f"lost={self.lost})"
        )

    @property
    def lost(self) -> bool:
        """True once this process knows the lease is gone (failed renewal, release, finish)."""
        return self._lost_reason is not None

    @property
    def in_use(self) -> bool:
        """This process still works on the run with this lease: not lost, not abandoned (``runs.in_use``)."""
        return self._lost_reason is None and not self._abandoned

    def abandon(self) -> None:
        """Stop working on the run without releasing it (the release failed, or the work never started).

        Nothing changes in Redis: a TTL lease runs out by itself, and a run held by presence is released by the
        owner's audit (``runs.audit``). A later successful fenced write through this lease takes it back up.
        """
        self._abandoned = True

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason

    async def renew(self) -> bool:
        """Push the expiry one TTL ahead of the server clock; False when the lease is no longer ours."""
        if self.lost:
            return False
        if self.held:  # nothing to push ahead: whether it is still ours is all a renewal can tell
            try:
                await self.ensure_owned()
            except LeaseLostError:
                return False
            return True
        if await self.store._renew_lease(self):
            return True
        self._mark_lost("renewal refused: another owner took over, or the run ended")
        return False

    async def ensure_owned(self) -> None:
        """Raise ``LeaseLostError`` unless this lease still holds the run (call before every side effect).

        Fails fast without a round trip once a heartbeat saw the lease go; otherwise asks Redis.
        """
        if self._lost_reason is not None:
            raise LeaseLostError(self.thread_id, self.fence, self._lost_reason)
        owner, fence, status = await self.store._holder(self.thread_id)
        if fence is None:
            self._mark_lost("the run record is gone")
        elif fence != str(self.fence):
            self._mark_lost(f"taken over with fence {fence}")
        elif owner != self.owner:
            self._mark_lost("released" if status not in FINAL_RUN_STATUSES else f"run ended ({status})")
        if self._lost_reason is not None:
            raise LeaseLostError(self.thread_id, self.fence, self._lost_reason)

    async def release(self) -> bool:
        """Give the run up (status back to ``pending``) so it can be recovered at once; False if not ours."""
        try:
            released = await self.store._release_lease(self)
        except BaseException:
            # not released, and whoever called this is giving the run up: its audit must not count it as in use
            self.abandon()
            raise
        self._mark_lost("released")
        return released

    async def park(self, waiting: Mapping[str, Any], *, waiting_id: str, until: float) -> None:
        """Stop here waiting for a person (``RunStatus.PARKED``): the lease ends, no scan recovers the run, and
        ``RunStore.decide`` takes it up again. ``LeaseLostError`` if the run is not ours any more."""
        try:
            parked = await self.store._park_lease(self, waiting, waiting_id, until)
        except BaseException:
            self.abandon()
            raise
        self._mark_lost("parked")
        if not parked:
            raise LeaseLostError(self.thread_id, self.fence, "taken over before it could park")

    async def set_aside(self, version: str) -> None:
        """Stop here: the run's graph ``version`` is one this process does not run (``RunStatus.AWAITING_VERSION``).
        The lease ends; a process that runs it takes it up (``RunStore.wake``). ``LeaseLostError`` if not ours."""
        try:
            done = await self.store._set_aside_lease(self, version)
        except BaseException:
            self.abandon()
            raise
        self._mark_lost("set aside for its graph version")
        if not done:
            raise LeaseLostError(self.thread_id, self.fence, "taken over before it could be set aside")

    async def set_version(self, version: str) -> None:
        """Record the graph version the run goes on with (after a migration). ``LeaseLostError`` if not ours."""
        if not await self.store._set_version_lease(self, version):
            self._mark_lost("taken over before its version could be recorded")
            raise LeaseLostError(self.thread_id, self.fence, "taken over before its version could be recorded")

    async def set_status(self, status: RunStatus | str, *, error: str | None = None) -> None:
        """Fenced ``RunStore.set_status``."""
        try:
            await self.store.set_status(self.thread_id, status, error=error, fence=self.fence)
        except LeaseLostError as exc:
            self._mark_lost(exc.reason)
            raise
        if RunStatus(status).is_final:
            self._mark_lost(f"run ended ({RunStatus(status).value})")
        else:
            self._abandoned = False  # a holder that carries on after a failed release: in use again

    async def finish(self, status: RunStatus | str, *, error: str | None = None) -> None:
        """Fenced ``RunStore.finish``: final status, lease over."""
        if not RunStatus(status).is_final:
            raise ValueError(f"finish() needs a final status, got {status!r}")
        await self.set_status(status, error=error)

    async def increment_attempts(self, by: int = 1) -> int:
        """Fenced ``RunStore.increment_attempts``."""
        try:
            count = await self.store.increment_attempts(self.thread_id, fence=self.fence, by=by)
        except LeaseLostError as exc:
            self._mark_lost(exc.reason)
            raise
        self._abandoned = False
        return count

    @asynccontextmanager
    async def keep_alive(self, interval: float | None = None) -> AsyncIterator[RunLease]:
        """Renew the lease every ``interval`` (default TTL/3) in a background task while the block runs.

        The heartbeat runs whatever the block is doing, so a slow node never lets the lease lapse. When a renewal
        is refused the heartbeat stops and ``ensure_owned()`` fails fast; it cancels nothing by itself. Redis
        errors (and renewals slower than ``interval``) are logged and retried at the next tick. The lease is not
        released on exit: call ``release()`` or ``finish()``.
        """
        period = self.store.ttl / 3 if interval is None else interval
        if period <= 0:
            raise ValueError(f"heartbeat interval must be positive, got {period!r}")
        if self.held:
            # liveness is per process: the owner's presence stands for this run, and fence checks catch a takeover
            yield self
            return
        stop = asyncio.Event()
        task = asyncio.create_task(self._heartbeat(period, stop), name=f"lease-heartbeat:{self.thread_id}")
        try:
            yield self
        finally:
            stop.set()
            task.cancel()
            # Bounded, and asyncio.wait does not swallow a cancellation aimed at us: a renewal stuck in a library
            # that ate its cancellation must not hold the run (the flag ends the loop at its next turn anyway).
            done, _ = await asyncio.wait({task}, timeout=1.0)
            if not done:
                logger.warning("lease heartbeat for run %s did not stop within 1s", self.thread_id)

    async def _heartbeat(self, period: float, stop: asyncio.Event) -> None:
        while not self.lost and not stop.is_set():
            await self.store.sleep(period)
            if stop.is_set():
                return
            try:
                async with asyncio.timeout(period):
                    renewed = await self.renew()
            except TimeoutError:
                logger.warning("lease heartbeat for run %s: renewal took over %.3fs; retrying", self.thread_id, period)
                continue
            except Exception as exc:
                logger.warning("lease heartbeat for run %s: renewal failed (%s); retrying", self.thread_id, exc)
                continue
            if not renewed:
                logger.warning(
                    "lease on run %s (owner %s, fence %s) is lost: %s",
                    self.thread_id,
                    self.owner,
                    self.fence,
                    self._lost_reason,
                )
                return
