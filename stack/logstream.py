"""Service-prefixed log streaming for ``concierge up`` in the foreground.

Children write straight to their log files (so a service keeps logging even if the supervisor dies, and a detached
stack has the same logs); the foreground supervisor follows those files and prints each new line as
``<name> | <line>``. Offsets are taken when the streamer is created, before anything starts: nothing is missed
and an old run's lines are not replayed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

__all__ = ["POLL_INTERVAL_S", "LogStreamer", "last_line"]

POLL_INTERVAL_S = 0.1
_COLOURS = (36, 33, 35, 32, 34, 31, 96, 93, 95, 92, 94)


class LogStreamer:
    def __init__(self, sources: Sequence[tuple[str, Path]], *, out: TextIO | None = None) -> None:
        self._out = out or sys.stdout
        self._colour = self._out.isatty()
        width = max((len(name) for name, _ in sources), default=0)
        self._sources = [(self._prefix(i, name, width), path) for i, (name, path) in enumerate(sources)]
        self._offsets = {path: _size(path) for _, path in sources}
        self._partial: dict[Path, bytes] = {}

    def _prefix(self, index: int, name: str, width: int) -> str:
        padded = f"{name:<{width}} |"
        if not self._colour:
            return padded
        return f"\x1b[{_COLOURS[index % len(_COLOURS)]}m{padded}\x1b[0m"

    def pump(self) -> None:
        """Print whatever was appended since the last call (whole lines only)."""
        for prefix, path in self._sources:
            chunk = self._read_new(path)
            if not chunk:
                continue
            data = self._partial.pop(path, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            for line in lines:
                self._out.write(f"{prefix} {line.decode('utf-8', errors='replace').rstrip()}\n")
        self._out.flush()

    def _read_new(self, path: Path) -> bytes:
        offset = self._offsets.get(path, 0)
        try:
            with path.open("rb") as fh:
                fh.seek(0, 2)
                end = fh.tell()
                if end < offset:  # truncated: start over
                    offset = 0
                fh.seek(offset)
                chunk = fh.read(end - offset)
        except FileNotFoundError:
            return b""
        self._offsets[path] = offset + len(chunk)
        return chunk

    async def run(self, interval: float = POLL_INTERVAL_S) -> None:
        """Follow the files until cancelled; prints what is left on the way out."""
        try:
            while True:
                # local files, a few KiB at a time: cheaper than a thread hop, and prints stay in one thread
                self.pump()
                await asyncio.sleep(interval)
        finally:
            self.pump()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def last_line(path: Path, *, limit: int = 300) -> str:
    """The last meaningful line of a log (not the ``$ command`` header the supervisor writes), or ``""``."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            lines = [line.strip() for line in fh.read().decode("utf-8", errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line and not line.startswith("$ ")]
    return lines[-1][:limit] if lines else ""
