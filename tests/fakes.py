"""Test doubles shared by the unit tests (time only: everything else in this suite is real)."""

from __future__ import annotations


class FakeClock:
    """A monotonic clock that moves only when a test says so: ``clock.now += 5``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
