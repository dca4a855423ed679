"""Checkpoints recorded from a graph's shape, kept in tests/data/checkpoints/ as fixtures: the migrations a later
shape declares are tested against them (tests/integration/test_checkpoint_fixtures.py; docs/upgrades.md).

``python -m tests.checkpoints`` records each durable graph's current shape: a booking run whose process died
mid-charge (the hold taken, the charge not answered) into ``booking@<fingerprint>.json``, and a confirmed booking's
cancel that died mid-refund (the stay cancelled, the refund not answered) into ``cancellation@<fingerprint>.json``;
record before changing a shape, so the next shape's migration has the previous one's checkpoint to be tested against.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tests.booking_fakes import CHECKIN, CHECKOUT, HotelApi, PaymentAgent, SearchAgent, offer

FIXTURES = Path(__file__).parent / "data" / "checkpoints"
FORMAT = 1
_SERDE = JsonPlusSerializer()


class Died(BaseException):
    """The process dying in the middle of a step: nothing in the graph catches it, as nothing catches ``kill -9``."""


def fixture_path(graph: str, version: str) -> Path:
    return FIXTURES / f"{graph}@{version}.json"


def _value(value: Any) -> dict[str, Any]:
    """A channel's value: as JSON when it is plain data (readable in review), else as the savers' own encoding."""
    try:
        if json.loads(json.dumps(value)) == value:
            return {"json": value}
    except (TypeError, ValueError):
        pass
    kind, data = _SERDE.dumps_typed(value)
    return {"serde": kind, "data": base64.b64encode(data).decode()}


def _unvalue(stored: dict[str, Any]) -> Any:
    if "json" in stored:
        return stored["json"]
    return _SERDE.loads_typed((stored["serde"], base64.b64decode(stored["data"])))


async def dump(saver: BaseCheckpointSaver[Any], thread_id: str, graph: str, version: str) -> dict[str, Any]:
    """The thread's last checkpoint, its metadata and its pending writes, as a fixture."""
    found = await saver.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
    assert found is not None, f"no checkpoint for {thread_id!r}"
    checkpoint = dict(found.checkpoint)
    checkpoint["channel_values"] = {name: _value(value) for name, value in checkpoint["channel_values"].items()}
    return {
        "format": FORMAT,
        "graph": graph,
        "version": version,
        "checkpoint": checkpoint,
        "metadata": dict(found.metadata or {}),
        "pending_writes": [[task, channel, _value(value)] for task, channel, value in found.pending_writes or []],
    }


async def load(saver: BaseCheckpointSaver[Any], fixture: dict[str, Any], thread_id: str) -> None:
    """Store the fixture as the last checkpoint of ``thread_id`` (its pending writes attached to it)."""
    checkpoint: Any = dict(fixture["checkpoint"])
    checkpoint["channel_values"] = {name: _unvalue(value) for name, value in checkpoint["channel_values"].items()}
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    stored = await saver.aput(config, checkpoint, fixture["metadata"], dict(checkpoint["channel_versions"]))
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task, channel, value in fixture["pending_writes"]:
        by_task.setdefault(task, []).append((channel, _unvalue(value)))
    for task, writes in by_task.items():
        await saver.aput_writes(stored, writes, task)


def read(graph: str, version: str) -> dict[str, Any]:
    fixture: dict[str, Any] = json.loads(fixture_path(graph, version).read_text())
    return fixture


async def run_until_it_dies(graph: Any, run_input: Any, config: Any, what: str) -> None:
    """Run ``graph`` from ``run_input`` until a fake dependency kills it (``Died``), as kill -9 would mid-step."""
    from resilience import budget_scope

    try:
        with budget_scope(30.0):
            await graph.ainvoke(run_input, config, durability="sync")
    except Died:
        return
    raise AssertionError(f"{what} was to die")


# ----------------------------------------------------------------------------------------- the booking graph

BOOKING_REQUEST: dict[str, Any] = {
    "city": "Lisbon",
    "checkin": CHECKIN,
    "checkout": CHECKOUT,
    "guests": 2,
    "payment_token": "tok_visa",
    "owner": "alice",
}
"""The booking the recorded run is for (its card token is the test card's, and never reaches the checkpoint)."""


