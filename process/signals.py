"""Acting on SIGTERM the moment it arrives, ahead of the server's own graceful stop.

uvicorn turns SIGTERM into "stop accepting, wait for open requests (long polls included), then run the lifespan
shutdown": a booking run would keep working through all of that before it is handed back. ``on_terminate`` runs a
callback first (on the event loop) and then calls the handler that was installed before, so the server still stops
as it always did.

``Stopping`` is what requests that hold a connection watch (``app.state.stopping``, set by the service shell on
SIGTERM): a long-poll answers what it knows and a stream ends at once, instead of holding uvicorn's graceful
timeout and then being cancelled into a 500. What arrives meanwhile is refused with ``ShuttingDownError`` (503
``shutting_down``, ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["RETRY_AFTER_SHUTDOWN_S", "ShuttingDownError", "Stopping", "on_terminate"]

logger = logging.getLogger(__name__)

RETRY_AFTER_SHUTDOWN_S = 1.0
"""What a request refused by a stopping service is told to wait: a replica answers at once, a restart in seconds."""


class ShuttingDownError(Exception):
    """This process is stopping: send the request again (to a replica, or once restarted) after ``retry_after``."""

    def __init__(self, service: str) -> None:
        super().__init__(f"{service} is shutting down: send it again after Retry-After")
        self.retry_after = RETRY_AFTER_SHUTDOWN_S


class Stopping:
    """Set once, the moment the process is told to stop; runs what was registered with ``add`` then (on the loop).

    Requests that hold their connection watch it: ``is_set()`` between two polls, or ``wait()``.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._callbacks: list[Callable[[], object]] = []

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def add(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` when stopping begins (at once if it has); a failing one is logged, the others still run."""
        self._callbacks.append(callback)
        if self._event.is_set():
            self._run(callback)

    def set(self) -> None:
        if self._event.is_set():
            return
        self._event.set()
        for callback in self._callbacks:
            self._run(callback)

    @staticmethod
    def _run(callback: Callable[[], object]) -> None:
        try:
            callback()
        except Exception:
            logger.exception("a stop callback failed")


_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def on_terminate(callback: Callable[[], object]) -> Iterator[None]:
    """Within the block, SIGTERM/SIGINT call ``callback`` on the running loop, then the previous handler.

    Installs nothing where no Python handler was there to chain to (no server, e.g. an app under test in process)
    or outside the main thread: the default action of a signal is not ours to change.
    """
    loop = asyncio.get_running_loop()
    previous: dict[int, Callable[[int, FrameType | None], object]] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)
        previous[signum](signum, frame)

    for sig in _SIGNALS:
        try:
            current = signal.getsignal(sig)
            if callable(current):
                previous[sig] = current
                signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break
    try:
        yield
    finally:
        for signum, before in previous.items():
            with contextlib.suppress(ValueError):
                if signal.getsignal(signum) is handler:
                    signal.signal(signum, before)
