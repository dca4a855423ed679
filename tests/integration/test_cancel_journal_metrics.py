"""Where the cancel and the journal meet, against a real Redis: a booking whose cancel was requested and whose saga
then ends ``failed`` is written ``cancelled``, and so is its journal's final entry (one script does both); the
story metrics count each booking's outcome once, whichever of ``update``/``finalize`` wrote it."""

from __future__ import annotations

from typing import Any

from domain.booking import BookingStatus
from infra.bookings import BookingStore
from infra.journal import read_journal
from infra.metrics import story_metrics

REQUEST = {"city": "Lisbon", "checkin": "2027-03-01", "checkout": "2027-03-03", "guests": 2, "hotel_id": None}


def finals(outcome: str) -> float:
    return float(story_metrics().bookings_final.labels(outcome)._value.get())


def finished(outcome: str) -> float:
    for metric in story_metrics().time_to_final.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels.get("outcome") == outcome:
                return float(sample.value)
    return 0.0


async def test_a_failed_end_after_a_cancel_is_cancelled_in_the_record_and_the_journal(redis: Any) -> None:
    store = BookingStore(redis)
    assert await store.create("c1", REQUEST)
    requests_before = story_metrics().cancel_requests.labels("requested")._value.get()
    await store.request_cancel("c1")
    assert story_metrics().cancel_requests.labels("requested")._value.get() == requests_before + 1
    before = finals("cancelled"), finished("cancelled")

    status, wrote = await store.finalize("c1", BookingStatus.FAILED, error={"code": "timeout", "message": "x"})
    assert (status, wrote) == ("cancelled", True)
    entries = await read_journal(redis, "c1")
    assert [e["kind"] for e in entries] == ["accepted", "cancelled"]
    assert entries[-1]["error_code"] == "timeout"
    assert (finals("cancelled"), finished("cancelled")) == (before[0] + 1, before[1] + 1)

    # final is final: nothing more written, nothing counted twice
    again = await store.finalize("c1", BookingStatus.FAILED)
    assert again == ("cancelled", False)
    assert not await store.update("c1", status="confirmed")
    assert len(await read_journal(redis, "c1")) == 2
    assert finals("cancelled") == before[0] + 1


async def test_a_confirmed_booking_is_counted_once_with_its_time_to_final(redis: Any) -> None:
    store = BookingStore(redis)
    before = finals("confirmed"), finished("confirmed")
    assert await store.create("c2", REQUEST)
    assert await store.update("c2", status="confirmed", reservation_id="r", payment_id="p")
    assert not await store.update("c2", status="confirmed")
    assert (finals("confirmed"), finished("confirmed")) == (before[0] + 1, before[1] + 1)
    assert [e["kind"] for e in await read_journal(redis, "c2")] == ["accepted", "confirmed"]
