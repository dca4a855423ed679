"""Every class that takes a Redis client works with both kinds: ``create_redis`` (``decode_responses=True``, str
replies) and a client made the default way (``Redis.from_url(url)``, bytes replies); and ``RedisScript``, the one
way scripts are run, loads a script the server does not know."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from redis.asyncio import Redis

from graph import idempotent_node
from infra.bookings import BookingStore
from infra.redis import RedisScript, key, text
from providers.idempotency import IdempotencyKeyReusedError, IdempotentScript
from recovery import AckOutcome, DeadLetterQueue, EnqueueOutcome, OrphanScanner, QueueConfig, QueueGuard, RecoveryQueue
from runs import LeaseLostError, RunFinalError, RunStatus, RunStore

REQUEST = {"city": "Lisbon", "checkin": "2027-03-01", "checkout": "2027-03-03", "guests": 2, "hotel_id": None}


@pytest.fixture(params=[True, False], ids=["str-replies", "bytes-replies"])
async def client(request: pytest.FixtureRequest, redis: Redis, redis_url: str) -> AsyncIterator[Redis]:
    """A client with or without ``decode_responses``; ``redis`` (str replies) deletes the test's keys afterwards."""
    made = Redis.from_url(redis_url, decode_responses=request.param)
    try:
        yield made
    finally:
        await made.aclose()


async def test_run_store_and_its_leases(client: Redis) -> None:
    store = RunStore(client, ttl=0.2)

    lease = await store.create("b-1", "booking", {"hotel": "h1"}, "agent-a")
    assert lease is not None and lease.fence == 1
    record = await store.get("b-1")
    assert record is not None
    assert (record.thread_id, record.graph, record.input, record.owner) == (
        "b-1",
        "booking",
        {"hotel": "h1"},
        "agent-a",
    )
    assert (record.status, record.attempts, record.fence, record.last_error) == (RunStatus.RUNNING, 0, 1, None)
    assert [run.thread_id for run in await store.active_runs()] == ["b-1"]

    await lease.ensure_owned()
    assert await lease.renew()
    assert await lease.increment_attempts() == 1
    await lease.set_status(RunStatus.RUNNING, error="first try failed")
    record = await store.get("b-1")
    assert record is not None and record.last_error == "first try failed"

    await asyncio.sleep(0.3)  # the lease runs out; another owner takes over
    taken = await store.acquire("b-1", "agent-b")
    assert taken is not None and taken.fence == 2
    with pytest.raises(LeaseLostError, match="taken over with fence 2"):
        await lease.ensure_owned()
    with pytest.raises(LeaseLostError, match="current fence is 2"):
        await store.set_status("b-1", RunStatus.RUNNING, fence=1)

    await taken.finish(RunStatus.DONE)
    with pytest.raises(RunFinalError) as final:
        await store.set_status("b-1", RunStatus.RUNNING)
    assert final.value.status == "done"
    assert await store.active_runs() == []

    released = await store.create("b-2", "booking", {}, "agent-a")
    assert released is not None
    assert await released.release()
    record = await store.get("b-2")
    assert record is not None and record.status is RunStatus.PENDING and record.owner is None


async def test_queue_guard_recovery_queue_and_dead_letter_queue(client: Redis) -> None:
    dlq = DeadLetterQueue(client, config=QueueConfig(max_size=2, visibility_timeout_s=5, max_deliveries=3))
    guard, queue = QueueGuard(client, dlq), RecoveryQueue(client, dlq)

    assert (await guard.enqueue("r-1")).outcome is EnqueueOutcome.QUEUED
    assert (await guard.enqueue("r-1")).outcome is EnqueueOutcome.DUPLICATE
    assert await guard.safe_enqueue("r-2")
    full = await guard.enqueue("r-3")
    assert (full.outcome, full.depth) == (EnqueueOutcome.DEAD_LETTERED, 2)
    assert (await guard.enqueue("r-3")).outcome is EnqueueOutcome.IN_DLQ

    delivery = await queue.take("consumer-a")
    assert delivery is not None
    assert (delivery.thread_id, delivery.attempts) == ("r-1", 1)
    assert await queue.extend(delivery)
    assert await queue.nack(delivery)
    retaken = await queue.take("consumer-a")
    assert retaken is not None and (retaken.thread_id, retaken.attempts) == ("r-1", 2)
    assert await queue.ack(retaken, AckOutcome.RECOVERED)
    assert not await queue.ack(delivery)  # superseded

    second = await queue.take("consumer-b")
    assert second is not None and second.thread_id == "r-2"
    assert await queue.dead_letter(second, "max_attempts", "gave up")

    stats = await queue.stats()
    assert (stats["depth"], stats["in_flight"], stats["dlq_depth"]) == (0, 0, 2)
    assert (stats["enqueued_total"], stats["recovered_total"], stats["dead_lettered_total"]) == (2, 1, 2)

    assert {entry.thread_id for entry in await dlq.list()} == {"r-2", "r-3"}
    entry = await dlq.get("r-2")
    assert entry is not None and (entry.reason, entry.error, entry.attempts) == ("max_attempts", "gave up", 1)
    assert await dlq.depth() == 2
    assert await dlq.requeue("r-3")
    assert not await dlq.requeue("r-3")
    assert await dlq.requeue_all() == 1
    assert await dlq.depth() == 0
    await dlq.send_to_dlq("r-9", "manual", "operator said so")
    assert await dlq.purge() == 1


