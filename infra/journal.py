"""Every booking's journal: an append-only Redis Stream of what happened to it, written by whichever process acts.

Entries are JSON objects with ``kind`` (``domain.booking.JournalKind``), ``at`` (ISO 8601 UTC), ``instance`` (the
writer's instance id, as in lease owners) and the kind's own fields (``docs/journal.md``). The stream is bounded
(``JOURNAL_MAX_LEN``, trimmed approximately) and expires ``JOURNAL_TTL_S`` after its last entry.

Writing is cheap on purpose: ``note`` / ``JournalWriter.record`` only queue the entry. A booking's status writes
(``infra.bookings``: its progress reports and its final status) take the process's queued entries of that booking
(``take``) and append them in their own script, so most entries cost no round trip at all; one background task per
process sends whatever is still queued ``BATCH_WINDOW_S`` after it was recorded, in one script call for the lot. The
``accepted`` entry and the final one (``confirmed``/``failed``/``cancelled``) are written by the booking record's
own scripts, atomically with the status they report, and the append script refuses anything after a final status,
so a journal always ends with its final entry. Deep code (clients, resilience hooks, graph nodes)
writes through ``note`` into the booking of the current ``journal_scope``: outside one it does nothing.

Secrets never go in: callers pass ids, names and outcomes only; ``record`` drops any field named like a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from domain.booking import FINAL_JOURNAL_KINDS, JournalKind
from infra.booking_keys import booking_key, journal_key
from infra.redis import RedisClient, RedisScript, text
from infra.settings import get_settings
from resilience.events import CircuitRejected, ResilienceEvent, RetryScheduled

__all__ = [
    "ENTRY_FIELD",
    "JournalScope",
    "JournalWriter",
    "current_scope",
    "encode_entry",
    "flush",
    "give_back",
    "install_writer",
    "instance_id",
    "is_final",
    "iso_now",
    "journal_key",
    "journal_of",
    "journal_scope",
    "name_instance",
    "note",
    "parse_entries",
    "read_journal",
    "resilience_hook",
    "take",
    "writer",
]

logger = logging.getLogger(__name__)

ENTRY_FIELD: Final = "e"
"""The one field of a stream entry: the entry's JSON."""
MAX_PENDING: Final = 10_000
"""Entries queued in one process while Redis does not answer; past it the oldest are dropped (and logged)."""
MAX_BATCH: Final = 500
"""Entries per script call: a backlog (Redis was away) goes out in slices, never one long script."""
BATCH_WINDOW_S: Final = 0.05
"""How long an entry may wait in the queue before the writer sends it: long enough that a booking's next status
write usually takes it first (``take``), short for a person watching; whoever needs entries written now
(payment-agent before it answers, a handoff, a shutdown) flushes and cuts it short."""
_SECRET_WORDS: Final = ("token", "secret", "password", "authorization", "card")

# KEYS: stream₁, booking₁, stream₂, booking₂, ... | ARGV: max_len, ttl_s, entry₁, entry₂, ...
# A journal closes with its final entry: nothing is appended once the booking's status is final.
_APPEND = RedisScript("""
local n = 0
for i = 1, #KEYS, 2 do
  local status = redis.call('HGET', KEYS[i + 1], 'status')
  if status ~= 'confirmed' and status ~= 'failed' and status ~= 'cancelled' then
    redis.call('XADD', KEYS[i], 'MAXLEN', '~', ARGV[1], '*', 'e', ARGV[2 + (i + 1) / 2])
    redis.call('EXPIRE', KEYS[i], ARGV[2])
    n = n + 1
  end
end
return n
""")


# Every entry is encoded on its step's path, a dozen or more per booking: that is kept to a few microseconds (the
# second's text is formatted once per second, a field name is judged once, one encoder serves every entry).
_second: tuple[int, str] = (-1, "")
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), default=str)


def iso_now(epoch: float | None = None) -> str:
    global _second
    now = time.time() if epoch is None else epoch
    whole = int(now)
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int((now - whole) * 1000):03d}Z"


@functools.cache
def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None and not _is_secret(name)}


def encode_entry(kind: JournalKind | str, instance: str, fields: Mapping[str, Any], at: float | None = None) -> str:
    """The JSON of one entry (also what the booking scripts append for ``accepted`` and the final kinds)."""
    return _ENCODER.encode({"kind": str(kind), "at": iso_now(at), "instance": instance, **_clean(fields)})


