"""idempotent_node against a real Redis: a side effect runs at most once per (node, run, input), whoever calls."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from graph import (
    ClaimLostError,
    GraphError,
    IdempotencyStoreError,
    MissingThreadIdError,
    NodeResultError,
    derive_idempotency_key,
    fence_scope,
    idempotency_key,
    idempotent_node,
    traced_node,
    use_tracer_provider,
)
from infra.redis import create_redis, key
from resilience import BudgetExhaustedError, budget_scope, configure_budget

NAME = "reserve"
FIELDS = ["booking_id", "hotel_id"]
THREAD = "booking-1"
STATE: dict[str, Any] = {"booking_id": "b-1", "hotel_id": "h-9", "guests": 2}
CONFIG: RunnableConfig = {"configurable": {"thread_id": THREAD}}

Node = Callable[[Any, RunnableConfig], Coroutine[Any, Any, dict[str, Any]]]


def record_key(state: dict[str, Any] = STATE, thread: str = THREAD, name: str = NAME) -> str:
    return key("idem", derive_idempotency_key(name, thread, state, FIELDS))


class Body:
    """A node body that counts its executions; optionally waits for ``gate`` and/or fails."""

    def __init__(
        self, result: str = "r", *, delay: float = 0.0, gate: asyncio.Event | None = None, fail: bool = False
    ) -> None:
        self.result = result
        self.delay = delay
        self.gate = gate
        self.fail = fail
        self.calls = 0
        self.started = asyncio.Event()
        self.keys: list[str] = []

    async def __call__(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        self.calls += 1
        self.keys.append(idempotency_key())
        self.started.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("hotel-api answered 500")
        return {"reservation_id": f"{self.result}-{self.calls}", "guests": state.get("guests")}


def make(redis: Any, body: Body, name: str = NAME, **options: Any) -> Node:
    async def reserve(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        return await body(state, config)

    return idempotent_node(redis, name, key_fields=FIELDS, **options)(reserve)


async def stalled_sleep(seconds: float) -> None:
    """Like a paused process: the lease renewal never gets to run."""
    await asyncio.Event().wait()


# ------------------------------------------------------------------------------------------------ basic contract


async def test_completed_result_is_returned_without_running_the_body(redis: Redis) -> None:
    body = Body()
    node = make(redis, body, ttl_s=60)

    first = await node(STATE, CONFIG)
    again = await node({**STATE, "guests": 3}, CONFIG)  # a field outside key_fields changes nothing

    assert first == {"reservation_id": "r-1", "guests": 2}
    assert again == first
    assert body.calls == 1
    assert await redis.hget(record_key(), "status") == "done"
    assert 0 < await redis.pttl(record_key()) <= 60_000


async def test_different_key_field_values_or_thread_run_again(redis: Redis) -> None:
    body = Body()
    node = make(redis, body)

    await node(STATE, CONFIG)
    other_hotel = await node({**STATE, "hotel_id": "h-10"}, CONFIG)
    other_run = await node(STATE, {"configurable": {"thread_id": "booking-2"}})

    assert body.calls == 3
    assert other_hotel["reservation_id"] == "r-2"
    assert other_run["reservation_id"] == "r-3"


async def test_twenty_concurrent_invocations_run_the_body_once(redis: Redis) -> None:
    body = Body(delay=0.2)
    node = make(redis, body)

    results = await asyncio.gather(*(node(STATE, CONFIG) for _ in range(20)))

    assert body.calls == 1
    assert all(r == results[0] for r in results)


async def test_a_dead_owners_claim_is_taken_over_once_its_lease_expires(redis: Redis) -> None:
    await redis.hset(record_key(), mapping={"status": "claimed", "owner": "dead"})
    await redis.pexpire(record_key(), 200)
    body = Body()
    node = make(redis, body)

    started = time.monotonic()
    result = await node(STATE, CONFIG)

    # it waited for the lease instead of stealing a claim that could still be live
    assert time.monotonic() - started >= 0.15
    assert body.calls == 1
    assert result["reservation_id"] == "r-1"
    assert await redis.hget(record_key(), "status") == "done"
    assert await redis.hget(record_key(), "owner") != "dead"


async def test_a_claim_left_under_a_lower_run_fence_is_taken_over_at_once(redis: Redis) -> None:
    """The run was taken from the claim's owner (fenced out of its next side effect): no need to wait its lease."""

    async def passes() -> None:
        return None

    await redis.hset(record_key(), mapping={"status": "claimed", "owner": "killed-owner", "fence": "1"})
    await redis.pexpire(record_key(), 600_000)
    body = Body()
    node = make(redis, body)

    # the same fence: the claimer could be us, alive; it is waited for
    with fence_scope(passes, 1), pytest.raises(BudgetExhaustedError), budget_scope(0.3):
        await node(STATE, CONFIG)
    assert body.calls == 0
    with fence_scope(passes, 2):
        result = await asyncio.wait_for(node(STATE, CONFIG), 5)  # far below the 600 s lease left

    assert body.calls == 1 and result["reservation_id"] == "r-1"
    assert await redis.hget(record_key(), "status") == "done"


