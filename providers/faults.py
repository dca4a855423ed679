"""Fault injection for the simulated providers, driven over HTTP and kept in Redis.

``PUT /admin/faults {"latency_s", "error_rate", "hang"}`` · ``GET /admin/faults`` · ``DELETE /admin/faults``.
State is one Redis key per provider, so every replica obeys it and it survives a restart. Applied to every
business route (never to ``/admin`` or ``/health``), in this order:

1. ``latency_s``: wait that long (cut short if the client leaves);
2. ``error_rate``: with that probability answer 503 ``{"error": "injected_fault"}``;
3. ``hang``: hold the request until the client disconnects (polled; a request is never held after its client
   left), then drop it.

Reading the faults costs one Redis GET per request. The number of requests held by ``hang`` right now is the
gauge ``concierge_provider_hanging_requests{provider}`` (how tests see that a hung handler did exit).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache

from fastapi import APIRouter, Request
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from providers.keys import provider_key

__all__ = [
    "NO_FAULTS",
    "ClientGoneError",
    "FaultInjector",
    "Faults",
    "InjectedFaultError",
    "fault_metrics",
    "faults_key",
    "faults_router",
    "hold",
    "load_faults",
]

logger = logging.getLogger(__name__)

MAX_LATENCY_S = 300.0


class Faults(BaseModel):
    """The fault settings; fields left out of a PUT are reset to "no fault". Strict: the types its JSON Schema says
    (``"hang": 0`` or ``"latency_s": "5"`` is refused, not read as ``false`` or 5)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    latency_s: float = Field(0.0, ge=0, le=MAX_LATENCY_S, allow_inf_nan=False)
    error_rate: float = Field(0.0, ge=0, le=1, allow_inf_nan=False)
    hang: bool = False

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.error_rate > 0 or self.hang


NO_FAULTS = Faults()


class InjectedFaultError(Exception):
    """Raised by the injector; the provider app answers 503 ``injected_fault``."""


class ClientGoneError(Exception):
    """The client disconnected while we were delaying or holding its request."""


def faults_key(provider: str) -> str:
    return provider_key(provider, "faults")


async def load_faults(redis: Redis, provider: str) -> Faults:
    raw = await redis.get(faults_key(provider))
    return NO_FAULTS if raw is None else Faults.model_validate_json(raw)


@dataclass(frozen=True)
class _FaultMetrics:
    injected: Counter
    hanging: Gauge


@lru_cache(maxsize=1)
def fault_metrics() -> _FaultMetrics:
    """The counter of injected faults (by provider and kind) and the gauge of held requests."""
    return _FaultMetrics(
        injected=Counter(
            "concierge_provider_faults_injected", "Faults injected by a simulated provider.", ["provider", "kind"]
        ),
        hanging=Gauge(
            "concierge_provider_hanging_requests", "Requests a provider is holding (hang fault).", ["provider"]
        ),
    )


class FaultInjector:
    """FastAPI dependency applying the provider's faults to a request.

    ``rng`` (``[0, 1)``), ``sleep`` and ``clock`` are injectable so tests can drive it without waiting.
    """

    def __init__(
        self,
        provider: str,
        *,
        rng: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.provider = provider
        self._rng = rng
        self._sleep = sleep
        self._clock = clock
        self._poll = poll_interval_s

    async def __call__(self, request: Request) -> None:
        faults = await load_faults(request.app.state.redis, self.provider)
        if not faults.active:
            return
        metrics = fault_metrics()
        if faults.latency_s > 0:
            metrics.injected.labels(self.provider, "latency").inc()
            await self._hold(request, faults.latency_s)
        if faults.error_rate > 0 and self._rng() < faults.error_rate:
            metrics.injected.labels(self.provider, "error").inc()
            raise InjectedFaultError(f"{self.provider}: injected fault (error_rate={faults.error_rate})")
        if faults.hang:
            metrics.injected.labels(self.provider, "hang").inc()
            gauge = metrics.hanging.labels(self.provider)
            gauge.inc()
            try:
                await self._hold(request, None)
            finally:
                gauge.dec()

    async def _hold(self, request: Request, seconds: float | None) -> None:
        await hold(request, seconds, sleep=self._sleep, clock=self._clock, poll_interval_s=self._poll)


async def hold(
    request: Request,
    seconds: float | None,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    poll_interval_s: float = 0.05,
) -> None:
    """Wait ``seconds`` (forever when ``None``), but only while the client is still there (``ClientGoneError``)."""
    deadline = None if seconds is None else clock() + seconds
    while True:
        if await request.is_disconnected():
            logger.info("client left during an injected delay on %s", request.url.path)
            raise ClientGoneError
        if deadline is None:
            await sleep(poll_interval_s)
            continue
        left = deadline - clock()
        if left <= 0:
            return
        await sleep(min(poll_interval_s, left))


def faults_router(provider: str) -> APIRouter:
    """``/admin/faults`` for ``provider``."""
    router = APIRouter(prefix="/admin/faults", tags=["admin"])

    @router.get("")
    async def get_faults(request: Request) -> Faults:
        return await load_faults(request.app.state.redis, provider)

    @router.put("")
    async def put_faults(faults: Faults, request: Request) -> Faults:
        redis: Redis = request.app.state.redis
        await redis.set(faults_key(provider), faults.model_dump_json())
        logger.warning("%s: faults set to %s", provider, faults.model_dump())
        return faults

    @router.delete("")
    async def delete_faults(request: Request) -> Faults:
        redis: Redis = request.app.state.redis
        await redis.delete(faults_key(provider))
        logger.info("%s: faults cleared", provider)
        return NO_FAULTS

    return router
