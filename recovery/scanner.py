"""The orphan scanner: finds runs whose owner died (lease expired, status not final) and queues them for recovery.

It reads expired leases from the active-run index with one range query on the Redis server clock (no keyspace
SCAN), then hands them to ``QueueGuard.enqueue_orphans``, which re-checks each run and claims and enqueues it in
one script. So any number of scanners can run side by side (one per replica): each orphan is enqueued once per
lease expiry. A run stops being an orphan as soon as a consumer acquires its lease; if that consumer dies too, the
new lease expires and the run is an orphan again.

With a ``PresenceMonitor`` each scan first sweeps the processes' presence (``runs.presence``): the runs of a process
whose named Redis connection is gone (past ``PRESENCE_GRACE``) or whose instance lease expired get their lease ended
in that pass, so the same scan finds and queues them: a dead owner is noticed in one scan interval plus the grace,
not after a run lease TTL.

``run`` ends when ``stopping`` is set (at its next turn) as well as when cancelled: a cancellation that lands as a
Redis call completes can be lost (``process.tasks``), and a scanner that went on scanning held its worker's shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from domain.booking import JournalKind
from infra.error_table import is_outage
from infra.journal import writer
from infra.redis import RedisScript, text
from infra.settings import get_settings
from recovery.errors import redis_errors
from recovery.queue import EnqueueOutcome, QueueGuard
from runs.errors import RunStoreError
from runs.leases import RunStore
from runs.presence import PresenceMonitor

logger = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[object]]
Clock = Callable[[], float]

# ARGV: limit → thread ids whose lease ran out by the server clock, oldest expiry first (claimed runs score +inf)
_EXPIRED = RedisScript("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
""")

# A scan handles at most this many pages; every page moves its runs out of the expired range, so this only
# bounds a pathological index (a run whose record disagrees with it) instead of looping on it.
_MAX_PAGES = 100


class OrphanScanner:
    """Periodic orphan detection. ``redis`` runs the index query; ``store`` names the index; ``guard`` enqueues.

    ``interval`` defaults to ``ORPHAN_SCAN_INTERVAL`` (``PRESENCE_SCAN_INTERVAL`` with a ``presence`` monitor);
    ``batch_size`` is how many candidates one script handles. Setting ``stopping`` ends ``run`` at its next turn.
    """

    def __init__(
        self,
        redis: Redis,
        store: RunStore,
        guard: QueueGuard,
        *,
        interval: float | None = None,
        batch_size: int = 100,
        presence: PresenceMonitor | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        settings = get_settings()
        default = settings.presence_scan_interval_s if presence is not None else settings.orphan_scan_interval_s
        self.interval = float(interval if interval is not None else default)
        self.presence = presence
        if self.interval <= 0:
            raise ValueError(f"scan interval must be positive, got {self.interval!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size!r}")
        self.batch_size = batch_size
        self.store = store
        self.guard = guard
        self._redis = redis
        self._clock = clock
        self._sleep = sleep
        self.stopping = asyncio.Event()

    async def scan_once(self) -> list[str]:
        """Enqueue every current orphan; returns the ids this call newly put in the queue."""
        enqueued: list[str] = []
        gone: set[str] = set()
        if self.presence is not None:
            try:
                # ends the holds of dead processes: their runs are expired leases now
                gone = set((await self.presence.sweep()).dead)
            except RunStoreError as exc:
                # the lease TTL is the fallback: a failed sweep must not stop the expiry scan below
                logger.warning("presence sweep failed (%s); scanning expired leases only", exc)
        for _ in range(_MAX_PAGES):
            with redis_errors("reading expired leases"):
                expired = await _EXPIRED(self._redis, keys=[self.store.index_key], args=[self.batch_size])
            candidates = [text(thread_id) for thread_id in expired]
            if not candidates:
                break
            for result in await self.guard.enqueue_orphans(candidates):
                if result.outcome is EnqueueOutcome.QUEUED:
                    enqueued.append(result.thread_id)
                    await self._journal(result.thread_id, result.depth, gone)
            if len(candidates) < self.batch_size:
                break
        if enqueued:
            logger.info("orphan scan queued %d run(s) for recovery: %s", len(enqueued), ", ".join(enqueued))
        return enqueued

    async def _journal(self, thread_id: str, depth: int, gone: set[str]) -> None:
        """``owner_lost`` (whose, why: its presence gone in this pass, its hold released by its own audit, or its
        lease expired; noticed by us) and ``queued_for_recovery``."""
        journal = writer()
        if journal is None:
            return
        try:
            record = await self.store.get(thread_id)
        except Exception:
            logger.debug("run %s: could not read its record for the journal", thread_id, exc_info=True)
            record = None
        fields: dict[str, object] = {"noticed_by": journal.instance, "reason": "lease expired"}
        if record is not None and record.owner in gone:
            fields.update(owner=record.owner, fence=record.fence, reason="presence gone")
        elif record is not None and record.hold_ended:
            # its live owner's audit found it held but not executing (runs.audit) and released it
            fields.update(owner=record.owner, fence=record.fence, reason=record.hold_ended)
        elif record is not None:
            fields.update(owner=record.owner, fence=record.fence, lease_ttl_s=get_settings().run_lease_ttl_s)
            if record.lease_expires_at is not None:
                fields["expired_s_ago"] = round(max(0.0, time.time() - record.lease_expires_at), 2)
        journal.record(thread_id, JournalKind.OWNER_LOST, **fields)
        journal.record(thread_id, JournalKind.QUEUED_FOR_RECOVERY, queue_depth=depth)

    async def run(self) -> None:
        """Scan every ``interval`` until cancelled or ``stopping``; a failed scan is logged and the loop carries on."""
        down_since: float | None = None  # an outage of the stores is one WARNING when it starts and one when it ends
        while not self.stopping.is_set():
            started = self._clock()
            try:
                await self.scan_once()
            except Exception as exc:
                if not is_outage(exc):
                    logger.exception("orphan scan failed; retrying in %.2fs", self.interval)
                elif down_since is None:
                    down_since = started
                    logger.warning(
                        "orphan scans paused: %s: %s; retrying every %.2fs", type(exc).__name__, exc, self.interval
                    )
            else:
                if down_since is not None:
                    logger.warning("orphan scans resumed after %.1fs", started - down_since)
                    down_since = None
            if self.stopping.is_set():
                return
            await self._sleep(max(0.0, self.interval - (self._clock() - started)))
