"""``create_redis``'s bounded pool: a burst past ``REDIS_MAX_CONNECTIONS`` waits for a connection, it does not fail.

Each command here is a ``BLPOP`` with a short timeout on a key nobody writes: it holds its connection for that
long, so the pool is provably full while the others queue.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from infra.redis import BoundedConnectionPool, create_redis, key
from infra.settings import get_settings
from tests.procs import free_port


async def test_a_burst_past_the_pool_waits_its_turn(settings_env: pytest.MonkeyPatch, redis: object) -> None:
    client = create_redis(max_connections=2)
    nothing = key("pool-test", uuid.uuid4().hex)
    try:
        started = time.monotonic()
        replies = await asyncio.gather(*(client.blpop([nothing], timeout=0.2) for _ in range(10)))
        assert replies == [None] * 10, "every command ran; none was refused with 'Too many connections'"
        assert time.monotonic() - started >= 0.9, "ten 0.2 s commands on two connections take five turns"
    finally:
        await client.aclose()


async def test_a_wait_past_the_pool_timeout_is_a_connection_error(
    settings_env: pytest.MonkeyPatch, redis: object
) -> None:
    client = create_redis(max_connections=1, timeout=0.05)
    nothing = key("pool-test", uuid.uuid4().hex)
    try:
        replies = await asyncio.gather(
            client.blpop([nothing], timeout=0.5), client.blpop([nothing], timeout=0.5), return_exceptions=True
        )
        assert replies[0] is None
        assert isinstance(replies[1], RedisConnectionError), replies  # the error table: dependency_unavailable
    finally:
        await client.aclose()


async def test_a_connection_that_fails_to_connect_goes_back_to_the_pool(settings_env: pytest.MonkeyPatch) -> None:
    # nothing listens there: each command fails to connect, and must not keep the pool's only slot
    client = create_redis(f"redis://127.0.0.1:{free_port()}/0", max_connections=1, timeout=0.2, retry=None)
    try:
        for _ in range(3):
            with pytest.raises(RedisConnectionError) as failed:
                await client.ping()
            assert "No connection available" not in str(failed.value)
    finally:
        await client.aclose()


async def test_pool_size_and_wait_come_from_the_settings(settings_env: pytest.MonkeyPatch) -> None:
    settings_env.setenv("REDIS_MAX_CONNECTIONS", "7")
    settings_env.setenv("REDIS_POOL_TIMEOUT", "0.5")
    get_settings.cache_clear()
    client = create_redis()
    try:
        pool = client.connection_pool
        assert isinstance(pool, BoundedConnectionPool) and isinstance(pool, BlockingConnectionPool)
        assert (pool.max_connections, pool.timeout) == (7, 0.5)
    finally:
        await client.aclose()
