"""The recovery consumer against real Redis and a real Postgres checkpointer, driving a real LangGraph saga.

The graph has the booking saga's shape (``a → b → c → finish``, any error → ``compensate → finish``); its nodes
record every execution so a test sees what ran, what was resumed and what was never repeated.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TypedDict, cast

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

from agents.booking.durable import booking_recovery
from agents.booking.graph import BookingDeps, booking_input
from infra.a2a import A2ASkillError
from infra.bookings import BookingStore
from infra.checkpointer import open_checkpointer
from recovery import DeadLetterQueue, QueueGuard, RecoveryQueue
from recovery.consumer import ConsumerConfig, RecoverableGraph, RecoveryConsumer, RecoveryOutcome
from resilience import Bulkhead, BulkheadConfig, CircuitOpenError, RetryConfig
from runs import RunStatus, RunStore
from runs.runner import run_config

GRAPH = "saga"


class SagaState(TypedDict, total=False):
    order: str
    trail: list[str]
    held: str | None
    error: dict[str, str] | None
    status: str


@dataclass
class Behaviour:
    """What the nodes do; tests flip these between attempts."""

    fail: set[str] = field(default_factory=set)
    outage: Counter[str] = field(default_factory=Counter)
    """Node → how many more of its runs meet an outage (not a failure of the run): ``outage_error``."""
    outage_error: Callable[[], Exception] = field(default=lambda: CircuitOpenError("hotel_api", 30.0))
    gate: dict[str, asyncio.Event] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    after: dict[str, Callable[[], object]] = field(default_factory=dict)
    """Called when a node's body is done, before its result is checkpointed."""
    runs: Counter[str] = field(default_factory=Counter)
    seen: dict[str, SagaState] = field(default_factory=dict)
    started: dict[str, asyncio.Event] = field(default_factory=dict)
    concurrent: int = 0
    max_concurrent: int = 0


def build_saga(behaviour: Behaviour, checkpointer: Any) -> Any:
    def node(name: str) -> Any:
        async def run(state: SagaState) -> dict[str, Any]:
            behaviour.runs[name] += 1
            behaviour.seen[name] = state
            behaviour.started.setdefault(name, asyncio.Event()).set()
            behaviour.concurrent += 1
            behaviour.max_concurrent = max(behaviour.max_concurrent, behaviour.concurrent)
            try:
                if name in behaviour.delay:
                    await asyncio.sleep(behaviour.delay[name])
                if name in behaviour.gate:
                    await behaviour.gate[name].wait()
                if name in behaviour.fail:
                    raise RuntimeError(f"{name} is broken")
                if behaviour.outage[name] > 0:
                    behaviour.outage[name] -= 1
                    raise behaviour.outage_error()
            finally:
                behaviour.concurrent -= 1
            if name in behaviour.after:
                behaviour.after[name]()
            update: dict[str, Any] = {"trail": [*state.get("trail", []), name]}
            if name == "b":
                update["held"] = f"hold-{state.get('order')}"  # the side effect a compensation has to undo
            if name == "a":
                update["error"] = None  # like the booking's validate: a fresh run starts without an error
            if name == "compensate":
                update["status"] = "failed"
            if name == "finish":
                update["status"] = "failed" if state.get("error") else "confirmed"
            return update

        return run

    builder = StateGraph(SagaState)
    for name in ("a", "b", "c", "compensate", "finish"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "a")

    def next_or_compensate(following: str) -> Any:
        return lambda state: "compensate" if state.get("error") else following

    for current, following in itertools.pairwise(["a", "b", "c", "finish"]):
        builder.add_conditional_edges(current, next_or_compensate(following), [following, "compensate"])
    builder.add_edge("compensate", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer)


