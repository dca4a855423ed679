"""The exceptions the recovery queue, DLQ and scanner raise (on top of ``runs.errors``).

::

    runs.errors.RunError
     └── RecoveryError                  base of the errors below
          └── RecoveryStoreError        Redis failed under the queue or the scanner; also a ``RunStoreError``,
                                        so one ``except RunStoreError`` covers every Redis failure of a run

A consumer catches ``RunError``: whatever the run store or the queue raised, the delivery comes back later.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from runs.errors import RunError, RunStoreError
from runs.errors import redis_errors as _run_redis_errors

__all__ = ["RecoveryError", "RecoveryStoreError", "redis_errors"]


class RecoveryError(RunError):
    """Base class of every error the recovery package raises."""


class RecoveryStoreError(RecoveryError, RunStoreError):
    """Redis could not be reached or refused a command; the original error is the ``__cause__``."""


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Convert redis-py errors into ``RecoveryStoreError`` at the package boundary."""
    with _run_redis_errors(action, RecoveryStoreError):
        yield