async def record_booking(redis: Any, booking_id: str) -> dict[str, Any]:
    """A booking run of the current shape that died mid-charge: search and reserve done, the charge never answered."""
    from agents.booking.graph import BOOKING_BUILDERS, BOOKING_GRAPH, BookingDeps, booking_input
    from infra.bookings import BookingStore
    from infra.clients.providers import HotelApiClient
    from infra.payment_tokens import PaymentTokens
    from runs.runner import run_config
    from runs.versions import graph_fingerprint

    def die(data: dict[str, Any]) -> Any:
        raise Died("kill -9 while the charge waited at payment-api")

    api = HotelApi()
    http = httpx.AsyncClient(transport=httpx.MockTransport(api.handle), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as hotels:
        store, tokens = BookingStore(redis), PaymentTokens(redis)
        deps = BookingDeps(
            redis=redis,
            bookings=store,
            payment_tokens=tokens,
            hotels=hotels,
            search_agent=SearchAgent([offer("h1", 100)]),
            payment_agent=PaymentAgent(die),
        )
        saver = InMemorySaver()
        graph = BOOKING_BUILDERS[0](deps, saver)
        version = graph_fingerprint(graph)
        await tokens.put(booking_id, BOOKING_REQUEST["payment_token"])
        await store.create(booking_id, BOOKING_REQUEST)
        run = booking_input(booking_id, BOOKING_REQUEST)
        await run_until_it_dies(graph, run, run_config(booking_id, version), "the recorded run, in its charge")
    await http.aclose()
    return await dump(saver, booking_id, BOOKING_GRAPH, version)


# ------------------------------------------------------------------------------------ the cancellation graph

REFUND = {"amount": 200.0, "fee": 0.0, "currency": "EUR"}
"""What the recorded cancel gives back: the whole stay (cancelled before its free cancellation ended)."""


async def record_cancellation(redis: Any, booking_id: str) -> dict[str, Any]:
    """A confirmed booking's cancel of the current shape that died mid-refund: the stay cancelled at the hotel, the
    refund never answered."""
    from agents.booking.cancellation import (
        CANCELLATION_BUILDERS,
        CANCELLATION_GRAPH,
        cancel_thread_id,
        cancellation_input,
    )
    from agents.booking.graph import BookingDeps
    from domain.booking import BookingStatus
    from infra.bookings import BookingStore
    from infra.clients.providers import HotelApiClient
    from infra.payment_tokens import PaymentTokens
    from runs.runner import run_config
    from runs.versions import graph_fingerprint

    def die(data: dict[str, Any]) -> Any:
        raise Died("kill -9 while the refund waited at payment-api")

    api = HotelApi()
    http = httpx.AsyncClient(transport=httpx.MockTransport(api.handle), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as hotels:
        store = BookingStore(redis)
        deps = BookingDeps(
            redis=redis,
            bookings=store,
            payment_tokens=PaymentTokens(redis),
            hotels=hotels,
            search_agent=SearchAgent([offer("h1", 100)]),
            payment_agent=PaymentAgent(lambda data: {}, cancel_refund=die),
        )
        saver = InMemorySaver()
        graph = CANCELLATION_BUILDERS[0](deps, saver)
        version = graph_fingerprint(graph)
        thread_id = cancel_thread_id(booking_id)
        booking = await confirmed_booking(store, booking_id)
        await store.begin_cancel(booking_id, REFUND, thread_id)
        run = cancellation_input(booking, REFUND)
        await run_until_it_dies(graph, run, run_config(thread_id, version), "the recorded cancel, in its refund")
        assert (await store.status(booking_id)) == BookingStatus.CANCELLING
    await http.aclose()
    return await dump(saver, thread_id, CANCELLATION_GRAPH, version)


async def confirmed_booking(store: Any, booking_id: str) -> dict[str, Any]:
    """A confirmed booking of ``BOOKING_REQUEST``'s stay at ``h1`` (200 EUR, free cancellation), as a saga leaves it."""
    from domain.booking import BookingStatus

    await store.create(booking_id, BOOKING_REQUEST)
    policy = {"free_until": "2099-01-01T00:00:00Z", "fee": 100.0, "currency": "EUR", "refundable": True}
    await store.finalize(
        booking_id,
        BookingStatus.CONFIRMED,
        hotel_id="h1",
        hotel_name="Hotel h1",
        total_price=200.0,
        currency="EUR",
        reservation_id="res-h1",
        payment_id="pay-1",
        cancellation=policy,
    )
    booking: dict[str, Any] | None = await store.get(booking_id)
    assert booking is not None
    return booking


RECORDERS = {"booking": record_booking, "cancellation": record_cancellation}
"""Graph name → how its current shape's checkpoint is recorded (each a run that died mid-step)."""


async def _main() -> int:
    from infra.redis import create_redis
    from infra.settings import get_settings

    os.environ["CONCIERGE_KEY_PREFIX"] = f"record-{uuid.uuid4().hex[:12]}"
    get_settings.cache_clear()
    redis = create_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        fixtures = [await record(redis, f"{name}-recorded") for name, record in RECORDERS.items()]
        async for key in redis.scan_iter(match=f"{os.environ['CONCIERGE_KEY_PREFIX']}*"):
            await redis.delete(key)
    finally:
        await redis.aclose()
    for fixture in fixtures:
        path = fixture_path(fixture["graph"], fixture["version"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
        print(f"recorded {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main()))
