"""Finding Redis for ``concierge up``: ``REDIS_URL`` when it answers, else a ``redis-server`` of our own, else a
clear message. Decided in well under 5 s: one PING bounded by ``PROBE_TIMEOUT_S``, then a PATH lookup.

The Redis we start keeps an append-only file in ``<data dir>/redis/`` so bookings, leases and the recovery
queue survive ``down``/``up``. It listens on REDIS_URL's port when that URL points at this machine and the port
is free (so the configured URL becomes true), otherwise on a free port. It asks for the data directory's password
(``StackSecrets.redis_password``), handed over on its stdin (``redis_server_config``), never on a command line that
any local user can read in ``/proc``: the services get it inside their ``REDIS_URL``, the commands from
``secrets.json`` (``stack.target.stack_redis_url``).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from redis.exceptions import RedisError

from infra.redis import create_redis
from infra.redis_url import parse_redis_url, redact_redis_url
from stack.errors import RedisUnavailableError, StackError

__all__ = [
    "PROBE_TIMEOUT_S",
    "RedisPlan",
    "check_redis_password",
    "find_redis_server",
    "plan_redis",
    "redact",
    "redis_reachable",
    "redis_server_argv",
    "redis_server_config",
    "url_with_password",
]

PROBE_TIMEOUT_S = 2.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# what ``secrets.token_urlsafe`` makes, at a length nobody guesses: nothing a config line could be split or ended on
_PASSWORD = re.compile(r"[A-Za-z0-9_-]{16,256}")

HOW_TO_GET_REDIS = (
    "install it (apt-get install redis-server · brew install redis) so `concierge up` can start its own, "
    "run one (docker run -d -p 6379:6379 redis:7), or point REDIS_URL at a reachable server"
)


@dataclass(frozen=True)
class RedisPlan:
    url: str = field(repr=False)
    """What the services get as REDIS_URL (with the password of our own server in it)."""
    own: bool
    """True: ``up`` starts ``executable`` on ``port`` and stops it on ``down``."""
    executable: str | None = None
    port: int | None = None
    password: str = field(default="", repr=False)
    """What our own server requires (``requirepass``); empty for the user's Redis, which keeps its own."""


def check_redis_password(password: str) -> str:
    """``password`` when it is safe on a config line (``token_urlsafe`` characters, 16 to 256); else a
    ``StackError`` that never repeats it (a newline or space would end the setting and start another)."""
    if not _PASSWORD.fullmatch(password):
        raise StackError(
            f"the Redis password in secrets.json is unusable ({len(password)} characters; 16-256 of A-Z a-z 0-9 _ - "
            "expected): delete its redis_password and `concierge up` makes a new one"
        )
    return password


def url_with_password(url: str, password: str) -> str:
    """``url`` (``redis://host:port/db``, any user or password dropped) with ``password`` in it."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    where = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme or 'redis'}://:{quote(password, safe='')}@{where}{port}{parts.path}"


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


async def plan_redis(url: str, password: str = "") -> RedisPlan:
    """Use ``url`` if it answers; otherwise plan our own server (requiring ``password``, when given); otherwise
    ``RedisUnavailableError``."""
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
    plain = f"redis://127.0.0.1:{port}{database}"
    if password:
        check_redis_password(password)
    return RedisPlan(
        url=url_with_password(plain, password) if password else plain,
        own=True,
        executable=executable,
        port=port,
        password=password,
    )


def redis_server_config(password: str) -> bytes:
    """What our server reads on its stdin (``redis-server -``): the one setting no command line may show."""
    if not password:
        return b""
    return f"requirepass {check_redis_password(password)}\n".encode()


def redis_server_argv(executable: str, port: int, directory: Path) -> list[str]:
    """Config from stdin (``-``, ``redis_server_config``), then: loopback only, append-only file in ``directory``,
    no RDB snapshots, logs on stdout."""
    return [
        executable,
        "-",
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
