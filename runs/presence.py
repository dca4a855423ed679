"""Per-process presence: a dead owner is noticed by its Redis connection going away, not by a run lease running out.

Every process that owns runs (booking-agent replicas, recovery workers) keeps

- ONE dedicated Redis connection named ``CLIENT SETNAME <instance id>`` (its own one-connection pool, so nothing the
  shared pool does, and no stalled event loop, closes it; redis-py re-sends the name on every reconnect), and
- ONE instance lease: its score in the ZSET ``{recovery}:instances`` (instance id → expiry, Redis server clock),
  renewed every ``PRESENCE_INTERVAL`` over that connection. This is the whole liveness cost: per process, not per run.

A run created or acquired by a registered instance is *held by its instance*: its ``lease_until`` is ``HELD_MS``
(never expires on its own), its id is in the SET ``{recovery}:instance:<id>:runs``, and it keeps its fence per
acquisition. ``PresenceMonitor.sweep`` (run by every orphan scanner) takes one ``CLIENT LIST`` and one script: an
instance whose named connection has been missing for ``PRESENCE_GRACE`` (a reconnect within it keeps everything),
or whose instance lease expired (a frozen process keeps its socket open: the lease is the fallback), is moved to
``{recovery}:instances:dead``; then each of its runs gets ``lease_until = now``, exactly what a run lease expiry
leaves, and the ordinary orphan path (claim, queue, fenced acquire) takes it over.

After Redis restarts or fails over every connection drops at once. That is not every process dying: for
``PRESENCE_RESTART_GRACE`` after the monitor sees the server change (new ``run_id``, low uptime) or its own
connection fail, nobody is declared dead, so every process has the time to reconnect and renew.

A live process can also hold a run it no longer works on (its task ended and the release met a Redis outage): the
sweep would never end that hold. So ``Presence`` also audits its own holds every ``PRESENCE_AUDIT_INTERVAL``
(``runs.audit``) and releases such runs to the same orphan path. See ``docs/presence.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from infra.redis import RedisScript, clients_and_server, create_redis, key, text
from infra.settings import get_settings
from process.tasks import bounded_step, stop_task
from runs.audit import AuditResult, HoldAudit
from runs.errors import redis_errors
from runs.in_use import LeasesInUse
from runs.leases import (
    HELD_MS,
    RECOVERY_TAG,
    active_index_key,
    instance_name,
    instance_runs_key,
    instances_key,
    run_key,
)

__all__ = [
    "HELD_MS",
    "AuditResult",
    "Presence",
    "PresenceMonitor",
    "SweepResult",
    "dead_instances_key",
    "instance_name",
    "instance_runs_key",
    "instances_key",
    "missing_key",
]

logger = logging.getLogger(__name__)

_EXPIRE_BATCH = 500


def missing_key(*, prefix: str | None = None) -> str:
    return key(RECOVERY_TAG, "instances", "missing", prefix=prefix)


def dead_instances_key(*, prefix: str | None = None) -> str:
    return key(RECOVERY_TAG, "instances", "dead", prefix=prefix)


# KEYS: instances, missing, dead | ARGV: instance, ttl_ms → 1 renewed, 0 (re)registered after being absent or dead
_HEARTBEAT = RedisScript("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local was = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
-- declared dead but not yet swept: alive after all, its runs stay held (the sweep re-checks this per batch)
local revived = redis.call('SREM', KEYS[3], ARGV[1])
if was and revived == 0 then return 1 end
return 0
""")

# KEYS: instances, missing, dead | ARGV: instance → 1
_DEREGISTER = RedisScript("""
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[1])
return 1
""")