async def test_lease_is_renewed_so_a_long_node_is_never_taken_over(redis: Redis, redis_url: str) -> None:
    first_body = Body("first", delay=1.2)
    second_body = Body("second")
    other_process = create_redis(redis_url)
    try:
        first = asyncio.create_task(make(redis, first_body, lease_s=0.3)(STATE, CONFIG))
        await asyncio.wait_for(first_body.started.wait(), 5)
        second = await make(other_process, second_body, lease_s=0.3)(STATE, CONFIG)
        assert second == await first
    finally:
        await other_process.aclose()

    assert first_body.calls == 1
    assert second_body.calls == 0
    assert second["reservation_id"] == "first-1"


async def test_failure_releases_the_claim_so_a_retry_runs(redis: Redis) -> None:
    failing = Body(fail=True)
    with pytest.raises(RuntimeError, match="500"):
        await make(redis, failing, lease_s=30)(STATE, CONFIG)
    assert await redis.exists(record_key()) == 0, "released: no 30 s lease left for the retry to wait out"

    retry = Body("retry")
    result = await make(redis, retry, lease_s=30)(STATE, CONFIG)

    assert retry.calls == 1
    assert result["reservation_id"] == "retry-1"


async def test_cancelled_node_releases_its_claim_and_stops_renewing(redis: Redis) -> None:
    body = Body(gate=asyncio.Event())
    task = asyncio.create_task(make(redis, body, lease_s=30)(STATE, CONFIG))
    await asyncio.wait_for(body.started.wait(), 5)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert await redis.exists(record_key()) == 0
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("idempotency-renew")]


