"""Runs across a deploy, against real Redis and a real Postgres checkpointer: a run resumes only on the graph version
it started on, waits (``awaiting_version``) where nobody runs it, and is taken up exactly once by a process that
does; a graph out of steps is never ``done`` while its run is not final; nothing is compensated past the point of no
return.

The saga is ``a → b → c → finish`` (any error → ``compensate → finish``); "a deploy" is the same saga with ``b``
renamed ``b2`` (a new shape), both over one checkpointer, as the old and new code of a rolling upgrade would be;
the migrations rename a state key and add one too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from graph import Migration
from infra.checkpointer import open_checkpointer
from infra.journal import JournalWriter, install_writer, read_journal
from recovery import DeadLetterQueue, QueueGuard, RecoveryQueue
from recovery.consumer import (
    DLQ_REASON_MIGRATION_FAILED,
    ConsumerConfig,
    RecoverableGraph,
    RecoveryConsumer,
    RecoveryOutcome,
)
from resilience import Bulkhead, BulkheadConfig, RetryConfig
from runs import RunStatus, RunStore
from runs.errors import RunNotFinalError
from runs.runner import RunOutcome, execute_run, run_config
from runs.versions import graph_fingerprint, version_label
from stack.runs import awaiting_runs, open_runs, version_summary, waiting_lines

GRAPH = "saga"
WAIT_S = 20.0


class SagaState(TypedDict, total=False):
    order: str
    trail: list[str]
    error: dict[str, str] | None
    status: str
    receipt: str


class Saga:
    """One version of the saga; ``runs`` counts what each node of it executed, ``fail`` breaks nodes. ``order_key``
    renames the state key ``order`` (``finish`` writes it on the receipt) and ``extra`` adds one (on it too)."""

    def __init__(self, saver: Any, middle: str = "b", *, order_key: str = "order", extra: str | None = None) -> None:
        self.runs: Counter[str] = Counter()
        self.fail: set[str] = set()
        self.order_key, self.extra = order_key, extra
        keys = {(order_key if key == "order" else key): kind for key, kind in SagaState.__annotations__.items()}
        state: Any = SagaState if keys == SagaState.__annotations__ else TypedDict("State", keys, total=False)  # type: ignore[operator]
        if extra is not None:
            state = TypedDict("State", {**keys, extra: str}, total=False)  # type: ignore[operator]
        builder = StateGraph(state)
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
        async def run(state: Any) -> dict[str, Any]:  # ``Any``: a node typed ``SagaState`` sees only its keys
            self.runs[name] += 1
            if name in self.fail:
                raise RuntimeError(f"{name} is broken")
            update: dict[str, Any] = {"trail": [*state.get("trail", []), name]}
            if name == "finish":
                update["status"] = "failed" if state.get("error") else "confirmed"
                keys = (self.order_key, self.extra)
                update["receipt"] = "/".join(str(state.get(key)) for key in keys if key is not None)
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

    def consumer(
        self, *sagas: Saga, name: str = "worker", committed: Any = None, migrations: Any = (), **config: Any
    ) -> RecoveryConsumer:
        """A worker running ``sagas`` (current first, which declares ``migrations``)."""
        targets = [
            RecoverableGraph(graph=saga.graph, give_up_update=give_up, is_final=is_final, committed=committed)
            for saga in sagas
        ]
        targets[0] = dataclasses.replace(targets[0], migrations=migrations)
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


# ----------------------------------------------------------------------------------------- migrations


def migrated(world: World) -> tuple[Saga, Migration]:
    """The next shape: ``b`` renamed ``b2``, the state key ``order`` renamed ``order_id``, a new key ``currency``; and
    the migration its code declares from the old shape."""
    new = Saga(world.saver, middle="b2", order_key="order_id", extra="currency")
    migration = Migration(
        world.old.version, nodes={"b": "b2"}, keys={"order": "order_id"}, defaults={"currency": "EUR"}
    )
    return new, migration


@pytest.fixture
def journal(redis: Any) -> Iterator[JournalWriter]:
    mine = JournalWriter(redis, "test-worker")
    previous = install_writer(mine)
    yield mine
    install_writer(previous)


async def test_a_run_of_a_shape_the_new_code_migrates_from_is_migrated_and_resumed_once_on_it(
    world: World, journal: JournalWriter
) -> None:
    await world.died_in_b("order-7")
    new, migration = migrated(world)

    outcome = await world.process_next(world.consumer(new, migrations=(migration,)))

    assert outcome is RecoveryOutcome.RECOVERED
    record = await world.runs.get("order-7")
    assert record is not None and record.status is RunStatus.DONE and record.version == new.version
    assert world.old.runs == Counter({"a": 1, "b": 1}), "the old code's attempt only"
    assert new.runs == Counter({"b2": 1, "c": 1, "finish": 1}), "resumed at the renamed step, each step once"
    state = await new.graph.aget_state(run_config("order-7"))
    assert state.values["trail"] == ["a", "b2", "c", "finish"]
    assert state.values["receipt"] == "order-7/EUR", "the renamed key kept its value, the new one its default"
    assert "order" not in state.values
    assert state.metadata is not None and state.metadata.get("graph_version") == new.version
    await journal.flush()
    kinds = [entry for entry in await read_journal(world.redis, "order-7") if entry["kind"] == "migrated"]
    assert len(kinds) == 1 and kinds[0]["to"] == version_label(GRAPH, new.version)


async def test_a_waiting_run_is_woken_and_migrated_by_the_first_worker_that_declares_it_exactly_once(
    world: World,
) -> None:
    await world.died_in_b("order-8")
    new, migration = migrated(world)
    assert await world.process_next(world.consumer(new)) is RecoveryOutcome.WAITING, "no migration declared yet"

    workers = [world.consumer(new, migrations=(migration,), name=f"next-{n}") for n in range(2)]
    loops = [asyncio.create_task(worker.run()) for worker in workers]
    try:
        record = await world.until_done("order-8")
    finally:
        for worker in workers:
            await worker.stop(grace=5)
        await asyncio.gather(*loops)

    assert record.status is RunStatus.DONE and record.version == new.version
    assert new.runs == Counter({"b2": 1, "c": 1, "finish": 1})
    assert await world.runs.awaiting() == []


async def test_an_incomplete_migration_leaves_the_checkpoint_as_it_was_and_the_run_in_the_dlq(world: World) -> None:
    await world.died_in_b("order-9")
    new, _ = migrated(world)
    before = await world.old.graph.aget_state(run_config("order-9"))
    forgot_the_rename = Migration(world.old.version, keys={"order": "order_id"})

    outcome = await world.process_next(world.consumer(new, migrations=(forgot_the_rename,)))

    assert outcome is RecoveryOutcome.DEAD_LETTERED
    entry = await world.dlq.get("order-9")
    assert entry is not None and entry.reason == DLQ_REASON_MIGRATION_FAILED and "'branch:to:b'" in entry.error
    assert new.runs == Counter() and world.old.runs["compensate"] == 0
    after = await world.old.graph.aget_state(run_config("order-9"))
    assert after.values == before.values and after.config == before.config, "the checkpoint as it was"
    record = await world.runs.get("order-9")
    assert record is not None and record.version == world.old.version
