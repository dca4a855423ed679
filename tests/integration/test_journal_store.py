"""The journal against a real Redis: batched in order, closed by the final entry, bounded, expiring, no secret
fields; and the ``GET /bookings`` index pages without repeats even when bookings share a creation time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from domain.booking import JournalKind
from infra import bookings, journal
from infra.bookings import BookingStore
from infra.journal import JournalWriter, install_writer, journal_key, journal_scope, note, read_journal

REQUEST = {"city": "Lisbon", "checkin": "2027-03-01", "checkout": "2027-03-03", "guests": 2, "hotel_id": None}


@pytest.fixture
def writer(redis: Any) -> Any:
    mine = JournalWriter(redis, "test-instance")
    previous = install_writer(mine)
    yield mine
    install_writer(previous)


async def test_entries_land_in_order_in_one_batch_and_the_final_entry_closes_the_journal(
    redis: Any, writer: JournalWriter
) -> None:
    store = BookingStore(redis)
    assert await store.create("b1", REQUEST)
    with journal_scope("b1", fence=3):
        for n in range(5):
            note(JournalKind.STEP_STARTED, step=f"s{n}", attempt=1)
    note(JournalKind.STEP_STARTED, step="outside any scope")  # nothing: no booking at hand
    assert await store.update("b1", status="confirmed", reservation_id="r1", payment_id="pay_1")
    writer.record("b1", JournalKind.STEP_FINISHED, step="finish")  # after the final entry: refused
    await writer.flush()

    entries = await read_journal(redis, "b1")
    assert [e["kind"] for e in entries] == ["accepted", *["step_started"] * 5, "confirmed"]
    assert [e.get("step") for e in entries[1:6]] == [f"s{n}" for n in range(5)]
    assert all(e["fence"] == 3 and e["instance"] == "test-instance" for e in entries[1:6])
    assert entries[-1]["reservation_id"] == "r1" and entries[-1]["payment_id"] == "pay_1"
    assert all(e["at"].endswith("Z") for e in entries)
    # a second final update changes nothing and writes nothing
    assert not await store.update("b1", status="failed", error={"code": "timeout", "message": "late"})
    assert len(await read_journal(redis, "b1")) == len(entries)
    assert await read_journal(redis, "b1", after=entries[2]["id"]) == entries[3:]
    assert 0 < await redis.ttl(journal_key("b1")) <= 7 * 24 * 3600


async def test_secret_fields_are_dropped_and_the_stream_is_bounded(
    redis: Any, writer: JournalWriter, settings_env: pytest.MonkeyPatch
) -> None:
    writer.max_len = 10
    for n in range(500):
        writer.record("b2", JournalKind.CALL, n=n, payment_token="tok_visa", authorization="Bearer x")
    await writer.flush()
    entries = await read_journal(redis, "b2")
    assert entries[-1]["n"] == 499
    assert len(entries) < 200, "MAXLEN ~ trims whole nodes, approximately"
    assert all("payment_token" not in e and "authorization" not in e for e in entries)


async def test_a_failed_write_is_logged_not_raised(redis: Any, caplog: pytest.LogCaptureFixture) -> None:
    broken = JournalWriter(redis, "x")
    await redis.set(journal_key("b3"), "not a stream")  # XADD fails: WRONGTYPE
    broken.record("b3", JournalKind.CALL)
    await broken.flush()
    assert "could not write" in caplog.text


async def test_the_index_pages_newest_first_without_repeats_on_equal_times(redis: Any) -> None:
    store = BookingStore(redis)
    for n in range(7):
        assert await store.create(f"b{n}", REQUEST)
    # same creation time for four of them: the cursor must still neither skip nor repeat
    for n in range(3, 7):
        await redis.zadd(store.index_key(), {f"b{n}": 1000.0})
    await store.update("b1", status="confirmed")
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page, cursor = await store.page(status=None, limit=2, cursor=cursor)
        seen += [item["booking_id"] for item in page]
        if cursor is None:
            break
    assert sorted(seen) == [f"b{n}" for n in range(7)] and len(seen) == 7
    assert seen[:3] == ["b2", "b1", "b0"] and seen[3:] == ["b6", "b5", "b4", "b3"]
    confirmed, _ = await store.page(status="confirmed", limit=5, cursor=None)
    assert [item["booking_id"] for item in confirmed] == ["b1"]
    assert confirmed[0]["created_at"].endswith("Z")


async def test_flush_with_no_writer_installed_returns(redis: Any) -> None:
    previous = install_writer(None)
    try:
        await asyncio.wait_for(journal.flush(), 1)
    finally:
        install_writer(previous)


class _CountingScript:
    """Wraps the writer's append script to count its round trips."""

    def __init__(self, script: Any) -> None:
        self.script = script
        self.calls = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return await self.script(*args, **kwargs)


