"""The journal against a real Redis: batched in order, closed by the final entry, bounded, expiring, no secret
fields; and the ``GET /bookings`` index pages without repeats even when bookings share a creation time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from domain.booking import JournalKind
from infra import journal
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
