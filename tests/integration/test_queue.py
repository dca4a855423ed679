"""The recovery queue, its guard and the DLQ against a real Redis."""

from __future__ import annotations

import asyncio
import logging

import pytest

from infra.redis import create_redis
from recovery import AckOutcome, DeadLetterQueue, EnqueueOutcome, QueueConfig, QueueGuard, RecoveryQueue
from runs import RunStatus, RunStore


def make(redis, **config: object) -> tuple[DeadLetterQueue, QueueGuard, RecoveryQueue]:
    dlq = DeadLetterQueue(redis, config=QueueConfig(**config))  # type: ignore[arg-type]
    return dlq, QueueGuard(redis, dlq), RecoveryQueue(redis, dlq)


async def waiting(redis, guard: QueueGuard) -> list[str]:
    return await redis.lrange(guard.keys.queue, 0, -1)


async def test_the_defaults_come_from_the_settings(settings_env, redis):
    settings_env.setenv("RECOVERY_QUEUE_MAX_SIZE", "7")
    settings_env.setenv("RECOVERY_QUEUE_WARN_THRESHOLD", "0.5")
    settings_env.setenv("RECOVERY_VISIBILITY_TIMEOUT", "12")
    settings_env.setenv("RECOVERY_MAX_ATTEMPTS", "4")
    from infra.settings import get_settings

    get_settings.cache_clear()
    dlq = DeadLetterQueue(redis)
    guard = QueueGuard(redis, dlq, max_size=3)

    assert dlq.config == QueueConfig(max_size=7, warn_threshold=0.5, visibility_timeout_s=12, max_deliveries=4)
    assert guard.config.max_size == 3 and guard.config.warn_threshold == 0.5
    assert RecoveryQueue(redis, dlq, visibility_timeout=1).config.visibility_timeout_s == 1


async def test_concurrent_producers_never_push_the_queue_past_its_cap_and_lose_nothing(redis, redis_url):
    cap, producers, per_producer = 100, 8, 250
    clients = [create_redis(redis_url) for _ in range(producers)]
    sampler_client = create_redis(redis_url)
    dlq, guard, queue = make(redis, max_size=cap)
    samples: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            samples.append(await sampler_client.llen(guard.keys.queue))
            await asyncio.sleep(0)

    async def produce(i: int, client) -> list[int]:
        producer = QueueGuard(client, DeadLetterQueue(client, config=QueueConfig(max_size=cap)))
        depths = []
        for n in range(per_producer):
            depths.append((await producer.enqueue(f"run-{i}-{n}")).depth)
        return depths

    sampler = asyncio.create_task(sample())
    try:
        depths = await asyncio.gather(*(produce(i, c) for i, c in enumerate(clients)))
    finally:
        stop.set()
        await sampler
        for client in [*clients, sampler_client]:
            await client.aclose()

    assert len(samples) > 10
    assert max(samples) <= cap
    assert max(max(d) for d in depths) <= cap
    queued = await waiting(redis, guard)
    dead = [entry.thread_id for entry in await dlq.list()]
    everything = {f"run-{i}-{n}" for i in range(producers) for n in range(per_producer)}
    assert len(queued) == cap
    assert len(queued) + len(dead) == len(everything)
    assert set(queued) | set(dead) == everything
    assert not set(queued) & set(dead)
    assert all(entry.reason == "queue_full" and entry.count == 1 for entry in await dlq.list())
    stats = await queue.stats()
    assert (stats["depth"], stats["dlq_depth"]) == (cap, len(everything) - cap)
    assert (stats["enqueued_total"], stats["dead_lettered_total"]) == (cap, len(everything) - cap)


