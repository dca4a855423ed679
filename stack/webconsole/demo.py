"""The console's cascade button: ``concierge demo cascade [--layers off]`` run for the page, its narration streamed.

One demo at a time (a second start is refused): it drives the whole stack. The demo is the CLI command itself,
a child process of the console, so the page tells exactly what the terminal would, and its own ``finally`` (fault
cleared, layers back on) runs when it ends or is stopped (SIGINT, as Ctrl-C).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["DemoRunner", "DemoState"]

MAX_LINES = 2000
STOP_GRACE_S = 10.0


@dataclass
class DemoState:
    layers: str
    lines: list[str] = field(default_factory=list)
    exit_code: int | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, line: str) -> None:
        if len(self.lines) < MAX_LINES:
            self.lines.append(line)
        self.changed.set()


class DemoRunner:
    """The running (or last) demo: start, stop, follow its lines."""

    def __init__(self) -> None:
        self.current: DemoState | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self, layers: str) -> DemoState:
        if self.running:
            raise RuntimeError("a demo is running already")
        state = DemoState(layers)
        argv = [sys.executable, "-m", "stack.cli", "demo", "cascade", "--layers", layers]
        self._process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        self.current = state
        self._task = asyncio.create_task(self._pump(self._process, state), name="cascade demo")
        return state

    async def _pump(self, process: asyncio.subprocess.Process, state: DemoState) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            state.add(raw.decode(errors="replace").rstrip("\n"))
        state.exit_code = await process.wait()
        state.changed.set()

    async def stop(self) -> None:
        """SIGINT (its ``finally`` restores the stack), then SIGKILL if it has not ended within the grace."""
        process, task = self._process, self._task
        if process is None or task is None or task.done():
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await task

    async def follow(self, state: DemoState) -> AsyncIterator[str]:
        """Every line of ``state`` from the first, then the new ones as they come, until the demo ends."""
        sent = 0
        while True:
            state.changed.clear()
            while sent < len(state.lines):
                yield state.lines[sent]
                sent += 1
            if state.exit_code is not None:
                return
            await state.changed.wait()

    async def aclose(self) -> None:
        await self.stop()
