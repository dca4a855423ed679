"""The booking records users poll: written once, final states stay final, long polls wake up promptly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from infra import bookings
from infra.bookings import BookingStore

REQUEST = {"city": "Lisbon", "checkin": "2027-03-01", "checkout": "2027-03-03", "guests": 2, "hotel_id": None}


@pytest.fixture
def store(redis) -> BookingStore:
    return BookingStore(redis)


async def test_create_is_once_and_the_view_has_every_public_field(store: BookingStore) -> None:
    assert await store.create("b1", REQUEST)
    assert not await store.create("b1", {**REQUEST, "city": "Porto"})
    view = await store.get("b1")
    assert view is not None
    assert view["status"] == "pending" and view["city"] == "Lisbon" and view["guests"] == 2
    assert view["error"] is None and view["payment_id"] is None
    assert view["created_at"].endswith("Z")
    assert await store.get("missing") is None
    assert await store.in_flight() == 1


async def test_final_states_never_change_again(store: BookingStore) -> None:
    await store.create("b2", REQUEST)
    assert await store.update("b2", status="reserving")
    assert await store.update("b2", status="failed", error={"code": "timeout", "message": "late"})
    assert not await store.update("b2", status="confirmed")
    view = await store.get("b2")
    assert view is not None
    assert view["status"] == "failed" and view["error"] == {"code": "timeout", "message": "late"}
    assert await store.in_flight() == 0
    assert not await store.update("unknown", status="searching")


async def test_a_long_poll_wakes_when_the_booking_becomes_final(
    store: BookingStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no fallback poll within the wait: only the update can hand the waiters a final record before it runs out
    monkeypatch.setattr(bookings, "FALLBACK_POLL_S", 3600.0)
    await store.create("b3", REQUEST)

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        await store.update("b3", status="confirmed", payment_id="pay_1")

    finisher = asyncio.create_task(finish_soon())
    views = await asyncio.gather(store.wait_final("b3", 30), store.wait_final("b3", 30))
    await finisher
    view = views[0]
    assert view is not None and view["status"] == "confirmed" and view["payment_id"] == "pay_1"
    # both waiters got the record as stored, handed over by the update (not read again)
    assert views[0] == views[1] == await store.get("b3")
    views[0]["status"] = "tampered"
    assert views[1]["status"] == "confirmed", "each waiter gets its own copy"


async def test_a_long_poll_sees_a_run_finished_by_another_process(store: BookingStore, redis) -> None:
    await store.create("b4", REQUEST)
    other_process = BookingStore(redis)

    async def finish_elsewhere() -> None:
        await asyncio.sleep(0.05)
        await other_process.update("b4", status="confirmed")

    finisher = asyncio.create_task(finish_elsewhere())
    view = await store.wait_final("b4", 5)
    await finisher
    assert view is not None and view["status"] == "confirmed"


async def test_a_long_poll_returns_the_current_state_when_time_runs_out(store: BookingStore, redis) -> None:
    await store.create("b5", REQUEST)
    view = await store.wait_final("b5", 0.1)
    assert view is not None and view["status"] == "pending"

    # the state as it is when the wait ends, not as it was when it began
    async def progress_elsewhere() -> None:
        await asyncio.sleep(0.05)
        await BookingStore(redis).update("b5", status="paying")

    mover = asyncio.create_task(progress_elsewhere())
    view = await store.wait_final("b5", 0.4)
    await mover
    assert view is not None and view["status"] == "paying"


async def test_a_stopping_process_answers_its_long_polls_at_once_with_the_booking_as_it_stands(
    store: BookingStore, redis: Any
) -> None:
    await store.create("b6", REQUEST)
    await store.update("b6", status="paying")
    polls = [asyncio.create_task(store.wait_final("b6", 30)) for _ in range(20)]
    await asyncio.sleep(0.1)
    assert not any(p.done() for p in polls), "they wait for the booking to end"
    store.release_waiters()  # SIGTERM (the shell's ``stopping``)
    done, pending = await asyncio.wait(polls, timeout=5)
    assert not pending, "every long-poll answered, none left for the server to cancel"
    assert {view["status"] for view in (p.result() for p in done) if view is not None} == {"paying"}
    # one that starts while stopping does not wait either
    late = await asyncio.wait_for(store.wait_final("b6", 30), timeout=5)
    assert late is not None and late["status"] == "paying"


class CountingReads(BookingStore):
    def __init__(self, redis: Any) -> None:
        super().__init__(redis)
        self.reads: list[str] = []
        self.statuses: list[str | None] = []

    async def get(self, booking_id: str) -> dict[str, Any] | None:
        self.reads.append("record")
        return await super().get(booking_id)

    async def status(self, booking_id: str) -> str | None:
        self.reads.append("status")
        self.statuses.append(status := await super().status(booking_id))
        return status


async def test_a_long_wait_backs_off_and_reads_the_status_only(redis) -> None:
    store = CountingReads(redis)
    await store.create("b6", REQUEST)
    await store.wait_final("b6", 2.0)
    # every 0.25 s for 2 s would be 8 reads of the whole record; backing off (0.25, 0.5, 1) it is 3 status reads,
    # plus the record at the start and at the end
    assert store.reads == ["record", "status", "status", "status", "record"], store.reads

    async def finish_elsewhere() -> None:
        await asyncio.sleep(1.2)
        await BookingStore(redis).update("b6", status="confirmed")

    store.reads.clear()
    finisher = asyncio.create_task(finish_elsewhere())
    view = await store.wait_final("b6", 10)
    await finisher
    assert view is not None and view["status"] == "confirmed"
    # noticed at the next read (1.75 s), not at the end of the wait
    assert store.statuses[-1] == "confirmed", store.statuses
    assert store.reads == ["record", "status", "status", "status", "record"], store.reads


async def test_a_booking_is_its_owners_in_lists_keys_and_records_and_expires_once_final(
    store: BookingStore, redis: Any
) -> None:
    assert await store.create("ba", {**REQUEST, "owner": "alice"})
    assert await store.create("bb", {**REQUEST, "owner": "bob"})
    assert await store.owner("ba") == (True, "alice") and await store.owner("nope") == (False, None)
    assert (await store.get("ba") or {})["owner"] == "alice"
    alices, _ = await store.page(status=None, limit=10, cursor=None, owner="alice", everyone=False)
    everyone, _ = await store.page(status=None, limit=10, cursor=None)
    assert [b["booking_id"] for b in alices] == ["ba"] and {"ba", "bb"} <= {b["booking_id"] for b in everyone}
    assert 0 < await redis.ttl(store.owner_index_key("alice")) <= 7 * 24 * 3600  # a person's index expires
    # keys are per person: the same key from two people binds two bookings
    assert await store.claim_client_key("k", "h", "ba", "alice") == ("ba", True)
    assert await store.claim_client_key("k", "h", "bb", "bob") == ("bb", True)
    assert await store.booking_for_key("k", "alice") == "ba" and await store.booking_for_key("k", "bob") == "bb"
    # a booking in flight stays; a final one goes with its journal
    assert await redis.ttl(bookings.booking_key("ba")) == -1
    assert await store.update("ba", status="confirmed")
    assert 0 < await redis.ttl(bookings.booking_key("ba")) <= 7 * 24 * 3600


async def test_a_client_key_binds_one_booking_and_remembers_the_body(store: BookingStore) -> None:
    assert await store.claim_client_key("k1", "hash-a", "first") == ("first", True)
    assert await store.claim_client_key("k1", "hash-a", "second") == ("first", True)
    assert await store.claim_client_key("k1", "hash-b", "third") == ("first", False)


# ------------------------------------------------------------------------------------------- progress reports


class SlowFirstUpdate(BookingStore):
    """The first update takes a while (a slow network moment); records the order updates reach Redis."""

    def __init__(self, redis: Any) -> None:
        super().__init__(redis)
        self.landed: list[str] = []

    async def update(self, booking_id: str, **fields: Any) -> bool:
        if not self.landed:
            self.landed.append("(slow)")
            await asyncio.sleep(0.1)
        self.landed.append(str(fields.get("status")))
        return await super().update(booking_id, **fields)


async def test_progress_reports_do_not_wait_and_land_in_order(redis: Any) -> None:
    store = SlowFirstUpdate(redis)
    await store.create("p1", REQUEST)
    store.report("p1", "searching")
    store.report("p1", "reserving")
    store.report("p1", "paying")
    assert store.landed == [], "report() returns before anything is written"
    await store.flush("p1")
    assert store.landed == ["(slow)", "searching", "reserving", "paying"]
    view = await store.get("p1")
    assert view is not None and view["status"] == "paying"


async def test_a_report_never_moves_a_final_booking(store: BookingStore) -> None:
    await store.create("p2", REQUEST)
    await store.update("p2", status="confirmed")
    store.report("p2", "confirming")
    await store.flush()
    view = await store.get("p2")
    assert view is not None and view["status"] == "confirmed"


async def test_a_report_is_only_a_progress_status(store: BookingStore) -> None:
    for status in ("confirmed", "failed", "lost"):
        with pytest.raises(ValueError, match="not a progress status"):
            store.report("p3", status)


async def test_a_failed_report_is_logged_not_raised(store: BookingStore, caplog: pytest.LogCaptureFixture) -> None:
    async def broken(booking_id: str, **fields: Any) -> bool:
        raise ConnectionError("redis went away")

    store.update = broken  # type: ignore[method-assign]
    store.report("p4", "searching")
    await store.flush("p4")
    assert "could not record status 'searching'" in caplog.text
