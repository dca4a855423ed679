"""recovery-worker: the service that finds orphaned runs and finishes them on the graphs the agent packages of
``DURABLE_AGENTS`` declare (``recovery.registry``; bookings, cancels, chat turns), port 8020.

One process runs two loops next to the service shell's routes:

- the ``OrphanScanner`` (every ``ORPHAN_SCAN_INTERVAL``) queues runs whose lease expired;
- the ``RecoveryConsumer`` takes them, up to ``RECOVERY_CONCURRENCY`` at a time (bulkhead ``recovery_worker``), and
  resumes each from its checkpoint with a fresh ``BOOKING_BUDGET_S`` (see ``recovery.consumer`` for the whole
  decision).

With presence on (``PRESENCE_ENABLED``) the scanner also sweeps the processes' presence every
``PRESENCE_SCAN_INTERVAL`` (a process whose named connection is gone loses its runs at once), and this process keeps
a presence of its own for the runs it resumes.

Any number of workers may run side by side: the scanner's claims, the queue's deliveries and the fenced leases keep
every run with exactly one of them.

Routes added to the shell's: ``GET /health/queue`` (queue figures, shared by every replica, plus the runs this
worker is resuming) and the same figures as Prometheus gauges in ``/metrics``, read from Redis when scraped.
``/health/ready`` checks Redis and the checkpointer.

SIGTERM: the consumer stops taking at once and the runs in hand have their current step cancelled and are handed
back (lease released, re-enqueued at once); then uvicorn finishes open requests and the lifespan stops the scanner
and cancels whatever still runs after ``DRAIN_S`` (which hands it back too).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel
from redis.asyncio import Redis
from starlette.types import ASGIApp, Receive, Scope, Send

from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.journal import name_instance
from infra.service import create_service_app
from infra.settings import get_settings
from process.tasks import stop_task
from recovery.consumer import BULKHEAD_NAME, ConsumerConfig, RecoveryConsumer, Versions
from recovery.queue import DeadLetterQueue, QueueGuard, RecoveryQueue
from recovery.registry import load_durable_graphs
from recovery.scanner import OrphanScanner
from resilience import bulkhead_registry
from runs.leases import RunStore, instance_name
from runs.presence import Presence, PresenceMonitor

__all__ = [
    "DRAIN_S",
    "QUEUE_HEALTH_FIELDS",
    "SERVICE",
    "RecoveryWorker",
    "app",
    "install_queue_metrics",
]

logger = logging.getLogger(__name__)

SERVICE = "recovery-worker"
DRAIN_S = 10.0
"""How long a stopping worker lets its runs hand themselves back before cancelling their tasks."""
QUEUE_HEALTH_FIELDS = (
    "depth",
    "max_size",
    "dlq_depth",
    "oldest_age_s",
    "in_flight",
    "recovered_total",
    "dead_lettered_total",
)
# A scrape must not hang on Redis: past this, /metrics goes out without the queue figures.
_SCRAPE_REFRESH_TIMEOUT_S = 1.0


class RecoveryWorker:
    """The scanner and the consumer of one process, started and stopped together."""

    def __init__(self, *, scanner: OrphanScanner, consumer: RecoveryConsumer) -> None:
        self.scanner = scanner
        self.consumer = consumer
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def for_graphs(
        cls,
        redis: Redis,
        graphs: Mapping[str, Versions],
        *,
        consumer_id: str,
        config: ConsumerConfig | None = None,
    ) -> RecoveryWorker:
        """Wire store, queue, guard, scanner and consumer from the settings (``RECOVERY_CONCURRENCY`` runs at once)."""
        settings = get_settings()
        dlq = DeadLetterQueue(redis)
        guard = QueueGuard(redis, dlq)
        queue = RecoveryQueue(redis, dlq)
        runs = RunStore(redis)
        bulkhead = bulkhead_registry.configure(BULKHEAD_NAME, max_concurrent=settings.recovery_concurrency)
        consumer = RecoveryConsumer(
            runs=runs,
            queue=queue,
            guard=guard,
            graphs=graphs,
            consumer_id=consumer_id,
            config=config,
            bulkhead=bulkhead,
        )
        monitor = PresenceMonitor(redis) if settings.presence_enabled else None
        return cls(scanner=OrphanScanner(redis, runs, guard, presence=monitor), consumer=consumer)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.scanner.run(), name="orphan-scanner"),
            asyncio.create_task(self.consumer.run(), name="recovery-consumer"),
        ]

    async def stop(self, grace: float = DRAIN_S) -> None:
        """Stop scanning and taking; hand back (or finish) the runs in hand within ``grace``.

        Every wait is bounded and never a bare ``await`` on a task: a cancellation lost in a Redis call
        (``process.tasks``) once kept the scanner running and this shutdown waiting for it. Each loop also ends on its
        flag at its next turn; what does not stop in time is named in the log and left behind.
        """
        scanner_task, consumer_task = self._tasks or (None, None)
        self._tasks = []
        if scanner_task is not None:
            await stop_task(
                scanner_task, stop=self.scanner.stopping, within=self.scanner.interval + 1.0, what="the orphan scanner"
            )
        await self.consumer.stop(grace)  # bounded: grace, then the runs still busy are cancelled (5 s to hand back)
        if consumer_task is not None:
            # the take loop notices the stop within one take (take_wait); a hung Redis call is cancelled instead
            await asyncio.wait({consumer_task}, timeout=self.consumer.config.take_wait + 2)
            await stop_task(consumer_task, within=1.0, what="the recovery consumer's take loop")

    async def queue_health(self) -> dict[str, int | float]:
        """``GET /health/queue``: the queue's figures (shared by every worker) and this worker's runs in hand.

        ``in_flight`` counts deliveries taken but not yet acked; this consumer acks as soon as it holds the run's
        lease, so the runs being resumed are ``recovering`` (this worker only).
        """
        stats = await self.consumer.queue.stats()
        health: dict[str, int | float] = {name: stats[name] for name in QUEUE_HEALTH_FIELDS}
        health["recovering"] = self.consumer.in_flight
        return health


# --------------------------------------------------------------------------------------------------- metrics

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("depth", "concierge_recovery_queue_depth", "Runs waiting in the recovery queue"),
    ("max_size", "concierge_recovery_queue_max_size", "Cap on waiting runs (RECOVERY_QUEUE_MAX_SIZE)"),
    ("dlq_depth", "concierge_recovery_dlq_depth", "Runs in the dead-letter queue"),
    ("oldest_age_s", "concierge_recovery_queue_oldest_age_seconds", "Age of the oldest waiting run"),
    ("in_flight", "concierge_recovery_queue_in_flight", "Deliveries taken and not yet acked"),
    ("recovered_total", "concierge_recovery_recovered_total", "Runs taken over by a recovery consumer (all workers)"),
    ("dead_lettered_total", "concierge_recovery_dead_lettered_total", "Runs sent to the DLQ (all workers)"),
    ("recovering", "concierge_recovery_recovering", "Runs this worker is resuming now"),
)


class QueueGauges(Collector):
    """The ``/health/queue`` figures as gauges. Collecting is synchronous, so the figures are refreshed (from Redis)
    by the ``/metrics`` request just before it collects; a failed refresh leaves them out rather than stale."""

    def __init__(self) -> None:
        self.latest: Mapping[str, int | float] = {}

    def collect(self) -> Iterable[Metric]:
        latest = self.latest
        families = []
        for field, name, help_text in _GAUGES:
            if field in latest:
                family = GaugeMetricFamily(name, help_text)
                family.add_metric([], float(latest[field]))
                families.append(family)
        return families

    def describe(self) -> Iterable[Metric]:
        return []


_gauges_by_registry: dict[int, tuple[CollectorRegistry, QueueGauges]] = {}


def install_queue_metrics(registry: CollectorRegistry | None = None) -> QueueGauges:
    """Register the queue gauges once per registry (default: the global one ``/metrics`` serves)."""
    registry = REGISTRY if registry is None else registry
    installed = _gauges_by_registry.get(id(registry))
    if installed is not None:
        return installed[1]
    gauges = QueueGauges()
    registry.register(gauges)
    _gauges_by_registry[id(registry)] = (registry, gauges)
    return gauges


class RefreshQueueGaugesOnScrape:
    """Pure ASGI: before ``GET /metrics`` is served, read the queue figures into the gauges."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") == "/metrics":
            worker: RecoveryWorker | None = getattr(scope["app"].state, "recovery", None)
            latest: Mapping[str, int | float] = {}
            if worker is not None:
                try:
                    async with asyncio.timeout(_SCRAPE_REFRESH_TIMEOUT_S):
                        latest = await worker.queue_health()
                except Exception as exc:
                    logger.warning("queue figures unavailable for /metrics: %s", exc)
            install_queue_metrics().latest = latest
        await self.app(scope, receive, send)


