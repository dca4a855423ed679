"""What ``/health`` says about the process itself, and the layer switch every service obeys.

Vitals: the event loop's lag (how late a 100 ms sleep wakes up: the latest and the worst of the last 2 s), RSS,
the app's open Redis connections, bulkhead slots held, calls inside each outbound policy, the runs in flight (the
service's ``app.state.runs_in_flight``, when it has runs) and whether the layers are on. One background task samples
the lag and reads the switch; ``/health`` reads everything else when asked.

The switch: the key ``<prefix>:layers:off``, set with a TTL by ``bench/cascade.py`` and ``concierge demo cascade``
(``layers_switched_off``, a ``Restore``: leaving its block deletes the key). Every service reads it twice a second
and calls ``resilience.set_layers``; if whoever set it dies, the TTL puts the layers back on by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from infra.redis import connection_counts, key
from process.tasks import stop_task
from resilience import Restore, bulkhead_registry, calls_in_flight, layers_on, set_layers

__all__ = ["LAYERS_OFF_KEY", "Vitals", "layers_off_key", "layers_switched_off", "rss_kib"]

logger = logging.getLogger(__name__)

LAYERS_OFF_KEY = ("layers", "off")
TICK_S = 0.1
READ_SWITCH_EVERY = 5
"""Ticks between two reads of the switch (0.5 s)."""
LAG_WINDOW = 20


def layers_off_key(prefix: str | None = None) -> str:
    return key(*LAYERS_OFF_KEY, prefix=prefix)


def layers_switched_off(client: Any, ttl_s: float, *, prefix: str | None = None) -> Restore[bool]:
    """Switch the layers off, for at most ``ttl_s``, in every service of the stack whose Redis ``client`` (sync) is
    and whose key prefix is ``prefix`` (default: this process's). Effective within half a second; ``restore()`` (or
    leaving ``with``) puts back what was there."""
    name = layers_off_key(prefix)
    was_off = bool(client.exists(name))
    client.set(name, "1", px=max(1, int(ttl_s * 1000)))

    def put_back(previous: bool) -> None:
        if not previous:
            client.delete(name)

    return Restore(was_off, put_back)


def rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Vitals:
    """The sampler task and the snapshot ``/health`` shows. ``clock`` and ``sleep`` are injectable."""

    def __init__(
        self,
        redis: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._sleep = sleep
        self._lags: deque[float] = deque(maxlen=LAG_WINDOW)
        self.runs_in_flight: Callable[[], int] | None = None

    async def read_switch(self) -> None:
        try:
            off = bool(await self._redis.exists(layers_off_key()))
        except Exception as exc:  # Redis away: keep the last state, the next read tries again
            logger.debug("layer switch unread: %s", exc)
            return
        if off == layers_on():
            logger.warning("resilience layers switched %s", "off" if off else "on")
            set_layers(not off)

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0
        while not stop.is_set():
            started = self._clock()
            await self._sleep(TICK_S)
            self._lags.append(max(0.0, self._clock() - started - TICK_S))
            if tick % READ_SWITCH_EVERY == 0:
                await self.read_switch()
            tick += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The sampler for the app's lifetime; the layers back on when it ends (a switch must not outlive it)."""
        stop = asyncio.Event()
        await self.read_switch()
        task = asyncio.create_task(self.run(stop), name="vitals")
        try:
            yield
        finally:
            await stop_task(task, within=1.0, what="the vitals sampler", stop=stop)
            set_layers(True)

    def snapshot(self) -> dict[str, Any]:
        lags = list(self._lags)
        return {
            "layers": "on" if layers_on() else "off",
            "loop_lag_ms": round(lags[-1] * 1000, 2) if lags else 0.0,
            "loop_lag_max_ms": round(max(lags) * 1000, 2) if lags else 0.0,
            "rss_kib": rss_kib(),
            "redis_connections": connection_counts(self._redis),
            "bulkheads_held": {name: s["in_use"] for name, s in bulkhead_registry.stats().items()},
            "calls_in_flight": calls_in_flight(),
            "runs_in_flight": None if self.runs_in_flight is None else self.runs_in_flight(),
        }
