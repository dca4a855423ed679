"""Redis client factory, the key helper every module uses, and the one way to run a Lua script.

All keys start with ``CONCIERGE_KEY_PREFIX`` so several stacks (or test runs) can share one server. ``REDIS_URL``
names one server, a Sentinel-watched master or a Cluster (``infra/redis_url.py``); ``create_redis`` (asyncio) and
``create_sync_redis`` make the right client for each, so no other module builds one (docs/redis-ha.md).

Every module takes either kind of client: ``create_redis`` decodes replies to ``str`` (``decode_responses=True``),
a client made the default way (``Redis.from_url(url)``) answers ``bytes``. Read replies through ``text`` and both
work alike.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis as sync_redis
import redis.cluster as sync_cluster
import redis.sentinel as sync_sentinel
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException, SlotNotCoveredError
from redis.exceptions import TimeoutError as RedisTimeoutError

from infra.redis_url import RedisTarget, parse_redis_url
from infra.settings import get_settings

logger = logging.getLogger(__name__)

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


class SentinelBoundedConnectionPool(BoundedConnectionPool, SentinelConnectionPool):
    """The bounded pool on connections that ask the sentinels where the master is (on every new connection, so
    after a failover the next connection, including a retry's, goes to the promoted replica)."""

    def __init__(self, service_name: str, sentinel_manager: Sentinel, **kwargs: Any) -> None:
        kwargs.setdefault("connection_class", SentinelManagedConnection)
        super().__init__(service_name=service_name, sentinel_manager=sentinel_manager, **kwargs)


class SentinelRedis(Redis):
    """A master's client that also closes its sentinels' connections on ``aclose()``."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        try:
            await super().aclose(close_connection_pool)
        finally:
            for client in self.sentinel_manager.sentinels if self.sentinel_manager is not None else ():
                await client.aclose()


class ClusterClient(RedisCluster):
    """``RedisCluster`` whose "cannot reach the cluster" errors are ``ConnectionError`` ones, as a single server's are.

    redis-py raises them as ``RedisClusterException``, which is no ``RedisError``: every boundary that turns Redis
    failures into a 503 or a retry (``infra/error_table.py``, ``runs/errors.py``...) let them through as crashes.
    """

    async def initialize(self, *args: Any, **kwargs: Any) -> RedisCluster:
        try:
            return await super().initialize(*args, **kwargs)
        except RedisClusterException as exc:
            raise RedisConnectionError(str(exc)) from exc

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except SlotNotCoveredError as exc:  # the nodes serving that slot are gone: the cluster is (partly) down
            raise RedisConnectionError(str(exc)) from exc


# Options of a single server's pool that a cluster client does not take (it keeps its own connections per node).
_POOL_ONLY = frozenset({"timeout", "retry_on_timeout", "max_connections"})


def create_redis(url: str | None = None, **kwargs: object) -> Any:
    """A new asyncio client (str responses) for ``url`` (default ``REDIS_URL``). Callers own it and must ``aclose()``.

    One server or a Sentinel master: a ``Redis`` on a ``BoundedConnectionPool`` of ``REDIS_MAX_CONNECTIONS``: a burst
    past it waits (at most ``REDIS_POOL_TIMEOUT``) for a connection to come back instead of failing with "Too many
    connections", so a spike of bookings costs milliseconds, not heartbeats and 500s. ``max_connections`` and
    ``timeout`` (the pool wait) may be passed like any other option. A Cluster: a ``RedisCluster`` with
    ``REDIS_MAX_CONNECTIONS`` per node. Typed ``Any`` because callers use both through the commands they share.
    """
    settings = get_settings()
    target = parse_redis_url(url or settings.redis_url)
    # No command of ours blocks server-side, so a reply slower than socket_timeout means a dead or half-open
    # connection: fail (and let the caller's retry/lease logic act) instead of waiting forever.
    options: dict[str, Any] = {
        "decode_responses": True,
        # After Redis restarts (or fails over), every pooled connection is dead and finds out on its next command:
        # send that command again on a fresh connection rather than answer a 503 for each stale one. (A command that
        # reached the server before its connection died runs twice; ours are scripts and writes that say so: a
        # second ``create`` of a run finds it exists.)
        "retry": Retry(ExponentialBackoff(cap=0.25, base=0.02), 2),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
        "health_check_interval": 10,
        "socket_timeout": 5.0,
        "socket_connect_timeout": 5.0,
        "max_connections": settings.redis_max_connections,
        "timeout": settings.redis_pool_timeout_s,
    }
    options.update(kwargs)
    if target.kind == "cluster":
        return _cluster(target, options)
    if target.kind == "sentinel":
        return _sentinel_master(target, options)
    pool = BoundedConnectionPool.from_url(target.url, **options)
    return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def _sentinel_master(target: RedisTarget, options: dict[str, Any]) -> SentinelRedis:
    # the sentinels are asked with the same socket bounds, without the master's credentials
    sentinel_options = {name: value for name, value in options.items() if name.startswith("socket_")}
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs=sentinel_options)
    assert target.master is not None  # parse_redis_url always names it for redis+sentinel
    client = sentinel.master_for(
        target.master,
        redis_class=SentinelRedis,
        connection_pool_class=SentinelBoundedConnectionPool,
        db=target.db,
        username=target.username,
        password=target.password,
        **options,
    )
    client.sentinel_manager = sentinel
    return client


def _cluster(target: RedisTarget, options: dict[str, Any]) -> ClusterClient:
    cluster_options = {name: value for name, value in options.items() if name not in _POOL_ONLY}
    return ClusterClient(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        max_connections=int(options["max_connections"]),
        username=target.username,
        password=target.password,
        **cluster_options,
    )


def create_sync_redis(url: str | None = None, **kwargs: Any) -> Any:
    """The blocking twin of ``create_redis`` (str responses) for scripts and tests that are not asyncio."""
    target = parse_redis_url(url or get_settings().redis_url)
    options: dict[str, Any] = {"decode_responses": True, **kwargs}
    if target.kind == "cluster":
        nodes = [sync_cluster.ClusterNode(host, port) for host, port in target.nodes]
        return sync_cluster.RedisCluster(
            startup_nodes=nodes, username=target.username, password=target.password, **options
        )
    if target.kind == "sentinel":
        sentinel_options = {name: value for name, value in options.items() if name.startswith("socket_")}
        sentinel = sync_sentinel.Sentinel(list(target.nodes), sentinel_kwargs=sentinel_options)
        assert target.master is not None
        return sentinel.master_for(
            target.master, db=target.db, username=target.username, password=target.password, **options
        )
    return sync_redis.Redis.from_url(target.url, **options)


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

    async def __call__(
        self, client: RedisClient, keys: Sequence[str] = (), args: Sequence[Any] = (), *, durable: bool = False
    ) -> Any:
        """``durable``: answer only once ``REDIS_WAIT_REPLICAS`` replicas have the write too (``WAIT``, bounded by
        ``REDIS_WAIT_TIMEOUT_MS``), for the writes a failover must not lose (docs/redis-ha.md)."""
        wanted = get_settings().redis_wait_replicas
        if durable and wanted:
            node = await _node_of(client, keys)
            if await replicas.count(client, node):
                return await self._call_and_wait(client, node, wanted, keys, args)
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # SCRIPT LOAD answers the SHA the server uses, which is ours unless the client encodes text otherwise
            sha = text(await client.script_load(self.source))
            return await client.evalsha(sha, len(keys), *keys, *args)

    async def _call_and_wait(
        self, client: RedisClient, node: ClusterNode | None, wanted: int, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        # WAIT counts the writes of the connection it is sent on, so it goes in one pipeline with the script (one
        # connection; on a cluster, the node of the script's keys)
        timeout_ms = get_settings().redis_wait_timeout_ms
        sha = self.sha
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", wanted, timeout_ms, **({"target_nodes": node} if node is not None else {}))
            try:
                reply, acked = await pipe.execute()
            except NoScriptError:
                if attempt:
                    raise
                sha = text(await client.script_load(self.source))
                continue
            if int(acked) < wanted:
                replicas.forget(client, node)  # a replica gone since the last look: look again next time
                logger.warning("a write reached %s of %d replica(s) within %d ms", acked, wanted, timeout_ms)
            return reply
        raise AssertionError("unreachable")  # pragma: no cover


async def _node_of(client: RedisClient, keys: Sequence[str]) -> ClusterNode | None:
    """The cluster node that owns the keys (whose replicas a WAIT must hear from); None for a single master."""
    if not isinstance(client, RedisCluster) or not keys:
        return None
    await client.initialize()  # a fresh client knows no slot yet; a no-op once it does
    return client.get_node_from_key(keys[0])


async def clients_and_server(client: RedisClient, near_key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``CLIENT LIST`` (normal clients) and ``INFO server`` of the server that holds ``near_key``, in one round trip.

    On a Cluster that is the node owning the key's slot: where the connections that write such keys are (redis-py
    refuses these commands in a cluster pipeline, and would otherwise send them to a random node).
    """
    node = await _node_of(client, [near_key])
    if node is not None:
        clients = await client.execute_command("CLIENT LIST", "TYPE", "normal", target_nodes=node)
        server = await client.execute_command("INFO", "server", target_nodes=node)
        return list(clients), dict(server)
    async with client.pipeline(transaction=False) as pipe:
        pipe.client_list(_type="normal")
        pipe.info("server")
        listed, info = await pipe.execute()
    return list(listed), dict(info)


class ReplicaCounts:
    """How many replicas a client's master (or a cluster node) has, from ``ROLE``, kept ``REFRESH_S`` seconds.

    ``WAIT`` on a master without replicas would wait out its whole timeout, so durable writes ask first; the answer
    is cached because it changes only when a replica joins or leaves (a failover: a few seconds of stale answers
    cost at most a WAIT timeout each, or a write not waited for; see docs/redis-ha.md).
    """

    REFRESH_S = 2.0

    def __init__(self) -> None:
        self._counts: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, int]]] = weakref.WeakKeyDictionary()

    async def count(self, client: RedisClient, node: ClusterNode | None = None) -> int:
        name = node.name if node is not None else ""
        seen = self._counts.setdefault(client, {})
        cached = seen.get(name)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.REFRESH_S:
            return cached[1]
        if node is not None:
            role = await client.execute_command("ROLE", target_nodes=node)
        else:
            role = await client.execute_command("ROLE")
        count = len(role[2]) if text(role[0]) == "master" else 0
        seen[name] = (now, count)
        return count

    def forget(self, client: RedisClient, node: ClusterNode | None = None) -> None:
        self._counts.get(client, {}).pop(node.name if node is not None else "", None)


replicas = ReplicaCounts()
"""The process's replica counts, one entry per client and node."""


def connection_counts(client: Any) -> dict[str, int]:
    """The open connections of ``client``'s pool: ``in_use``, ``idle`` (a Cluster client has no one pool: zeros)."""
    pools = [client.connection_pool] if hasattr(client, "connection_pool") else []
    in_use = sum(len(getattr(pool, "_in_use_connections", ())) for pool in pools)
    idle = sum(len(getattr(pool, "_available_connections", ())) for pool in pools)
    return {"in_use": in_use, "idle": idle, "open": in_use + idle}