# --------------------------------------------------------------------------------------------------- the app


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    redis: Redis = app.state.redis
    instance = instance_name(settings.instance_id or f"{SERVICE}-{uuid.uuid4().hex[:8]}")
    name_instance(instance)  # the journal names the process as its run leases do
    durable = load_durable_graphs(settings.durable_agents)  # a package that declares none stops the start here
    presence = Presence(instance) if settings.presence_enabled else None
    if presence is not None:
        await presence.start()
    async with open_checkpointer() as saver, AsyncExitStack() as opened:
        app.state.checkpointer = saver
        deps: dict[Callable[..., Any], Any] = {}  # graphs that name the same dependencies share them
        for declared in durable:
            if declared.open_deps not in deps:
                deps[declared.open_deps] = await opened.enter_async_context(declared.open_deps(redis))
        # every version this code runs, current first (which takes runs of the shapes it migrates from)
        graphs = {d.name: d.versions(deps[d.open_deps], saver) for d in durable}
        worker = RecoveryWorker.for_graphs(redis, graphs, consumer_id=instance)
        app.state.recovery = worker
        install_queue_metrics()
        worker.start()
        logger.info("recovery worker %s scanning every %.2fs", instance, worker.scanner.interval)
        app.state.stopping.add(worker.consumer.stopping.set)
        try:
            yield
        finally:
            try:
                await worker.stop()
            finally:
                if presence is not None:
                    await presence.stop()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready})
app.add_middleware(RefreshQueueGaugesOnScrape)


class QueueHealth(BaseModel):
    """``GET /health/queue`` (documentation only)."""

    depth: int
    max_size: int
    dlq_depth: int
    oldest_age_s: float
    in_flight: int
    recovered_total: int
    dead_lettered_total: int
    recovering: int


@app.get("/health/queue", tags=["health"], responses={200: {"model": QueueHealth}})
async def queue_health(request: Request) -> dict[str, int | float]:
    """The queue's figures; with Redis down, 503 ``dependency_unavailable`` (the error table) with ``Retry-After``."""
    worker: RecoveryWorker = request.app.state.recovery
    return await worker.queue_health()
