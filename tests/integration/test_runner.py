"""``execute_run`` on real Redis leases: what a finished run, an interrupted one and a failing one report."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from redis.asyncio import Redis

from runs.leases import RunRecord, RunStatus, RunStore
from runs.runner import RunOutcome, RunResult, execute_run


class State(TypedDict, total=False):
    order: str
    trail: list[str]


def graph(*, stop_at_b: bool = False, fail_at_b: bool = False) -> Any:
    async def a(state: State) -> dict[str, Any]:
        return {"trail": [*state.get("trail", []), "a"]}

    async def b(state: State) -> dict[str, Any]:
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
