"""The exceptions the run store and the run executor raise.

::

    Exception
     └── RunError                       base of everything below
          ├── RunStoreError             Redis failed (connection, timeout, script error); the cause is chained
          ├── LeaseLostError            another owner holds a higher fence, or this lease was released/ended:
          │                             the holder must stop writing for the run at once
          ├── RunNotFoundError          no run record for that thread id
          ├── RunFinalError             the run already reached a final status and cannot change to another one
          └── RunNotFinalError          the graph ran out of steps while what it runs for (the booking, the turn)
                                        is not final: an error, never ``done`` (a checkpoint of another shape)

``LeaseLostError`` is the one a graph runner must handle: it means "someone else is (or will be) running this
thread; anything you write now would race them". Fenced writes (``set_status(..., fence=...)``) raise it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

__all__ = [
    "LeaseLostError",
    "RunError",
    "RunFinalError",
    "RunNotFinalError",
    "RunNotFoundError",
    "RunStoreError",
    "redis_errors",
]


class RunError(Exception):
    """Base class of every error the runs package raises."""


class RunStoreError(RunError):
    """Redis could not be reached or refused a command; the original error is the ``__cause__``."""


class LeaseLostError(RunError):
    def __init__(self, thread_id: str, fence: int, reason: str) -> None:
        super().__init__(f"lease on run {thread_id!r} (fence {fence}) is lost: {reason}")
        self.thread_id = thread_id
        self.fence = fence
        self.reason = reason


class RunNotFoundError(RunError):
    def __init__(self, thread_id: str) -> None:
        super().__init__(f"no run record for thread {thread_id!r}")
        self.thread_id = thread_id


class RunFinalError(RunError):
    def __init__(self, thread_id: str, status: str) -> None:
        super().__init__(f"run {thread_id!r} is already final ({status}); its status cannot change")
        self.thread_id = thread_id
        self.status = status


class RunNotFinalError(RunError):
    def __init__(self, thread_id: str, detail: str) -> None:
        super().__init__(f"run {thread_id!r} has no next step but is not final ({detail}): not marked done")
        self.thread_id = thread_id


@contextmanager
def redis_errors(action: str, into: type[RunStoreError] = RunStoreError) -> Iterator[None]:
    """Convert redis-py errors into ``into`` (a ``RunStoreError``) at the package boundary."""
    try:
        yield
    except RedisError as exc:
        raise into(f"{action} failed: {exc}") from exc
