"""The owner's audit of its held runs against a real Redis (``runs.audit``): a run held by a live process but no
longer worked on (its release met an outage, or its lease object was dropped) is released after two audits and
recovered through the ordinary orphan path; a run in use, or re-acquired with a new fence, is never released; and
when Redis holds no more runs than the process uses, an audit is one ``SCARD``.

Each test has its own registry of leases in use (``LeasesInUse``), standing for one process; the audits are called
directly (the presence loop's own audit is pushed an hour away), except in the last test, which leaves it to the loop.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from domain.booking import JournalKind
from infra.journal import install_writer
from infra.redis import create_redis
from recovery import DeadLetterQueue, OrphanScanner, QueueGuard
from runs import RunStatus, RunStore, RunStoreError
from runs.audit import HOLD_NOT_EXECUTING
from runs.in_use import LeasesInUse
from runs.leases import HELD_MS, instance_runs_key
from runs.presence import Presence, PresenceMonitor
from tests.conftest import start_redis_server

HOUR = 3600.0


def instance() -> str:
    return f"agent-{uuid.uuid4().hex[:8]}"


class Journal:
    """Stands for the process's journal writer: what the scanner records, in memory."""

    instance = "worker-under-test"

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, dict[str, Any]]] = []

    def record(self, booking_id: str, kind: JournalKind | str, **fields: Any) -> None:
        self.entries.append((booking_id, str(kind), fields))


@pytest.fixture
def journal() -> Any:
    mine = Journal()
    previous = install_writer(mine)  # type: ignore[arg-type]
    yield mine
    install_writer(previous)


@pytest.fixture
def in_use() -> LeasesInUse:
    return LeasesInUse()


@pytest.fixture
async def owner(redis: Any, redis_url: str, in_use: LeasesInUse) -> AsyncIterator[Presence]:
    p = Presence(instance(), url=redis_url, interval=0.05, ttl=60.0, audit_interval=HOUR, in_use=in_use)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


def scanner_for(redis: Any, store: RunStore) -> OrphanScanner:
    guard = QueueGuard(redis, DeadLetterQueue(redis))
    return OrphanScanner(redis, store, guard, presence=PresenceMonitor(redis, grace=0.3, restart_grace=0))


