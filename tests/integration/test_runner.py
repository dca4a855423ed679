"""``execute_run`` on real Redis leases: what a finished run, an interrupted one and a failing one report."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from redis.asyncio import Redis

from graph.idempotency import idempotent_node
from infra.a2a import A2ASkillError
from infra.redis import create_redis
from infra.settings import get_settings
from runs.leases import RunRecord, RunStatus, RunStore
from runs.runner import RunOutcome, RunResult, execute_run
from tests.conftest import free_port, start_redis_server


class State(TypedDict, total=False):
    order: str
    trail: list[str]


def graph(*, stop_at_b: bool = False, fail_at_b: bool = False, before_b: Callable[[], None] | None = None) -> Any:
    async def a(state: State) -> dict[str, Any]:
        return {"trail": [*state.get("trail", []), "a"]}

    async def b(state: State) -> dict[str, Any]:
        if before_b is not None:
            before_b()
        if stop_at_b:
            interrupt("needs a human")
        if fail_at_b:
            raise RuntimeError("b is broken")
        return {"trail": [*state["trail"], "b"]}

    builder = StateGraph(State)
    builder.add_node("a", a)
    builder.add_node("b", b)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder.compile(checkpointer=InMemorySaver())


async def run(redis: Redis, thread_id: str, compiled: Any) -> tuple[RunResult, RunRecord]:
    """Create the run and its lease, execute it, and read the run record back."""
    store = RunStore(redis, ttl=5)
    lease = await store.create(thread_id, "test", {"order": thread_id}, "me")
    assert lease is not None
    result = await execute_run(compiled, lease, {"order": thread_id}, budget_s=10)
    record = await store.get(thread_id)
    assert record is not None
    return result, record


async def test_a_finished_run_reports_its_final_state_and_is_marked_done(redis: Redis) -> None:
    result, record = await run(redis, "run-done", graph())
    assert result.outcome is RunOutcome.DONE
    assert result.values == {"order": "run-done", "trail": ["a", "b"]}
    assert record.status is RunStatus.DONE


async def test_a_run_that_stops_short_of_the_end_is_not_reported_done(redis: Redis) -> None:
    result, record = await run(redis, "run-interrupted", graph(stop_at_b=True))
    assert result.outcome is RunOutcome.FAILED
    assert "stopped before END" in str(result.error)
    assert record.status is RunStatus.PENDING and record.owner is None


async def test_a_failing_run_releases_its_lease_with_the_error(redis: Redis) -> None:
    result, record = await run(redis, "run-failed", graph(fail_at_b=True))
    assert result.outcome is RunOutcome.FAILED
    assert record.owner is None and "b is broken" in (record.last_error or "")


# ------------------------------------------------------------------------------------ a Redis outage mid-run


async def test_a_redis_outage_mid_run_pauses_the_run_and_it_continues_when_redis_is_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """kill -9 of Redis while a step waits, restart 1 s later on the same AOF: the same run goes on to DONE."""
    port = free_port()
    server, url = start_redis_server(port, appendonly=True, workdir=str(tmp_path))
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("CONCIERGE_KEY_PREFIX", f"outage-{uuid.uuid4().hex[:8]}")
    get_settings.cache_clear()
    client = create_redis(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    gate, entered = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    @idempotent_node(client, "hold", key_fields=["order"])
    async def hold(state: State, config: RunnableConfig) -> dict[str, Any]:
        calls.append("hold")
        entered.set()
        await gate.wait()  # Redis dies here; the step's stored result cannot be written
        return {"trail": [*state.get("trail", []), "hold"]}

    async def done(state: State) -> dict[str, Any]:
        return {"trail": [*state["trail"], "done"]}

    builder = StateGraph(State)
    builder.add_node("hold", hold)
    builder.add_node("done", done)
    builder.add_edge(START, "hold")
    builder.add_edge("hold", "done")
    builder.add_edge("done", END)
    compiled = builder.compile(checkpointer=InMemorySaver())
    try:
        store = RunStore(client, ttl=5)
        lease = await store.create("run-outage", "test", {"order": "o-1"}, "me")
        assert lease is not None
        running = asyncio.create_task(execute_run(compiled, lease, {"order": "o-1"}, budget_s=30))
        await asyncio.wait_for(entered.wait(), timeout=10)
        server.kill()
        server.wait()
        gate.set()
        await asyncio.sleep(1.0)
        assert not running.done(), "the run gave up while Redis was down"
        server, _ = start_redis_server(port, appendonly=True, workdir=str(tmp_path))
        result = await asyncio.wait_for(running, timeout=20)

        assert result.outcome is RunOutcome.DONE, result.error
        assert result.values is not None and result.values["trail"] == ["hold", "done"]
        record = await store.get("run-outage")
        assert record is not None and record.status is RunStatus.DONE
        assert calls == ["hold", "hold"]  # the step whose result was not stored ran again (its effects are keyed)
    finally:
        gate.set()
        await client.aclose()
        server.kill()
        server.wait()
        get_settings.cache_clear()


async def test_a_peer_whose_store_is_down_pauses_the_run_with_growing_waits_and_it_goes_on(redis: Redis) -> None:
    """A peer answering ``dependency_unavailable`` while our own stores answer: each pause waits longer than the one
    before (the peer is not polled ten times a second), and the run goes on to DONE once the peer is back."""
    unavailable = 4
    waits: list[float] = []

    def peer_down() -> None:
        nonlocal unavailable
        if unavailable:
            unavailable -= 1
            raise A2ASkillError("dependency_unavailable", "payment-agent cannot reach its Redis")

    async def sleep(delay: float) -> None:
        waits.append(delay)

    store = RunStore(redis, ttl=5)
    lease = await store.create("run-peer-down", "test", {"order": "o"}, "me")
    assert lease is not None

    result = await execute_run(graph(before_b=peer_down), lease, {"order": "o"}, budget_s=10, sleep=sleep)

    assert result.outcome is RunOutcome.DONE, result.error
    assert result.values == {"order": "o", "trail": ["a", "b"]}
    assert waits == sorted(waits) and waits[-1] > waits[0] and len(waits) == 4, waits
