"""Redis client factory, the key helper every module uses, and the one way to run a Lua script.

All keys start with ``CONCIERGE_KEY_PREFIX`` so several stacks (or test runs) can share one server.

Every module takes either kind of client: ``create_redis`` decodes replies to ``str`` (``decode_responses=True``),
a client made the default way (``Redis.from_url(url)``) answers ``bytes``. Read replies through ``text`` and both
work alike.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from infra.settings import get_settings

RedisClient = Redis | RedisCluster
"""Every client the code accepts: a single server or a cluster."""


class BoundedConnectionPool(BlockingConnectionPool):
    """redis-py's ``BlockingConnectionPool`` (at most ``max_connections``; past them wait up to ``timeout``, then
    ``ConnectionError``), paying for the wait only when there is one.

    The stock pool takes a condition and arms a timer for every command, free connection or not: 20-45 µs of CPU
    per command here, about 4% of a booking's CPU across the services. This one takes a free connection straight
    away and touches the condition only to wait for one, or to wake a waiter on release.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0

    async def get_connection(self, command_name: str | None = None, *keys: Any, **options: Any) -> AbstractConnection:
        if not self.can_get_connection():
            await self._wait_for_connection()
        connection = self.get_available_connection()  # no await since the check: it is still free
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def _wait_for_connection(self) -> None:
        # counted before the condition is checked, so a release from now on notifies: no wake-up is lost
        self._waiting += 1
        try:
            async with self._condition, asyncio.timeout(self.timeout):
                await self._condition.wait_for(self.can_get_connection)
        except TimeoutError:
            raise RedisConnectionError("No connection available.") from None
        finally:
            self._waiting -= 1

    async def release(self, connection: AbstractConnection) -> None:
        await ConnectionPool.release(self, connection)
        if self._waiting:
            async with self._condition:
                self._condition.notify()


def create_redis(url: str | None = None, **kwargs: object) -> Redis:
    """A new asyncio client (str responses) on its own bounded pool. Callers own it and must ``aclose()`` it.

    The pool is a ``BoundedConnectionPool`` of ``REDIS_MAX_CONNECTIONS``: a burst past it waits (at most
    ``REDIS_POOL_TIMEOUT``) for a connection to come back instead of failing with "Too many connections", so a spike
    of bookings costs milliseconds, not heartbeats and 500s. ``max_connections`` and ``timeout`` (the pool wait)
    may be passed like any other option.
    """
    settings = get_settings()
    # No command of ours blocks server-side, so a reply slower than socket_timeout means a dead or half-open
    # connection: fail (and let the caller's retry/lease logic act) instead of waiting forever.
    options: dict[str, object] = {
        "decode_responses": True,
        # After Redis restarts, every pooled connection is dead and finds out on its next command: send that command
        # again on a fresh connection rather than answer a 503 for each stale one. (A command that reached the server
        # before its connection died runs twice; ours are scripts and writes that say so: a second ``create`` of a
        # run finds it exists.)
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.02), 2),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 10,
        "socket_timeout": 5.0,
        "socket_connect_timeout": 5.0,
        "max_connections": settings.redis_max_connections,
        "timeout": settings.redis_pool_timeout_s,
    }
    options.update(kwargs)
    pool = BoundedConnectionPool.from_url(url or settings.redis_url, **options)
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def key(*parts: str, prefix: str | None = None) -> str:
    """``prefix:part1:part2`` with the configured prefix."""
    return ":".join((prefix if prefix is not None else get_settings().key_prefix, *parts))


def text(value: object) -> str:
    """A reply value as ``str``, whether the client decodes responses (``str``) or not (``bytes``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class RedisScript:
    """A Lua script, defined once at module level and run on any client: ``await SCRIPT(client, keys=..., args=...)``.

    Runs by ``EVALSHA``; when the server does not know the script (first use, restart, ``SCRIPT FLUSH``, another
    node of a cluster) it is loaded with ``SCRIPT LOAD`` and run again. Holds no client, so one object serves every
    client, ``Redis`` and ``RedisCluster`` alike (a cluster routes ``EVALSHA`` by its keys and loads scripts on
    every primary). Pass every key through ``keys``.
    """

    source: str
    sha: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # the SHA1 the server computes for the script as the clients send it (UTF-8, redis-py's default encoding)
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest())

    async def __call__(self, client: RedisClient, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # SCRIPT LOAD answers the SHA the server uses, which is ours unless the client encodes text otherwise
            sha = text(await client.script_load(self.source))
            return await client.evalsha(sha, len(keys), *keys, *args)
