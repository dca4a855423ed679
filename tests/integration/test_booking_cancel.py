"""Cancelling a booking, in process against real Redis: the flag and the point of no return in the booking store,
and how the saga (``build_booking_graph``) routes once the flag is set, with hotel-api behind ``httpx.MockTransport``
and the two peer agents as in-process fakes.

A cancel arriving during a step lets that step finish and stops the run before the next one: during ``reserve`` the
hold is released and nothing is charged, during ``charge`` the capture is refunded, during ``confirm`` (past the
commit) it is too late and the booking ends ``confirmed``. A run resumed from its checkpoint (as the recovery worker
resumes one) finds the flag at its next step boundary the same way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from agents.booking.graph import BookingDeps, booking_input, build_booking_graph
from domain.booking import BookingStatus
from infra.a2a import A2ASkillError
from infra.bookings import BookingStore, CancelOutcome
from infra.clients.providers import HotelApiClient
from infra.payment_tokens import PaymentTokens
from resilience import budget_scope, bulkhead_registry, circuit_registry, set_testing

REQUEST = {
    "city": "Lisbon",
    "checkin": "2031-04-10",
    "checkout": "2031-04-12",
    "guests": 2,
    "payment_token": "tok_visa",
}
OFFER = {"hotel_id": "h1", "name": "Hotel h1", "price_per_night": 100.0, "available_rooms": 3}

Hook = Callable[[], Awaitable[None]]


class World:
    """hotel-api (over ``httpx.MockTransport``), search-agent and payment-agent, recording every call.

    ``during[step]`` runs inside that step's outbound call (``search``, ``reserve``, ``charge``, ``confirm``): where
    a test sends its cancel, while the step is in flight.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.during: dict[str, Hook] = {}

    async def _hook(self, step: str) -> None:
        if (hook := self.during.get(step)) is not None:
            await hook()

    async def hotel(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/reservations":
            self.calls.append("reserve")
            await self._hook("reserve")
            body = json.loads(request.content)
            held = {"reservation_id": f"res-{body['hotel_id']}", "status": "held", "total_price": 200.0}
            return httpx.Response(201, json={**held, "currency": "EUR"})
        reservation_id, _, action = request.url.path.removeprefix("/reservations/").partition("/")
        self.calls.append(action)
        await self._hook(action)
        return httpx.Response(200, json={"reservation_id": reservation_id, "status": action})

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        """Both peers: ``search_hotels``, ``charge_payment``, ``refund_payment``."""
        self.calls.append(skill)
        if skill == "search_hotels":
            await self._hook("search")
            return {"offers": [OFFER]}
        if skill == "charge_payment":
            await self._hook("charge")
            return {"payment_id": "pay-1", "status": "captured"}
        assert skill == "refund_payment", skill
        return {"refunded": ["pay-1"], "reference": data["reference"]}


@pytest.fixture(autouse=True)
def fresh_layers() -> Any:
    circuit_registry.clear()
    bulkhead_registry.clear()
    with set_testing(True):
        yield
    circuit_registry.clear()
    bulkhead_registry.clear()


@pytest.fixture
async def world(redis: Redis) -> AsyncIterator[tuple[World, BookingDeps]]:
    world = World()
    http = httpx.AsyncClient(transport=httpx.MockTransport(world.hotel), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as hotels:
        store = BookingStore(redis)
        deps = BookingDeps(
            redis=redis,
            bookings=store,
            payment_tokens=PaymentTokens(redis),
            hotels=hotels,
            search_agent=world,
            payment_agent=world,
        )
        yield world, deps
        await store.flush()
    await http.aclose()


async def accepted(deps: BookingDeps) -> str:
    """A booking as booking-agent records it before its 202."""
    booking_id = uuid.uuid4().hex
    await deps.payment_tokens.put(booking_id, REQUEST["payment_token"])
    assert await deps.bookings.create(booking_id, REQUEST)
    return booking_id


async def run_saga(deps: BookingDeps, booking_id: str, *, saver: InMemorySaver | None = None, **kw: Any) -> Any:
    graph = build_booking_graph(deps, saver or InMemorySaver())
    run_input = kw.pop("input", booking_input(booking_id, REQUEST))
    with budget_scope(10):
        return await graph.ainvoke(run_input, {"configurable": {"thread_id": booking_id}}, durability="sync", **kw)


def cancel_now(deps: BookingDeps, booking_id: str, seen: list[CancelOutcome]) -> Hook:
    async def hook() -> None:
        outcome, _status = await deps.bookings.request_cancel(booking_id)
        seen.append(outcome)

    return hook


# ------------------------------------------------------------------------------------------------ the store


async def test_a_cancel_is_recorded_once_and_answers_the_same_until_the_booking_is_cancelled(redis: Redis) -> None:
    store = BookingStore(redis)
    assert await store.request_cancel("nobody") == (CancelOutcome.UNKNOWN, None)
    booking_id = uuid.uuid4().hex
    await store.create(booking_id, REQUEST)

    assert await store.request_cancel(booking_id) == (CancelOutcome.REQUESTED, "pending")
    first = await store.get(booking_id)
    assert first is not None and first["cancel_requested_at"] is not None
    assert await store.request_cancel(booking_id) == (CancelOutcome.CANCELLING, "pending")
    second = await store.get(booking_id)
    assert second is not None and second["cancel_requested_at"] == first["cancel_requested_at"]
    assert await store.cancel_requested(booking_id)

    assert not await store.commit(booking_id), "the cancel came first: no confirm may be sent"
    # the saga's compensation asks for "failed" (it undoes the same way); a requested cancel makes it "cancelled"
    error = {"code": "timeout", "message": "slow"}
    assert await store.finalize(booking_id, BookingStatus.FAILED, error=error) == ("cancelled", True)
    assert await store.finalize(booking_id, BookingStatus.CONFIRMED) == ("cancelled", False)
    assert await store.request_cancel(booking_id) == (CancelOutcome.CANCELLED, "cancelled")
    assert not await store.update(booking_id, status="compensating"), "final is final"
    assert (await store.status(booking_id)) == "cancelled"
    assert await store.in_flight() == 0


async def test_after_the_commit_a_cancel_is_too_late_and_changes_nothing(redis: Redis) -> None:
    store = BookingStore(redis)
    booking_id = uuid.uuid4().hex
    await store.create(booking_id, REQUEST)
    await store.update(booking_id, status="paying")

    assert await store.commit(booking_id)
    assert await store.commit(booking_id), "a resumed confirm passes again"
    assert await store.request_cancel(booking_id) == (CancelOutcome.TOO_LATE, "paying")
    assert not await store.cancel_requested(booking_id)
    assert await store.finalize(booking_id, BookingStatus.FAILED) == ("failed", True)
    assert await store.request_cancel(booking_id) == (CancelOutcome.TOO_LATE, "failed")


async def test_a_confirmed_booking_cannot_be_cancelled(redis: Redis) -> None:
    store = BookingStore(redis)
    booking_id = uuid.uuid4().hex
    await store.create(booking_id, REQUEST)
    assert await store.finalize(booking_id, BookingStatus.CONFIRMED) == ("confirmed", True)
    assert await store.request_cancel(booking_id) == (CancelOutcome.TOO_LATE, "confirmed")
    record = await store.get(booking_id)
    assert record is not None and record["status"] == "confirmed" and record["cancel_requested_at"] is None


# ------------------------------------------------------------------------------------------------ the saga


async def test_cancelled_before_the_run_starts_touches_no_provider(world: tuple[World, BookingDeps]) -> None:
    calls, deps = world[0].calls, world[1]
    booking_id = await accepted(deps)
    assert (await deps.bookings.request_cancel(booking_id))[0] is CancelOutcome.REQUESTED

    state = await run_saga(deps, booking_id)

    assert state["status"] == "cancelled" and state["cancelled"] is True
    assert calls == [], "no search, no hold, no charge, nothing to undo"
    record = await deps.bookings.get(booking_id)
    assert record is not None and record["status"] == "cancelled" and record["error"] is None
    assert await deps.payment_tokens.get(booking_id) is None, "the card token is dropped"


async def test_cancelled_during_search_holds_no_room(world: tuple[World, BookingDeps]) -> None:
    api, deps = world
    booking_id = await accepted(deps)
    seen: list[CancelOutcome] = []
    api.during["search"] = cancel_now(deps, booking_id, seen)

    state = await run_saga(deps, booking_id)

    assert seen == [CancelOutcome.REQUESTED]
    assert state["status"] == "cancelled"
    assert api.calls == ["search_hotels"], "the search finished; the reserve never started"


async def test_cancelled_during_reserve_releases_the_hold_and_charges_nothing(
    world: tuple[World, BookingDeps],
) -> None:
    api, deps = world
    booking_id = await accepted(deps)
    seen: list[CancelOutcome] = []
    api.during["reserve"] = cancel_now(deps, booking_id, seen)

    state = await run_saga(deps, booking_id)

    assert seen == [CancelOutcome.REQUESTED]
    assert state["status"] == "cancelled"
    assert api.calls == ["search_hotels", "reserve", "cancel"], "held, then released; no charge, no refund"
    record = await deps.bookings.get(booking_id)
    assert record is not None and record["status"] == "cancelled" and record["reservation_id"] == "res-h1"


async def test_cancelled_during_charge_refunds_the_capture_and_never_confirms(
    world: tuple[World, BookingDeps],
) -> None:
    api, deps = world
    booking_id = await accepted(deps)
    seen: list[CancelOutcome] = []
    api.during["charge"] = cancel_now(deps, booking_id, seen)

    state = await run_saga(deps, booking_id)

    assert seen == [CancelOutcome.REQUESTED]
    assert state["status"] == "cancelled" and state["payment_id"] == "pay-1"
    assert api.calls[:3] == ["search_hotels", "reserve", "charge_payment"]
    assert sorted(api.calls[3:]) == ["cancel", "refund_payment"], "release and refund, side by side"
    assert "confirm" not in api.calls


async def test_cancelled_during_confirm_is_too_late_and_the_booking_is_confirmed(
    world: tuple[World, BookingDeps],
) -> None:
    api, deps = world
    booking_id = await accepted(deps)
    seen: list[CancelOutcome] = []
    api.during["confirm"] = cancel_now(deps, booking_id, seen)

    state = await run_saga(deps, booking_id)

    assert seen == [CancelOutcome.TOO_LATE]
    assert state["status"] == "confirmed"
    assert api.calls == ["search_hotels", "reserve", "charge_payment", "confirm"]
    assert await deps.bookings.status(booking_id) == "confirmed"


async def test_a_resumed_run_finds_the_cancel_at_its_next_step_boundary(world: tuple[World, BookingDeps]) -> None:
    """As the recovery worker resumes a run whose owner died: from the checkpoint, with the flag set meanwhile."""
    api, deps = world
    booking_id = await accepted(deps)
    saver = InMemorySaver()
    paused = await run_saga(deps, booking_id, saver=saver, interrupt_before=["charge"])
    assert paused["reservation_id"] == "res-h1" and api.calls == ["search_hotels", "reserve"]

    assert (await deps.bookings.request_cancel(booking_id))[0] is CancelOutcome.REQUESTED
    state = await run_saga(deps, booking_id, saver=saver, input=None)

    # the checkpoint already says "charge next" (decided before the cancel): a step with a side effect is never
    # skipped on the way in, since after a crash only its idempotent replay knows what it did; it is undone after
    assert state["status"] == "cancelled"
    assert api.calls[:3] == ["search_hotels", "reserve", "charge_payment"]
    assert sorted(api.calls[3:]) == ["cancel", "refund_payment"]
    assert await deps.bookings.status(booking_id) == "cancelled"


async def test_a_cancel_during_a_failing_compensation_ends_cancelled_with_the_error_kept(
    world: tuple[World, BookingDeps],
) -> None:
    api, deps = world
    booking_id = await accepted(deps)
    seen: list[CancelOutcome] = []

    async def declined_then_cancelled() -> None:
        await cancel_now(deps, booking_id, seen)()
        raise A2ASkillError("payment_declined", "card declined")

    api.during["charge"] = declined_then_cancelled
    state = await run_saga(deps, booking_id)

    assert seen == [CancelOutcome.REQUESTED]
    record = await deps.bookings.get(booking_id)
    assert record is not None and record["status"] == "cancelled" and state["status"] == "cancelled"
    assert record["error"]["code"] == "payment_declined", "why it failed before the cancel is kept"
    assert "refund_payment" not in api.calls and api.calls[-1] == "cancel"


async def test_a_cancel_flag_that_cannot_be_read_after_a_step_fails_the_step_and_the_resume_goes_on(
    world: tuple[World, BookingDeps], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis unreachable for the flag's read right after ``reserve`` (a failover): the resumed run must go on.

    When the read lived in the edge, LangGraph kept ``reserve``'s writes with no branch taken, and the resume ended
    the graph there: the run ``done``, the booking never confirmed, its room held.
    """
    api, deps = world
    booking_id = await accepted(deps)
    reads = 0
    asks = deps.bookings.cancel_requested

    async def unreachable_once_after_reserve(booking: str) -> bool:
        nonlocal reads
        reads += 1
        if reads == 3:  # before search, after search, after reserve
            raise RedisConnectionError("Redis is failing over")
        return await asks(booking)

    monkeypatch.setattr(deps.bookings, "cancel_requested", unreachable_once_after_reserve)
    saver = InMemorySaver()
    with pytest.raises(RedisConnectionError):
        await run_saga(deps, booking_id, saver=saver)

    state = await run_saga(deps, booking_id, saver=saver, input=None)

    assert state["status"] == "confirmed"
    assert api.calls == ["search_hotels", "reserve", "charge_payment", "confirm"], "the hold is not made twice"
    assert await deps.bookings.status(booking_id) == "confirmed"