async def test_orphan_scanner(client: Redis) -> None:
    store, long_leases = RunStore(client, ttl=0.1), RunStore(client, ttl=30)
    guard = QueueGuard(client, DeadLetterQueue(client, config=QueueConfig(max_size=10)))
    scanner = OrphanScanner(client, store, guard, interval=1)
    assert await store.create("orphan-1", "booking", {}, "dead-agent") is not None
    assert await long_leases.create("live-1", "booking", {}, "live-agent") is not None

    await asyncio.sleep(0.2)

    assert await scanner.scan_once() == ["orphan-1"]
    assert await scanner.scan_once() == []
    results = await guard.enqueue_orphans(["orphan-1", "live-1"])
    assert [(r.thread_id, r.outcome) for r in results] == [
        ("orphan-1", EnqueueOutcome.NOT_ORPHAN),
        ("live-1", EnqueueOutcome.NOT_ORPHAN),
    ]
    delivery = await RecoveryQueue(client, guard.dlq).take("consumer")
    assert delivery is not None and delivery.thread_id == "orphan-1"


async def test_booking_store(client: Redis) -> None:
    store = BookingStore(client)

    assert await store.create("b-1", REQUEST)
    assert not await store.create("b-1", REQUEST)
    view = await store.get("b-1")
    assert view is not None
    assert (view["booking_id"], view["status"], view["city"], view["guests"]) == ("b-1", "pending", "Lisbon", 2)
    assert view["hotel_id"] is None and view["created_at"].endswith("Z")
    assert await store.status("b-1") == "pending"
    assert await store.status("missing") is None
    assert await store.in_flight() == 1

    store.report("b-1", "reserving")
    await store.flush("b-1")
    assert await store.status("b-1") == "reserving"

    async def finish_soon() -> None:
        await asyncio.sleep(0.05)
        assert await store.update("b-1", status="confirmed", hotel_name="Ritz", total_price={"amount": 10})

    finisher = asyncio.create_task(finish_soon())
    final = await store.wait_final("b-1", 5)
    await finisher
    assert final is not None
    assert (final["status"], final["hotel_name"], final["total_price"]) == ("confirmed", "Ritz", {"amount": 10})
    assert final == await store.get("b-1")
    assert not await store.update("b-1", status="failed")
    assert await store.in_flight() == 0

    assert await store.claim_client_key("ck-1", "hash-a", "b-1") == ("b-1", True)
    assert await store.claim_client_key("ck-1", "hash-a", "b-2") == ("b-1", True)
    assert await store.claim_client_key("ck-1", "hash-b", "b-3") == ("b-1", False)


async def test_idempotent_node(client: Redis) -> None:
    calls = 0

    @idempotent_node(client, "reserve", key_fields=["booking_id"])
    async def reserve(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {"reservation_id": f"r-{calls}"}

    config: RunnableConfig = {"configurable": {"thread_id": "t-1"}}
    first = await reserve({"booking_id": "b-1"}, config)
    assert first == await reserve({"booking_id": "b-1"}, config) == {"reservation_id": "r-1"}
    assert calls == 1


async def test_provider_idempotent_script(client: Redis, key_prefix: str) -> None:
    script = IdempotentScript("""
redis.call('INCR', KEYS[2])
return finish(201, ARGV[3])
""")
    record, counter = key("idem-test", "k", prefix=key_prefix), key("idem-test", "n", prefix=key_prefix)

    done = await script.run(client, record_key=record, request_fingerprint="fp", keys=[counter], args=['{"ok":1}'])
    replay = await script.run(client, record_key=record, request_fingerprint="fp", keys=[counter], args=["{}"])
    assert (done.kind, done.status, done.body) == ("done", 201, '{"ok":1}')
    assert (replay.kind, replay.status, replay.body) == ("replay", 201, '{"ok":1}')
    assert text(await client.get(counter)) == "1"
    with pytest.raises(IdempotencyKeyReusedError):
        await script.run(client, record_key=record, request_fingerprint="other", keys=[counter])


async def test_a_script_the_server_does_not_know_is_loaded_and_run(client: Redis) -> None:
    # a body no server has seen yet (the comment makes it unique), so the first EVALSHA fails with NOSCRIPT
    script = RedisScript(f"-- {uuid.uuid4().hex}\nreturn {{KEYS[1], ARGV[1]}}\n")
    assert await client.script_exists(script.sha) == [False]

    assert [text(v) for v in await script(client, keys=["k"], args=["v"])] == ["k", "v"]
    assert await client.script_exists(script.sha) == [True]  # the SHA we run by is the server's
    assert [text(v) for v in await script(client, keys=["k"], args=["w"])] == ["k", "w"]