async def test_non_dict_result_is_refused_and_the_claim_released(redis: Redis) -> None:
    async def reserve(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        return ["not", "a", "dict"]  # type: ignore[return-value]

    node = idempotent_node(redis, NAME, key_fields=FIELDS)(reserve)

    with pytest.raises(NodeResultError):
        await node(STATE, CONFIG)
    assert await redis.exists(record_key()) == 0


# --------------------------------------------------------------------------------------------------- waiting


async def test_waiter_gets_the_owners_result_without_running(redis: Redis) -> None:
    gate = asyncio.Event()
    owner_body, waiter_body = Body("owner", gate=gate), Body("waiter")
    owner = asyncio.create_task(make(redis, owner_body)(STATE, CONFIG))
    await asyncio.wait_for(owner_body.started.wait(), 5)

    waiter = asyncio.create_task(make(redis, waiter_body)(STATE, CONFIG))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    gate.set()

    assert await waiter == await owner
    assert waiter_body.calls == 0


async def test_waiter_runs_itself_when_the_owner_fails_and_releases(redis: Redis) -> None:
    gate = asyncio.Event()
    owner_body, waiter_body = Body("owner", gate=gate, fail=True), Body("waiter")
    owner = asyncio.create_task(make(redis, owner_body, lease_s=30)(STATE, CONFIG))
    await asyncio.wait_for(owner_body.started.wait(), 5)
    waiter = asyncio.create_task(make(redis, waiter_body, lease_s=30)(STATE, CONFIG))
    await asyncio.sleep(0.1)

    gate.set()
    with pytest.raises(RuntimeError):
        await owner
    result = await asyncio.wait_for(waiter, 5)  # far less than the 30 s lease: the release woke it

    assert waiter_body.calls == 1
    assert result["reservation_id"] == "waiter-1"


async def test_waiter_is_bounded_by_the_timeout_budget(redis: Redis) -> None:
    gate = asyncio.Event()
    owner_body, waiter_body = Body("owner", gate=gate), Body("waiter")
    owner = asyncio.create_task(make(redis, owner_body)(STATE, CONFIG))
    await asyncio.wait_for(owner_body.started.wait(), 5)
    try:
        with budget_scope(0.3), pytest.raises(BudgetExhaustedError, match=NAME):
            await make(redis, waiter_body)(STATE, CONFIG)
        assert not owner.done(), "gave up at its budget while the owner was still running"
        assert waiter_body.calls == 0
    finally:
        gate.set()
        await owner


async def test_waiter_outside_a_budget_scope_is_bounded_by_the_default_budget(redis: Redis) -> None:
    # Outside a scope remaining_budget() never shrinks; the wait must still end.
    gate = asyncio.Event()
    owner_body = Body("owner", gate=gate)
    owner = asyncio.create_task(make(redis, owner_body)(STATE, CONFIG))
    await asyncio.wait_for(owner_body.started.wait(), 5)
    try:
        with configure_budget(default=0.3), pytest.raises(BudgetExhaustedError):
            await asyncio.wait_for(make(redis, Body("waiter"))(STATE, CONFIG), 5)
    finally:
        gate.set()
        await owner


# ---------------------------------------------------------------------------------------------- lost claim


async def test_lost_claim_while_another_owner_runs_raises_and_does_not_overwrite(redis: Redis) -> None:
    paused_gate, new_gate = asyncio.Event(), asyncio.Event()
    paused_body, new_body = Body("paused", gate=paused_gate), Body("new", gate=new_gate)
    paused = asyncio.create_task(make(redis, paused_body, lease_s=0.2, sleep=stalled_sleep)(STATE, CONFIG))
    await asyncio.wait_for(paused_body.started.wait(), 5)
    new_owner = asyncio.create_task(make(redis, new_body, lease_s=5)(STATE, CONFIG))
    await asyncio.wait_for(new_body.started.wait(), 5)  # took over after the paused owner's lease lapsed

    paused_gate.set()
    with pytest.raises(ClaimLostError) as info:
        await paused
    assert isinstance(info.value, GraphError)
    assert await redis.hget(record_key(), "status") == "claimed"  # the new owner's claim is intact

    new_gate.set()
    assert (await new_owner)["reservation_id"] == "new-1"
    assert (await make(redis, Body("late"))(STATE, CONFIG))["reservation_id"] == "new-1"


async def test_lost_claim_after_the_other_owner_finished_returns_its_result(redis: Redis) -> None:
    paused_gate = asyncio.Event()
    paused_body = Body("paused", gate=paused_gate)
    paused = asyncio.create_task(make(redis, paused_body, lease_s=0.2, sleep=stalled_sleep)(STATE, CONFIG))
    await asyncio.wait_for(paused_body.started.wait(), 5)
    theirs = await asyncio.wait_for(make(redis, Body("new"))(STATE, CONFIG), 5)

    paused_gate.set()
    ours = await paused

    assert ours == theirs
    assert ours["reservation_id"] == "new-1"
    assert (await make(redis, Body("late"))(STATE, CONFIG)) == theirs


async def test_lapsed_claim_nobody_took_over_still_stores_the_result(redis: Redis) -> None:
    body = Body("slow", delay=0.4)
    result = await make(redis, body, lease_s=0.2, sleep=stalled_sleep)(STATE, CONFIG)

    assert result["reservation_id"] == "slow-1"
    assert await redis.hget(record_key(), "status") == "done"


# ------------------------------------------------------------------------------------------ idempotency_key()


async def test_idempotency_key_is_stable_across_retries_and_never_contains_the_owner(redis: Redis) -> None:
    owners: list[Any] = []

    class Peek(Body):
        async def __call__(self, state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
            owners.append(await redis.hget(record_key(), "owner"))
            return await super().__call__(state, config)

    failing = Peek(fail=True)
    with pytest.raises(RuntimeError):
        await make(redis, failing)(STATE, CONFIG)
    retry = Peek()
    await make(redis, retry)(STATE, CONFIG)

    assert failing.keys == retry.keys == [derive_idempotency_key(NAME, THREAD, STATE, FIELDS)]
    assert owners[0] != owners[1]
    assert all(owner and owner not in retry.keys[0] for owner in owners)


def test_idempotency_key_depends_only_on_name_thread_and_key_field_values() -> None:
    base = derive_idempotency_key(NAME, THREAD, STATE, FIELDS)

    assert derive_idempotency_key(NAME, THREAD, {**STATE, "guests": 9}, FIELDS) == base
    assert derive_idempotency_key(NAME, THREAD, STATE, list(reversed(FIELDS))) == base
    assert derive_idempotency_key(NAME, THREAD, {**STATE, "hotel_id": "h-10"}, FIELDS) != base
    assert derive_idempotency_key(NAME, "booking-2", STATE, FIELDS) != base
    assert derive_idempotency_key("charge", THREAD, STATE, FIELDS) != base


def test_idempotency_key_is_the_same_in_another_process() -> None:
    here = derive_idempotency_key(NAME, THREAD, STATE, FIELDS)
    script = (
        "from graph import derive_idempotency_key\n"
        "state = {'guests': 2, 'hotel_id': 'h-9', 'booking_id': 'b-1'}\n"
        f"print(derive_idempotency_key({NAME!r}, {THREAD!r}, state, ['hotel_id', 'booking_id']))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)

    assert out.stdout.strip() == here


def test_idempotency_key_outside_an_idempotent_node_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="idempotent_node"):
        idempotency_key()


async def test_missing_thread_id_is_refused_before_touching_redis() -> None:
    def no_redis() -> Redis:
        raise AssertionError("Redis must not be needed to refuse a call without a thread id")

    body = Body()
    node = make(no_redis, body)

    configs: list[Any] = [{}, {"configurable": {}}, {"configurable": {"thread_id": ""}}]
    for config in configs:
        with pytest.raises(MissingThreadIdError, match="thread_id") as info:
            await node(STATE, config)
        assert isinstance(info.value, ValueError)
    assert body.calls == 0


async def test_redis_failure_is_reported_as_an_idempotency_store_error(settings_env: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = create_redis(f"redis://127.0.0.1:{port}/0", retry=Retry(NoBackoff(), 0), socket_connect_timeout=1)
    body = Body()
    try:
        with pytest.raises(IdempotencyStoreError) as info:
            await make(dead, body)(STATE, CONFIG)
    finally:
        await dead.aclose()

    assert info.value.__cause__ is not None
    assert body.calls == 0


# ----------------------------------------------------------------------------------------------- fencing


async def test_fence_check_that_raises_stops_the_body_and_releases_the_claim(redis: Redis) -> None:
    class RunLeaseLost(Exception):
        pass

    seen: list[Any] = []

    async def check() -> None:
        seen.append(await redis.hget(record_key(), "status"))
        raise RunLeaseLost("another worker owns this booking now")

    body = Body()
    with fence_scope(check), pytest.raises(RunLeaseLost):
        await make(redis, body, lease_s=30)(STATE, CONFIG)

    assert seen == ["claimed"]  # checked after claiming, right before the side effect
    assert body.calls == 0
    assert await redis.exists(record_key()) == 0


async def test_fence_check_that_passes_lets_the_body_run_and_no_scope_means_no_check(redis: Redis) -> None:
    checks = 0

    async def check() -> None:
        nonlocal checks
        checks += 1

    body = Body()
    with fence_scope(check):
        await make(redis, body)(STATE, CONFIG)
        await make(redis, body)(STATE, CONFIG)  # replayed: no side effect, nothing to fence
    await make(redis, body)({**STATE, "hotel_id": "h-10"}, CONFIG)  # outside the scope

    assert checks == 1
    assert body.calls == 2


# ---------------------------------------------------------------------------------------------- in a graph


class BookingState(TypedDict, total=False):
    booking_id: str
    reservation_id: str
    provider_key: str


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with use_tracer_provider(provider):
            yield exporter
    finally:
        provider.shutdown()


async def test_in_a_real_graph_the_side_effect_happens_once_per_thread(
    redis: Redis, spans: InMemorySpanExporter
) -> None:
    clients: dict[str, Redis] = {}
    counter = key("side-effects", "reserve")

    # built before any client exists: the factory is resolved per execution
    @traced_node("reserve")
    @idempotent_node(lambda: clients["redis"], "reserve", key_fields=["booking_id"])
    async def reserve(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        count = await clients["redis"].incr(counter)
        return {"reservation_id": f"res-{count}", "provider_key": idempotency_key()}

    builder = StateGraph(BookingState)
    builder.add_node("reserve", reserve)
    builder.add_edge(START, "reserve")
    builder.add_edge("reserve", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    clients["redis"] = redis
    config: RunnableConfig = {"configurable": {"thread_id": "booking-77"}}

    fenced: list[str] = []

    async def check() -> None:
        fenced.append("checked")

    with fence_scope(check):  # LangGraph runs nodes in tasks that inherit this context
        first = await graph.ainvoke({"booking_id": "b-77"}, config)
    second = await graph.ainvoke({"booking_id": "b-77"}, config)

    assert await redis.get(counter) == "1"
    assert first["reservation_id"] == second["reservation_id"] == "res-1"
    assert first["provider_key"] == derive_idempotency_key(
        "reserve", "booking-77", {"booking_id": "b-77"}, ["booking_id"]
    )
    assert fenced == ["checked"]
    outcomes = [
        (s.attributes or {}).get("idempotency.outcome") for s in spans.get_finished_spans() if s.name == "node reserve"
    ]
    assert outcomes == ["executed", "replayed"]  # the span covers the idempotency check