# KEYS: instances, missing, dead | ARGV: grace_ms, quiet ('1': declare nobody dead), connected names...
# → instance ids now in the dead set (newly declared or left by an earlier sweep)
_SWEEP = RedisScript("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace, quiet = tonumber(ARGV[1]), ARGV[2] == '1'
local connected = {}
for i = 3, #ARGV do connected[ARGV[i]] = true end
local missing = {}
local flat = redis.call('HGETALL', KEYS[2])
for i = 1, #flat, 2 do missing[flat[i]] = tonumber(flat[i + 1]) end
local rows = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local id, expiry = rows[i], tonumber(rows[i + 1])
  local dead = false
  if connected[id] then
    if missing[id] then redis.call('HDEL', KEYS[2], id) end
  elseif not quiet then
    if not missing[id] then redis.call('HSET', KEYS[2], id, now)
    elseif now - missing[id] > grace then dead = true end
  end
  if not quiet and expiry <= now then dead = true end
  if dead then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('SADD', KEYS[3], id)
  end
end
return redis.call('SMEMBERS', KEYS[3])
""")

# KEYS: dead, instance runs, active index, run records... | ARGV: instance, final ('1': last batch), thread ids...
# → runs whose lease now ends (-1: the instance came back meanwhile, nothing changed)
_EXPIRE_RUNS = RedisScript(
    f"local HELD = '{HELD_MS}'\n"
    + """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = 0
for i = 3, #ARGV do
  local run = KEYS[i + 1]
  local owner, lease_until = unpack(redis.call('HMGET', run, 'owner', 'lease_until'))
  if owner == ARGV[1] and lease_until == HELD then
    -- what a run lease expiry leaves behind: the orphan scan claims it, a consumer acquires it with fence + 1
    redis.call('HSET', run, 'lease_until', now)
    redis.call('ZADD', KEYS[3], now, ARGV[i])
    expired = expired + 1
  end
  redis.call('SREM', KEYS[2], ARGV[i])
end
if ARGV[2] == '1' then
  redis.call('SREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
return expired
"""
)


class Presence:
    """One process's presence: the named connection and the instance lease it renews (see the module docstring).

    ``start()`` registers before returning (so the runs this process creates next are held by it) and keeps
    renewing in a background task, which also audits the runs it holds every ``audit_interval``
    (``PRESENCE_AUDIT_INTERVAL``; against ``in_use``, by default the process's registry, ``runs.in_use``);
    ``stop()`` deregisters, so whatever it still holds is swept at the next scan.
    """

    def __init__(
        self,
        instance: str,
        *,
        url: str | None = None,
        interval: float | None = None,
        ttl: float | None = None,
        client: Redis | None = None,
        audit_interval: float | None = None,
        in_use: LeasesInUse | None = None,
    ) -> None:
        settings = get_settings()
        self.instance = instance_name(instance)
        self.interval = float(interval if interval is not None else settings.presence_interval_s)
        self.ttl = float(ttl if ttl is not None else settings.presence_lease_ttl_s)
        if self.interval <= 0 or self.ttl <= self.interval:
            raise ValueError(f"presence needs 0 < interval < ttl, got {self.interval!r} and {self.ttl!r}")
        self.audit_interval = float(
            audit_interval if audit_interval is not None else settings.presence_audit_interval_s
        )
        if self.audit_interval <= 0:
            raise ValueError(f"the audit interval must be positive, got {self.audit_interval!r}")
        prefix = settings.key_prefix
        self._keys = [instances_key(prefix=prefix), missing_key(prefix=prefix), dead_instances_key(prefix=prefix)]
        # Its own pool of one: the shared pool's health checks and timeouts never close it, and redis-py sends
        # CLIENT SETNAME again on every reconnect, so a blip is over as soon as the next renewal reconnects.
        self.client: Redis = client or create_redis(
            url,
            client_name=self.instance,
            max_connections=1,
            socket_timeout=max(self.ttl, 1.0),
            health_check_interval=0,
        )
        self._owns_client = client is None
        self._task: asyncio.Task[None] | None = None
        self.holds = HoldAudit(self.client, self.instance, prefix=prefix, in_use=in_use)
        # ends the renewals even if a cancellation is lost in a Redis call (``process.tasks``): a renewal after the
        # deregistration would register this instance again as it exits
        self._stopping = asyncio.Event()

    async def audit(self) -> AuditResult:
        """Audit the runs this instance holds now (``runs.audit``): those not in use here two audits in a row are
        released to the orphan scan."""
        return await self.holds.audit()

    async def renew(self) -> bool:
        """Renew the instance lease now; False when this registered the instance afresh (first time, or after it
        was declared dead: the runs it held then are being taken over, and fencing stops this process on them)."""
        with redis_errors(f"renewing the presence of {self.instance!r}"):
            return bool(await _HEARTBEAT(self.client, keys=self._keys, args=[self.instance, round(self.ttl * 1000)]))

    async def start(self) -> None:
        """Register now (a failure is logged: runs taken before the first renewal get TTL leases) and keep renewing."""
        try:
            async with asyncio.timeout(self.ttl):
                await self.renew()
        except Exception as exc:
            logger.warning("presence of %s: could not register yet (%s); retrying", self.instance, exc)
        self._stopping.clear()
        self._task = asyncio.create_task(self._loop(), name=f"presence:{self.instance}")
        logger.info(
            "presence of %s registered (renewed every %.2fs, lease %.1fs)", self.instance, self.interval, self.ttl
        )

    async def _loop(self) -> None:
        next_audit = time.monotonic() + self.audit_interval
        while not self._stopping.is_set():
            await asyncio.sleep(self.interval)
            if self._stopping.is_set():
                return
            try:
                async with asyncio.timeout(self.ttl):
                    if not await self.renew():
                        logger.warning("presence of %s re-registered after it was absent", self.instance)
            except TimeoutError:
                logger.warning("presence of %s: renewal took over %.1fs; retrying", self.instance, self.ttl)
            except Exception as exc:
                logger.warning("presence of %s: renewal failed (%s); retrying", self.instance, exc)
            if time.monotonic() >= next_audit and not self._stopping.is_set():
                next_audit = time.monotonic() + self.audit_interval
                await self._audit_quietly()

    async def _audit_quietly(self) -> None:
        # bounded like a renewal, so a slow audit cannot starve the instance lease; a failure only logs
        try:
            async with asyncio.timeout(self.ttl / 2):
                await self.audit()
        except TimeoutError:
            logger.warning("presence of %s: the audit of its held runs took over %.1fs", self.instance, self.ttl / 2)
        except Exception as exc:
            logger.warning("presence of %s: the audit of its held runs failed (%s)", self.instance, exc)

    async def stop(self) -> None:
        """Stop renewing and deregister: runs still held are swept (and recovered) at the next scan."""
        if self._task is not None:
            await stop_task(self._task, stop=self._stopping, within=1.0, what=f"presence renewal of {self.instance}")
            self._task = None
        try:
            async with asyncio.timeout(2):
                await _DEREGISTER(self.client, keys=self._keys, args=[self.instance])
        except Exception as exc:
            logger.warning("presence of %s: could not deregister (%s); its lease will expire", self.instance, exc)
        finally:
            if self._owns_client:
                await bounded_step(
                    self.client.aclose(), within=2.0, what=f"closing the presence connection of {self.instance}"
                )


@dataclass(frozen=True)
class SweepResult:
    dead: list[str]
    """Instances declared dead whose runs were released to the orphan scan in this pass."""
    expired_runs: int
    quiet: bool
    """True while nobody may be declared dead (Redis restarted or failed over, or this monitor lost its connection)."""


class PresenceMonitor:
    """The scanner's side: finds dead instances in one pass and ends the leases of the runs they held.

    ``grace`` (``PRESENCE_GRACE``) is how long a named connection may be missing before its instance is dead;
    ``restart_grace`` (``PRESENCE_RESTART_GRACE``) how long nobody is declared dead after a Redis restart.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        grace: float | None = None,
        restart_grace: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        settings = get_settings()
        self.grace = float(grace if grace is not None else settings.presence_grace_s)
        self.restart_grace = float(restart_grace if restart_grace is not None else settings.presence_restart_grace_s)
        self._redis = redis
        self._prefix = settings.key_prefix
        self._keys = [instances_key(prefix=self._prefix), missing_key(prefix=self._prefix)]
        self._dead_key = dead_instances_key(prefix=self._prefix)
        self._index_key = active_index_key(prefix=self._prefix)
        self._clock = clock
        self._server_run_id: str | None = None
        self._quiet_until = 0.0
        self._failed = False

    def _quiet_for(self, why: str) -> None:
        if self._clock() >= self._quiet_until:
            logger.warning("presence: %s; nobody is declared dead for %.1fs", why, self.restart_grace)
        self._quiet_until = self._clock() + self.restart_grace

    async def sweep(self) -> SweepResult:
        """One pass: ``CLIENT LIST`` + ``INFO server`` in one round trip, one script, and for a dead instance one
        script per ``_EXPIRE_BATCH`` of its runs."""
        try:
            with redis_errors("reading the connected clients"):
                clients, server = await clients_and_server(self._redis, self._keys[0])
        except BaseException:
            self._failed = True
            raise
        run_id, uptime = str(server.get("run_id", "")), float(server.get("uptime_in_seconds", 0))
        if self._failed:
            self._quiet_for("the connection to Redis failed and came back")
        elif self._server_run_id is not None and run_id != self._server_run_id:
            self._quiet_for("Redis restarted or failed over (new run_id)")
        elif uptime < self.restart_grace:
            self._quiet_for(f"Redis is up for {uptime:.0f}s only")
        self._failed = False
        self._server_run_id = run_id
        quiet = self._clock() < self._quiet_until
        names = sorted({text(c.get("name", "")) for c in clients} - {""})
        with redis_errors("sweeping instance presence"):
            dead = [
                text(d)
                for d in await _SWEEP(
                    self._redis,
                    keys=[*self._keys, self._dead_key],
                    args=[round(self.grace * 1000), "1" if quiet else "0", *names],
                )
            ]
        expired = 0
        for instance in dead:
            expired += await self._expire_runs_of(instance)
        if dead:
            logger.warning("presence: instance(s) %s gone; %d run(s) released for recovery", ", ".join(dead), expired)
        return SweepResult(dead=dead, expired_runs=expired, quiet=quiet)

    async def _expire_runs_of(self, instance: str) -> int:
        runs_key = instance_runs_key(instance, prefix=self._prefix)
        with redis_errors(f"releasing the runs of instance {instance!r}"):
            thread_ids = sorted(text(t) for t in await self._redis.smembers(runs_key))
            expired = 0
            batches = [thread_ids[i : i + _EXPIRE_BATCH] for i in range(0, len(thread_ids), _EXPIRE_BATCH)] or [[]]
            for n, batch in enumerate(batches):
                result = int(
                    await _EXPIRE_RUNS(
                        self._redis,
                        keys=[
                            self._dead_key,
                            runs_key,
                            self._index_key,
                            *(run_key(t, prefix=self._prefix) for t in batch),
                        ],
                        args=[instance, "1" if n == len(batches) - 1 else "0", *batch],
                    )
                )
                if result < 0:
                    logger.info("presence: instance %s came back before its runs were released", instance)
                    return expired
                expired += result
        return expired
