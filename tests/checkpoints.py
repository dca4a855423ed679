"""Checkpoints recorded from a graph's shape, kept in tests/data/checkpoints/ as fixtures: the migrations a later
shape declares are tested against them (tests/integration/test_checkpoint_fixtures.py; docs/upgrades.md).

``python -m tests.checkpoints [graph ...]`` records the current shape of each durable graph (all of ``RECORDERS``
by default) into ``<graph>@<fingerprint>.json``: a booking run whose process died mid-charge (the hold taken, the
charge not answered); a confirmed booking's cancel that died mid-refund (the stay cancelled, the refund not
answered); a chat turn parked at its approval after the model asked to book; an MCP host's approved call parked at
its approval; and a restaurant table whose run died mid-reserve. A fixture of the same fingerprint already there is
kept as it is (``--rewrite`` records it again): its shape is the same, and a new recording only moves its ids and
timestamps. Record before changing a shape, so the next shape's migration has the previous one's checkpoint.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import uuid
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tests.booking_fakes import CHECKIN, CHECKOUT, HotelApi, PaymentAgent, SearchAgent, offer

if TYPE_CHECKING:
    from infra.llm import ModelReply

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


# -------------------------------------------------------------------------------- the concierge's graphs

CHAT_OWNER = "alice"
"""The person whose chat the recorded turn and call are in (the concierge books as them, ``acting_for``)."""


def stay() -> dict[str, Any]:
    """Two nights for two in Lisbon a month from today: a stay the concierge's tools accept whenever it is recorded."""
    checkin = date.today() + timedelta(days=30)
    return {"city": "Lisbon", "checkin": checkin.isoformat(), "checkout": (checkin + timedelta(days=2)).isoformat()}


class ScriptedModel:
    """The concierge's model as a script: each ``respond`` answers the next message of ``replies`` (then words),
    so a turn takes the same steps every time it is recorded or resumed."""

    def __init__(self, replies: list[AIMessage]) -> None:
        self.replies = list(replies)
        self.calls = 0

    async def respond(self, messages: Any, tools: Any, **options: Any) -> ModelReply:
        from infra.llm import ModelReply, Usage

        self.calls += 1
        said = self.replies.pop(0) if self.replies else AIMessage(content="Done: your stay is booked.")
        message = said.model_copy(deep=True)  # the graph adds the turn id to what it is given
        return ModelReply(message=message, model="scripted", usage=Usage(12, 4, 1), attempts=1)


def asks_to(name: str, call_id: str, args: dict[str, Any]) -> AIMessage:
    """The model's answer calling tool ``name`` once."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id, "type": "tool_call"}])


class Search:
    """search-agent's ``search_hotels`` as the simulated hotels answer it, cheapest first."""

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        from providers.inventory import hotels_in

        assert skill == "search_hotels"
        checkin = date.fromisoformat(data["checkin"])
        found = sorted((h.offer(3, checkin) for h in hotels_in(data["city"])), key=lambda o: o["price_per_night"])
        return {"offers": found}


