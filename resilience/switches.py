"""The one idiom for process-wide switches: set now, put back when the ``with`` block ends.

``set_testing``, ``configure_budget`` and ``graph.use_tracer_provider`` each change a global and return a
``Restore``: the change is already in effect, and leaving ``with ... :`` (or calling ``restore()``) puts the previous
value back, so a test cannot leak its setting into the next one (stamina's ``set_testing`` works the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Generic, Self, TypeVar

__all__ = ["Restore"]

T = TypeVar("T")


class Restore(Generic[T]):
    """The previous value of a switch, and how to put it back."""

    def __init__(self, previous: T, put_back: Callable[[T], None]) -> None:
        self.previous = previous
        self._put_back = put_back

    def restore(self) -> None:
        self._put_back(self.previous)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()