async def test_a_full_queue_sends_the_id_to_the_dlq_and_says_so(redis, caplog):
    dlq, guard, _ = make(redis, max_size=2)
    assert await guard.safe_enqueue("a") and await guard.safe_enqueue("b")

    with caplog.at_level(logging.ERROR, logger="recovery.queue"):
        assert await guard.safe_enqueue("c") is False

    assert await waiting(redis, guard) == ["a", "b"]
    [entry] = await dlq.list()
    assert (entry.thread_id, entry.reason, entry.attempts, entry.count) == ("c", "queue_full", 0, 1)
    assert "2" in entry.error
    assert any("sent to the DLQ" in r.getMessage() for r in caplog.records)
    # parked in the DLQ: a later enqueue leaves it there for an operator to requeue
    await redis.lpop(guard.keys.queue)
    assert (await guard.enqueue("c")).outcome is EnqueueOutcome.IN_DLQ
    assert await waiting(redis, guard) == ["b"]


async def test_a_warning_is_logged_from_the_threshold_on(redis, caplog):
    _, guard, _ = make(redis, max_size=10, warn_threshold=0.7)

    with caplog.at_level(logging.WARNING, logger="recovery.queue"):
        for n in range(6):
            await guard.safe_enqueue(f"run-{n}")
        assert not caplog.records
        await guard.safe_enqueue("run-6")

    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "70%" in record.getMessage() and "7/10" in record.getMessage()


async def test_enqueueing_an_id_already_queued_or_in_flight_does_not_duplicate_it(redis):
    _, guard, queue = make(redis, max_size=10)

    assert (await guard.enqueue("a")).outcome is EnqueueOutcome.QUEUED
    assert (await guard.enqueue("a")).outcome is EnqueueOutcome.DUPLICATE
    assert await guard.safe_enqueue("a") is True
    assert await waiting(redis, guard) == ["a"]

    delivery = await queue.take("c1")
    assert delivery is not None
    assert await guard.safe_enqueue("a") is True
    assert await waiting(redis, guard) == []
    assert await queue.take("c2") is None

    assert await queue.ack(delivery)
    assert (await guard.enqueue("a")).outcome is EnqueueOutcome.QUEUED


async def test_an_unacked_delivery_is_delivered_again_after_the_visibility_timeout(redis):
    _, guard, queue = make(redis, visibility_timeout_s=0.3)
    await guard.safe_enqueue("a")

    first = await queue.take("c1")
    assert first is not None and (first.thread_id, first.attempts) == ("a", 1)
    assert first.deadline - first.taken_at == pytest.approx(0.3, abs=0.002)
    assert await queue.take("c2") is None  # invisible while c1 may still be working

    second = await queue.take("c2", wait=3)  # c1 "died": no ack

    assert second is not None
    assert (second.thread_id, second.attempts, second.consumer_id) == ("a", 2, "c2")
    assert second.enqueued_at == first.enqueued_at
    # c1's late ack must not remove c2's delivery
    assert await queue.ack(first) is False
    assert await queue.ack(second) is True
    stats = await queue.stats()
    assert (stats["redelivered_total"], stats["recovered_total"], stats["in_flight"]) == (1, 1, 0)


async def test_an_ack_removes_the_id_for_good(redis):
    _, guard, queue = make(redis, visibility_timeout_s=0.1)
    await guard.safe_enqueue("a")
    delivery = await queue.take("c1")
    assert delivery is not None

    assert await queue.ack(delivery, AckOutcome.SKIPPED) is True
    await asyncio.sleep(0.3)

    assert await queue.take("c1") is None
    assert await queue.ack(delivery) is False
    stats = await queue.stats()
    assert (stats["depth"], stats["in_flight"], stats["recovered_total"], stats["skipped_total"]) == (0, 0, 0, 1)


async def test_nack_returns_the_id_after_its_delay(redis):
    _, guard, queue = make(redis, visibility_timeout_s=30)
    await guard.safe_enqueue("a")
    first = await queue.take("c1")
    assert first is not None

    assert await queue.nack(first, delay=0.3) is True

    assert await queue.take("c1") is None
    again = await queue.take("c1", wait=3)
    assert again is not None and again.attempts == 2
    assert await queue.nack(first) is False  # superseded
    assert await queue.release(again) is True  # delay 0: back at once
    third = await queue.take("c2")
    assert third is not None and third.attempts == 3