class BookingAgentPeer:
    """booking-agent's ``book_hotel`` for the concierge: each booking it makes is in ``bookings``, bound to the
    request's ``Idempotency-Key`` for the person and confirmed at once, its journal ending so (the concierge's relay
    follows the key to the booking, then its journal to the final entry)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.bookings: list[dict[str, Any]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        from domain.booking import JournalKind
        from identity.auth import person_acted_for
        from infra.booking_keys import journal_key
        from infra.bookings import BookingStore
        from infra.journal import ENTRY_FIELD, encode_entry

        self.calls.append((skill, data))
        assert skill == "book_hotel", f"the recorded runs only book, not {skill}"
        self.bookings.append(data)
        booking_id = f"bk-{len(self.bookings)}"
        await BookingStore(self.redis).claim_client_key(data["idempotency_key"], "-", booking_id, person_acted_for())
        entry = encode_entry(JournalKind.CONFIRMED, "booking-agent", {"status": "confirmed"})
        await self.redis.xadd(journal_key(booking_id), {ENTRY_FIELD: entry})
        terms = {name: data[name] for name in ("hotel_id", "city", "checkin", "checkout", "guests", "currency")}
        return {"booking_id": booking_id, "status": "confirmed", "total_price": data["max_total_price"], **terms}


def concierge_deps(redis: Any, model: ScriptedModel, booking_agent: Any) -> Any:
    """What the concierge's graphs talk to: real chat and booking stores, a scripted model and fake peers."""
    from agents.concierge.context import ConciergeDeps
    from infra.bookings import BookingStore
    from infra.chats import ChatFeed, ChatStore

    return ConciergeDeps(
        redis=redis,
        chats=ChatStore(redis),
        feed=ChatFeed(redis),
        bookings=BookingStore(redis),
        model=model,
        search_agent=Search(),
        booking_agent=booking_agent,
    )


async def persons_chat(deps: Any, chat_id: str) -> None:
    """``chat_id`` as concierge-agent keeps a chat: the person's, with their card token on it (never in a state)."""
    await deps.chats.create(chat_id, CHAT_OWNER)
    await deps.chats.put_token(chat_id, "tok_visa")


async def run_until_it_parks(graph: Any, run_input: Any, config: Any, at: str) -> None:
    """Run ``graph`` from ``run_input`` until it waits at its ``at`` interrupt, as a run parked for a person."""
    from resilience import budget_scope

    with budget_scope(30.0):
        await graph.ainvoke(run_input, config, durability="sync")
    snapshot = await graph.aget_state(config)
    assert snapshot.next == (at,) and snapshot.interrupts, f"the recorded run was to wait at {at}: {snapshot.next}"


async def record_concierge(redis: Any, chat_id: str) -> dict[str, Any]:
    """A chat turn of the current shape parked at its approval: the model searched, then asked to book the cheapest
    hotel; the person has not answered (the checkpoint a deploy most often finds)."""
    from agents.concierge.graph import CONCIERGE_BUILDERS, CONCIERGE_GRAPH
    from agents.concierge.state import turn_input
    from domain.llm import BOOK_HOTEL, SEARCH_HOTELS
    from runs.runner import run_config
    from runs.versions import graph_fingerprint

    where = stay()
    offers = await Search().call(SEARCH_HOTELS, {**where, "guests": 2})
    cheapest = offers["offers"][0]["hotel_id"]
    model = ScriptedModel(
        [
            asks_to(SEARCH_HOTELS, "call-search", {**where, "guests": 2}),
            asks_to(BOOK_HOTEL, "call-book", {**where, "guests": 2, "hotel_id": cheapest}),
        ]
    )
    deps = concierge_deps(redis, model, BookingAgentPeer(redis))
    saver = InMemorySaver()
    graph = CONCIERGE_BUILDERS[0](deps, saver)
    version = graph_fingerprint(graph)
    await persons_chat(deps, chat_id)
    run = turn_input(chat_id, "turn-1", f"Book me the cheapest hotel in Lisbon from {where['checkin']}, two nights")
    await run_until_it_parks(graph, run, run_config(chat_id, version), "approval")
    return await dump(saver, chat_id, CONCIERGE_GRAPH, version)


