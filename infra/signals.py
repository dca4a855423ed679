"""Acting on SIGTERM the moment it arrives, ahead of the server's own graceful stop.

uvicorn turns SIGTERM into "stop accepting, wait for open requests (long polls included), then run the lifespan
shutdown": a booking run would keep working through all of that before it is handed back. ``on_terminate`` runs a
callback first (on the event loop) and then calls the handler that was installed before, so the server still stops
as it always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["on_terminate"]

logger = logging.getLogger(__name__)

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
