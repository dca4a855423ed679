"""Runs across a deploy, against real Redis and a real Postgres checkpointer: a run resumes only on the graph version
it started on, waits (``awaiting_version``) where nobody runs it, and is taken up exactly once by a process that
does; a graph out of steps is never ``done`` while its run is not final; nothing is compensated past the point of no
return.

The saga is ``a → b → c → finish`` (any error → ``compensate → finish``); "a deploy" is the same saga with ``b``
renamed ``b2`` (a new shape), both over one checkpointer, as the old and new code of a rolling upgrade would be.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from infra.checkpointer import open_checkpointer
from recovery import DeadLetterQueue, QueueGuard, RecoveryQueue
from recovery.consumer import ConsumerConfig, RecoverableGraph, RecoveryConsumer, RecoveryOutcome
from resilience import Bulkhead, BulkheadConfig, RetryConfig
from runs import RunStatus, RunStore
from runs.errors import RunNotFinalError
from runs.runner import RunOutcome, execute_run, run_config
from runs.versions import graph_fingerprint
from stack.runs import awaiting_runs, open_runs, version_summary, waiting_lines

GRAPH = "saga"
WAIT_S = 20.0


class SagaState(TypedDict, total=False):
    order: str
    trail: list[str]
    error: dict[str, str] | None
    status: str


class Saga:
    """One version of the saga; ``runs`` counts what each node of it executed, ``fail`` breaks nodes."""

    def __init__(self, saver: Any, middle: str = "b") -> None:
        self.runs: Counter[str] = Counter()
        self.fail: set[str] = set()
        builder = StateGraph(SagaState)
        chain = ["a", middle, "c", "finish"]
        for name in (*chain, "compensate"):
            builder.add_node(name, self._node(name))
        builder.add_edge(START, "a")
        for current, following in itertools.pairwise(chain):
            builder.add_conditional_edges(current, self._route(following), [following, "compensate"])
        builder.add_edge("compensate", "finish")
        builder.add_edge("finish", END)
        self.graph = builder.compile(checkpointer=saver, name=GRAPH)
        self.version = graph_fingerprint(self.graph)

    def _node(self, name: str) -> Any:
        async def run(state: SagaState) -> dict[str, Any]:
            self.runs[name] += 1
            if name in self.fail:
                raise RuntimeError(f"{name} is broken")
            update: dict[str, Any] = {"trail": [*state.get("trail", []), name]}
            if name == "finish":
                update["status"] = "failed" if state.get("error") else "confirmed"
            return update

        return run

    @staticmethod
    def _route(following: str) -> Any:
        async def route(state: SagaState) -> str:
            return "compensate" if state.get("error") else following

        return route


def is_final(values: Mapping[str, Any]) -> bool:
    return values.get("status") in ("confirmed", "failed")


def give_up(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
    return {"error": {"code": "provider_unavailable", "message": f"recovery gave up: {last_error}"}}


class World:
    def __init__(self, redis: Any, saver: Any) -> None:
        self.redis = redis
        self.saver = saver
        self.old = Saga(saver)
        self.new = Saga(saver, middle="b2")
        self.runs = RunStore(redis, ttl=0.5)
        self.dlq = DeadLetterQueue(redis)
        self.guard = QueueGuard(redis, self.dlq)
        self.queue = RecoveryQueue(redis, self.dlq, visibility_timeout=5)

    def consumer(self, *sagas: Saga, name: str = "worker", committed: Any = None, **config: Any) -> RecoveryConsumer:
        targets = [
            RecoverableGraph(graph=saga.graph, give_up_update=give_up, is_final=is_final, committed=committed)
            for saga in sagas
        ]
        defaults: dict[str, Any] = {
            "max_attempts": 2,
            "budget_s": 10.0,
            "backoff": RetryConfig(base_delay=0.01, max_delay=0.02),
            "take_wait": 0.05,
            "wake_interval": 0.05,
        }
        return RecoveryConsumer(
            runs=self.runs,
            queue=self.queue,
            guard=self.guard,
            graphs={GRAPH: targets},
            consumer_id=name,
            bulkhead=Bulkhead(f"test_versions_{name}", BulkheadConfig(max_concurrent=3, timeout=30.0)),
            config=ConsumerConfig(**(defaults | config)),
        )

    async def died_in_b(self, order: str) -> None:
        """The old code ran ``a`` and died in ``b``: its checkpoint waits at ``b``, its lease is gone, it is queued."""
        self.old.fail.add("b")
        with pytest.raises(RuntimeError):
            await self.old.graph.ainvoke({"order": order}, run_config(order, self.old.version), durability="sync")
        self.old.fail.clear()
        lease = await self.runs.create(order, GRAPH, {"order": order}, "old-agent", version=self.old.version)
        assert lease is not None
        await lease.release()
        assert await self.guard.safe_enqueue(order)

    async def process_next(self, consumer: RecoveryConsumer) -> RecoveryOutcome:
        delivery = await self.queue.take(consumer.consumer_id)
        assert delivery is not None
        return await consumer.process(delivery)

    async def until_done(self, order: str) -> Any:
        async with asyncio.timeout(WAIT_S):
            while True:
                record = await self.runs.get(order)
                if record is not None and record.is_final:
                    return record
                await asyncio.sleep(0.02)


@pytest.fixture
async def world(redis: Any, postgres_url: str) -> AsyncIterator[World]:
    async with open_checkpointer(postgres_url) as saver:
        yield World(redis, saver)


async def test_a_run_of_a_version_nobody_runs_waits_and_the_old_version_takes_it_up_exactly_once(world: World) -> None:
    await world.died_in_b("order-1")
    checkpoint = (await world.old.graph.aget_state(run_config("order-1"))).config

    assert await world.process_next(world.consumer(world.new)) is RecoveryOutcome.WAITING

    record = await world.runs.get("order-1")
    assert record is not None and record.status is RunStatus.AWAITING_VERSION and record.owner is None
    assert record.version == world.old.version
    assert world.new.runs == Counter(), "nothing ran on the new shape, nor was compensated"
    assert (await world.old.graph.aget_state(run_config("order-1"))).config == checkpoint, "the checkpoint as it was"
    assert await world.runs.awaiting() == ["order-1"] and await world.runs.awaiting(world.old.version) == ["order-1"]
    assert "order-1" not in {run.thread_id for run in await world.runs.active_runs()}, "no scan hands it on again"
    assert await world.runs.acquire("order-1", "anyone") is None, "taken up only by a process that runs its version"

    # a rollback (or an old replica): two workers that run the old version start at once; one takes it up
    old_workers = [world.consumer(world.old, world.new, name=f"old-{n}") for n in range(2)]
    loops = [asyncio.create_task(worker.run()) for worker in old_workers]
    try:
        record = await world.until_done("order-1")
    finally:
        for worker in old_workers:
            await worker.stop(grace=5)
        await asyncio.gather(*loops)

    assert record.status is RunStatus.DONE
    assert world.old.runs == Counter({"a": 1, "b": 2, "c": 1, "finish": 1}), "resumed at b on its own graph, once"
    assert world.new.runs == Counter()
    state = await world.old.graph.aget_state(run_config("order-1"))
    assert state.values["trail"] == ["a", "b", "c", "finish"] and state.values["status"] == "confirmed"
    assert state.metadata is not None and state.metadata.get("graph_version") == world.old.version
    assert await world.runs.awaiting() == [] and await world.runs.awaiting(world.old.version) == []


async def test_a_resume_with_another_graph_sets_the_run_aside_instead_of_running_it(world: World) -> None:
    """``execute_run`` itself refuses: whoever resumes a run (an approval decided on new code, say) checks."""
    await world.died_in_b("order-2")
    lease = await world.runs.acquire("order-2", "new-agent")
    assert lease is not None

    result = await execute_run(world.new.graph, lease, None, budget_s=5, is_final=is_final)

    assert result.outcome is RunOutcome.WAITING
    record = await world.runs.get("order-2")
    assert record is not None and record.status is RunStatus.AWAITING_VERSION
    assert world.new.runs == Counter()


async def test_a_graph_out_of_steps_is_never_done_while_its_run_is_not_final(world: World) -> None:
    """LangGraph returns at once, without an error, on a checkpoint whose next node the graph lacks (the renamed
    ``b``): with the version check out of the way (a record that lies), the run still does not pass for done."""
    await world.died_in_b("order-3")
    lease = await world.runs.acquire("order-3", "new-agent")
    assert lease is not None
    await world.redis.hset(world.runs.run_key("order-3"), "version", world.new.version)  # the lie

    result = await execute_run(world.new.graph, lease, None, budget_s=5, is_final=is_final)

    assert result.outcome is RunOutcome.FAILED and isinstance(result.error, RunNotFinalError)
    record = await world.runs.get("order-3")
    assert record is not None and record.status is RunStatus.PENDING and "not final" in (record.last_error or "")

    # nor does recovery mark it done, or compensate it with the wrong graph: it ends in the DLQ as it stands
    assert await world.guard.safe_enqueue("order-3")
    assert await world.process_next(world.consumer(world.new)) is RecoveryOutcome.DEAD_LETTERED
    record = await world.runs.get("order-3")
    assert record is not None and record.status is RunStatus.DEAD_LETTERED
    assert world.new.runs == Counter(), "no step of the new graph ran, compensate included"
    entry = await world.dlq.get("order-3")
    assert entry is not None and "not final" in entry.error


async def test_past_the_point_of_no_return_giving_up_dead_letters_without_compensating(world: World) -> None:
    await world.died_in_b("order-4")
    world.old.fail.add("c")

    async def committed(record: Any) -> bool:
        return True

    outcome = await world.process_next(world.consumer(world.old, committed=committed))

    assert outcome is RecoveryOutcome.DEAD_LETTERED
    assert world.old.runs["compensate"] == 0 and world.old.runs["c"] == 2, "two attempts, then left as it stands"
    entry = await world.dlq.get("order-4")
    assert entry is not None and "point of no return" in entry.error
    record = await world.runs.get("order-4")
    assert record is not None and record.status is RunStatus.DEAD_LETTERED


async def test_before_the_point_of_no_return_giving_up_still_compensates(world: World) -> None:
    await world.died_in_b("order-5")
    world.old.fail.add("c")

    async def committed(record: Any) -> bool:
        return False

    assert await world.process_next(world.consumer(world.old, committed=committed)) is RecoveryOutcome.COMPENSATED
    assert world.old.runs["compensate"] == 1


async def test_status_verify_and_runs_read_the_waiting_runs_from_the_store(world: World) -> None:
    await world.died_in_b("order-6")
    assert await world.process_next(world.consumer(world.new)) is RecoveryOutcome.WAITING

    rows = version_summary(await awaiting_runs(world.redis))
    assert [(row.graph, row.waiting, dict(row.statuses)) for row in rows] == [
        (GRAPH, ("order-6",), {"awaiting_version": 1})
    ]
    lines = waiting_lines(rows)
    assert len(lines) == 1 and "1 run(s) wait for graph version saga@" in lines[0] and "order-6" in lines[0]
    everything = version_summary(await open_runs(world.redis))
    assert [row.waiting for row in everything] == [("order-6",)], "the open runs include the waiting ones"