async def record_approved_call(redis: Any, chat_id: str) -> dict[str, Any]:
    """An MCP host's ``book_hotel`` of the current shape parked at its approval, as ``agents.concierge.calls.ask``
    parks one: its terms quoted, the person's card on its chat, nobody has decided."""
    from agents.concierge.approved_call import APPROVED_CALL_BUILDERS, APPROVED_CALL_GRAPH, call_input
    from agents.concierge.graph import ask_approval
    from agents.concierge.tools import ToolContext, tool_named
    from domain.llm import BOOK_HOTEL, SEARCH_HOTELS
    from identity.auth import acting_for
    from runs.runner import run_config
    from runs.versions import graph_fingerprint

    where = {**stay(), "guests": 2}
    cheapest = (await Search().call(SEARCH_HOTELS, where))["offers"][0]["hotel_id"]
    deps = concierge_deps(redis, ScriptedModel([]), BookingAgentPeer(redis))
    saver = InMemorySaver()
    graph = APPROVED_CALL_BUILDERS[0](deps, saver)
    version = graph_fingerprint(graph)
    tool, args = tool_named(BOOK_HOTEL), tool_named(BOOK_HOTEL).validate({**where, "hotel_id": cheapest})
    with acting_for(CHAT_OWNER):
        state = {"chat_id": chat_id, "turn_id": "call-1"}
        pending = await ask_approval(deps, state, ToolContext(deps, chat_id, frozenset()), tool, "mcp-call-1", args)
    await persons_chat(deps, chat_id)
    run = call_input(chat_id, "call-1", pending)
    await run_until_it_parks(graph, run, run_config(chat_id, version), "approval")
    return await dump(saver, chat_id, APPROVED_CALL_GRAPH, version)


# ----------------------------------------------------------------------------- the example restaurant graph


async def record_restaurant(redis: Any, run_id: str) -> dict[str, Any]:
    """A table of the current shape whose run died mid-reserve: the request on its way to the provider, unanswered."""
    from examples.restaurant.durable import GRAPH, RestaurantDeps, build_restaurant_graph
    from infra.clients.providers import HotelApiClient
    from runs.runner import run_config
    from runs.versions import graph_fingerprint

    def die(request: httpx.Request) -> httpx.Response:
        raise Died("kill -9 while the table's hold waited at hotel-api")

    http = httpx.AsyncClient(transport=httpx.MockTransport(die), base_url="http://hotel-api")
    async with HotelApiClient(http=http, client="restaurant-agent") as tables:
        saver = InMemorySaver()
        graph = build_restaurant_graph(RestaurantDeps(redis, tables), saver)
        version = graph_fingerprint(graph)
        run = {"hotel_id": "lisbon-01", "day": stay()["checkin"], "guests": 2, "owner": CHAT_OWNER}
        await run_until_it_dies(graph, run, run_config(run_id, version), "the recorded table, in its reserve")
    await http.aclose()
    return await dump(saver, run_id, GRAPH, version)


RECORDERS = {
    "booking": record_booking,
    "cancellation": record_cancellation,
    "concierge": record_concierge,
    "approved_call": record_approved_call,
    "restaurant": record_restaurant,
}
"""Graph name → how its current shape's checkpoint is recorded (a run that died mid-step, or one parked for a person).
Every durable graph the registry declares has one (tests/integration/test_checkpoint_fixtures.py)."""


async def _main(argv: list[str]) -> int:
    from infra.redis import create_redis
    from infra.settings import get_settings

    rewrite = "--rewrite" in argv
    names = [name for name in argv if name != "--rewrite"] or list(RECORDERS)
    unknown = sorted(set(names) - set(RECORDERS))
    if unknown:
        print(f"no recorder for {', '.join(unknown)}: the graphs recorded are {', '.join(RECORDERS)}", file=sys.stderr)
        return 2
    os.environ["CONCIERGE_KEY_PREFIX"] = f"record-{uuid.uuid4().hex[:12]}"
    get_settings.cache_clear()
    redis = create_redis(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        fixtures = [await RECORDERS[name](redis, f"{name}-recorded") for name in names]
        async for key in redis.scan_iter(match=f"{os.environ['CONCIERGE_KEY_PREFIX']}*"):
            await redis.delete(key)
    finally:
        await redis.aclose()
    for fixture in fixtures:
        path = fixture_path(fixture["graph"], fixture["version"])
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        if path.exists() and not rewrite:
            print(f"kept {shown} (recorded from this shape already)")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
        print(f"recorded {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(sys.argv[1:])))