async def test_the_last_entries_ride_on_the_final_status_script_not_a_flush_of_their_own(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    appends = _CountingScript(journal._APPEND)
    monkeypatch.setattr(journal, "_APPEND", appends)
    store = BookingStore(redis)
    assert await store.create("b-fold", REQUEST)
    await store.create("b-other", REQUEST)
    with journal_scope("b-fold", fence=1):
        note(JournalKind.STEP_FINISHED, step="confirm", attempt=1)
        note(JournalKind.STEP_STARTED, step="finish", attempt=1)
    writer.record("b-other", JournalKind.CALL, dependency="hotel_api")  # another booking's: not taken
    assert await store.finalize("b-fold", "confirmed", reservation_id="r1") == ("confirmed", True)

    kinds = [e["kind"] for e in await read_journal(redis, "b-fold")]
    assert kinds == ["accepted", "step_finished", "step_started", "confirmed"]
    assert appends.calls == 0, "the booking's last entries went with the final status"
    await writer.flush()
    assert appends.calls == 1 and [e["kind"] for e in await read_journal(redis, "b-other")] == ["accepted", "call"]


async def test_a_batch_already_on_its_way_lands_before_the_final_entry(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    landing = asyncio.Event()
    real = journal._APPEND

    async def slow_append(*args: Any, **kwargs: Any) -> Any:
        await landing.wait()  # the batch is on the wire while the final status comes
        return await real(*args, **kwargs)

    monkeypatch.setattr(journal, "_APPEND", slow_append)
    store = BookingStore(redis)
    assert await store.create("b-race", REQUEST)
    writer.record("b-race", JournalKind.STEP_STARTED, step="finish")
    flushing = asyncio.create_task(writer.flush())
    await asyncio.sleep(0.05)  # the batch was taken off the queue and is being sent
    final = asyncio.create_task(store.finalize("b-race", "failed", error={"code": "timeout", "message": "late"}))
    await asyncio.sleep(0.05)
    assert not final.done(), "the final status waits for the batch that carries this booking's entries"
    landing.set()
    await asyncio.wait_for(asyncio.gather(flushing, final), 5)
    assert [e["kind"] for e in await read_journal(redis, "b-race")] == ["accepted", "step_started", "failed"]


async def test_entries_taken_by_a_final_status_that_failed_are_queued_again(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BookingStore(redis)
    assert await store.create("b-back", REQUEST)
    writer.record("b-back", JournalKind.STEP_STARTED, step="finish")

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("Redis went away")

    with monkeypatch.context() as patch:
        patch.setattr(bookings, "_UPDATE", unreachable)
        with pytest.raises(RedisConnectionError):
            await store.finalize("b-back", "confirmed")
    await writer.flush()
    assert [e["kind"] for e in await read_journal(redis, "b-back")] == ["accepted", "step_started"]
    assert await store.finalize("b-back", "confirmed") == ("confirmed", True)
    assert [e["kind"] for e in await read_journal(redis, "b-back")] == ["accepted", "step_started", "confirmed"]


async def test_an_eager_scope_sends_its_entries_at_once_and_an_ordinary_one_waits_out_the_window(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "BATCH_WINDOW_S", 3600)  # a window no test outlasts: only eager entries go now
    store = BookingStore(redis)
    for booking in ("b-eager", "b-batched"):
        assert await store.create(booking, REQUEST)
    with journal_scope("b-batched"):
        note(JournalKind.CALL, dependency="hotel_api")
    await asyncio.sleep(0)  # the writer starts and waits out its window
    with journal_scope("b-eager", steps=False, eager=True):
        note(JournalKind.CALL, dependency="payment_api")
    # nobody flushes: the eager entry goes on its own (cutting the window short for what was queued before it)
    for _ in range(500):
        if len(await read_journal(redis, "b-eager")) == 2:
            break
        await asyncio.sleep(0.01)
    assert [e["kind"] for e in await read_journal(redis, "b-eager")] == ["accepted", "call"]
    assert [e["kind"] for e in await read_journal(redis, "b-batched")] == ["accepted", "call"]

    with journal_scope("b-batched"):
        note(JournalKind.STEP_STARTED, step="confirm")
    await asyncio.sleep(0.2)
    assert len(await read_journal(redis, "b-batched")) == 2, "an ordinary entry waits for the window or a flush"
    await writer.flush()
    assert [e["kind"] for e in await read_journal(redis, "b-batched")] == ["accepted", "call", "step_started"]


async def test_progress_reports_carry_the_bookings_queued_entries(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal, "BATCH_WINDOW_S", 3600)  # only a status write can have sent them
    appends = _CountingScript(journal._APPEND)
    monkeypatch.setattr(journal, "_APPEND", appends)
    store = BookingStore(redis)
    for booking in ("b-ride", "b-else"):
        assert await store.create(booking, REQUEST)
    writer.record("b-else", JournalKind.CALL, dependency="hotel_api")
    with journal_scope("b-ride", fence=2):
        note(JournalKind.STEP_STARTED, step="search", attempt=1)
        note(JournalKind.CALL, dependency="search-agent", outcome="ok")
        store.report("b-ride", "searching")
        note(JournalKind.STEP_FINISHED, step="search", attempt=1)
        note(JournalKind.STEP_STARTED, step="reserve", attempt=1)
        store.report("b-ride", "reserving")
        await store.flush("b-ride")

    entries = await read_journal(redis, "b-ride")
    assert [(e["kind"], e.get("step")) for e in entries] == [
        ("accepted", None),
        ("step_started", "search"),
        ("call", None),
        ("step_finished", "search"),
        ("step_started", "reserve"),
    ]
    assert (await store.get("b-ride") or {})["status"] == "reserving"
    assert appends.calls == 0, "the entries rode on the progress reports"
    assert [e["kind"] for e in await read_journal(redis, "b-else")] == ["accepted"], "another booking's waits"
    await writer.flush()
    assert [e["kind"] for e in await read_journal(redis, "b-else")] == ["accepted", "call"]


async def test_a_run_whose_status_writes_come_within_the_window_sends_no_batch_of_its_own(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each step is far shorter than the window, the run as a whole longer: the window runs from the oldest entry
    # still queued, so entries a report took never start the batch that would have gone out mid-run
    monkeypatch.setattr(journal, "BATCH_WINDOW_S", 0.5)
    appends = _CountingScript(journal._APPEND)
    monkeypatch.setattr(journal, "_APPEND", appends)
    store = BookingStore(redis)
    assert await store.create("b-long", REQUEST)
    statuses = ["searching", "reserving", "paying", "confirming"] * 3
    with journal_scope("b-long", fence=1):
        for n, status in enumerate(statuses):
            note(JournalKind.STEP_STARTED, step=f"s{n}", attempt=1)
            await asyncio.sleep(0.05)
            store.report("b-long", status)
            await store.flush("b-long")
        note(JournalKind.STEP_STARTED, step="finish", attempt=1)
        assert await store.finalize("b-long", "confirmed") == ("confirmed", True)
        note(JournalKind.STEP_FINISHED, step="finish", attempt=1)  # after the final status: not even queued
    await writer.flush()

    kinds = [e["kind"] for e in await read_journal(redis, "b-long")]
    assert kinds == ["accepted", *["step_started"] * (len(statuses) + 1), "confirmed"]
    assert appends.calls == 0, f"{appends.calls} batch(es) sent besides the status writes"


async def test_a_final_status_that_failed_reopens_the_scope_it_closed(
    redis: Any, writer: JournalWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BookingStore(redis)
    assert await store.create("b-reopen", REQUEST)

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise RedisConnectionError("Redis went away")

    with journal_scope("b-reopen", fence=1):
        with monkeypatch.context() as patch:
            patch.setattr(bookings, "_UPDATE", unreachable)
            with pytest.raises(RedisConnectionError):
                await store.finalize("b-reopen", "confirmed")
        note(JournalKind.STEP_STARTED, step="finish", attempt=2)  # the step run again after the pause
        assert await store.finalize("b-reopen", "confirmed") == ("confirmed", True)
    kinds = [(e["kind"], e.get("attempt")) for e in await read_journal(redis, "b-reopen")]
    assert kinds == [("accepted", None), ("step_started", 2), ("confirmed", None)]
