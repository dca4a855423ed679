"""Fault injection for the simulated providers, driven over HTTP and kept in Redis.

``PUT /admin/faults {"latency_s", "error_rate", "hang", "answer_delay_s"}`` · ``GET /admin/faults`` ·
``DELETE /admin/faults``.
State is one Redis key per provider, so every replica obeys it and it survives a restart. Applied to every
business route (never to ``/admin`` or ``/health``), in this order:

1. ``latency_s``: wait that long (cut short if the client leaves);
2. ``error_rate``: with that probability answer 503 ``{"error": "injected_fault"}``;
3. ``hang``: hold the request until the client disconnects (polled; a request is never held after its client
   left), then drop it;
4. ``answer_delay_s``: the route acts (its side effect committed), then its answer waits that long, and is dropped
   if the client leaves meanwhile (``AnswerDelay``): "the provider acted, the answer was lost", for kill -9 tests.
   Shown by ``GET /admin/faults`` only when set, so the answer without it is what it always was.

A provider may take faults of its own besides (``model``: a subclass of ``Faults``): hotel-api's ``HotelFaults``
change what it answers, not whether it does (``price_change_pct``: holds cost that much more than search showed;
``name_suffix``: appended to every hotel name, third-party text for tests to plant instructions in). The injector
leaves the request's faults in ``request.state.faults`` for its routes.

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
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from providers.keys import provider_key

__all__ = [
    "MAX_NAME_SUFFIX",
    "MAX_PRICE_CHANGE_PCT",
    "MIN_PRICE_CHANGE_PCT",
    "NO_FAULTS",
    "AnswerDelay",
    "ClientGoneError",
    "FaultInjector",
    "Faults",
    "HotelFaults",
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
    answer_delay_s: float = Field(0.0, ge=0, le=MAX_LATENCY_S, allow_inf_nan=False)
    """After the route has acted: how long its answer waits (``AnswerDelay``)."""

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.error_rate > 0 or self.hang or self.answer_delay_s > 0

    def shown(self) -> dict[str, object]:
        """What ``GET /admin/faults`` answers: every field, ``answer_delay_s`` only when set."""
        shown = self.model_dump(mode="json")
        if not self.answer_delay_s:
            del shown["answer_delay_s"]
        return shown


NO_FAULTS = Faults()

MIN_PRICE_CHANGE_PCT = -50.0
MAX_PRICE_CHANGE_PCT = 200.0
MAX_NAME_SUFFIX = 1_000


class HotelFaults(Faults):
    """hotel-api's faults: ``Faults``, and two that change what it answers rather than whether it does."""

    price_change_pct: float = Field(0.0, ge=MIN_PRICE_CHANGE_PCT, le=MAX_PRICE_CHANGE_PCT, allow_inf_nan=False)
    name_suffix: str = Field("", max_length=MAX_NAME_SUFFIX)

    def hotel_name(self, name: str) -> str:
        return name + self.name_suffix

    def held_total(self, offered_total: float) -> float:
        """What a hold costs when search showed ``offered_total``: ``price_change_pct`` more, rounded to cents."""
        if not self.price_change_pct:
            return offered_total
        factor = (100 + Decimal(str(self.price_change_pct))) / 100
        return float((Decimal(str(offered_total)) * factor).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


class InjectedFaultError(Exception):
    """Raised by the injector; the provider app answers 503 ``injected_fault``."""


class ClientGoneError(Exception):
    """The client disconnected while we were delaying or holding its request."""


def faults_key(provider: str) -> str:
    return provider_key(provider, "faults")


async def load_faults(redis: Redis, provider: str, model: type[Faults] = Faults) -> Faults:
    """The provider's faults, read as ``model`` (its own, for a provider that takes more than ``Faults``)."""
    raw = await redis.get(faults_key(provider))
    return model() if raw is None else model.model_validate_json(raw)


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
        model: type[Faults] = Faults,
        rng: Callable[[], float] = random.random,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.provider = provider
        self._model = model
        self._rng = rng
        self._sleep = sleep
        self._clock = clock
        self._poll = poll_interval_s

    async def __call__(self, request: Request) -> None:
        faults = await load_faults(request.app.state.redis, self.provider, self._model)
        request.state.faults = faults  # the route's own faults, without a second read
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


class AnswerDelay:
    """Pure ASGI: a business route's answer waits ``answer_delay_s`` after the route has acted (its side effect is
    committed), and is dropped if the client leaves meanwhile. The faults are the ones the injector read for the
    request (``request.state.faults``): no fault, or a route the injector does not guard, passes straight through."""

    def __init__(self, app: ASGIApp, *, provider: str) -> None:
        self.app = app
        self.provider = provider

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gone = False

        async def delayed(message: Message) -> None:
            nonlocal gone
            faults = scope.get("state", {}).get("faults")
            if message["type"] == "http.response.start" and isinstance(faults, Faults) and faults.answer_delay_s > 0:
                fault_metrics().injected.labels(self.provider, "answer_delay").inc()
                try:
                    await hold(Request(scope, receive), faults.answer_delay_s)
                except ClientGoneError:
                    gone = True  # the provider acted; nobody is left to hear it
            if not gone:
                await send(message)

        await self.app(scope, receive, delayed)


def faults_router(provider: str, model: type[Faults] = Faults) -> APIRouter:
    """``/admin/faults`` for ``provider``, its body ``model`` (documented as such in the OpenAPI)."""
    router = APIRouter(prefix="/admin/faults", tags=["admin"])

    @router.get("", response_model=model)
    async def get_faults(request: Request) -> Response:
        return JSONResponse((await load_faults(request.app.state.redis, provider, model)).shown())

    async def put_faults(faults: Faults, request: Request) -> Response:
        redis: Redis = request.app.state.redis
        await redis.set(faults_key(provider), faults.model_dump_json())
        logger.warning("%s: faults set to %s", provider, faults.shown())
        return JSONResponse(faults.shown())

    # the body is validated as the provider's own model: FastAPI reads the annotation, so it is set per router
    put_faults.__annotations__["faults"] = model
    router.put("", response_model=model)(put_faults)

    @router.delete("", response_model=model)
    async def delete_faults(request: Request) -> Response:
        redis: Redis = request.app.state.redis
        await redis.delete(faults_key(provider))
        logger.info("%s: faults cleared", provider)
        return JSONResponse(model().shown())

    return router
