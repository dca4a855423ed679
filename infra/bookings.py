"""The booking records users poll: input, progress and outcome of every accepted booking, in Redis.

A booking is written before its 202 is sent and only moves forward: once ``confirmed``, ``failed`` or
``cancelled`` its saga can change it no more, whichever process (the owner, a stale owner, the recovery worker)
tries. The one way on from ``confirmed`` is a cancel of the stay: ``begin_cancel`` (→ ``cancelling``), then
``finalize`` (``cancelled``) or ``keep_confirmed`` (back, saying why), each one script (``agents.booking.cancellation``).
Client idempotency keys map to booking ids here too, so a retried ``POST /bookings`` finds the booking it already
created.

Cancelling is two fields of the record, each set by one script, so exactly one of them wins a race:
``cancel_requested_at`` (``request_cancel``: the durable flag the saga asks for at every step boundary) and
``committed_at`` (``commit``: the saga's point of no return, set just before the confirm is sent). A cancel after
the commit answers "too late"; a commit after the cancel is refused and the saga compensates. A booking with the
flag that ends ``failed`` is written ``cancelled`` (the compensation it needed ran either way). See docs/cancel.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

from redis.asyncio import Redis

from domain.booking import FINAL_BOOKING_STATUSES, BookingStatus, JournalKind
from identity.people import person_key
from infra import journal
from infra.booking_keys import BOOKINGS_TAG, booking_key, journal_key
from infra.journal import encode_entry, instance_id
from infra.metrics import count_cancel_request, count_final
from infra.redis import RedisScript, key, text
from infra.settings import get_settings

logger = logging.getLogger(__name__)

PUBLIC_FIELDS: Final = (
    "booking_id",
    "status",
    "owner",
    "city",
    "checkin",
    "checkout",
    "guests",
    "hotel_id",
    "hotel_name",
    "total_price",
    "currency",
    "reservation_id",
    "payment_id",
    "cancellation",
    "refund",
    "cancel_error",
    "error",
    "cancel_requested_at",
    "created_at",
    "updated_at",
)
# A long-poll waiting on a run that another process finishes (the recovery worker, a replica) only sees it by
# reading Redis: first after 0.25 s, then at doubling intervals up to 1 s, so a wait of many seconds costs a few
# reads instead of four a second. Runs finished here wake their waiters at once, without polling.
FALLBACK_POLL_S: Final = 0.25
FALLBACK_POLL_MAX_S: Final = 1.0
_JSON_FIELDS: Final = frozenset({"error", "guests", "total_price", "cancellation", "refund", "cancel_error"})
INDEX_MAX: Final = 100_000
"""Bookings kept in the ``GET /bookings`` index (besides its retention, ``JOURNAL_TTL_S``); the oldest go first."""

# Creates the record only once; a second create (a retried request, a racing replica) changes nothing. The same
# call opens the booking's journal (``accepted``) and lists it in the index ``GET /bookings`` pages through, trimmed
# to the journal's retention.
# KEYS: booking, inflight, journal, index, owner's index | ARGV: now, accepted entry, journal max len, ttl_s, index
# max, fields... (the owner's index is the person's own ``GET /bookings``, bounded and expiring alike)
_CREATE = RedisScript("""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[4])
for i = 4, 5 do
  redis.call('ZADD', KEYS[i], ARGV[1], ARGV[7])  -- the fields start 'booking_id', <id>
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. (tonumber(ARGV[1]) - tonumber(ARGV[4])))
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -1 - tonumber(ARGV[5]))
end
redis.call('EXPIRE', KEYS[5], ARGV[4])
return 1
""")

# Final states are final: an update never moves a confirmed/failed/cancelled booking anywhere else. A final update
# also appends the journal's final entry (in the same step, so exactly one, whichever process gets there first) and
# answers with the whole record, which the long-polls waiting here return without reading it again. A final
# ``failed`` of a booking whose cancel was requested is written ``cancelled`` (its journal entry too): the cancel
# asked for exactly that end. Every update, progress or final, carries the writing process's entries of this booking
# not sent yet (they go first): a booking's entries ride on the status writes it makes anyway.
# KEYS: booking, inflight, journal | ARGV: final ('1'/'0'), final entry, journal max len, ttl_s, n, n entries, fields...
_UPDATE = RedisScript("""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-1} end
if status == 'confirmed' or status == 'failed' or status == 'cancelled' then return {0, status} end
local first = 6 + tonumber(ARGV[5])
for i = 6, first - 1 do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i])
end
if first > 6 then redis.call('EXPIRE', KEYS[3], ARGV[4]) end
if ARGV[1] == '1' then
  local fields = {}
  local cancelled = redis.call('HEXISTS', KEYS[1], 'cancel_requested_at') == 1
  for i = first, #ARGV, 2 do
    local value = ARGV[i + 1]
    if cancelled and ARGV[i] == 'status' and value == 'failed' then
      value = 'cancelled'
      local entry = cjson.decode(ARGV[2])  -- the final entry says what the record says
      entry['kind'] = 'cancelled'
      ARGV[2] = cjson.encode(entry)
    end
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = value
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  redis.call('EXPIRE', KEYS[1], ARGV[4])  -- a final booking is kept as long as its journal, then goes with it
  redis.call('ZREM', KEYS[2], KEYS[1])
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return {1, redis.call('HGETALL', KEYS[1])}
end
redis.call('HSET', KEYS[1], unpack(ARGV, first))
return {1}
""")

# The cancel request: sets the flag unless the booking is final or committed (past its point of no return).
# Answers {outcome, status}; ARGV[1] is the time.
_REQUEST_CANCEL = RedisScript("""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'unknown', ''} end
if status == 'cancelled' then return {'cancelled', status} end
if status == 'confirmed' or status == 'failed' then return {'too_late', status} end
if redis.call('HEXISTS', KEYS[1], 'committed_at') == 1 then return {'too_late', status} end
if redis.call('HEXISTS', KEYS[1], 'cancel_requested_at') == 1 then return {'cancelling', status} end
redis.call('HSET', KEYS[1], 'cancel_requested_at', ARGV[1], 'updated_at', ARGV[1])
return {'requested', status}
""")

# The saga's point of no return, right before the confirm is sent: refused (0) once a cancel was requested.
# Again after a crash: still 1. A booking without a record (never the case for a running saga) is not held up.
_COMMIT = RedisScript("""
if redis.call('HEXISTS', KEYS[1], 'cancel_requested_at') == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSETNX', KEYS[1], 'committed_at', ARGV[1]) end
return 1
""")

# A confirmed booking's cancel (``agents.booking.cancellation``): ``confirmed`` → ``cancelling`` with the refund its policy
# gives now, once; a second cancel finds it (and the refund fixed by the first). Back in flight until it ends.
# KEYS: booking, inflight, journal | ARGV: now, refund JSON, accepted entry, journal max len, ttl_s, the run's thread
_BEGIN_CANCEL = RedisScript("""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'unknown', ''} end
if status == 'cancelling' or status == 'cancelled' then
  return {status, redis.call('HGET', KEYS[1], 'refund') or ''}
