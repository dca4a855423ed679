"""Per-process presence against a real Redis: the named connection, held runs, the sweep, blips, frozen owners and
a Redis restart (a private redis-server)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from infra.redis import create_redis
from recovery import DeadLetterQueue, OrphanScanner, QueueGuard
from runs import LeaseLostError, RunStatus, RunStore, RunStoreError
from runs.leases import HELD_MS, instance_runs_key
from runs.presence import Presence, PresenceMonitor
from tests.conftest import start_redis_server

GRACE = 0.3


def instance() -> str:
    return f"agent-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def presence(redis: object, redis_url: str) -> AsyncIterator[Presence]:
    p = Presence(instance(), url=redis_url, interval=0.05, ttl=2.0)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def connected_names(client: object) -> set[str]:
    return {c["name"] for c in await client.client_list(_type="normal")}  # type: ignore[attr-defined]


async def test_a_registered_process_holds_its_runs_without_renewing_them(redis, presence: Presence) -> None:
    assert presence.instance in await connected_names(redis), "the presence connection carries the instance id"
    store = RunStore(redis, ttl=0.2)
    lease = await store.create("run-1", "booking", {}, presence.instance)
    assert lease is not None and lease.held
    record = await store.get("run-1")
    assert record is not None and record.held and record.lease_expires_at is None
    assert await redis.zscore(store.index_key, "run-1") == HELD_MS
    assert await redis.smembers(instance_runs_key(presence.instance, prefix=store.prefix)) == {"run-1"}

    async with lease.keep_alive():
        await asyncio.sleep(0.5)  # over twice the run TTL: nothing renews the run, nothing expires it
    assert (await store.acquire("run-1", "thief")) is None
    await lease.ensure_owned()

    await lease.finish(RunStatus.DONE)
    assert await redis.smembers(instance_runs_key(presence.instance, prefix=store.prefix)) == set()


async def test_an_unregistered_owner_gets_a_ttl_lease_as_before(redis) -> None:
    store = RunStore(redis, ttl=0.2)
    lease = await store.create("run-2", "booking", {}, "nobody-registered-this")
    assert lease is not None and not lease.held
    record = await store.get("run-2")
    assert record is not None and not record.held and record.lease_expires_at is not None


async def test_a_closed_connection_hands_the_runs_over_after_the_grace_only(redis, redis_url: str) -> None:
    owner = Presence(instance(), url=redis_url, interval=0.05, ttl=60.0)
    await owner.start()
    store = RunStore(redis, ttl=60)
    leases = [await store.create(f"run-d{n}", "booking", {}, owner.instance) for n in range(20)]
    assert all(lease is not None and lease.held for lease in leases)
    guard = QueueGuard(redis, DeadLetterQueue(redis))
    scanner = OrphanScanner(redis, store, guard, presence=PresenceMonitor(redis, grace=GRACE, restart_grace=0))

    assert await scanner.scan_once() == [], "alive and connected: nothing to take"
    # what kill -9 does to a process's sockets: gone at once, nobody deregisters (60 s instance lease left)
    assert owner._task is not None
    owner._task.cancel()
    await owner.client.aclose()
    assert await scanner.scan_once() == [], "missing for less than the grace: a reconnect would keep everything"
    await asyncio.sleep(GRACE + 0.1)
    queued = await scanner.scan_once()
    assert sorted(queued) == sorted(f"run-d{n}" for n in range(20))

    taken = await store.acquire("run-d0", "worker-1")
    assert taken is not None and taken.fence == 2
    stale = leases[0]
    assert stale is not None
    with pytest.raises(LeaseLostError):
        await stale.ensure_owned()
    assert await scanner.scan_once() == [], "each run is handed over once"


async def test_client_kill_is_a_blip_the_process_reconnects_and_keeps_its_runs(redis, presence: Presence) -> None:
    store = RunStore(redis, ttl=60)
    lease = await store.create("run-b", "booking", {}, presence.instance)
    assert lease is not None and lease.held
    guard = QueueGuard(redis, DeadLetterQueue(redis))
    scanner = OrphanScanner(redis, store, guard, presence=PresenceMonitor(redis, grace=2.0, restart_grace=0))
    killed = await redis.execute_command("CLIENT", "KILL", "ID", await presence_id(redis, presence))
    assert killed == 1
    assert await scanner.scan_once() == []
    for _ in range(100):
        if presence.instance in await connected_names(redis):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("the presence never reconnected")
    await asyncio.sleep(0.1)
    assert await scanner.scan_once() == []
    assert not await redis.hexists(f"{store.prefix}:{{recovery}}:instances:missing", presence.instance)
    await lease.ensure_owned()


async def presence_id(redis: object, presence: Presence) -> int:
    for client in await redis.client_list(_type="normal"):  # type: ignore[attr-defined]
        if client["name"] == presence.instance:
            return int(client["id"])
    raise AssertionError(f"no connection named {presence.instance}")


async def test_a_frozen_owner_keeps_its_socket_and_loses_its_runs_when_its_instance_lease_expires(
    redis, redis_url: str
) -> None:
    owner = Presence(instance(), url=redis_url, interval=0.05, ttl=0.4)
    await owner.renew()  # registered once, then frozen: connected, never renewing
    try:
        store = RunStore(redis, ttl=60)
        lease = await store.create("run-f", "booking", {}, owner.instance)
        assert lease is not None and lease.held
        monitor = PresenceMonitor(redis, grace=GRACE, restart_grace=0)
        scanner = OrphanScanner(redis, store, QueueGuard(redis, DeadLetterQueue(redis)), presence=monitor)
        assert await scanner.scan_once() == []
        await asyncio.sleep(0.5)
        assert owner.instance in await connected_names(redis), "its connection is still open"
        assert await scanner.scan_once() == ["run-f"]
        # woken up: it registers again, but the run went to the orphan path and the next owner fences it out
        assert not await owner.renew()
        taken = await store.acquire("run-f", "worker-1")
        assert taken is not None
        with pytest.raises(LeaseLostError):
            await lease.ensure_owned()
    finally:
        await owner.client.aclose()


async def test_the_runs_of_a_deregistered_process_are_swept_at_once(redis, redis_url: str) -> None:
    owner = Presence(instance(), url=redis_url, interval=0.05, ttl=60.0)
    await owner.start()
    store = RunStore(redis, ttl=60)
    assert await store.create("run-s", "booking", {}, owner.instance) is not None
    await owner.stop()  # a graceful exit that could not hand this run back
    scanner = OrphanScanner(
        redis, store, QueueGuard(redis, DeadLetterQueue(redis)), presence=PresenceMonitor(redis, grace=60)
    )
    assert await scanner.scan_once() == ["run-s"]


async def test_a_redis_restart_declares_nobody_dead_until_everyone_had_the_grace(
    settings_env: pytest.MonkeyPatch, tmp_path: object
) -> None:
    workdir = str(tmp_path)
    server, url = start_redis_server(appendonly=True, workdir=workdir)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    client = create_redis(url)
    owner = Presence(instance(), url=url, interval=0.05, ttl=30.0)
    try:
        await owner.renew()  # registered, then never renews again: it does not reconnect after the restart
        store = RunStore(client, ttl=60)
        assert await store.create("run-r", "booking", {}, owner.instance) is not None
        monitor = PresenceMonitor(client, grace=0.2, restart_grace=1.5)
        scanner = OrphanScanner(client, store, QueueGuard(client, DeadLetterQueue(client)), presence=monitor)
        await asyncio.sleep(2.1)  # past the restart grace by INFO's uptime, which counts whole seconds
        assert (await monitor.sweep()).quiet is False
        assert await scanner.scan_once() == []

        server.kill()
        server.wait(timeout=10)
        with pytest.raises(RunStoreError):
            await monitor.sweep()
        server, _ = start_redis_server(port, appendonly=True, workdir=workdir)

        # every connection dropped, the owner's included; for the restart grace nobody is declared dead
        result = await monitor.sweep()
        assert result.quiet and result.dead == []
        await asyncio.sleep(0.5)
        assert await scanner.scan_once() == [], "the owner is still missing, but the grace after a restart holds"
        await asyncio.sleep(2.5)  # restart grace over; the owner never came back: after its own grace it is dead
        assert await scanner.scan_once() == []
        await asyncio.sleep(0.3)
        assert await scanner.scan_once() == ["run-r"]
    finally:
        await owner.client.aclose()
        await client.aclose()
        server.kill()
        server.wait(timeout=10)
