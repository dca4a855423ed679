"""The recovery worker's shutdown ends within a bound even when a cancellation is lost on the way (real Redis).

On Python 3.11 redis-py can swallow a cancellation that lands as a command's write completes (its
``asyncio.wait_for``); the orphan scanner then kept scanning, "cancelling", and the worker's lifespan shutdown
waited for it for ever (seen in the SIGTERM chaos test). Every wait below is ``asyncio.wait`` with a timeout, not
``asyncio.timeout``: a bare ``await`` on a task that ignores its cancellation cannot be cut off by cancelling the
waiter, which is exactly the hang these tests must report as a failure rather than reproduce.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents import recovery_worker
from agents.recovery_worker import RecoveryWorker
from infra.settings import get_settings
from process.tasks import stop_task
from recovery import DeadLetterQueue, OrphanScanner, QueueGuard
from recovery.consumer import ConsumerConfig
from runs import RunStore
from runs.presence import PresenceMonitor, SweepResult

BOUND_S = 15.0
"""Far above what a stop takes here (a fraction of a second); only a hang reaches it."""


async def ends_within(step: Coroutine[Any, Any, object], seconds: float = BOUND_S) -> asyncio.Task[object]:
    task = asyncio.ensure_future(step)
    await asyncio.wait({task}, timeout=seconds)
    assert task.done(), f"still running after {seconds:.0f}s: the shutdown hangs"
    return task


@contextlib.contextmanager
def lost_cancellations() -> Iterator[Callable[[float], Awaitable[None]]]:
    """A sleep that swallows its cancellation, as redis-py's write can; back to normal when the block ends."""
    swallowing = True

    async def sleep(seconds: float) -> None:
        if not swallowing:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(seconds)

    try:
        yield sleep
    finally:
        swallowing = False


def worker_for(redis: object, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> RecoveryWorker:
    worker = RecoveryWorker.for_graphs(
        redis,  # type: ignore[arg-type]
        {},
        consumer_id=f"recovery-worker-{uuid.uuid4().hex[:8]}",
        config=ConsumerConfig(take_wait=0.05),
    )
    store = RunStore(redis)  # type: ignore[arg-type]
    guard = QueueGuard(redis, DeadLetterQueue(redis))  # type: ignore[arg-type]
    worker.scanner = OrphanScanner(
        redis,  # type: ignore[arg-type]
        store,
        guard,
        interval=0.02,
        presence=PresenceMonitor(redis, restart_grace=0),  # type: ignore[arg-type]
        sleep=sleep,
    )
    return worker


async def test_the_worker_stops_although_its_scanner_loses_its_cancellation(redis: object) -> None:
    asleep = asyncio.Event()
    with lost_cancellations() as stubborn_sleep:

        async def sleep_after_a_scan(seconds: float) -> None:
            # long enough that the stop lands here, however slowly a loaded machine runs the scan before it
            asleep.set()
            await stubborn_sleep(max(seconds, BOUND_S))

        worker = worker_for(redis, sleep=sleep_after_a_scan)
        worker.start()
        scanner_task = worker._tasks[0]
        await ends_within(asleep.wait())  # a scan done, the scanner asleep where its cancellation is lost

        await ends_within(worker.stop(grace=1.0))
        # the flag ended the loop the cancellation did not: nothing is left running to hold the process
        await asyncio.wait({scanner_task}, timeout=BOUND_S)
        assert scanner_task.done() and not scanner_task.cancelled(), "ended by its flag, its cancellation lost"


async def test_a_scanner_stopped_in_the_middle_of_its_redis_calls_always_ends(redis: object) -> None:
    # No fake here: a stop lands at many points of the real scan (presence sweep, expiry query, enqueue). Some of
    # those cancellations are swallowed by redis-py on Python 3.11; before the stop flag about one stop in fifteen
    # left the scanner running.
    store = RunStore(redis)  # type: ignore[arg-type]
    guard = QueueGuard(redis, DeadLetterQueue(redis))  # type: ignore[arg-type]
    for n in range(60):
        scanner = OrphanScanner(
            redis,  # type: ignore[arg-type]
            store,
            guard,
            interval=0.001,
            presence=PresenceMonitor(redis, restart_grace=0),  # type: ignore[arg-type]
        )
        task = asyncio.create_task(scanner.run(), name=f"orphan-scanner-{n}")
        await asyncio.sleep(0.0005 * (n % 20))
        stopped = await stop_task(task, stop=scanner.stopping, within=2.0)
        assert stopped and task.done(), f"stop {n}: the scanner is still running"


async def test_the_worker_lifespan_shutdown_ends_although_a_cancellation_is_lost(
    redis: object, settings_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the real service: shell, presence, checkpointer (SQLite here), booking deps, scanner and consumer
    settings_env.setenv("CONCIERGE_DATA_DIR", str(tmp_path))
    settings_env.setenv("PRESENCE_ENABLED", "true")
    settings_env.setenv("PRESENCE_SCAN_INTERVAL", "0.02")
    settings_env.delenv("DATABASE_URL", raising=False)
    get_settings.cache_clear()
    swallowing = True
    real_sweep = PresenceMonitor.sweep

    async def sweep_that_loses_its_cancellation(self: PresenceMonitor) -> SweepResult:
        result = await real_sweep(self)
        if swallowing:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)
        return result

    settings_env.setattr(PresenceMonitor, "sweep", sweep_that_loses_its_cancellation)
    app = recovery_worker.app
    lifespan = app.router.lifespan_context(app)
    try:
        await ends_within(lifespan.__aenter__())
        await asyncio.sleep(0.2)  # the scanner sweeps a few times
        with caplog.at_level(logging.INFO):
            await ends_within(lifespan.__aexit__(None, None, None))
    finally:
        swallowing = False
    assert any("recovery-worker stopped" in r.getMessage() for r in caplog.records)
