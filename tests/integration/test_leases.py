"""Run records and fenced leases against a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import pytest

from infra.redis import create_redis
from runs import LeaseLostError, RunFinalError, RunLease, RunNotFoundError, RunStatus, RunStore


async def _acquire_within(store: RunStore, thread_id: str, owner: str, seconds: float) -> RunLease | None:
    """Poll until the lease can be taken (it has to expire first); generous bound, not a timing assertion."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        lease = await store.acquire(thread_id, owner)
        if lease is not None:
            return lease
        await asyncio.sleep(0.02)
    return None


async def test_create_records_the_run_and_takes_the_lease_in_one_step(redis):
    store = RunStore(redis, ttl=5)

    lease = await store.create("b-1", "booking", {"hotel": "h1", "nights": 2}, "agent-a")

    assert lease is not None
    assert (lease.thread_id, lease.owner, lease.fence) == ("b-1", "agent-a", 1)
    record = await store.get("b-1")
    assert record is not None
    assert record.graph == "booking"
    assert record.input == {"hotel": "h1", "nights": 2}
    assert record.owner == "agent-a"
    assert record.status is RunStatus.RUNNING
    assert (record.attempts, record.fence, record.last_error) == (0, 1, None)
    assert record.lease_expires_at is not None
    assert record.lease_expires_at - record.created_at == pytest.approx(5, abs=0.01)
    # the lease is live from the first moment: nobody else can take it
    assert await store.acquire("b-1", "agent-b") is None
    await lease.ensure_owned()
    assert [run.thread_id for run in await store.active_runs()] == ["b-1"]


async def test_creating_an_existing_run_changes_nothing_and_returns_none(redis):
    store = RunStore(redis, ttl=5)
    assert await store.create("b-1", "booking", {"n": 1}, "agent-a") is not None

    assert await store.create("b-1", "booking", {"n": 2}, "agent-b") is None

    record = await store.get("b-1")
    assert record is not None
    assert (record.input, record.owner, record.fence) == ({"n": 1}, "agent-a", 1)


async def test_concurrent_creates_of_one_thread_yield_exactly_one_lease(redis, redis_url):
    clients = [create_redis(redis_url) for _ in range(8)]
    try:
        stores = [RunStore(client, ttl=5) for client in clients]
        leases = await asyncio.gather(*(s.create("b-1", "booking", {}, f"agent-{i}") for i, s in enumerate(stores)))
    finally:
        for client in clients:
            await client.aclose()

    winners = [lease for lease in leases if lease is not None]
    assert len(winners) == 1
    record = await RunStore(redis).get("b-1")
    assert record is not None and record.owner == winners[0].owner


async def test_heartbeat_keeps_the_lease_alive_well_past_its_ttl(redis):
    store = RunStore(redis, ttl=0.3)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None

    async with lease.keep_alive(interval=0.1):
        await asyncio.sleep(1.0)
        await lease.ensure_owned()
        assert await store.acquire("b-1", "agent-b") is None

    assert not lease.lost
    record = await store.get("b-1")
    assert record is not None and record.fence == 1


async def test_a_stopped_heartbeat_lets_the_lease_expire_and_a_new_owner_takes_it_with_a_higher_fence(redis):
    store = RunStore(redis, ttl=0.3)
    old = await store.create("b-1", "booking", {}, "agent-a")
    assert old is not None
    async with old.keep_alive(interval=0.1):
        await asyncio.sleep(0.2)
    # the heartbeat is gone (as if the process froze or died): the lease runs out and is taken

    new = await _acquire_within(store, "b-1", "agent-b", seconds=3)

    assert new is not None
    assert new.fence == old.fence + 1
    with pytest.raises(LeaseLostError):
        await old.ensure_owned()
    assert await old.renew() is False
    with pytest.raises(LeaseLostError):
        await old.set_status(RunStatus.FAILED, error="late write")
    with pytest.raises(LeaseLostError):
        await store.set_status("b-1", RunStatus.DONE, fence=old.fence)
    with pytest.raises(LeaseLostError):
        await store.increment_attempts("b-1", fence=old.fence)
    record = await store.get("b-1")
    assert record is not None
    assert (record.owner, record.fence, record.status, record.last_error) == ("agent-b", 2, RunStatus.RUNNING, None)
    await new.ensure_owned()
    assert await new.renew() is True


async def test_the_heartbeat_notices_a_lost_lease_and_ensure_owned_then_fails_fast(redis, caplog):
    store = RunStore(redis, ttl=0.2)
    old = await store.create("b-1", "booking", {}, "agent-a")
    assert old is not None
    new = await _acquire_within(store, "b-1", "agent-b", seconds=3)
    assert new is not None

    with caplog.at_level(logging.WARNING, logger="runs.leases"):
        async with old.keep_alive(interval=0.05):
            for _ in range(150):  # up to ~3 s; the first renewal already fails
                if old.lost:
                    break
                await asyncio.sleep(0.02)

    assert old.lost
    assert any("is lost" in r.getMessage() for r in caplog.records)
    with pytest.raises(LeaseLostError):
        await old.ensure_owned()
    record = await store.get("b-1")
    assert record is not None and record.owner == "agent-b"


async def test_an_expired_lease_nobody_took_is_still_owned_and_renewable(redis):
    store = RunStore(redis, ttl=0.1)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None
    await asyncio.sleep(0.3)

    await lease.ensure_owned()
    assert await lease.renew() is True
    assert await store.acquire("b-1", "agent-b") is None


