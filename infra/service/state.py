"""What every service app carries on ``app.state``: who it is (``service``) and its Redis client (``redis``)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request
from redis.asyncio import Redis


@dataclass(frozen=True)
class ServiceInfo:
    """Who answers ``/health``: set when the app is built, refreshed when its lifespan starts."""

    name: str
    instance_id: str
    started_at: float
    """``time.monotonic()`` at start; uptime is measured from here."""


async def get_redis(request: Request) -> Redis:
    """FastAPI dependency: the app's shared Redis client (created by the lifespan).

    ``async`` although it does not await: FastAPI runs a plain ``def`` dependency on its thread pool, a thread hop
    (and a GIL hand-off) on every request that uses it, for one attribute read.
    """
    redis: Redis = request.app.state.redis
    return redis
