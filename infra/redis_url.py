"""``REDIS_URL`` read into where Redis is: one server, a Sentinel-watched master, or a Cluster (stdlib only).

- ``redis://[user:password@]host:port/db`` (and ``rediss://``, ``unix://``): one server, as redis-py reads it;
- ``redis+sentinel://[user:password@]host:port[,host:port...]/<master name>/<db>``: ask those sentinels for the
  master called ``<master name>``; the password is the master's (the sentinels are reached without one);
- ``redis+cluster://[user:password@]host:port[,host:port...]/0``: any of the nodes of a Redis Cluster (db 0 only).

``parse_redis_url`` raises ``ValueError`` naming what is wrong; ``infra/settings.py`` turns it into a settings
error on ``REDIS_URL``. Details and examples: docs/redis-ha.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

__all__ = ["CLUSTER_SCHEME", "SENTINEL_SCHEME", "RedisTarget", "parse_redis_url", "redact_redis_url"]

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
_SINGLE_SCHEMES = frozenset({"redis", "rediss", "unix"})


@dataclass(frozen=True)
class RedisTarget:
    kind: Literal["single", "sentinel", "cluster"]
    url: str
    """The URL as given (for a single server, what redis-py reads)."""
    nodes: tuple[tuple[str, int], ...] = ()
    """Sentinels (``sentinel``) or cluster nodes (``cluster``)."""
    master: str | None = None
    """The Sentinel master name."""
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_redis_url(url: str) -> RedisTarget:
    """Where ``url`` says Redis is; ``ValueError`` with the reason when it says nothing usable."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if not rest:
        raise ValueError(f"not a URL: expected redis://, {SENTINEL_SCHEME}:// or {CLUSTER_SCHEME}://, got {url!r}")
    if scheme in _SINGLE_SCHEMES:
        return RedisTarget("single", url)
    if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        raise ValueError(
            f"unknown scheme {scheme!r}: use redis://, rediss://, {SENTINEL_SCHEME}:// or {CLUSTER_SCHEME}://"
        )
    authority, _, path = rest.partition("/")
    credentials, at, hosts = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_node(part, scheme) for part in hosts.split(","))
    segments = [segment for segment in urlsplit("x:/" + path).path.split("/") if segment]
    if scheme == SENTINEL_SCHEME:
        if not segments:
            raise ValueError(f"{SENTINEL_SCHEME}:// needs the master name: {SENTINEL_SCHEME}://host:port/mymaster/0")
        if len(segments) > 2:
            raise ValueError(f"{SENTINEL_SCHEME}:// takes /<master name>/<db>, got /{'/'.join(segments)}")
        db = _db(segments[1]) if len(segments) == 2 else 0
        return RedisTarget("sentinel", url, nodes, unquote(segments[0]), db, username, password)
    if len(segments) > 1 or (segments and _db(segments[0]) != 0):
        raise ValueError(f"{CLUSTER_SCHEME}:// has database 0 only (a Redis Cluster has no other), got /{path}")
    return RedisTarget("cluster", url, nodes, None, 0, username, password)


def _node(part: str, scheme: str) -> tuple[str, int]:
    host, colon, port = part.strip().rpartition(":")
    if not colon:
        host, port = port, ""
    host = host.strip("[]")
    if not host:
        raise ValueError(f"{scheme}:// needs host:port[,host:port...], got an empty host in {part!r}")
    if not port:
        return host, 26379 if scheme == SENTINEL_SCHEME else 6379
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{scheme}:// port must be 1-65535, got {port!r}")
    return host, int(port)


def _db(segment: str) -> int:
    if not segment.isdigit():
        raise ValueError(f"the database must be a number, got {segment!r}")
    return int(segment)


def redact_redis_url(url: str) -> str:
    """The URL with its password as ``***`` (any scheme, several hosts too), for messages and state files."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    credentials, at, hosts = authority.rpartition("@")
    user, colon, _password = credentials.partition(":")
    if not (sep and at and colon):
        return url
    return f"{scheme}://{user}:***@{hosts}{slash}{path}"