class JournalWriter:
    """One per process: queues entries and sends them in batches, in the order they were recorded."""

    def __init__(self, redis: RedisClient, instance: str) -> None:
        settings = get_settings()
        self.redis = redis
        self.instance = instance
        self.max_len = settings.journal_max_len
        self.ttl_s = settings.journal_ttl_s
        self._pending: list[tuple[str, str]] = []
        self._since = 0.0
        """When the queue last became non-empty (loop time): the oldest entry queued has waited since then at most."""
        self._drain: asyncio.Task[None] | None = None
        self._now = asyncio.Event()
        self._sending: frozenset[str] = frozenset()
        """The bookings of the batch on its way to Redis right now."""
        self._sent = asyncio.Event()
        """Set each time a batch is done (written or failed)."""

    def record(self, booking_id: str, kind: JournalKind | str, **fields: Any) -> None:
        """Queue one entry for ``booking_id`` (or a run's thread id: ``journal_of``); it is written within
        milliseconds, in order, without waiting."""
        booking_id = journal_of(booking_id)
        if not self._pending:
            self._since = asyncio.get_running_loop().time()
        self._pending.append((booking_id, encode_entry(kind, self.instance, fields)))
        if len(self._pending) > MAX_PENDING:
            dropped = len(self._pending) - MAX_PENDING
            del self._pending[:dropped]
            logger.warning("journal: Redis is not keeping up; dropped the %d oldest queued entries", dropped)
        self._start_drain()

    def send_now(self) -> None:
        """Send what is queued without waiting out the batching window (nothing is waited for here)."""
        if self._drain is not None and not self._drain.done():
            self._now.set()

    async def flush(self) -> None:
        """Wait until every entry recorded so far is written (or its write failed, which is logged)."""
        while self._drain is not None and not self._drain.done():
            self._now.set()  # no batching window: someone waits
            await asyncio.wait({self._drain})

    async def take(self, booking_id: str) -> list[str]:
        """Hand over ``booking_id``'s entries not sent yet, for a script that writes them itself (in order).

        The booking's status writes do this (a progress report, the final status): their script appends them first,
        so a booking's entries ride on round trips it makes anyway instead of a batch of their own. Only a batch
        already on its way with entries of this booking is waited for (it must land first). The caller writes them
        before the next ``take`` of the same booking (progress reports are chained, the final status waits for them).
        """
        while booking_id in self._sending:
            self._sent.clear()
            await self._sent.wait()
        mine = [entry for booking, entry in self._pending if booking == booking_id]
        if mine:
            self._pending = [(booking, entry) for booking, entry in self._pending if booking != booking_id]
        return mine

    def give_back(self, booking_id: str, entries: list[str]) -> None:
        """Queue again, first, entries ``take`` handed over whose script then failed: they are not lost with it."""
        if entries:
            if not self._pending:
                self._since = asyncio.get_running_loop().time()
            self._pending[:0] = [(booking_id, entry) for entry in entries]
            self._start_drain()

    def _start_drain(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_task(self._write_all(), name="journal-writer")

    async def _write_all(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            # a step's entries come in bursts (a step ends, the next starts, a call ends): one write for the burst,
            # unless the booking's next status write takes them first; that empties the queue, and the next entry
            # starts a new window
            while self._pending and not self._now.is_set():
                left = self._since + BATCH_WINDOW_S - loop.time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._now.wait()
            self._now.clear()
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            if not batch:  # taken meanwhile by a final status (``take``)
                break
            keys: list[str] = []
            for booking_id, _ in batch:
                keys.extend((journal_key(booking_id), booking_key(booking_id)))
            self._sending = frozenset(booking_id for booking_id, _ in batch)
            try:
                await _APPEND(self.redis, keys=keys, args=[self.max_len, self.ttl_s, *(e for _, e in batch)])
            except Exception:
                # the journal tells the story; it must never stop the story: the booking's own writes fail loudly
                logger.warning("journal: could not write %d entries", len(batch), exc_info=True)
            finally:
                self._sending = frozenset()
                self._sent.set()
        self._now.clear()


def journal_of(thread_id: str) -> str:
    """The journal a run's entries go in: its own (a booking, a chat), or for a run after the booking's own
    (``<booking_id>:cancel``, ``agents.booking.cancellation``) its booking's, so one journal tells the booking's whole life."""
    return thread_id.partition(":")[0]


# ----------------------------------------------------------------------------------------- process-wide writer

_writer: JournalWriter | None = None


def install_writer(journal: JournalWriter | None) -> JournalWriter | None:
    """Make ``journal`` this process's writer (the service shell does, at startup); returns the previous one."""
    global _writer
    previous, _writer = _writer, journal
    return previous


def writer() -> JournalWriter | None:
    return _writer


def name_instance(instance: str) -> None:
    """Sign this process's entries ``instance``: a service whose lease owner id differs from the shell's says so."""
    if _writer is not None:
        _writer.instance = instance


def instance_id() -> str:
    """Who writes: the installed writer's instance, else ``CONCIERGE_INSTANCE_ID``, else host and pid."""
    if _writer is not None:
        return _writer.instance
    return get_settings().instance_id or f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class JournalScope:
    """The booking the code running now works for, and what every entry written for it adds."""

    booking_id: str
    fence: int | None = None
    steps: bool = True
    """Whether graph steps run here are the booking's own (not in payment-agent, which runs a graph of its own)."""
    attempts: dict[str, int] = field(default_factory=dict)
    """Starts of each step in this scope (a step run again after a pause is attempt 2)."""
    eager: bool = False
    """Send each entry at once, without the batching window: for a process that must have them written before it
    answers (payment-agent), so the write runs while the step still works instead of after it."""
    closed: bool = False
    """The booking's final status took its entries: what this scope would note after it (the last step's
    ``step_finished``) the journal refuses, so it is not even queued."""


_scope: ContextVar[JournalScope | None] = ContextVar("concierge_journal_scope", default=None)


@contextlib.contextmanager
def journal_scope(
    booking_id: str, *, fence: int | None = None, steps: bool = True, eager: bool = False
) -> Iterator[JournalScope]:
    """``note`` writes into ``booking_id``'s journal inside this block (tasks started in it inherit it)."""
    scope = JournalScope(journal_of(booking_id), fence, steps, eager=eager)
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_scope() -> JournalScope | None:
    return _scope.get()


def note(kind: JournalKind | str, **fields: Any) -> None:
    """Record an entry in the current scope's journal; nothing outside a scope or without a writer."""
    scope = _scope.get()
    if scope is None or scope.closed or _writer is None:
        return
    if scope.fence is not None:
        fields.setdefault("fence", scope.fence)
    _writer.record(scope.booking_id, kind, **fields)
    if scope.eager:
        _writer.send_now()


async def flush() -> None:
    """Wait for this process's queued entries (before a process answers or stops, so they land first)."""
    if _writer is not None:
        await _writer.flush()


async def take(booking_id: str, *, final: bool = False) -> list[str]:
    """This process's unsent entries of ``booking_id``, for a status write's script to append before its own.

    ``final``: the final status takes them, which closes the journal for the current scope (see ``JournalScope``).
    """
    if final and (scope := _scope.get()) is not None and scope.booking_id == booking_id:
        scope.closed = True
    return await _writer.take(booking_id) if _writer is not None else []


def give_back(booking_id: str, entries: list[str], *, final: bool = False) -> None:
    """Queue again what ``take`` gave when the script that was to write it failed; ``final`` reopens the scope the
    final status's ``take`` closed (the step runs again)."""
    if final and (scope := _scope.get()) is not None and scope.booking_id == booking_id:
        scope.closed = False
    if _writer is not None:
        _writer.give_back(booking_id, entries)


def resilience_hook(event: ResilienceEvent) -> None:
    """A ``resilience.add_hook`` hook: retries and circuit refusals go in the journal of the booking at hand."""
    if isinstance(event, RetryScheduled):
        note(
            JournalKind.RETRY_SCHEDULED,
            dependency=event.service,
            attempt=event.attempt,
            delay_s=round(event.delay, 3),
            error=type(event.error).__name__,
        )
    elif isinstance(event, CircuitRejected):
        note(JournalKind.CIRCUIT_REJECTED, dependency=event.name, state=str(event.state))


# ------------------------------------------------------------------------------------------------------ reading


def parse_entries(raw: Any) -> list[dict[str, Any]]:
    """``XRANGE``/``XREAD`` entries as dicts, each with its stream ``id``."""
    entries: list[dict[str, Any]] = []
    for entry_id, values in raw or ():
        payload = values.get(ENTRY_FIELD) if isinstance(values, dict) else None
        if payload is None and isinstance(values, dict):
            payload = values.get(ENTRY_FIELD.encode())
        if payload is None:
            continue
        try:
            entry = json.loads(text(payload))
        except ValueError:
            continue
        entries.append({"id": text(entry_id), **entry})
    return entries


async def read_journal(
    redis: RedisClient, booking_id: str, *, after: str | None = None, count: int | None = None
) -> list[dict[str, Any]]:
    """The entries after stream id ``after`` (exclusive; all of them with ``None``), oldest first."""
    start = "-" if after is None else f"({after}"
    return parse_entries(await redis.xrange(journal_key(booking_id), min=start, max="+", count=count))


def is_final(entry: Mapping[str, Any]) -> bool:
    return entry.get("kind") in FINAL_JOURNAL_KINDS
