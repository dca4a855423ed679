"""A thread's next run, a run parked at an ``interrupt()``, and the first decision taking it up (``runs.leases``,
``runs.runner``), on real Redis and a real LangGraph graph (in-memory checkpointer)."""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from runs import RunStatus, RunStore
from runs.runner import RunOutcome, execute_run


async def test_begin_starts_a_threads_next_run_only_once_the_last_is_final(redis):
    store = RunStore(redis, ttl=5, presence=False)
    first = await store.begin("chat-1", "concierge", {"turn_id": "t1"}, "agent-a", turn="t1", client_key="k1")
    assert first.lease is not None and first.lease.fence == 1
    busy = await store.begin("chat-1", "concierge", {"turn_id": "t2"}, "agent-a", turn="t2")
    assert busy.lease is None and busy.busy is RunStatus.RUNNING
    repeat = await store.begin("chat-1", "concierge", {"turn_id": "t3"}, "agent-b", turn="t3", client_key="k1")
    assert repeat.repeat == "t1" and repeat.lease is None

    await first.lease.finish(RunStatus.DONE)
    second = await store.begin("chat-1", "concierge", {"turn_id": "t2"}, "agent-b", turn="t2")
    assert second.lease is not None and second.lease.fence == 2  # fenced against the first turn's owner
    record = await store.get("chat-1")
    assert record is not None
    assert (record.turn, record.input, record.status, record.owner) == (
        "t2",
        {"turn_id": "t2"},
        RunStatus.RUNNING,
        "agent-b",
    )
    assert (await store.begin("chat-1", "concierge", {}, "agent-c", turn="t9", client_key="k1")).repeat == "t1"


async def test_a_parked_run_is_nobodys_and_the_first_decision_takes_it_up(redis):
    store = RunStore(redis, ttl=5, presence=False)
    begun = await store.begin("chat-2", "concierge", {}, "agent-a", turn="t1")
    assert begun.lease is not None
    await begun.lease.park({"approval": {"total": 10}}, waiting_id="ap1", until=time.time() + 60)

    record = await store.get("chat-2")
    assert record is not None
    assert (record.status, record.owner, record.waiting) == (RunStatus.PARKED, None, {"approval": {"total": 10}})
    assert "chat-2" not in [run.thread_id for run in await store.active_runs()]  # no scan recovers it
    assert await store.acquire("chat-2", "recovery") is None

    assert await store.decide("chat-2", "ap-unknown", {"approve": True}, {"expired": True}, "agent-b") is None
    # two replicas answer at once: one records its answer and takes the run, the other gets that answer back
    first, second = await asyncio.gather(
        store.decide("chat-2", "ap1", {"approve": True}, {"expired": True}, "agent-b"),
        store.decide("chat-2", "ap1", {"approve": False}, {"expired": True}, "agent-c"),
    )
    assert first is not None and second is not None
    assert [d.lease is not None for d in (first, second)].count(True) == 1
    assert first.answer == second.answer
    winner = first if first.lease is not None else second
    assert winner.lease is not None and winner.lease.fence == 2
    record = await store.get("chat-2")
    assert record is not None
    assert (record.status, record.owner, record.resume, record.waiting) == (
        RunStatus.RUNNING,
        winner.lease.owner,
        winner.answer,
        None,
    )


async def test_an_expired_wait_is_decided_expired(redis):
    store = RunStore(redis, ttl=5, presence=False)
    begun = await store.begin("chat-3", "concierge", {}, "agent-a", turn="t1")
    assert begun.lease is not None
    await begun.lease.park({"approval": {}}, waiting_id="ap1", until=time.time() - 1)
    decision = await store.decide("chat-3", "ap1", {"approve": True}, {"approve": False, "expired": True}, "b")
    assert decision is not None and decision.expired and decision.answer == {"approve": False, "expired": True}
    again = await store.decide("chat-3", "ap1", {"approve": True}, {"approve": False, "expired": True}, "c")
    assert again is not None and again.expired and again.lease is None


class _State(TypedDict, total=False):
    asked: int
    answer: Any
    booked: int