def give_up(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
    return {"error": {"code": "provider_unavailable", "message": f"recovery gave up: {last_error}"}}


class Harness:
    def __init__(self, redis: Any, saver: Any, postgres_url: str) -> None:
        self.redis = redis
        self.saver = saver
        self.postgres_url = postgres_url
        self.behaviour = Behaviour()
        self.graph = build_saga(self.behaviour, saver)
        self.runs = RunStore(redis, ttl=0.5)
        self.dlq = DeadLetterQueue(redis)
        self.guard = QueueGuard(redis, self.dlq)
        self.queue = RecoveryQueue(redis, self.dlq, visibility_timeout=5)
        self.sleeps: list[float] = []
        self.prepared: list[str] = []

    async def record_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def consumer(
        self, *, slots: int = 3, prepare: Any = None, real_sleep: bool = False, **config: Any
    ) -> RecoveryConsumer:
        async def remember(record: Any) -> None:
            self.prepared.append(record.thread_id)

        target = RecoverableGraph(graph=self.graph, give_up_update=give_up, prepare=prepare or remember)
        defaults: dict[str, Any] = {
            "max_attempts": 3,
            "budget_s": 10.0,
            "backoff": RetryConfig(base_delay=0.2, max_delay=1.0),
            "take_wait": 0.05,
        }
        return RecoveryConsumer(
            runs=self.runs,
            queue=self.queue,
            guard=self.guard,
            graphs={GRAPH: target},
            consumer_id="worker-1",
            bulkhead=Bulkhead("test_recovery", BulkheadConfig(max_concurrent=slots, timeout=30.0)),
            config=ConsumerConfig(**(defaults | config)),
            sleep=asyncio.sleep if real_sleep else self.record_sleep,
        )

    async def orphan(self, thread_id: str, graph: str = GRAPH, input: Mapping[str, Any] | None = None) -> None:
        """A run whose owner is gone: lease released at once (a crash would let it expire), then queued."""
        lease = await self.runs.create(thread_id, graph, dict(input or {"order": thread_id}), "dead-agent")
        assert lease is not None
        await lease.release()
        assert await self.guard.safe_enqueue(thread_id)

    async def process_next(self, consumer: RecoveryConsumer) -> RecoveryOutcome:
        delivery = await self.queue.take("worker-1")
        assert delivery is not None
        return await consumer.process(delivery)

    async def state(self, thread_id: str) -> Any:
        return await self.graph.aget_state(run_config(thread_id))

    def sql(self, statement: str) -> None:
        with psycopg.connect(self.postgres_url, autocommit=True) as conn:
            conn.execute(statement)


@pytest.fixture
async def harness(redis: Any, postgres_url: str) -> AsyncIterator[Harness]:
    async with open_checkpointer(postgres_url) as saver:
        yield Harness(redis, saver, postgres_url)


async def test_run_without_checkpoint_starts_from_its_stored_input(harness: Harness) -> None:
    await harness.orphan("order-1", input={"order": "order-1", "trail": ["accepted"]})
    assert (await harness.state("order-1")).created_at is None

    outcome = await harness.process_next(harness.consumer())

    assert outcome is RecoveryOutcome.RECOVERED
    state = await harness.state("order-1")
    assert state.next == ()
    assert state.values["order"] == "order-1"
    assert state.values["trail"] == ["accepted", "a", "b", "c", "finish"]
    assert state.values["status"] == "confirmed"
    record = await harness.runs.get("order-1")
    assert record is not None and record.status is RunStatus.DONE and record.attempts == 1
    assert harness.prepared == ["order-1"]
    stats = await harness.queue.stats()
    assert (stats["depth"], stats["in_flight"], stats["recovered_total"]) == (0, 0, 1)


async def test_run_with_checkpoints_resumes_without_repeating_finished_steps(harness: Harness) -> None:
    # the owner ran "a", then died inside "b" (a crash is an exception as far as the checkpoints are concerned)
    harness.behaviour.fail.add("b")
    with pytest.raises(RuntimeError):
        await harness.graph.ainvoke({"order": "order-2"}, run_config("order-2"), durability="sync")
    lease = await harness.runs.create("order-2", GRAPH, {"order": "order-2"}, "dead-agent")
    assert lease is not None
    await asyncio.sleep(0.6)  # its lease runs out: nobody renews it
    assert await harness.guard.safe_enqueue("order-2")
    harness.behaviour.fail.clear()

    assert await harness.process_next(harness.consumer()) is RecoveryOutcome.RECOVERED

    assert harness.behaviour.runs == Counter({"a": 1, "b": 2, "c": 1, "finish": 1})
    assert (await harness.state("order-2")).values["trail"] == ["a", "b", "c", "finish"]
    record = await harness.runs.get("order-2")
    assert record is not None and record.status is RunStatus.DONE and record.fence == 2


async def test_final_checkpoint_is_marked_done_without_running_anything(harness: Harness) -> None:
    await harness.graph.ainvoke({"order": "order-3"}, run_config("order-3"), durability="sync")
    before = Counter(harness.behaviour.runs)
    await harness.orphan("order-3")

    assert await harness.process_next(harness.consumer()) is RecoveryOutcome.RECOVERED

    assert harness.behaviour.runs == before
    record = await harness.runs.get("order-3")
    assert record is not None and record.status is RunStatus.DONE


async def test_a_run_whose_owner_is_alive_is_left_alone(harness: Harness) -> None:
    lease = await harness.runs.create("order-4", GRAPH, {"order": "order-4"}, "live-agent")
    assert lease is not None
    async with lease.keep_alive(interval=0.1):
        assert await harness.guard.safe_enqueue("order-4")  # e.g. a scan that raced a renewal
        assert await harness.process_next(harness.consumer()) is RecoveryOutcome.SKIPPED
        assert not lease.lost
    record = await harness.runs.get("order-4")
    assert record is not None and record.owner == "live-agent" and record.fence == 1
    assert harness.behaviour.runs == Counter()
    stats = await harness.queue.stats()
    assert (stats["depth"], stats["in_flight"], stats["recovered_total"], stats["skipped_total"]) == (0, 0, 0, 1)


async def test_failing_resumes_retry_with_backoff_then_compensate_and_dead_letter(harness: Harness) -> None:
    harness.behaviour.fail.add("b")
    await harness.orphan("order-5")

    outcome = await harness.process_next(harness.consumer())

    assert outcome is RecoveryOutcome.COMPENSATED
    assert harness.behaviour.runs["b"] == 3, "three attempts, each failing in b"
    assert len(harness.sleeps) == 2 and all(0 <= s <= 1.0 for s in harness.sleeps), harness.sleeps
    assert harness.behaviour.runs["compensate"] == 1 and harness.behaviour.runs["c"] == 0
    state = await harness.state("order-5")
    assert state.next == () and state.values["status"] == "failed"
    assert state.values["error"]["message"] == "recovery gave up: RuntimeError: b is broken"
    entry = await harness.dlq.get("order-5")
    assert entry is not None
    assert (entry.reason, entry.attempts, entry.error) == ("max_attempts", 3, "RuntimeError: b is broken")
    record = await harness.runs.get("order-5")
    assert record is not None and record.status is RunStatus.DONE, "compensated: the run is over"
    assert (await harness.queue.stats())["dead_lettered_total"] == 1


OUTAGES = pytest.mark.parametrize(
    "outage",
    [
        lambda: CircuitOpenError("hotel_api", 30.0),
        # payment-agent answers its open breaker as a business error (so callers do not retry into it); for the
        # consumer it is still an outage, waited out, not three quick attempts and a DLQ entry
        lambda: A2ASkillError("provider_unavailable", "payment_api is unavailable (circuit open)"),
    ],
    ids=["open circuit", "a peer's provider down"],
)


@OUTAGES
async def test_attempts_that_meet_an_outage_do_not_count_toward_the_dlq(
    harness: Harness, outage: Callable[[], Exception]
) -> None:
    harness.behaviour.outage_error = outage
    harness.behaviour.outage["b"] = 5  # more than max_attempts: an outage for a while
    await harness.orphan("order-outage")

    outcome = await harness.process_next(harness.consumer(outage_backoff=RetryConfig(base_delay=1.0, max_delay=30.0)))

    assert outcome is RecoveryOutcome.RECOVERED
    assert harness.behaviour.runs["b"] == 6 and harness.behaviour.runs["compensate"] == 0
    assert len(harness.sleeps) == 5 and all(0 <= s <= 30.0 for s in harness.sleeps), harness.sleeps
    record = await harness.runs.get("order-outage")
    assert record is not None and record.status is RunStatus.DONE and record.attempts == 1
    assert await harness.dlq.get("order-outage") is None


async def test_an_outage_past_its_horizon_counts_like_any_failure(harness: Harness) -> None:
    harness.behaviour.outage["b"] = 5
    await harness.orphan("order-long-outage")

    outcome = await harness.process_next(harness.consumer(outage_horizon_s=0.0))

    assert outcome is RecoveryOutcome.COMPENSATED
    assert harness.behaviour.runs["b"] == 3
    assert (await harness.dlq.get("order-long-outage")) is not None


@OUTAGES
async def test_a_compensation_that_meets_an_outage_is_retried_until_done_not_dead_lettered(
    harness: Harness, outage: Callable[[], Exception]
) -> None:
    harness.behaviour.outage_error = outage
    harness.behaviour.fail.add("b")
    harness.behaviour.outage["compensate"] = 4  # the refund's provider is down when recovery gives up
    await harness.orphan("order-refund-later")

    outcome = await harness.process_next(harness.consumer())

    assert outcome is RecoveryOutcome.COMPENSATED
    assert harness.behaviour.runs["compensate"] == 5
    state = await harness.state("order-refund-later")
    assert state.next == () and state.values["status"] == "failed"
    record = await harness.runs.get("order-refund-later")
    assert record is not None and record.status is RunStatus.DONE


async def test_failed_compensation_stays_dead_lettered_until_an_operator_requeues_it(harness: Harness) -> None:
    harness.behaviour.fail.update({"b", "compensate"})
    await harness.orphan("order-6")
    consumer = harness.consumer()

    assert await harness.process_next(consumer) is RecoveryOutcome.DEAD_LETTERED
    record = await harness.runs.get("order-6")
    assert record is not None and record.status is RunStatus.DEAD_LETTERED
    assert record.last_error == "RuntimeError: b is broken"
    assert (await harness.state("order-6")).next == ("compensate",), "stopped where compensation failed"
    assert (await harness.dlq.get("order-6")) is not None
    assert await harness.queue.take("worker-1") is None, "a dead-lettered run is not recovered by itself"

    harness.behaviour.fail.clear()  # the operator fixed the cause
    assert await harness.dlq.requeue("order-6")
    assert await harness.process_next(consumer) is RecoveryOutcome.RECOVERED
    state = await harness.state("order-6")
    assert state.next == () and state.values["status"] == "failed"
    assert harness.behaviour.runs["compensate"] == 2 and harness.behaviour.runs["finish"] == 1
    record = await harness.runs.get("order-6")
    assert record is not None and record.status is RunStatus.DONE and record.attempts == 1
    assert await harness.dlq.get("order-6") is None


async def test_checkpoint_store_failure_leaves_the_state_untouched_and_a_requeue_completes_the_run(
    harness: Harness,
) -> None:
    # The checkpoint store breaks right after b's side effect: b's result is kept as a pending write but its step
    # checkpoint is never written, and every resume fails reading the checkpoint. Nothing can be compensated.
    harness.behaviour.after["b"] = lambda: harness.sql("ALTER TABLE checkpoints RENAME TO checkpoints_unavailable")
    with pytest.raises(Exception, match="checkpoints"):
        await harness.graph.ainvoke({"order": "order-7"}, run_config("order-7"), durability="sync")
    harness.behaviour.after.clear()
    await harness.orphan("order-7")
    try:
        outcome = await harness.process_next(harness.consumer())
    finally:
        harness.sql("ALTER TABLE checkpoints_unavailable RENAME TO checkpoints")

    assert outcome is RecoveryOutcome.DEAD_LETTERED
    entry = await harness.dlq.get("order-7")
    assert entry is not None and entry.reason == "max_attempts" and "checkpoints" in entry.error
    state = await harness.state("order-7")
    assert state.next == () and [t.name for t in state.tasks] == ["b"], "b finished, its checkpoint is missing"
    assert not state.values.get("error"), "no compensation could be written"

    assert await harness.dlq.requeue("order-7")
    assert await harness.process_next(harness.consumer()) is RecoveryOutcome.RECOVERED
    state = await harness.state("order-7")
    assert state.values["status"] == "confirmed" and state.values["trail"] == ["a", "b", "c", "finish"]
    assert harness.behaviour.runs["b"] == 1, "b's pending result was applied, not run again"


async def test_giving_up_after_a_lost_checkpoint_still_compensates_that_steps_side_effect(
    harness: Harness,
) -> None:
    breaks = {"count": 0}

    def break_store() -> None:
        breaks["count"] += 1
        harness.sql("ALTER TABLE checkpoints RENAME TO checkpoints_unavailable")

    harness.behaviour.after["b"] = break_store
    with pytest.raises(Exception, match="checkpoints"):
        await harness.graph.ainvoke({"order": "order-11"}, run_config("order-11"), durability="sync")
    harness.behaviour.after.clear()
    await harness.orphan("order-11")

    prepared = {"count": 0}

    async def fix_the_store_before_the_compensation(record: Any) -> None:
        prepared["count"] += 1
        if prepared["count"] == 2:  # the first call is the only attempt, the second is the compensation's
            harness.sql("ALTER TABLE checkpoints_unavailable RENAME TO checkpoints")

    try:
        consumer = harness.consumer(max_attempts=1, prepare=fix_the_store_before_the_compensation)
        outcome = await harness.process_next(consumer)
    finally:
        if prepared["count"] < 2:
            harness.sql("ALTER TABLE checkpoints_unavailable RENAME TO checkpoints")

    assert outcome is RecoveryOutcome.COMPENSATED
    assert harness.behaviour.seen["compensate"].get("held") == "hold-order-11", "the compensation saw b's hold"
    assert harness.behaviour.runs["b"] == 1 and harness.behaviour.runs["c"] == 0
    state = await harness.state("order-11")
    assert state.values["status"] == "failed" and state.values["trail"] == ["a", "b", "compensate", "finish"]


async def test_a_run_out_of_attempts_is_given_up_without_another_resume(harness: Harness) -> None:
    # workers died during all three attempts (each took the run and bumped the count), so nothing was recorded
    await harness.orphan("order-8")
    for _ in range(3):
        await harness.runs.increment_attempts("order-8")

    assert await harness.process_next(harness.consumer()) is RecoveryOutcome.COMPENSATED

    assert harness.behaviour.runs == Counter({"compensate": 1, "finish": 1}), "compensation only"
    state = await harness.state("order-8")
    assert state.values["status"] == "failed" and state.values["trail"] == ["compensate", "finish"]
    assert state.values["order"] == "order-8", "the compensation saw the stored input"
    entry = await harness.dlq.get("order-8")
    assert entry is not None and entry.attempts == 3


async def test_a_run_of_an_unknown_graph_is_dead_lettered(harness: Harness) -> None:
    await harness.orphan("order-9", graph="no-such-graph")

    assert await harness.process_next(harness.consumer()) is RecoveryOutcome.DEAD_LETTERED

    entry = await harness.dlq.get("order-9")
    assert entry is not None and entry.reason == "unknown_graph" and "no-such-graph" in entry.error


async def test_missing_booking_record_is_recreated_from_the_run_input(harness: Harness) -> None:
    bookings = BookingStore(harness.redis)
    request = {
        "city": "Lisbon",
        "checkin": "2031-05-01",
        "checkout": "2031-05-03",
        "guests": 2,
        "payment_token": "tok_visa",
    }
    run_input = dict(booking_input("booking-1", request))
    await harness.orphan("booking-1", input=run_input)  # booking-agent died before writing the booking record
    prepare = booking_recovery(harness.graph, cast(BookingDeps, SimpleNamespace(bookings=bookings))).prepare
    assert await bookings.get("booking-1") is None

    assert await harness.process_next(harness.consumer(prepare=prepare)) is RecoveryOutcome.RECOVERED

    booking = await bookings.get("booking-1")
    assert booking is not None
    assert (booking["city"], booking["checkin"], booking["checkout"], booking["guests"]) == (
        "Lisbon",
        "2031-05-01",
        "2031-05-03",
        2,
    )


async def test_runs_are_recovered_three_at_a_time(harness: Harness) -> None:
    harness.behaviour.delay["b"] = 0.3
    for n in range(7):
        await harness.orphan(f"order-c{n}")
    consumer = harness.consumer(slots=3)
    loop = asyncio.create_task(consumer.run())
    try:
        for _ in range(400):  # 20 s
            if (await harness.queue.stats())["recovered_total"] == 7 and not consumer.in_flight:
                break
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop(grace=5)
        await asyncio.wait_for(loop, 5)

    assert harness.behaviour.runs["finish"] == 7
    assert harness.behaviour.max_concurrent == 3, "never more than the bulkhead's slots, and it did use them all"
    for n in range(7):
        record = await harness.runs.get(f"order-c{n}")
        assert record is not None and record.status is RunStatus.DONE


async def test_stop_cancels_the_step_in_progress_and_hands_the_run_back_at_once(harness: Harness) -> None:
    harness.behaviour.gate["b"] = asyncio.Event()  # never set: b would wait forever
    harness.behaviour.started["b"] = asyncio.Event()
    await harness.orphan("order-10")
    consumer = harness.consumer()
    loop = asyncio.create_task(consumer.run())
    async with asyncio.timeout(10):
        await harness.behaviour.started["b"].wait()
    async with asyncio.timeout(5):  # b never ends on its own: only a cancelled step lets stop return
        await consumer.stop(grace=30)
        await loop

    assert harness.behaviour.runs["c"] == 0, "nothing after the cancelled step"
    record = await harness.runs.get("order-10")
    assert record is not None and record.status is RunStatus.PENDING and record.owner is None
    other = await harness.queue.take("worker-2")
    assert other is not None and other.thread_id == "order-10", "re-enqueued: another consumer can take it at once"
    assert (await harness.state("order-10")).next == ("b",), "a's checkpoint is kept; b runs again on the next owner"


async def test_stop_during_a_backoff_hands_the_run_back_at_once(harness: Harness) -> None:
    harness.behaviour.fail.add("b")
    await harness.orphan("order-12")
    consumer = harness.consumer(real_sleep=True, backoff=RetryConfig(base_delay=30.0, max_delay=30.0, jitter=False))
    loop = asyncio.create_task(consumer.run())
    for _ in range(200):
        record = await harness.runs.get("order-12")
        if (
            harness.behaviour.runs["b"] == 1
            and record is not None
            and record.owner == "worker-1"
            and record.last_error == "RuntimeError: b is broken"
        ):
            break  # attempt 1 failed (recorded) and the consumer holds the run again for its 30 s backoff
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("attempt 1 never failed")

    async with asyncio.timeout(5):  # far less than the backoff: stop does not wait it out
        await consumer.stop(grace=10)
        await loop

    record = await harness.runs.get("order-12")
    assert record is not None and record.status is RunStatus.PENDING and record.owner is None
    assert record.attempts == 1 and record.last_error == "RuntimeError: b is broken"
    assert harness.behaviour.runs["b"] == 1, "no attempt after the stop"
    other = await harness.queue.take("worker-2")
    assert other is not None and other.thread_id == "order-12", "another consumer can take it at once"
