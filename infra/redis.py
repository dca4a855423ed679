"""Redis client factory, the key helper every module uses, and the one way to run a Lua script.

All keys start with ``CONCIERGE_KEY_PREFIX`` so several stacks (or test runs) can share one server.

Every module takes either kind of client: ``create_redis`` decodes replies to ``str`` (``decode_responses=True``),
a client made the default way (``Redis.from_url(url)``) answers ``bytes``. Read replies through ``text`` and both
work alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from infra.settings import get_settings

RedisClient = Redis | RedisCluster
"""Every client the code accepts: a single server or a cluster."""


def create_redis(url: str | None = None, **kwargs: object) -> Redis:
    """A new asyncio client (str responses). Callers own it and must ``aclose()`` it."""
    # No command of ours blocks server-side, so a reply slower than socket_timeout means a dead or half-open
    # connection: fail (and let the caller's retry/lease logic act) instead of waiting forever.
    options: dict[str, object] = {
        "decode_responses": True,
        "health_check_interval": 10,
        "socket_timeout": 5.0,
        "socket_connect_timeout": 5.0,
    }
    options.update(kwargs)
    return Redis.from_url(url or get_settings().redis_url, **options)  # type: ignore[arg-type]


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
