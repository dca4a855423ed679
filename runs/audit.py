"""The owner's audit of its held runs: a run this process holds in Redis but no longer works on is released.

A run held by presence (``runs.presence``) has no expiry of its own: only the sweep of a *dead* process ends the
hold. A run whose task ended without a successful release (the release met a Redis failover, or the work never
started) would therefore stay held for as long as its process lives, and nobody would finish it. So each process
with presence checks, every ``PRESENCE_AUDIT_INTERVAL``, the runs its instance holds against the runs it works on
(``runs.in_use``), over its presence connection:

- **cheap in the common case**: one ``SCARD`` of ``{recovery}:instance:<id>:runs``; only when Redis lists more runs
  than the process uses does it read them (``SMEMBERS``). Per process, not per run;
- **two audits in a row**: a run is released only if it was missing locally in two consecutive audits *with the same
  fence*; the first sighting only records the fence (a run being created or acquired counts as in use from before
  its script is sent, see ``runs.in_use``);
- **one script** releases it, and only if the run is still held by this instance, with that fence, and not final:
  ``lease_until`` = now, out of the instance's set, active-index score now. That is what the sweep does for a dead
  process (and what a lease expiry leaves), so the ordinary orphan path (claim, queue, fenced acquire) takes it
  over. The run record keeps ``hold_ended`` (the reason) until the next acquire, for the scanner's ``owner_lost``.

Set members that are not runs held by this instance (a stale entry) are dropped by the same script, so they do not
make every later audit read the set. See docs/presence.md.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from redis.asyncio import Redis

from infra.redis import RedisScript, text
from runs.errors import redis_errors
from runs.in_use import LeasesInUse, leases_in_use
from runs.leases import HELD_MS, active_index_key, instance_runs_key, run_key

__all__ = ["HOLD_NOT_EXECUTING", "AuditResult", "HoldAudit"]

logger = logging.getLogger(__name__)

HOLD_NOT_EXECUTING = "held run not executing"
"""The reason the audit records on a run it releases (``RunRecord.hold_ended``, and the scanner's ``owner_lost``)."""

_BATCH = 500

# KEYS: instance runs, active index, run records... | ARGV: instance, reason, then (thread id, fence seen by the
# previous audit or '') per run → per run: 1 released, 0 held by us (3rd value: its fence), -1 not held by us
# (dropped from the set)
_AUDIT = RedisScript(
    f"local HELD = '{HELD_MS}'\n"
    + """
local FINAL = {done = true, failed = true, dead_lettered = true}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 3, #ARGV, 2 do
  local id, seen = ARGV[i], ARGV[i + 1]
  local run = KEYS[(i - 1) / 2 + 2]
  local code, fence = -1, ''
  if redis.call('SISMEMBER', KEYS[1], id) == 1 then
    local owner, current, lease_until, status = unpack(redis.call('HMGET', run, 'owner', 'fence', 'lease_until',
      'status'))
    if owner == ARGV[1] and lease_until == HELD and current and not FINAL[status] then
      fence = current
      if seen == current then
        -- what the sweep does for a dead process: the orphan scan claims it, a consumer acquires it with fence + 1
        redis.call('HSET', run, 'lease_until', now, 'updated_at', now, 'hold_ended', ARGV[2])
        redis.call('HDEL', run, 'claimed')
        redis.call('ZADD', KEYS[2], now, id)
        redis.call('SREM', KEYS[1], id)
        code = 1
      else
        code = 0
      end
    else
      redis.call('SREM', KEYS[1], id)
    end
  end
  out[#out + 1] = id
  out[#out + 1] = code
  out[#out + 1] = fence
end
return out
"""
)


@dataclass(frozen=True)
class AuditResult:
    held: int
    """Runs Redis lists as held by this instance (``SCARD``)."""
    in_use: int
    """Runs this process works on (``runs.in_use``)."""
    listed: bool
    """Whether the audit had to read the set (Redis held more than the process uses)."""
    suspects: dict[str, int] = field(default_factory=dict)
    """Held runs not in use here, fence by thread id: released by the next audit if still so, with that fence."""
    released: list[str] = field(default_factory=list)
    """Runs released in this audit (missing here in this audit and the previous one, same fence)."""


class HoldAudit:
    """One process's audit of the runs its instance holds (see the module docstring). ``audit()`` is one pass."""

    def __init__(self, redis: Redis, instance: str, *, prefix: str, in_use: LeasesInUse | None = None) -> None:
        self.instance = instance
        self._redis = redis
        self._prefix = prefix
        self._runs_key = instance_runs_key(instance, prefix=prefix)
        self._index_key = active_index_key(prefix=prefix)
        self._in_use = leases_in_use if in_use is None else in_use
        self._suspects: dict[str, int] = {}

    async def audit(self) -> AuditResult:
        """One audit: ``SCARD``; if Redis holds more than this process uses, ``SMEMBERS`` and the script per 500."""
        in_use = self._in_use.held(self.instance)
        with redis_errors(f"auditing the runs held by {self.instance!r}"):
            held = int(await self._redis.scard(self._runs_key))
            if held <= len(in_use):
                self._suspects = {}
                return AuditResult(held=held, in_use=len(in_use), listed=False)
            members = {text(m) for m in await self._redis.smembers(self._runs_key)}
            # read again after the round trip: a lease taken meanwhile is in use, not a suspect
            candidates = sorted(members - self._in_use.held(self.instance))
            suspects: dict[str, int] = {}
            released: list[str] = []
            for start in range(0, len(candidates), _BATCH):
                batch = candidates[start : start + _BATCH]
                args: list[str] = [self.instance, HOLD_NOT_EXECUTING]
                for thread_id in batch:
                    seen = self._suspects.get(thread_id)
                    args += [thread_id, "" if seen is None else str(seen)]
                reply = await _AUDIT(
                    self._redis,
                    keys=[self._runs_key, self._index_key, *(run_key(t, prefix=self._prefix) for t in batch)],
                    args=args,
                )
                for i in range(0, len(reply), 3):
                    thread_id, code, fence = text(reply[i]), int(reply[i + 1]), text(reply[i + 2])
                    if code == 1:
                        released.append(thread_id)
                    elif code == 0:
                        suspects[thread_id] = int(fence)
        self._suspects = suspects
        if released:
            logger.warning(
                "presence of %s: %d held run(s) not executing here released for recovery: %s",
                self.instance,
                len(released),
                ", ".join(released),
            )
        return AuditResult(held=held, in_use=len(in_use), listed=True, suspects=dict(suspects), released=released)
