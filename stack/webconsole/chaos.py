"""The console's chaos button: one short ``concierge chaos`` at a time, run as a subprocess, its output kept for the
page to show as it grows.

The run is the CLI command itself (``stack.chaos``) with the console's environment, which the supervisor (or
compose) gave it: the same stack, data directory and admin token. It never faults the console. Stopping it (the
page's Stop, or the console shutting down) is a SIGINT: chaos heals everything and still prints its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.params import Depends
from pydantic import BaseModel, ConfigDict, Field

from stack.errors import ConsoleRefusedError

__all__ = ["ChaosForm", "ChaosRunner", "add_chaos_routes"]

MAX_LINES = 500
STOP_GRACE_S = 60.0


class ChaosForm(BaseModel):
    """What the page may ask for: a short run (the CLI takes longer ones), a seed to replay, a light load."""

    model_config = ConfigDict(extra="forbid")

    duration_s: int = Field(default=30, ge=5, le=120)
    seed: int | None = Field(default=None, ge=0, le=2**31)
    clients: int = Field(default=4, ge=0, le=16)

    def argv(self) -> list[str]:
        argv = ["chaos", "--duration", str(self.duration_s), "--clients", str(self.clients), "--settle", "90"]
        return argv + (["--seed", str(self.seed)] if self.seed is not None else [])


class ChaosRunner:
    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: deque[str] = deque(maxlen=MAX_LINES)
        self.started_at: float | None = None
        self.exit_code: int | None = None
        self.argv: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def status(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "started_at": self.started_at,
            "command": " ".join(["concierge", *self.argv]) if self.argv else None,
            "exit_code": self.exit_code,
            "lines": list(self.lines),
        }

    async def start(self, form: ChaosForm) -> dict[str, Any]:
        if self.running:
            raise ConsoleRefusedError("a chaos run is already running; stop it or wait for its verdict")
        self.argv = form.argv()
        self.lines.clear()
        self.exit_code = None
        self.started_at = time.time()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "stack.cli",
            *self.argv,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self._reader = asyncio.create_task(self._read(self.proc), name="chaos-output")
        return self.status()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))
        self.exit_code = await proc.wait()

    def stop(self) -> dict[str, Any]:
        if not self.running or self.proc is None:
            raise ConsoleRefusedError("no chaos run is running")
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        return self.status()

    async def close(self) -> None:
        """The console is stopping: the run heals and ends (killed if it takes longer than ``STOP_GRACE_S``)."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


def add_chaos_routes(app: FastAPI, dependencies: Sequence[Depends] = ()) -> None:
    """``GET|POST|DELETE /api/chaos``: the run's output so far, start one, stop it (heal and judge now);
    ``dependencies`` guard each (the console's: the operator only)."""
    guard = list(dependencies)

    def runner_of(request: Request) -> ChaosRunner:
        runner: ChaosRunner = request.app.state.chaos
        return runner

    @app.get("/api/chaos", tags=["console"], dependencies=guard)
    async def chaos_status(request: Request) -> dict[str, Any]:
        return runner_of(request).status()

    @app.post("/api/chaos", tags=["console"], status_code=202, dependencies=guard)
    async def chaos_start(request: Request, form: ChaosForm) -> dict[str, Any]:
        return await runner_of(request).start(form)

    @app.delete("/api/chaos", tags=["console"], status_code=202, dependencies=guard)
    async def chaos_stop(request: Request) -> dict[str, Any]:
        return runner_of(request).stop()
