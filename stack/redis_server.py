"""Finding Redis for ``concierge up``: ``REDIS_URL`` when it answers, else a ``redis-server`` of our own, else a
clear message. Decided in well under 5 s: one PING bounded by ``PROBE_TIMEOUT_S``, then a PATH lookup.

The Redis we start keeps an append-only file in ``<data dir>/redis/`` so bookings, leases and the recovery
queue survive ``down``/``up``. It listens on REDIS_URL's port when that URL points at this machine and the port
is free (so the configured URL becomes true), otherwise on a free port.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from redis.exceptions import RedisError

from infra.redis import create_redis
from infra.redis_url import parse_redis_url, redact_redis_url
from stack.errors import RedisUnavailableError

__all__ = [
    "PROBE_TIMEOUT_S",
    "RedisPlan",
    "find_redis_server",
    "plan_redis",
    "redact",
    "redis_reachable",
    "redis_server_argv",
]

PROBE_TIMEOUT_S = 2.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

HOW_TO_GET_REDIS = (
    "install it (apt-get install redis-server · brew install redis) so `concierge up` can start its own, "
    "run one (docker run -d -p 6379:6379 redis:7), or point REDIS_URL at a reachable server"
)


@dataclass(frozen=True)
class RedisPlan:
    url: str
    """What the services get as REDIS_URL."""
    own: bool
    """True: ``up`` starts ``executable`` on ``port`` and stops it on ``down``."""
    executable: str | None = None
    port: int | None = None


def redact(url: str) -> str:
    """The URL without its password, for messages and the state file."""
    return redact_redis_url(url)


async def redis_reachable(url: str, within_s: float = PROBE_TIMEOUT_S) -> bool:
    client = create_redis(url, socket_connect_timeout=within_s, socket_timeout=within_s, retry_on_timeout=False)
    try:
        # redis-py retries connection errors by itself; the outer bound keeps the whole answer under the limit
        async with asyncio.timeout(within_s):
            return bool(await client.ping())
    except (TimeoutError, RedisError, OSError, ValueError):
        return False
    finally:
        await client.aclose()


def find_redis_server() -> str | None:
    return shutil.which("redis-server")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def plan_redis(url: str) -> RedisPlan:
    """Use ``url`` if it answers; otherwise plan our own server; otherwise ``RedisUnavailableError``."""
    if await redis_reachable(url):
        return RedisPlan(url=url, own=False)
    if parse_redis_url(url).kind != "single":
        # a Sentinel or Cluster deployment is not something to stand in for with one local server
        raise RedisUnavailableError(f"Redis at {redact(url)} is unreachable: start it, or point REDIS_URL elsewhere")
    executable = find_redis_server()
    if executable is None:
        raise RedisUnavailableError(
            f"Redis at {redact(url)} is unreachable and redis-server is not on PATH: {HOW_TO_GET_REDIS}"
        )
    parts = urlsplit(url)
    wanted = parts.port or 6379
    local = parts.scheme == "redis" and (parts.hostname or "") in _LOOPBACK and not parts.password
    port = wanted if local and _port_free(wanted) else _free_port()
    database = parts.path if local and parts.path not in ("", "/") else "/0"
    return RedisPlan(url=f"redis://127.0.0.1:{port}{database}", own=True, executable=executable, port=port)


def redis_server_argv(executable: str, port: int, directory: Path) -> list[str]:
    """Loopback only, append-only file in ``directory``, no RDB snapshots, logs on stdout."""
    return [
        executable,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(directory),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        "",
    ]