end
if status ~= 'confirmed' then return {'not_confirmed', status} end
redis.call('HSET', KEYS[1], 'status', 'cancelling', 'refund', ARGV[2], 'cancel_error', '', 'updated_at', ARGV[1],
  'cancel_thread', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[3], ARGV[5])
return {'started', ARGV[2]}
""")

# The hotel refused the cancel of a confirmed stay (nothing was moved): ``cancelling`` → ``confirmed`` again, saying
# why; the journal ends with ``confirmed`` once more. 0 when it was not cancelling.
# KEYS: booking, inflight, journal | ARGV: now, error JSON, journal max len, ttl_s, n, n entries (the last: confirmed)
_KEEP_CONFIRMED = RedisScript("""
if redis.call('HGET', KEYS[1], 'status') ~= 'cancelling' then return 0 end
for i = 6, 5 + tonumber(ARGV[5]) do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i])
end
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('HSET', KEYS[1], 'status', 'confirmed', 'cancel_error', ARGV[2], 'refund', '', 'updated_at', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('ZREM', KEYS[2], KEYS[1])
return 1
""")

# One client key → one booking id; the body hash tells a retry from a different request under the same key.
_CLAIM_KEY = RedisScript("""
local current = redis.call('GET', KEYS[1])
if current then return current end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return ARGV[1]
""")


class CancelOutcome(StrEnum):
    """What ``BookingStore.request_cancel`` found and did."""

    REQUESTED = "requested"
    """The flag is set now: the run stops at its next step boundary, compensates and ends ``cancelled``."""
    CANCELLING = "cancelling"
    """Requested before, not final yet: nothing changed (a cancel is idempotent)."""
    CANCELLED = "cancelled"
    """Final already, as ``cancelled``."""
    TOO_LATE = "too_late"
    """Final (``confirmed``, ``failed``) or committed (its confirm was sent): nothing changed."""
    UNKNOWN = "unknown"


class AfterSaleCancel(StrEnum):
    """What ``BookingStore.begin_cancel`` found and did with a booking that may be confirmed."""

    STARTED = "started"
    """``confirmed`` → ``cancelling`` now, with this call's refund: its run cancels the stay and refunds."""
    CANCELLING = "cancelling"
    """An earlier cancel is on its way, with its refund: nothing changed."""
    CANCELLED = "cancelled"
    """Final already as ``cancelled`` (with the refund of its cancel, if it was confirmed): nothing changed."""
    NOT_CONFIRMED = "not_confirmed"
    """Not confirmed (in flight, ``failed``): the cancel of a booking in flight applies (``request_cancel``)."""
    UNKNOWN = "unknown"


def _update_args(final: str, entry: str, before: list[str], fields: dict[str, Any]) -> list[Any]:
    """``_UPDATE``'s ARGV: the final flag and entry, the journal's bounds, the entries that go first, the fields."""
    settings = get_settings()
    return [final, entry, settings.journal_max_len, settings.journal_ttl_s, len(before), *before, *_flatten(fields)]


class BookingStore:
    def __init__(self, redis: Redis, *, idempotency_ttl_s: int = 24 * 3600) -> None:
        self._redis = redis
        self._ttl = idempotency_ttl_s
        # Long-polls waiting in this process, woken the moment a run here makes its booking final, with the final
        # record in ``_finals`` (so the answer leaves before the run's last checkpoint is written, without another
        # read). A run finished elsewhere (the recovery worker, another replica) is noticed by the fallback poll.
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._finals: dict[str, dict[str, Any]] = {}
        self._released = False  # stopping: every long-poll answers now, with the booking as it stands
        # The last progress write in flight per booking; the next one waits for it, so they land in order.
        self._reports: dict[str, asyncio.Task[None]] = {}

    @staticmethod
    def record_prefix() -> str:
        """What every booking record's key starts with (the booking id follows)."""
        return booking_key("")

    @staticmethod
    def _key(booking_id: str) -> str:
        return booking_key(booking_id)

    @staticmethod
    def index_key() -> str:
        """Every booking by creation time (epoch seconds): what ``GET /bookings`` pages through, newest first."""
        return key(BOOKINGS_TAG, "bookings", "created")

    @staticmethod
    def owner_index_key(owner: str | None) -> str:
        """One person's bookings by creation time: their ``GET /bookings`` (``None``: a service's own bookings)."""
        return key(BOOKINGS_TAG, "bookings", "owner", person_key(owner) if owner is not None else "-")

    @staticmethod
    def _client_key(owner: str | None, client_key: str) -> str:
        # keys are per person: the same key from two people is two bookings
        return key(BOOKINGS_TAG, "booking-key", person_key(owner) if owner is not None else "-", client_key)

    @staticmethod
    def _inflight_key() -> str:
        return key(BOOKINGS_TAG, "inflight")

    async def create(self, booking_id: str, request: Mapping[str, Any]) -> bool:
        """Record a new booking as ``pending``, on the replicas too; False when it already exists.

        ``request["owner"]``: the person it belongs to (``sub``), ``None`` for a service's own."""
        now = time.time()
        owner = request.get("owner")
        fields: dict[str, Any] = {
            "booking_id": booking_id,
            "status": "pending",
            "owner": owner,
            "city": request["city"],
            "checkin": request["checkin"],
            "checkout": request["checkout"],
            "guests": request["guests"],
            "hotel_id": request.get("hotel_id"),
            "created_at": now,
            "updated_at": now,
        }
        settings = get_settings()
        accepted = encode_entry(
            JournalKind.ACCEPTED,
            instance_id(),
            {
                "city": request["city"],
                "checkin": request["checkin"],
                "checkout": request["checkout"],
                "guests": request["guests"],
                "hotel_id": request.get("hotel_id"),
            },
            at=now,
        )
        args = [now, accepted, settings.journal_max_len, settings.journal_ttl_s, INDEX_MAX, *_flatten(fields)]
        keys = [
            self._key(booking_id),
            self._inflight_key(),
            journal_key(booking_id),
            self.index_key(),
            self.owner_index_key(owner),
        ]
        # durable: the last write before the 202; replicas that have it have everything written before it too
        return bool(await _CREATE(self._redis, keys=keys, args=args, durable=True))

    async def update(self, booking_id: str, **fields: Any) -> bool:
        """Move a booking forward; False if it is already final (or unknown). A final status goes to ``finalize``."""
        status = fields.pop("status", None)
        if status in FINAL_BOOKING_STATUSES:
            return (await self.finalize(booking_id, status, **fields))[1]
        if status is not None:
            fields["status"] = status
        fields["updated_at"] = time.time()
        before = await journal.take(booking_id)  # the booking's entries ride along (a progress report's round trip)
        try:
            reply = await _UPDATE(
                self._redis,
                keys=[self._key(booking_id), self._inflight_key(), journal_key(booking_id)],
                args=_update_args("0", "", before, fields),
            )
        except BaseException:
            journal.give_back(booking_id, before)
            raise
        return int(reply[0]) == 1

    async def finalize(self, booking_id: str, status: BookingStatus, **fields: Any) -> tuple[str | None, bool]:
        """Write the booking's final status; returns the status it ends with and whether this call wrote it.

        That is ``status``, or ``cancelled`` for a ``failed`` whose cancel was requested, or (not written) the final
        status it had already: final states never change. ``(None, False)`` for an unknown booking.
        """
        if status not in FINAL_BOOKING_STATUSES:
            raise ValueError(f"not a final status: {status!r}")
        fields["status"] = status
        now = fields["updated_at"] = time.time()
        before = await journal.take(booking_id, final=True)  # this process's entries first: the final entry is last
        entry = encode_entry(str(status), instance_id(), _final_fields(fields), at=now)
        try:
            reply = await _UPDATE(
                self._redis,
                keys=[self._key(booking_id), self._inflight_key(), journal_key(booking_id)],
                args=_update_args("1", entry, before, fields),
                # durable: the checkpoint after ``finish`` says the run needs nothing more, so a failover that
                # forgot this write would leave the booking unfinished for good
                durable=True,
            )
        except BaseException:
            journal.give_back(booking_id, before, final=True)
            raise
        outcome = int(reply[0])
        if outcome == -1:
            return None, False
        if outcome == 0:
            return text(reply[1]), False
        record = [text(value) for value in reply[1]]
        raw = dict(zip(record[::2], record[1::2], strict=True))
        _count_final(raw, now)
        final = _view(raw)
        if waiters := self._waiters.get(booking_id):
            self._finals[booking_id] = final
            for event in waiters:
                event.set()
        return str(final["status"]), True

    async def request_cancel(self, booking_id: str) -> tuple[CancelOutcome, str | None]:
        """Ask for the booking to be cancelled: the durable flag every step of its saga checks (idempotent).

        Returns what was found and done, and the status the booking had. The one place a cancel is recorded.
        """
        # durable: a 202 promises the cancel, so a failover must not forget the flag
        outcome, status = await _REQUEST_CANCEL(
            self._redis, keys=[self._key(booking_id)], args=[time.time()], durable=True
        )
        found = CancelOutcome(text(outcome))
        count_cancel_request(found.value)
        if found is CancelOutcome.REQUESTED:
            logger.info("booking %s: cancel requested (was %s)", booking_id, text(status))
        return found, (text(status) or None)

    async def begin_cancel(
        self, booking_id: str, refund: Mapping[str, Any], thread_id: str
    ) -> tuple[AfterSaleCancel, dict[str, Any] | str | None]:
        """Start cancelling a confirmed booking with ``refund`` (``domain.cancellation.RefundQuote``) by the run
        ``thread_id``, exactly once.

        Returns what was found and the refund in force (this one, or the first cancel's), or for ``not_confirmed``
        the status. The run that carries it out is created first (its input holds the refund), and its recovery
        calls this again: whatever dies in between, the run finds the booking ``cancelling``.
        """
        settings = get_settings()
        now = time.time()
        entry = encode_entry(JournalKind.CANCEL_ACCEPTED, instance_id(), dict(refund), at=now)
        outcome, found = await _BEGIN_CANCEL(
            self._redis,
            keys=[self._key(booking_id), self._inflight_key(), journal_key(booking_id)],
            args=[now, json.dumps(dict(refund)), entry, settings.journal_max_len, settings.journal_ttl_s, thread_id],
            durable=True,  # a 202 promises the refund: a failover must not forget it
        )
        answer = AfterSaleCancel(text(outcome))
        if answer is AfterSaleCancel.NOT_CONFIRMED:
            return answer, text(found) or None
        raw = text(found)
        return answer, (json.loads(raw) if raw else None)

    async def cancel_thread(self, booking_id: str) -> str | None:
        """The run of the booking's latest cancel after it was confirmed (``agents.booking.cancellation``), if any."""
        thread = await self._redis.hget(self._key(booking_id), "cancel_thread")
        return None if thread is None else text(thread)

    async def keep_confirmed(self, booking_id: str, error: Mapping[str, Any]) -> bool:
        """The hotel refused the cancel (nothing moved): ``confirmed`` again, ``cancel_error`` saying why."""
        settings = get_settings()
        now = time.time()
        before = await journal.take(booking_id, final=True)
        entries = [
            *before,
            encode_entry(JournalKind.CANCEL_FAILED, instance_id(), dict(error), at=now),
            encode_entry(JournalKind.CONFIRMED, instance_id(), {"kept": True}, at=now),
        ]
        try:
            kept = await _KEEP_CONFIRMED(
                self._redis,
                keys=[self._key(booking_id), self._inflight_key(), journal_key(booking_id)],
                args=[
                    now,
                    json.dumps(dict(error)),
                    settings.journal_max_len,
                    settings.journal_ttl_s,
                    len(entries),
                    *entries,
                ],
                durable=True,
            )
        except BaseException:
            journal.give_back(booking_id, before, final=True)
            raise
        return bool(kept)

    async def cancel_requested(self, booking_id: str) -> bool:
        """Whether a cancel was requested: what the saga asks at each step boundary."""
        return bool(await self._redis.hexists(self._key(booking_id), "cancel_requested_at"))

    async def charge_leaving(self, booking_id: str) -> bool:
        """Mark, before a charge is sent, that it may leave; True when an earlier attempt may have sent one already.

        Written ahead: a process that dies mid-call leaves the mark, so the run resumed elsewhere still knows a charge
        may be captured (and refunds it) even if its own attempt is then refused before sending.
        """
        return not await self._redis.hsetnx(self._key(booking_id), "charge_sent_at", time.time())

    async def charge_never_left(self, booking_id: str) -> None:
        """Clear the mark: the only attempt made was refused before anything was sent (nothing to refund)."""
        await self._redis.hdel(self._key(booking_id), "charge_sent_at")

    async def committed(self, booking_id: str) -> bool:
        """Whether the saga passed its point of no return (``commit``): from there it only goes forward."""
        return bool(await self._redis.hexists(self._key(booking_id), "committed_at"))

    async def commit(self, booking_id: str) -> bool:
        """Pass the point of no return (right before the confirm is sent); False when a cancel came first."""
        return bool(await _COMMIT(self._redis, keys=[self._key(booking_id)], args=[time.time()]))

    def report(self, booking_id: str, status: str) -> None:
        """Record a progress status (``searching``, ``reserving``...) in the background.

        Progress is for people watching a booking, so a step does not wait for it: the write goes out while the step
        does its work. Reports for one booking land in the order they were made here (each waits for the previous),
        and never after a final status (``update`` refuses that). A failed write is logged, not raised: the step's
        own Redis calls fail too if Redis is really gone.
        """
        if status in FINAL_BOOKING_STATUSES or status not in BookingStatus.__members__.values():
            raise ValueError(f"not a progress status: {status!r}")
        previous = self._reports.get(booking_id)
        task = asyncio.create_task(self._write_report(previous, booking_id, status), name=f"progress:{booking_id}")
        self._reports[booking_id] = task
        task.add_done_callback(functools.partial(self._report_done, booking_id))

    async def flush(self, booking_id: str | None = None) -> None:
        """Wait until the progress reports made so far (for one booking, or all) are written."""
        # Reports for one booking are chained, so its last one is enough.
        if booking_id is None:
            pending = set(self._reports.values())
        else:
            pending = {last} if (last := self._reports.get(booking_id)) is not None else set()
        if pending:
            await asyncio.wait(pending)

    async def _write_report(self, previous: asyncio.Task[None] | None, booking_id: str, status: str) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        try:
            await self.update(booking_id, status=status)
        except Exception:
            logger.warning("booking %s: could not record status %r", booking_id, status, exc_info=True)

    def _report_done(self, booking_id: str, task: asyncio.Task[None]) -> None:
        if self._reports.get(booking_id) is task:
            del self._reports[booking_id]

    async def get(self, booking_id: str) -> dict[str, Any] | None:
        raw = await self._redis.hgetall(self._key(booking_id))
        return _view({text(name): text(value) for name, value in raw.items()}) if raw else None

    async def owner(self, booking_id: str) -> tuple[bool, str | None]:
        """Whether the booking exists, and the person it belongs to (``None``: a service's own)."""
        status, owner = await self._redis.hmget(self._key(booking_id), ["status", "owner"])
        return status is not None, (text(owner) or None) if owner is not None else None

    async def status(self, booking_id: str) -> str | None:
        """The status alone (one field, not the whole record); ``None`` for an unknown booking."""
        status = await self._redis.hget(self._key(booking_id), "status")
        return None if status is None else text(status)

    def release_waiters(self) -> None:
        """The process is stopping: every long-poll (and any that starts from now) answers the booking as it stands
        at once, instead of holding its connection until the server cancels it."""
        self._released = True
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def wait_final(self, booking_id: str, wait_s: float) -> dict[str, Any] | None:
        """The booking once it is final, or as it stands when ``wait_s`` runs out or the process stops (long
        polling)."""
        deadline = time.monotonic() + max(0.0, wait_s)
        event = asyncio.Event()
        waiters = self._waiters.setdefault(booking_id, set())
        waiters.add(event)
        try:
            booking = await self.get(booking_id)
            interval = FALLBACK_POLL_S
            while booking is not None and booking["status"] not in FINAL_BOOKING_STATUSES:
                left = deadline - time.monotonic()
                if left <= 0 or self._released:
                    return booking
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, interval)):
                        await event.wait()
                if (final := self._finals.get(booking_id)) is not None:
                    return dict(final)
                if self._released:
                    return await self.get(booking_id)
                interval = min(interval * 2, FALLBACK_POLL_MAX_S)
                # the status first: the whole record only once it is final, gone, or the wait is over
                if time.monotonic() < deadline:
                    status = await self.status(booking_id)
                    if status is not None and status not in FINAL_BOOKING_STATUSES:
                        continue
                booking = await self.get(booking_id)
            return booking
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(booking_id, None)
                self._finals.pop(booking_id, None)

    async def page(
        self,
        *,
        status: str | None,
        limit: int,
        cursor: tuple[float, str] | None,
        owner: str | None = None,
        everyone: bool = True,
    ) -> tuple[list[dict[str, Any]], tuple[float, str] | None]:
        """Bookings newest first (``status`` only, when given), after ``cursor``; and the cursor of the next page.
        ``everyone=False``: only ``owner``'s.

        The cursor is the last item's (creation time, id): equal times are ordered by id, so a page never repeats or
        skips one. Reads the index in chunks and each chunk's statuses in one pipeline.
        """
        found: list[dict[str, Any]] = []
        top: str = "+inf" if cursor is None else repr(cursor[0])
        last = cursor
        chunk = max(limit, 50)
        while True:
            index = self.index_key() if everyone else self.owner_index_key(owner)
            raw: list[Any] = await self._redis.zrevrangebyscore(index, top, "-inf", start=0, num=chunk, withscores=True)
            items = [(text(member), float(score)) for member, score in raw]
            if last is not None:  # the cursor's own time may still hold ids after it (smaller, in reverse order)
                items = [(bid, sc) for bid, sc in items if sc < last[0] or (sc == last[0] and bid < last[1])]
            if not items:
                return found, None
            async with self._redis.pipeline(transaction=False) as pipe:
                for booking_id, _ in items:
                    pipe.hmget(self._key(booking_id), ["status", "created_at", "updated_at"])
                rows = await pipe.execute()
            for (booking_id, score), (row_status, created, updated) in zip(items, rows, strict=True):
                last = (score, booking_id)
                if row_status is None or (status is not None and text(row_status) != status):
                    continue
                found.append(
                    {
                        "booking_id": booking_id,
                        "status": text(row_status),
                        "created_at": _iso(float(text(created))) if created else None,
                        "updated_at": _iso(float(text(updated))) if updated else None,
                    }
                )
                if len(found) == limit:
                    return found, last
            if len(raw) < chunk:
                return found, None
            top = repr(items[-1][1])

    async def has_bookings(self, owner: str | None) -> bool:
        """Whether ``owner`` has any booking kept (their ``GET /bookings`` is not empty): one ``ZCARD``."""
        return bool(await self._redis.zcard(self.owner_index_key(owner)))

    async def in_flight(self) -> int:
        return int(await self._redis.zcard(self._inflight_key()))

    async def claim_client_key(
        self, client_key: str, body_hash: str, booking_id: str, owner: str | None = None
    ) -> tuple[str, bool]:
        """Bind ``owner``'s ``client_key`` to ``booking_id`` unless it is bound already.

        Returns the booking id the key belongs to and whether the stored body matches this one.
        """
        stored = await _CLAIM_KEY(
            self._redis,
            keys=[self._client_key(owner, client_key)],
            args=[f"{booking_id}:{body_hash}", self._ttl],
        )
        bound_id, _, bound_hash = text(stored).partition(":")
        return bound_id, bound_hash == body_hash

    async def booking_for_key(self, client_key: str, owner: str | None = None) -> str | None:
        """The booking ``owner``'s ``client_key`` is bound to, if any (the concierge follows the booking its key made)."""
        stored = await self._redis.get(self._client_key(owner, client_key))
        return None if stored is None else text(stored).partition(":")[0]

    async def find_client_key(
        self, client_key: str, body_hash: str, owner: str | None = None
    ) -> tuple[str, bool] | None:
        """What ``claim_client_key`` would answer, without binding the key: ``None`` when it is not bound.

        For a door that cannot take a new booking now but still owes a retried request the booking it has.
        """
        stored = await self._redis.get(self._client_key(owner, client_key))
        if stored is None:
            return None
        bound_id, _, bound_hash = text(stored).partition(":")
        return bound_id, bound_hash == body_hash


