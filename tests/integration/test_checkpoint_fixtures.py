"""Migrations against checkpoints recorded from an earlier shape (tests/data/checkpoints, ``tests.checkpoints``), in
a real Postgres checkpointer and against real Redis: the recorded booking died mid-charge; on its own shape it
resumes at the charge, and through a declared migration (a step renamed) on the next shape, booking once either way.
Every durable graph the registry declares (the optional example's too) has its current shape recorded; the recorded
chat turn and approved call resume in tests/integration/test_concierge_checkpoints.py.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from langgraph.graph import END, START, StateGraph

from agents.booking.cancellation import CANCELLATION_BUILDERS, CANCELLATION_GRAPH, cancel_thread_id
from agents.booking.graph import (
    ASKS_FOR_CANCEL,
    BOOKING_BUILDERS,
    BOOKING_GRAPH,
    STEPS,
    BookingDeps,
    BookingState,
    _next_or_compensate,
    _then_ask_for_cancel,
)
from graph import Migration, apply_migration, idempotent_node, traced_node
from graph.migrations import unknown_names
from infra.bookings import BookingStore
from infra.checkpointer import open_checkpointer
from infra.clients.providers import HotelApiClient
from infra.payment_tokens import PaymentTokens
from infra.settings import Settings
from recovery.registry import load_durable_graphs
from resilience import budget_scope, bulkhead_registry, circuit_registry, set_testing
from runs.runner import run_config
from runs.versions import graph_fingerprint
from scripts.graph_versions import families
from stack.services import SERVICES
from tests.booking_fakes import HotelApi, PaymentAgent, SearchAgent, offer
from tests.checkpoints import (
    BOOKING_REQUEST,
    RECORDERS,
    REFUND,
    confirmed_booking,
    fixture_path,
    load,
    read,
)

CURRENT = graph_fingerprint(BOOKING_BUILDERS[0](None))  # type: ignore[arg-type]
PACKAGES = tuple(
    dict.fromkeys([*Settings().durable_agents, *(s.package for s in SERVICES.values() if s.optional and s.durable)])
)
"""The agent packages whose graphs the recovery worker may run: ``DURABLE_AGENTS`` and the optional rows of the
service table that ``concierge up --with`` adds (the example, examples/restaurant), as scripts/graph_versions.py."""
DURABLE = {graph.name: graph for graph in load_durable_graphs(PACKAGES)}
RECORDED = "ce82de42196f23b8"
"""The booking shape the renamed-step example migrates from: its fixture stays when the shape moves on."""


def renamed_charge(deps: BookingDeps, checkpointer: Any = None) -> Any:
    """The booking graph with ``charge`` renamed ``capture``, as a developer would write it: the step keeps its
    idempotency record's name, so a replay finds what the old step did (docs/upgrades.md)."""
    builder = StateGraph(BookingState)
    for name, step, key_fields in STEPS:
        node: Any = functools.partial(step, deps=deps)
        if key_fields is not None:
            node = idempotent_node(lambda: deps.redis, name, key_fields=key_fields)(node)
        if name in ASKS_FOR_CANCEL:
            node = _then_ask_for_cancel(node, deps)
        named = "capture" if name == "charge" else name
        builder.add_node(named, traced_node(named)(node))
    builder.add_edge(START, "search")
    for current, following in itertools.pairwise(["search", "reserve", "capture", "confirm", "finish"]):
        builder.add_conditional_edges(current, _next_or_compensate(following), [following, "compensate"])
    builder.add_edge("compensate", "release_hold")
    builder.add_edge("compensate", "refund")
    builder.add_edge(["release_hold", "refund"], "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name=BOOKING_GRAPH)


@pytest.fixture(autouse=True)
def fresh_layers() -> Any:
    circuit_registry.clear()
    bulkhead_registry.clear()
    with set_testing(True):
        yield
    circuit_registry.clear()
    bulkhead_registry.clear()


class World:
    """The recorded booking loaded under ``booking_id``, its record and card token as booking-agent left them."""

    def __init__(self, redis: Any, saver: Any, hotels: HotelApiClient, api: HotelApi) -> None:
        self.saver, self.api = saver, api
        self.payment = PaymentAgent(lambda data: {"payment_id": "pay-1", "status": "captured"})
        self.store = BookingStore(redis)
        self.deps = BookingDeps(
            redis=redis,
            bookings=self.store,
            payment_tokens=PaymentTokens(redis),
            hotels=hotels,
            search_agent=SearchAgent([offer("h1", 100)]),
            payment_agent=self.payment,
        )

    async def loaded(self, version: str, booking_id: str) -> None:
        fixture = read(BOOKING_GRAPH, version)
        fixture["checkpoint"]["channel_values"]["booking_id"] = {"json": booking_id}
        await load(self.saver, fixture, booking_id)
        await self.deps.payment_tokens.put(booking_id, BOOKING_REQUEST["payment_token"])
        await self.store.create(booking_id, BOOKING_REQUEST)
        await self.store.update(booking_id, status="paying", reservation_id="res-h1")

    async def resume(self, graph: Any, booking_id: str) -> dict[str, Any]:
        with budget_scope(30.0):
            state: dict[str, Any] = await graph.ainvoke(
                None, run_config(booking_id, graph_fingerprint(graph)), durability="sync"
            )
        return state


@pytest.fixture
async def world(redis: Any, postgres_url: str) -> AsyncIterator[World]:
    api = HotelApi()
    http = httpx.AsyncClient(transport=httpx.MockTransport(api.handle), base_url="http://hotel-api")
    async with HotelApiClient(http=http) as hotels, open_checkpointer(postgres_url) as saver:
        yield World(redis, saver, hotels, api)
    await http.aclose()


def test_the_graphs_checked_here_are_those_whose_versions_are_checked() -> None:
    assert set(DURABLE) == set(families()), "the same registry as scripts/graph_versions.py"


@pytest.mark.parametrize("name", sorted(DURABLE))
def test_the_current_shape_of_each_durable_graph_has_a_recorded_checkpoint(name: str) -> None:
    version = version_list_current(name)
    assert name in RECORDERS, f"{name} has no recorder: add one to tests.checkpoints.RECORDERS (docs/upgrades.md)"
    path = fixture_path(name, version)
    assert path.exists(), f"no checkpoint recorded from {name}@{version}: run python -m tests.checkpoints {name}"


def version_list_current(name: str) -> str:
    return graph_fingerprint(DURABLE[name].builders[0](None))


@pytest.mark.parametrize("name", sorted(RECORDERS))
async def test_the_fixture_of_the_current_shape_is_what_it_records_today(redis: Any, name: str) -> None:
    recorded = await RECORDERS[name](redis, f"{name}-today")
    current = version_list_current(name)
    kept = read(name, current)
    assert recorded["version"] == kept["version"] == current
    assert set(recorded["checkpoint"]["channel_values"]) == set(kept["checkpoint"]["channel_values"])
    assert set(recorded["checkpoint"]["versions_seen"]) == set(kept["checkpoint"]["versions_seen"])
    stopped = [[channel for _, channel, _ in fixture["pending_writes"]] for fixture in (recorded, kept)]
    assert stopped[0] == stopped[1], "stopped where the kept one did (mid-step, or parked at an interrupt)"
    assert "tok_visa" not in repr(recorded), "no card token in a checkpoint"


async def test_a_recorded_cancellation_resumes_at_its_refund_and_refunds_once(world: World) -> None:
    graph = CANCELLATION_BUILDERS[0](world.deps, world.saver)
    current = graph_fingerprint(graph)
    fixture = read(CANCELLATION_GRAPH, current)
    thread_id = cancel_thread_id("c-own")
    fixture["checkpoint"]["channel_values"]["booking_id"] = {"json": "c-own"}
    await load(world.saver, fixture, thread_id)
    await confirmed_booking(world.store, "c-own")
    await world.store.begin_cancel("c-own", REFUND, thread_id)
    assert (await graph.aget_state(run_config(thread_id))).next == ("refund",)

    with budget_scope(30.0):
        state = await graph.ainvoke(None, run_config(thread_id, current), durability="sync")

    assert state["status"] == "cancelled"
    assert world.payment.cancel_refunds == [{"reference": "c-own"}], "refunded once, as the record says"
    assert world.api.requests == [], "the stay, cancelled before the crash, is not cancelled again"
    record = await world.store.get("c-own")
    assert record is not None and record["status"] == "cancelled" and record["refund"] == REFUND


async def test_a_recorded_booking_resumes_at_its_charge_on_its_own_shape(world: World) -> None:
    graph = BOOKING_BUILDERS[0](world.deps, world.saver)
    await world.loaded(CURRENT, "b-own")
    assert (await graph.aget_state(run_config("b-own"))).next == ("charge",)

    state = await world.resume(graph, "b-own")

    assert state["status"] == "confirmed"
    assert [charge["reference"] for charge in world.payment.charges] == ["b-own"]
    assert world.api.requests == [("confirm", "res-h1")], "the hold recorded before the crash, confirmed"


async def test_a_renamed_step_migrates_a_recorded_booking_and_it_books_once(world: World) -> None:
    graph = renamed_charge(world.deps, world.saver)
    await world.loaded(RECORDED, "b-moved")
    migration = Migration(RECORDED, nodes={"charge": "capture"})

    assert await apply_migration(graph, "b-moved", migration, graph_fingerprint(graph))
    assert not await apply_migration(graph, "b-moved", migration, graph_fingerprint(graph)), "once"
    snapshot = await graph.aget_state(run_config("b-moved"))
    assert snapshot.next == ("capture",)
    assert snapshot.values["reservation_id"] == "res-h1" and snapshot.values["owner"] == "alice"

    state = await world.resume(graph, "b-moved")

    assert state["status"] == "confirmed"
    assert [charge["reference"] for charge in world.payment.charges] == ["b-moved"], "charged once"
    assert world.api.requests == [("confirm", "res-h1")]
    record = await world.store.get("b-moved")
    assert record is not None and record["status"] == "confirmed" and record["payment_id"] == "pay-1"


DECLARED = [
    pytest.param(graph.name, graph.builders, migration, id=f"{graph.name}@{migration.from_version}")
    for graph in DURABLE.values()
    for migration in graph.migrations
]
"""Every migration of every graph the recovery worker runs (the registry: ``DURABLE_AGENTS``)."""


@pytest.mark.parametrize(("name", "builders", "migration"), DECLARED)
async def test_every_declared_migration_takes_its_recorded_checkpoint_to_the_current_shape(
    postgres_url: str, name: str, builders: Any, migration: Migration
) -> None:
    path = fixture_path(name, migration.from_version)
    assert path.exists(), f"a migration from {name}@{migration.from_version} needs a checkpoint recorded from it"
    async with open_checkpointer(postgres_url) as saver:
        graph = builders[0](None, saver)
        await load(saver, read(name, migration.from_version), "declared")
        assert await apply_migration(graph, "declared", migration, graph_fingerprint(graph))
        found = await saver.aget_tuple({"configurable": {"thread_id": "declared", "checkpoint_ns": ""}})
        assert found is not None and unknown_names(found.checkpoint, graph) == []
        snapshot = await graph.aget_state(run_config("declared"))
        assert set(snapshot.next) <= set(graph.nodes), "it resumes at steps the current shape has"