def _graph(saver: InMemorySaver) -> Any:
    async def ask(state: _State, config: RunnableConfig) -> dict[str, Any]:
        return {"asked": state.get("asked", 0) + 1}

    async def wait(state: _State, config: RunnableConfig) -> dict[str, Any]:
        return {"answer": interrupt({"waiting_id": "ap1", "until": time.time() + 60, "question": "book?"})}

    async def act(state: _State, config: RunnableConfig) -> dict[str, Any]:
        return {"booked": state.get("booked", 0) + (1 if state["answer"]["approve"] else 0)}

    builder = StateGraph(_State)
    builder.add_node("ask", ask)
    builder.add_node("wait", wait)
    builder.add_node("act", act)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "wait")
    builder.add_edge("wait", "act")
    builder.add_edge("act", END)
    return builder.compile(checkpointer=saver)


async def test_the_runner_parks_at_an_interrupt_and_a_resume_finds_the_recorded_answer(redis):
    store = RunStore(redis, ttl=5, presence=False)
    graph = _graph(InMemorySaver())
    begun = await store.begin("chat-4", "test", {}, "agent-a", turn="t1")
    assert begun.lease is not None
    parked = await execute_run(graph, begun.lease, {"asked": 0}, budget_s=10)
    assert parked.outcome is RunOutcome.PARKED
    assert parked.values is not None and parked.values["question"] == "book?"
    assert (await store.get("chat-4")).status is RunStatus.PARKED  # type: ignore[union-attr]

    decision = await store.decide("chat-4", "ap1", {"approve": True}, {"approve": False}, "agent-b")
    assert decision is not None and decision.lease is not None
    # the decider died before resuming: whoever takes the run next resumes it with the recorded answer (input None)
    await decision.lease.release()
    lease = await store.acquire("chat-4", "recovery")
    assert lease is not None
    done = await execute_run(graph, lease, None, budget_s=10)
    assert done.outcome is RunOutcome.DONE, done.error
    assert done.values is not None and (done.values["booked"], done.values["asked"]) == (1, 1)
    assert (await store.get("chat-4")).status is RunStatus.DONE  # type: ignore[union-attr]


async def test_a_command_resume_runs_the_rest_once(redis):
    store = RunStore(redis, ttl=5, presence=False)
    graph = _graph(InMemorySaver())
    begun = await store.begin("chat-5", "test", {}, "agent-a", turn="t1")
    assert begun.lease is not None
    assert (await execute_run(graph, begun.lease, {"asked": 0}, budget_s=10)).outcome is RunOutcome.PARKED
    decision = await store.decide("chat-5", "ap1", {"approve": False}, {"approve": False}, "agent-b")
    assert decision is not None and decision.lease is not None
    done = await execute_run(graph, decision.lease, Command(resume=decision.answer), budget_s=10)
    assert done.outcome is RunOutcome.DONE, done.error
    assert done.values is not None and done.values["booked"] == 0


async def test_the_waiting_index_lists_a_parked_run_until_it_is_decided_and_only_once_its_wait_ended(redis):
    """The approval sweeper's one range query: a run is listed from its park to its decision, due only once its wait
    ended by the server clock; an entry whose run ended another way is dropped, a parked run's never."""
    store = RunStore(redis, ttl=5, presence=False)
    soon = await store.begin("chat-6", "concierge", {}, "agent-a", turn="t1")
    later = await store.begin("chat-7", "concierge", {}, "agent-a", turn="t1")
    assert soon.lease is not None and later.lease is not None
    await soon.lease.park({"approval": {}}, waiting_id="ap1", until=time.time() - 1)
    await later.lease.park({"approval": {}}, waiting_id="ap2", until=time.time() + 60)
    assert await redis.zscore(store.waiting_key, "chat-7") is not None  # listed, not due yet
    assert await store.due_waits() == ["chat-6"]
    assert not await store.forget_wait("chat-6")  # parked: its entry stays

    decision = await store.decide("chat-6", "ap1", {"approve": True}, {"approve": False, "expired": True}, "sweeper")
    assert decision is not None and decision.expired and decision.lease is not None
    assert await store.due_waits() == []
    assert await redis.zscore(store.waiting_key, "chat-6") is None  # decided: gone from the index

    await redis.zadd(store.waiting_key, {"chat-6": 0})  # a stale entry (its run is running again, not parked)
    assert await store.due_waits() == ["chat-6"]
    assert await store.forget_wait("chat-6")
    assert await store.due_waits() == []
    await decision.lease.finish(RunStatus.DONE)
    await store.set_status("chat-7", RunStatus.FAILED)  # a parked run ended another way leaves the index too
    assert await redis.zcard(store.waiting_key) == 0
