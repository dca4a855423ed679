"""Redis client factory and the key helper every module uses.

All keys start with ``CONCIERGE_KEY_PREFIX`` so several stacks (or test runs) can share one server.
"""

from __future__ import annotations

from redis.asyncio import Redis

from infra.settings import get_settings


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
