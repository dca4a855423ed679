"""booking-agent's door in process: the in-flight cap against real Redis, with runs that wait on a gate.

Past the cap a new booking is refused (``OverloadedError``: 429 at the HTTP door, a retryable ``bulkhead_full`` over
A2A) before anything is recorded; a retry of a booking already accepted still gets it; a slot comes back when its
run ends. ``book_hotel`` goes through ``admit`` as ``POST /bookings`` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from agents.booking.app import BookingRequest, BookingService
from agents.booking.graph import BookingDeps
from identity.people import IdempotencyKeyReusedError
from infra.bookings import BookingStore
from infra.error_table import answer_for
from infra.payment_tokens import PaymentTokens
from recovery.queue import DeadLetterQueue, QueueGuard
from resilience import Bulkhead, BulkheadConfig, OverloadedError, TimedSlot
from runs.leases import RunStore

CAP = 2


class GatedService(BookingService):
    """The real door; each run just waits for ``gate`` (the graph is not under test here)."""

    gate: asyncio.Event

    def start(self, lease: Any, run_input: dict[str, Any], slot: TimedSlot) -> None:
        async def gated() -> None:
            try:
                await self.gate.wait()
            finally:
                slot.release()

        task = asyncio.create_task(gated(), name=f"gated:{lease.thread_id}")
        self.host.tasks.add(task)
        task.add_done_callback(self.host.tasks.discard)


@pytest.fixture
async def service(redis: Redis) -> AsyncIterator[GatedService]:
    bookings = BookingStore(redis)
    unused = cast(Any, None)  # the gated runs never call a provider or a peer
    deps = BookingDeps(
        redis=redis,
        bookings=bookings,
        payment_tokens=PaymentTokens(redis),
        hotels=unused,
        search_agent=unused,
        payment_agent=unused,
    )
    slots = Bulkhead("booking_runs", BulkheadConfig(max_concurrent=CAP, timeout=60.0, acquire_timeout=0))
    service = GatedService(deps, None, RunStore(redis), QueueGuard(redis, DeadLetterQueue(redis)), "door-test", slots)
    service.gate = asyncio.Event()
    yield service
    service.gate.set()
    if service.host.tasks:
        await asyncio.wait(set(service.host.tasks))


def request(n: int, city: str = "Lisbon") -> BookingRequest:
    """A stay of its own per ``n`` (so a different body under the same key is a different request)."""
    return BookingRequest.model_validate(
        {
            "city": city,
            "checkin": f"2027-0{n + 1}-10",
            "checkout": f"2027-0{n + 1}-12",
            "guests": 2,
            "payment_token": "tok_visa",
        }
    )


async def test_past_the_cap_a_new_booking_is_refused_before_anything_is_recorded(service: GatedService) -> None:
    first, created = await service.admit(request(0), "key-0")
    assert created
    await service.admit(request(1), None)
    assert service.slots.in_use == CAP
    in_flight = await service.bookings.in_flight()

    with pytest.raises(OverloadedError) as refused:
        await service.admit(request(2), "key-2")
    assert "BOOKING_MAX_IN_FLIGHT" in refused.value.message and refused.value.retry_after >= 1
    answer = answer_for(refused.value)  # how A2A's book_hotel reports it
    assert (answer.code, answer.status, answer.retryable) == ("overloaded", 429, True)
    assert await service.bookings.in_flight() == in_flight, "no booking recorded"
    assert await service.bookings.find_client_key("key-2", request(2).digest()) is None, "the key was not bound"

    # a retry of an accepted booking is not new work: it gets its booking, at capacity or not
    assert await service.admit(request(0), "key-0") == (first, False)
    with pytest.raises(IdempotencyKeyReusedError):  # 422 idempotency_key_reused
        await service.admit(request(2), "key-0")
    assert service.slots.stats()["rejected"] == 3

    service.gate.set()  # the runs end and give their slots back
    await asyncio.wait(set(service.host.tasks))
    assert service.slots.in_use == 0
    _, created = await service.admit(request(2), "key-2")
    assert created


async def test_a_retry_under_the_cap_takes_no_slot_for_long(service: GatedService) -> None:
    first, _ = await service.admit(request(0), "key-0")
    assert await service.admit(request(0), "key-0") == (first, False)
    assert service.slots.in_use == 1, "only the run holds a slot; the retry gave its own back at once"


def ceilinged(**fields: Any) -> BookingRequest:
    """``request(0)`` with more fields (``max_total_price``, ``currency``)."""
    return BookingRequest.model_validate(request(0).as_payload() | fields)


async def test_the_ceiling_is_stored_with_the_runs_input_and_is_part_of_the_request(service: GatedService) -> None:
    """A recovered run enforces what the first one would: the ceiling and currency are in the run's stored input.
    Under one ``Idempotency-Key`` another ceiling is another request (422), the same one the same booking."""
    booking_id, created = await service.admit(ceilinged(max_total_price=112.0, currency="EUR"), "key-ceiling")
    assert created
    record = await service.runs.get(booking_id)
    assert record is not None
    assert (record.input["max_total_price"], record.input["allowed_currency"]) == (112.0, "EUR")

    again = await service.admit(ceilinged(max_total_price=112.0, currency="EUR"), "key-ceiling")
    assert again == (booking_id, False)
    for other in (
        ceilinged(max_total_price=145.6, currency="EUR"),
        ceilinged(max_total_price=112.0),
        ceilinged(currency="EUR"),
        request(0),
    ):
        with pytest.raises(IdempotencyKeyReusedError):  # 422 idempotency_key_reused
            await service.admit(other, "key-ceiling")


def test_a_body_without_the_new_fields_hashes_as_before_them() -> None:
    """Keys bound before ``max_total_price`` and ``currency`` existed still match their bodies."""
    body = request(0)
    legacy = {k: v for k, v in body.as_payload().items() if k not in ("max_total_price", "currency")}
    assert body.digest() == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:32]
    assert ceilinged(max_total_price=112.0).digest() != body.digest()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_total_price": 0}, "max_total_price"),
        ({"max_total_price": -1}, "max_total_price"),
        ({"max_total_price": "112"}, "max_total_price"),
        ({"max_total_price": True}, "max_total_price"),
        ({"max_total_price": 1e12}, "max_total_price"),
        ({"currency": "eur"}, "currency"),
        ({"currency": "EURO"}, "currency"),
        ({"currency": 978}, "currency"),
    ],
)
def test_a_bad_ceiling_or_currency_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ceilinged(**fields)
    assert [e["loc"] for e in refused.value.errors()] == [(field,)]
    answer = answer_for(refused.value)  # how A2A's book_hotel reports it
    assert (answer.code, answer.status) == ("invalid_request", 422) and field in answer.message
