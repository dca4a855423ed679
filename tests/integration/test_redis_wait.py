"""A durable write waits for a replica (``WAIT`` on the write's own connection) only when the master has one, and
never longer than ``REDIS_WAIT_TIMEOUT_MS``: real master and replica processes, the replica frozen with SIGSTOP."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from infra.redis import RedisScript, create_redis, replicas
from infra.settings import get_settings
from tests.redis_topologies import RedisProcess, SentinelTopology

SET = RedisScript("redis.call('SET', KEYS[1], ARGV[1]) return redis.call('GET', KEYS[1])")


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    with SentinelTopology(replicas=1) as redis:
        yield redis


@pytest.fixture
async def client(topology: SentinelTopology, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.setenv("REDIS_WAIT_TIMEOUT_MS", "300")
    get_settings.cache_clear()
    redis = create_redis(topology.url)
    await SET(redis, keys=["wait:warm"], args=["0"])  # the script loaded: each durable call below is one WAIT
    try:
        yield redis
    finally:
        await redis.aclose()
        get_settings.cache_clear()


def wait_calls(node: RedisProcess) -> int:
    return int(node.client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


async def test_a_durable_write_waits_for_the_replica_and_a_plain_one_does_not(
    client: Any, topology: SentinelTopology
) -> None:
    before = wait_calls(topology.master)
    assert await SET(client, keys=["wait:a"], args=["1"], durable=True) == "1"
    assert wait_calls(topology.master) == before + 1
    assert topology.replicas[0].client.get("wait:a") == "1", "the replica had it when the write returned"
    assert await SET(client, keys=["wait:b"], args=["2"]) == "2"
    assert wait_calls(topology.master) == before + 1


async def test_no_wait_when_switched_off(
    client: Any, topology: SentinelTopology, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_WAIT_REPLICAS", "0")
    get_settings.cache_clear()
    before = wait_calls(topology.master)
    assert await SET(client, keys=["wait:c"], args=["3"], durable=True) == "3"
    assert wait_calls(topology.master) == before


async def test_a_frozen_replica_costs_at_most_the_timeout(
    client: Any, topology: SentinelTopology, caplog: pytest.LogCaptureFixture
) -> None:
    assert await SET(client, keys=["wait:d"], args=["4"], durable=True) == "4"  # the replica count is known
    replica = topology.replicas[0]
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="infra.redis"):
            assert await SET(client, keys=["wait:e"], args=["5"], durable=True) == "5"
        took = time.monotonic() - started
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert took >= 0.3, took  # waited out REDIS_WAIT_TIMEOUT_MS (300 ms), then answered (the replica still frozen)
    assert "reached 0 of 1 replica(s) within 300 ms" in caplog.text


async def test_a_master_without_replicas_is_not_waited_on(monkeypatch: pytest.MonkeyPatch) -> None:
    with SentinelTopology(replicas=0) as lonely:
        monkeypatch.setenv("REDIS_WAIT_TIMEOUT_MS", "5000")
        get_settings.cache_clear()
        redis = create_redis(lonely.url)
        try:
            assert await replicas.count(redis) == 0
            assert await SET(redis, keys=["wait:f"], args=["6"], durable=True) == "6"
            assert wait_calls(lonely.master) == 0
        finally:
            await redis.aclose()
            get_settings.cache_clear()