async def test_a_held_run_whose_lease_was_dropped_is_released_after_two_audits_and_recovered(
    redis: Any, owner: Presence, in_use: LeasesInUse, journal: Journal
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    lease = await store.create("run-dropped", "booking", {}, owner.instance)
    assert lease is not None and lease.held
    del lease  # the task that had it ended without releasing it
    gc.collect()
    scanner = scanner_for(redis, store)

    first = await owner.audit()
    assert first.listed and first.held == 1 and first.in_use == 0
    assert first.suspects == {"run-dropped": 1} and first.released == []
    record = await store.get("run-dropped")
    assert record is not None and record.held, "one sighting only records the fence"
    assert await scanner.scan_once() == [], "its owner is alive: the sweep takes nothing"

    second = await owner.audit()
    assert second.released == ["run-dropped"]
    record = await store.get("run-dropped")
    assert record is not None and not record.held and record.lease_expires_at is not None
    assert record.owner == owner.instance and record.fence == 1 and record.status is RunStatus.RUNNING
    assert record.hold_ended == HOLD_NOT_EXECUTING
    assert await redis.smembers(instance_runs_key(owner.instance, prefix=store.prefix)) == set()

    assert await scanner.scan_once() == ["run-dropped"], "the ordinary orphan path takes it from here"
    lost = [fields for booking, kind, fields in journal.entries if booking == "run-dropped" and kind == "owner_lost"]
    assert lost == [{"noticed_by": Journal.instance, "reason": HOLD_NOT_EXECUTING, "owner": owner.instance, "fence": 1}]
    taken = await store.acquire("run-dropped", "worker-1")
    assert taken is not None and taken.fence == 2
    record = await store.get("run-dropped")
    assert record is not None and record.hold_ended is None, "the next owner's acquire clears the mark"
    assert (await owner.audit()).released == []


async def test_a_run_whose_release_met_an_outage_is_released_while_its_lease_object_lives(
    redis: Any, owner: Presence, in_use: LeasesInUse, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    lease = await store.create("run-failed-release", "booking", {}, owner.instance)
    assert lease is not None and lease.held

    async def outage(_lease: object) -> bool:
        raise RunStoreError("releasing the lease: connection refused (Redis failing over)")

    monkeypatch.setattr(store, "_release_lease", outage)
    with pytest.raises(RunStoreError):
        await lease.release()
    assert not lease.lost and not lease.in_use, "a release that failed is given up, not in use"

    assert (await owner.audit()).suspects == {"run-failed-release": 1}
    assert (await owner.audit()).released == ["run-failed-release"]
    assert await scanner_for(redis, store).scan_once() == ["run-failed-release"]


async def test_runs_in_use_are_never_released_and_cost_one_scard(
    redis: Any, owner: Presence, in_use: LeasesInUse
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    kept = [await store.create(f"run-kept-{n}", "booking", {}, owner.instance) for n in range(3)]
    dropped = await store.create("run-gone", "booking", {}, owner.instance)
    assert all(lease is not None and lease.held for lease in [*kept, dropped])

    for _ in range(3):
        result = await owner.audit()
        assert not result.listed and result.held == result.in_use == 4
    del dropped
    gc.collect()
    released: list[str] = []
    for _ in range(3):
        released += (await owner.audit()).released
    assert released == ["run-gone"]
    for lease in kept:
        assert lease is not None
        await lease.ensure_owned()
        record = await store.get(lease.thread_id)
        assert record is not None and record.held and record.hold_ended is None
    assert await redis.zscore(store.index_key, "run-kept-0") == HELD_MS


async def test_a_run_being_created_or_acquired_counts_as_in_use(
    redis: Any, owner: Presence, in_use: LeasesInUse
) -> None:
    # the script has run in Redis, its reply is not back yet: no lease object exists in the process
    elsewhere = RunStore(redis, ttl=60, in_use=LeasesInUse())
    assert await elsewhere.create("run-on-its-way", "booking", {}, owner.instance) is not None
    with in_use.expecting(owner.instance, "run-on-its-way"):
        for _ in range(3):
            assert (await owner.audit()).released == []
    record = await elsewhere.get("run-on-its-way")
    assert record is not None and record.held


async def test_a_run_re_acquired_with_a_new_fence_between_two_audits_is_not_released(
    redis: Any, owner: Presence, in_use: LeasesInUse
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    first = await store.create("run-refenced", "booking", {}, owner.instance)
    assert first is not None
    first.abandon()
    assert (await owner.audit()).suspects == {"run-refenced": 1}

    # between the two audits the run changed hands and came back to this instance: another acquisition
    assert await first.release()
    second = await store.acquire("run-refenced", owner.instance)
    assert second is not None and second.held and second.fence == 2
    second.abandon()

    result = await owner.audit()
    assert result.released == [] and result.suspects == {"run-refenced": 2}, "fence 1 was seen, fence 2 is held"
    record = await store.get("run-refenced")
    assert record is not None and record.held and record.fence == 2
    assert (await owner.audit()).released == ["run-refenced"], "fence 2 missing twice: released"


async def test_a_lease_taken_up_again_after_a_failed_release_is_in_use(
    redis: Any, owner: Presence, in_use: LeasesInUse
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    lease = await store.create("run-carried-on", "booking", {}, owner.instance)
    assert lease is not None
    lease.abandon()
    assert (await owner.audit()).suspects == {"run-carried-on": 1}
    # the recovery consumer, after a failed release, records the error and carries on with the same lease
    await lease.set_status(RunStatus.RUNNING, error="RunStoreError: failing over")
    assert lease.in_use
    assert (await owner.audit()).released == []
    await lease.ensure_owned()


async def test_a_stale_member_of_the_instance_set_is_dropped_not_released(
    redis: Any, owner: Presence, in_use: LeasesInUse
) -> None:
    store = RunStore(redis, ttl=60, in_use=in_use)
    runs_key = instance_runs_key(owner.instance, prefix=store.prefix)
    await redis.sadd(runs_key, "no-such-run")
    result = await owner.audit()
    assert result.listed and result.released == [] and result.suspects == {}
    assert await redis.smembers(runs_key) == set()
    assert not (await owner.audit()).listed


async def test_the_audit_reads_the_set_only_when_redis_holds_more_than_the_process_uses(
    settings_env: pytest.MonkeyPatch,
) -> None:
    server, url = start_redis_server()  # private: its command counters are this test's alone
    client = create_redis(url)
    registry = LeasesInUse()
    # no renewal during the test either (interval 30 s): the only scripts would be the audit's
    owner = Presence(instance(), url=url, interval=30.0, ttl=60.0, audit_interval=HOUR, in_use=registry)
    try:
        await owner.start()
        store = RunStore(client, ttl=60, in_use=registry)
        leases = [await store.create(f"run-{n}", "booking", {}, owner.instance) for n in range(50)]
        assert all(lease is not None and lease.held for lease in leases)

        async def calls(command: str) -> int:
            return int((await client.info("commandstats")).get(f"cmdstat_{command}", {}).get("calls", 0))

        await client.config_resetstat()
        for _ in range(5):
            assert (await owner.audit()).released == []
        assert (await calls("scard"), await calls("smembers"), await calls("evalsha")) == (5, 0, 0)

        leases.pop()
        gc.collect()
        await owner.audit()
        assert (await calls("scard"), await calls("smembers")) == (6, 1)
    finally:
        await owner.stop()
        await client.aclose()
        server.kill()
        server.wait(timeout=10)


async def test_the_presence_loop_audits_by_itself_and_a_peer_recovers_the_run(
    redis: Any, redis_url: str, in_use: LeasesInUse
) -> None:
    owner = Presence(instance(), url=redis_url, interval=0.05, ttl=60.0, audit_interval=0.1, in_use=in_use)
    await owner.start()
    try:
        store = RunStore(redis, ttl=60, in_use=in_use)
        kept = await store.create("run-loop-kept", "booking", {}, owner.instance)
        lost = await store.create("run-loop-lost", "booking", {}, owner.instance)
        assert kept is not None and lost is not None
        lost.abandon()
        scanner = scanner_for(redis, store)
        queued: list[str] = []
        async with asyncio.timeout(10):
            while not queued:
                queued = await scanner.scan_once()
                await asyncio.sleep(0.05)
        assert queued == ["run-loop-lost"]
        await kept.ensure_owned()
        assert (await store.get("run-loop-kept")).held  # type: ignore[union-attr]
    finally:
        await owner.stop()
