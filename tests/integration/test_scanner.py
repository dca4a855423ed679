"""The orphan scanner against a real Redis: concurrent scanners, live and final runs, hand-over epochs."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from infra.redis import create_redis
from recovery import DeadLetterQueue, EnqueueOutcome, OrphanScanner, QueueConfig, QueueGuard, RecoveryQueue
from runs import RunLease, RunStatus, RunStore
from tests.conftest import start_redis_server

TTL = 0.2


def scanner_for(client, *, max_size: int = 100, batch_size: int = 100, **kwargs: object) -> OrphanScanner:
    store = RunStore(client, ttl=TTL)
    guard = QueueGuard(client, DeadLetterQueue(client, config=QueueConfig(max_size=max_size)))
    return OrphanScanner(client, store, guard, batch_size=batch_size, **kwargs)  # type: ignore[arg-type]


async def queued(redis, scanner: OrphanScanner) -> list[str]:
    return await redis.lrange(scanner.guard.keys.queue, 0, -1)


async def orphan(store: RunStore, thread_id: str) -> None:
    """A run whose owner died right after accepting it: nobody renews the lease."""
    assert await store.create(thread_id, "booking", {"id": thread_id}, "dead-agent") is not None


def enqueue_after(barrier: asyncio.Barrier, enqueue, outcomes: list):
    """``enqueue`` whose first call waits at ``barrier``; every outcome is noted in ``outcomes``."""
    first = True

    async def enqueue_orphans(thread_ids):
        nonlocal first
        if first:
            first = False
            async with asyncio.timeout(30):
                await barrier.wait()
        results = await enqueue(thread_ids)
        outcomes.extend((result.thread_id, result.outcome) for result in results)
        return results

    return enqueue_orphans


async def test_four_concurrent_scanners_enqueue_each_orphan_exactly_once(redis, redis_url):
    store = RunStore(redis, ttl=TTL)
    orphans = {f"orphan-{n}" for n in range(50)}
    for thread_id in sorted(orphans):
        await orphan(store, thread_id)
    live: list[RunLease] = []
    for n in range(5):
        lease = await store.create(f"live-{n}", "booking", {}, "live-agent")
        assert lease is not None
        live.append(lease)
    for n in range(5):
        lease = await store.create(f"final-{n}", "booking", {}, "live-agent")
        assert lease is not None
        await lease.finish(RunStatus.DONE if n % 2 else RunStatus.FAILED)

    clients = [create_redis(redis_url) for _ in range(4)]
    scanners = [scanner_for(client, batch_size=7) for client in clients]
    # all four read the same first page before any of them enqueues it, so they compete for the same orphans
    # however the machine schedules them (one scanner alone could otherwise take every page first)
    first_page = asyncio.Barrier(len(scanners))
    outcomes: list[tuple[str, EnqueueOutcome]] = []
    for scanner in scanners:
        enqueue = enqueue_after(first_page, scanner.guard.enqueue_orphans, outcomes)
        scanner.guard.enqueue_orphans = enqueue  # type: ignore[method-assign]

    async def scan_repeatedly(scanner: OrphanScanner) -> list[str]:
        found: list[str] = []
        for _ in range(15):
            found += await scanner.scan_once()
            await asyncio.sleep(0.02)
        return found

    try:
        async with contextlib.AsyncExitStack() as stack:
            for lease in live:
                await stack.enter_async_context(lease.keep_alive(interval=TTL / 4))
            await asyncio.sleep(TTL + 0.1)  # the orphans' leases run out; the live ones are renewed
            results = await asyncio.gather(*(scan_repeatedly(s) for s in scanners))
            assert not any(lease.lost for lease in live)
    finally:
        for client in clients:
            await client.aclose()

    every_enqueue = [thread_id for found in results for thread_id in found]
    assert sorted(every_enqueue) == sorted(orphans)  # each orphan once, by exactly one scanner
    in_queue = await queued(redis, scanners[0])
    assert sorted(in_queue) == sorted(orphans)  # no live or final run, no duplicate
    # the scanners really competed: an orphan that one queued, the others were told was not theirs to queue
    contested = [thread_id for thread_id, outcome in outcomes if outcome is not EnqueueOutcome.QUEUED]
    assert len(contested) >= 3 * 7  # the first page's seven, lost by three of the four


async def test_a_recovered_run_is_an_orphan_again_only_when_its_new_owner_dies(redis):
    scanner = scanner_for(redis)
    store = scanner.store
    queue = RecoveryQueue(redis, scanner.guard.dlq)
    await orphan(store, "b-1")
    await asyncio.sleep(TTL + 0.1)
    assert await scanner.scan_once() == ["b-1"]
    assert await scanner.scan_once() == []  # handed over: the queue's dedup and the claim cover it

    delivery = await queue.take("consumer-1")
    assert delivery is not None
    lease = await store.acquire("b-1", "consumer-1")
    assert lease is not None
    await queue.ack(delivery, "skipped")
    async with lease.keep_alive(interval=TTL / 4):
        await asyncio.sleep(TTL * 2)
        assert await scanner.scan_once() == []  # a live owner: not an orphan
    # the consumer dies: its lease lapses, and the run must be recovered again
    await asyncio.sleep(TTL + 0.1)

    assert await scanner.scan_once() == ["b-1"]
    assert await scanner.scan_once() == []
    assert await queued(redis, scanner) == ["b-1"]


async def test_a_consumer_dying_right_after_acquiring_leaves_an_orphan_to_recover(redis):
    scanner = scanner_for(redis)
    store = scanner.store
    queue = RecoveryQueue(redis, scanner.guard.dlq)
    await orphan(store, "b-1")
    await asyncio.sleep(TTL + 0.1)
    assert await scanner.scan_once() == ["b-1"]
    delivery = await queue.take("consumer-1")
    assert delivery is not None
    assert await store.acquire("b-1", "consumer-1") is not None
    await queue.ack(delivery, "skipped")
    # consumer-1 dies before its first heartbeat
    await asyncio.sleep(TTL + 0.1)

    assert await scanner.scan_once() == ["b-1"]


async def test_an_orphan_is_claimed_once_per_lease_expiry_even_by_a_scanner_with_a_stale_view(redis):
    scanner = scanner_for(redis)
    queue = RecoveryQueue(redis, scanner.guard.dlq)
    await orphan(scanner.store, "b-1")
    await asyncio.sleep(TTL + 0.1)
    [first] = await scanner.guard.enqueue_orphans(["b-1"])
    assert first.outcome is EnqueueOutcome.QUEUED
    # the queued id is consumed without anyone taking the lease (a consumer that gave up on it)
    delivery = await queue.take("consumer-1")
    assert delivery is not None
    await queue.ack(delivery, "skipped")

    # a scanner that listed b-1 before the claim must not hand it over again for the same expiry
    [second] = await scanner.guard.enqueue_orphans(["b-1"])

    assert second.outcome is EnqueueOutcome.NOT_ORPHAN
    assert await queued(redis, scanner) == []


async def test_a_consumer_dying_before_its_ack_is_covered_by_the_queue_not_duplicated(redis):
    scanner = scanner_for(redis)
    store = scanner.store
    queue = RecoveryQueue(redis, scanner.guard.dlq, visibility_timeout=0.3)
    await orphan(store, "b-1")
    await asyncio.sleep(TTL + 0.1)
    assert await scanner.scan_once() == ["b-1"]
    first = await queue.take("consumer-1")
    assert first is not None
    assert await store.acquire("b-1", "consumer-1") is not None
    await asyncio.sleep(TTL + 0.1)  # consumer-1 died holding the delivery and the lease

    assert await scanner.scan_once() == []  # still in flight: not pushed a second time

    second = await queue.take("consumer-2", wait=3)
    assert second is not None and (second.thread_id, second.attempts) == ("b-1", 2)
    lease = await store.acquire("b-1", "consumer-2")
    assert lease is not None and lease.fence == 3


async def test_a_released_run_is_picked_up_by_the_next_scan_without_waiting_for_the_ttl(redis):
    scanner = scanner_for(redis)
    long_store = RunStore(redis, ttl=30)
    lease = await long_store.create("b-1", "booking", {}, "draining-agent")
    assert lease is not None
    assert await scanner.scan_once() == []

    await lease.release()

    assert await scanner.scan_once() == ["b-1"]


async def test_an_orphan_that_finds_the_queue_full_is_parked_in_the_dlq_once(redis):
    scanner = scanner_for(redis, max_size=1)
    store = scanner.store
    await orphan(store, "b-1")
    await orphan(store, "b-2")
    await asyncio.sleep(TTL + 0.1)

    assert await scanner.scan_once() == ["b-1"]
    for _ in range(3):
        assert await scanner.scan_once() == []

    dlq = scanner.guard.dlq
    [entry] = await dlq.list()
    assert (entry.thread_id, entry.reason, entry.count) == ("b-2", "queue_full", 1)
    [run] = [r for r in await store.active_runs() if r.thread_id == "b-2"]
    assert run.lease_expires_at is None  # handed over; the scanner no longer looks at it
    queue = RecoveryQueue(redis, dlq)
    delivery = await queue.take("consumer")
    assert delivery is not None
    await queue.ack(delivery, "skipped")
    assert await dlq.requeue("b-2") is True
    assert await queued(redis, scanner) == ["b-2"]
    assert await scanner.scan_once() == []


async def test_run_keeps_scanning_through_errors(redis, caplog):
    sleeps: list[float] = []
    failed_a_few_times = asyncio.Event()
    scans_wanted = asyncio.Event()

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) >= 3:
            failed_a_few_times.set()
        if len(sleeps) >= 6:
            scans_wanted.set()
        await asyncio.sleep(0.01)

    scanner = scanner_for(redis, interval=0.5, sleep=sleep)
    # a real Redis error: the index key holds the wrong type, so the range query fails
    await redis.set(scanner.store.index_key, "not a zset")

    with caplog.at_level(logging.ERROR, logger="recovery.scanner"):
        task = asyncio.create_task(scanner.run())
        try:
            await asyncio.wait_for(failed_a_few_times.wait(), timeout=5)
            await redis.delete(scanner.store.index_key)
            await orphan(scanner.store, "b-1")
            await redis.zadd(scanner.store.index_key, {"b-1": 0})  # lease long gone
            await redis.hset(scanner.store.run_key("b-1"), "lease_until", 0)
            await asyncio.wait_for(scans_wanted.wait(), timeout=5)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    assert any("orphan scan failed" in r.getMessage() for r in caplog.records)
    assert await queued(redis, scanner) == ["b-1"]
    assert all(0 <= s <= 0.5 for s in sleeps)
    assert task.cancelled()


async def test_a_redis_outage_is_one_warning_when_it_starts_and_one_when_it_ends_never_an_error(
    caplog: pytest.LogCaptureFixture, settings_env: pytest.MonkeyPatch
) -> None:
    # a private redis-server, killed under the scanner and started again on the same port
    proc, url = start_redis_server()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    client = create_redis(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    scanner = scanner_for(client, interval=0.05)
    task = asyncio.create_task(scanner.run())
    restarted = None
    try:
        with caplog.at_level(logging.INFO, logger="recovery.scanner"):
            await asyncio.sleep(0.3)
            proc.kill()
            proc.wait()
            await asyncio.sleep(1.5)  # some thirty scans meet the outage
            restarted, _ = start_redis_server(port)
            deadline = asyncio.get_running_loop().time() + 10
            while not any("resumed" in r.getMessage() for r in caplog.records):
                assert asyncio.get_running_loop().time() < deadline, "the scans never said they resumed"
                await asyncio.sleep(0.05)
    finally:
        scanner.stopping.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()
        for server in (proc, restarted):
            if server is not None:
                server.kill()
                server.wait()
    records = [r for r in caplog.records if r.name == "recovery.scanner"]
    assert not [r for r in records if r.levelno >= logging.ERROR]
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("orphan scans paused") and warnings[1].startswith("orphan scans resumed")