async def test_extend_keeps_a_long_running_delivery_invisible(redis):
    _, guard, queue = make(redis, visibility_timeout_s=0.2)
    await guard.safe_enqueue("a")
    delivery = await queue.take("c1")
    assert delivery is not None

    for _ in range(4):
        await asyncio.sleep(0.1)
        assert await queue.extend(delivery) is True

    assert await queue.take("c2") is None
    assert await queue.ack(delivery) is True


async def test_an_id_delivered_max_deliveries_times_without_an_ack_goes_to_the_dlq(redis):
    dlq, guard, queue = make(redis, visibility_timeout_s=0.05, max_deliveries=2)
    await guard.safe_enqueue("poison")
    for attempt in (1, 2):
        delivery = await queue.take(f"c{attempt}", wait=3)
        assert delivery is not None and delivery.attempts == attempt
    await asyncio.sleep(0.15)

    assert await queue.take("c3") is None

    [entry] = await dlq.list()
    assert (entry.thread_id, entry.reason, entry.attempts) == ("poison", "max_deliveries", 2)
    stats = await queue.stats()
    assert (stats["in_flight"], stats["dlq_depth"], stats["dead_lettered_total"]) == (0, 1, 1)


async def test_take_waits_by_polling_and_returns_as_soon_as_an_id_arrives(redis):
    _, guard, queue = make(redis)

    # gave up instead of waiting forever (the wait_for only guards against a hang)
    assert await asyncio.wait_for(queue.take("c1", wait=0.2, poll_interval=0.02), 60) is None

    async def later() -> None:
        await asyncio.sleep(0.2)
        await guard.safe_enqueue("a")

    producer = asyncio.create_task(later())
    # an hour's wait: one that sat it out rather than returning with the id would fail the 60 s hang guard
    delivery = await asyncio.wait_for(queue.take("c1", wait=3600, poll_interval=0.02), 60)
    await producer

    assert delivery is not None and delivery.thread_id == "a"


async def test_a_consumer_can_dead_letter_its_delivery_atomically(redis):
    dlq, guard, queue = make(redis)
    await guard.safe_enqueue("a")
    delivery = await queue.take("c1")
    assert delivery is not None

    assert await queue.dead_letter(delivery, "max_attempts", "3 recovery attempts failed") is True

    [entry] = await dlq.list()
    assert (entry.reason, entry.error, entry.attempts) == ("max_attempts", "3 recovery attempts failed", 1)
    assert (await queue.stats())["in_flight"] == 0
    assert await queue.ack(delivery) is False


async def test_dead_lettering_twice_updates_the_entry_and_keeps_the_first_timestamp(redis):
    dlq, guard, _ = make(redis)
    await guard.safe_enqueue("a")

    await dlq.send_to_dlq("a", "recovery_failed", "boom", attempts=1)
    await asyncio.sleep(0.02)
    await dlq.send_to_dlq("a", "max_attempts", "boom again", attempts=3)

    [entry] = await dlq.list()
    assert (entry.thread_id, entry.reason, entry.error, entry.attempts, entry.count) == (
        "a",
        "max_attempts",
        "boom again",
        3,
        2,
    )
    assert entry.last_at > entry.first_at
    # it left the queue: an id lives in exactly one place
    assert await waiting(redis, guard) == []
    assert await dlq.depth() == 1
    assert await dlq.get("a") == entry
    assert await dlq.get("b") is None