async def test_release_makes_the_run_acquirable_at_once(redis):
    store = RunStore(redis, ttl=30)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None

    assert await lease.release() is True

    record = await store.get("b-1")
    assert record is not None
    assert (record.status, record.owner) == (RunStatus.PENDING, None)
    new = await store.acquire("b-1", "agent-b")
    assert new is not None and new.fence == 2
    with pytest.raises(LeaseLostError):
        await lease.ensure_owned()
    # release is owner-checked: the old holder cannot free the new owner's lease
    assert await lease.release() is False
    assert await RunLease(store, "b-1", "agent-a", 2).release() is False
    await new.ensure_owned()


async def test_a_final_status_ends_the_lease_and_removes_the_run_from_the_index(redis):
    store = RunStore(redis, ttl=30, retention_s=3600)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    other = await store.create("b-2", "booking", {}, "agent-a")
    assert lease is not None and other is not None

    await lease.finish(RunStatus.DONE)

    record = await store.get("b-1")
    assert record is not None
    assert (record.status, record.owner, record.lease_expires_at) == (RunStatus.DONE, None, None)
    assert [run.thread_id for run in await store.active_runs()] == ["b-2"]
    assert await store.acquire("b-1", "agent-b") is None
    assert lease.lost
    with pytest.raises(LeaseLostError):
        await lease.ensure_owned()
    # final is final: another status is refused, repeating the same one is harmless
    with pytest.raises(RunFinalError):
        await store.set_status("b-1", RunStatus.RUNNING)
    with pytest.raises(RunFinalError):
        await store.finish("b-1", RunStatus.FAILED, fence=1)
    await store.finish("b-1", RunStatus.DONE, fence=1)
    # finished records do not pile up forever
    assert 0 < await redis.ttl(store.run_key("b-1")) <= 3600


async def test_a_dead_lettered_run_is_kept_without_expiry(redis):
    store = RunStore(redis, ttl=30, retention_s=3600)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None

    await store.set_status("b-1", RunStatus.DEAD_LETTERED, error="gave up", fence=lease.fence)

    record = await store.get("b-1")
    assert record is not None
    assert (record.status, record.last_error) == (RunStatus.DEAD_LETTERED, "gave up")
    assert await redis.ttl(store.run_key("b-1")) == -1
    assert await store.active_runs() == []


async def test_status_and_attempt_writes(redis):
    store = RunStore(redis, ttl=30)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None

    await lease.set_status(RunStatus.PENDING, error="hotel-api timed out")
    assert await lease.increment_attempts() == 1
    assert await store.increment_attempts("b-1") == 2

    record = await store.get("b-1")
    assert record is not None
    assert (record.status, record.last_error, record.attempts) == (RunStatus.PENDING, "hotel-api timed out", 2)
    assert record.updated_at >= record.created_at
    with pytest.raises(ValueError):
        await store.finish("b-1", RunStatus.RUNNING, fence=1)
    with pytest.raises(RunNotFoundError):
        await store.set_status("missing", RunStatus.DONE)
    with pytest.raises(RunNotFoundError):
        await store.increment_attempts("missing")
    assert await store.get("missing") is None
    assert await store.acquire("missing", "agent-a") is None


async def test_concurrent_acquires_of_an_expired_lease_have_exactly_one_winner(redis, redis_url):
    store = RunStore(redis, ttl=0.1)
    assert await store.create("b-1", "booking", {}, "agent-a") is not None
    await asyncio.sleep(0.3)
    clients = [create_redis(redis_url) for _ in range(8)]
    try:
        stores = [RunStore(client, ttl=5) for client in clients]
        leases = await asyncio.gather(*(s.acquire("b-1", f"consumer-{i}") for i, s in enumerate(stores)))
    finally:
        for client in clients:
            await client.aclose()

    winners = [lease for lease in leases if lease is not None]
    assert len(winners) == 1
    assert winners[0].fence == 2


async def test_the_index_follows_the_lease_expiry(redis):
    store = RunStore(redis, ttl=2)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None
    [before] = await store.active_runs()
    await asyncio.sleep(0.1)

    assert await lease.renew()

    [after] = await store.active_runs()
    assert before.lease_expires_at is not None and after.lease_expires_at is not None
    assert after.lease_expires_at > before.lease_expires_at
    record = await store.get("b-1")
    assert record is not None and record.lease_expires_at == after.lease_expires_at


class _Proxy:
    """A TCP relay in front of Redis that can be cut and restored, to break the heartbeat's connection for real."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.broken = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        self.broken = True
        for writer in list(self._writers):
            writer.close()

    def restore(self) -> None:
        self.broken = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.broken:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.update({writer, up_writer})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers.difference_update({writer, up_writer})


@pytest.fixture
async def flaky_redis(redis, redis_url) -> AsyncIterator[tuple[object, _Proxy]]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    proxy = _Proxy(port)
    proxy_port = await proxy.start()
    client = create_redis(f"redis://127.0.0.1:{proxy_port}/0", socket_timeout=0.2, socket_connect_timeout=0.2)
    try:
        yield client, proxy
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
        await proxy.close()


async def test_the_heartbeat_survives_redis_errors_and_renews_once_redis_is_back(redis, flaky_redis, caplog):
    client, proxy = flaky_redis
    store = RunStore(client, ttl=1.5)
    lease = await store.create("b-1", "booking", {}, "agent-a")
    assert lease is not None

    with caplog.at_level(logging.WARNING, logger="runs.leases"):
        async with lease.keep_alive(interval=0.1):
            proxy.cut()
            await asyncio.sleep(0.6)
            assert not lease.lost
            proxy.restore()
            # well past the original TTL: only renewals after the outage can have kept it
            await asyncio.sleep(1.5)
            assert not lease.lost
            await lease.ensure_owned()

    assert any("renewal" in r.getMessage() and "retrying" in r.getMessage() for r in caplog.records)
    assert await RunStore(redis).acquire("b-1", "agent-b") is None