def _count_final(raw: Mapping[str, str], now: float) -> None:
    """The booking's outcome and its time from acceptance, counted by the one process that wrote the final status."""
    try:
        seconds: float | None = now - float(raw["created_at"])
    except (KeyError, ValueError):
        seconds = None
    count_final(raw.get("status", "unknown"), seconds)


def _final_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """What a final journal entry tells: the outcome's ids, or the error code (never a token)."""
    error = fields.get("error")
    out = {name: fields.get(name) for name in ("hotel_id", "reservation_id", "payment_id", "total_price", "currency")}
    if fields.get("refund") is not None:
        out["refund"] = fields["refund"]
    if isinstance(error, Mapping):
        out["error_code"] = error.get("code")
        out["error_message"] = error.get("message")
    return out


def _view(raw: Mapping[str, str]) -> dict[str, Any]:
    """The public view of a stored record: every public field, JSON fields decoded, times as ISO 8601."""
    view: dict[str, Any] = dict.fromkeys(PUBLIC_FIELDS)
    for name, value in raw.items():
        if name not in view:
            continue
        if value == "":
            view[name] = None
        elif name in _JSON_FIELDS:
            view[name] = json.loads(value)
        elif name in {"created_at", "updated_at", "cancel_requested_at"}:
            view[name] = _iso(float(value))
        else:
            view[name] = value
    return view


def _flatten(fields: Mapping[str, Any]) -> list[Any]:
    flat: list[Any] = []
    for name, value in fields.items():
        if value is None:
            encoded: Any = ""
        elif name in _JSON_FIELDS:
            encoded = json.dumps(value)
        else:
            encoded = value
        flat.extend((name, encoded))
    return flat


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"