async def test_requeue_moves_an_entry_back_within_the_cap(redis):
    dlq, guard, queue = make(redis, max_size=2)
    for thread_id in ("x", "y", "z"):
        await dlq.send_to_dlq(thread_id, "recovery_failed", f"error {thread_id}", attempts=2)
        await asyncio.sleep(0.002)

    assert await dlq.requeue("x") is True
    assert await dlq.requeue("x") is False  # no longer in the DLQ
    assert await dlq.requeue("unknown") is False
    assert await waiting(redis, guard) == ["x"]

    assert await dlq.requeue_all() == 1  # room for one more; oldest first
    assert await waiting(redis, guard) == ["x", "y"]
    [left] = await dlq.list()
    assert (left.thread_id, left.reason, left.error, left.attempts, left.count) == (
        "z",
        "recovery_failed",
        "error z",
        2,
        1,
    )
    assert await dlq.requeue("z") is False  # full: stays in the DLQ, unchanged
    assert await dlq.list() == [left]

    delivery = await queue.take("c1")
    assert delivery is not None and delivery.attempts == 1  # a requeued id starts a fresh delivery count
    await queue.ack(delivery)
    assert await dlq.requeue_all() == 1
    assert await dlq.depth() == 0


async def test_purge_empties_the_dlq(redis):
    dlq, _, _ = make(redis)
    for thread_id in ("x", "y", "z"):
        await dlq.send_to_dlq(thread_id, "queue_full", "full")

    assert await dlq.purge() == 3

    assert await dlq.list() == []
    assert await dlq.depth() == 0
    assert await dlq.purge() == 0


async def test_requeue_revives_a_dead_lettered_run(redis):
    dlq, _, queue = make(redis)
    store = RunStore(redis, ttl=5)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None
    await lease.increment_attempts()
    await lease.finish(RunStatus.DEAD_LETTERED, error="gave up")
    await dlq.send_to_dlq("b-1", "max_attempts", "gave up", attempts=1)
    assert await store.acquire("b-1", "consumer") is None

    assert await dlq.requeue("b-1") is True

    record = await store.get("b-1")
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.PENDING, 0)
    delivery = await queue.take("consumer")
    assert delivery is not None and delivery.thread_id == "b-1"
    recovered = await store.acquire("b-1", "consumer")
    assert recovered is not None and recovered.fence == 2


async def test_stats_report_depth_age_flight_and_shared_counters(redis, redis_url):
    dlq, guard, queue = make(redis, max_size=50)
    await guard.safe_enqueue("old")
    await asyncio.sleep(0.25)
    for thread_id in ("b", "c", "d"):
        await guard.safe_enqueue(thread_id)
    await dlq.send_to_dlq("e", "queue_full", "full")
    delivery = await queue.take("c1")
    assert delivery is not None and delivery.thread_id == "old"
    await queue.ack(delivery)
    in_flight = await queue.take("c1")
    assert in_flight is not None and in_flight.thread_id == "b"

    other_client = create_redis(redis_url)
    try:
        stats = await RecoveryQueue(
            other_client, DeadLetterQueue(other_client, config=QueueConfig(max_size=50))
        ).stats()
    finally:
        await other_client.aclose()

    assert stats["depth"] == 2
    assert stats["max_size"] == 50
    assert stats["dlq_depth"] == 1
    assert stats["in_flight"] == 1
    assert stats["recovered_total"] == 1
    assert stats["dead_lettered_total"] == 1
    assert stats["enqueued_total"] == 4
    assert 0 <= stats["oldest_age_s"] < 5  # "c" is the head now, enqueued moments ago
    assert set(stats) >= {"depth", "max_size", "dlq_depth", "oldest_age_s", "in_flight", "recovered_total"}


async def test_oldest_age_measures_the_head_of_the_waiting_list(redis):
    _, guard, queue = make(redis)
    assert (await queue.stats())["oldest_age_s"] == 0
    await guard.safe_enqueue("a")
    await asyncio.sleep(0.3)
    await guard.safe_enqueue("b")

    age = (await queue.stats())["oldest_age_s"]

    assert 0.3 <= age < 5
