"""Stopping a background task, or running one shutdown step, within a bound, whatever the awaited code does with a
cancellation.

A cancellation can be lost. On Python 3.11 ``asyncio.wait_for`` returns the inner result instead of raising when
the cancel lands in the loop iteration where the inner call completes, and redis-py sends every command through it
(``socket_timeout``): a loop that runs "until cancelled" then carries on, its task "cancelling" for ever, and
whoever ``await``s that task hangs with it (the recovery worker's shutdown did, waiting for its orphan scanner).
So a loop also watches a stop flag, and whoever stops it waits with ``asyncio.wait`` (which neither hangs on such
a task nor swallows a cancellation aimed at the waiter) for a bounded time, and says in the log what did not stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

__all__ = ["bounded_step", "drain_tasks", "stop_task"]

logger = logging.getLogger(__name__)


async def stop_task(
    task: asyncio.Task[Any], *, within: float, what: str | None = None, stop: asyncio.Event | None = None
) -> bool:
    """Set ``stop`` (the loop's flag, if it has one), cancel ``task`` and wait up to ``within`` seconds for it to end.

    True when it ended; otherwise a warning names ``what`` (default: the task's name) and the task is left to
    end on its own (its flag ends it at its next turn). An error it ended with is logged, never raised: a
    shutdown goes on.
    """
    if stop is not None:
        stop.set()
    if task.done():
        _log_failure(task, what)
        return True
    task.cancel()
    await asyncio.wait({task}, timeout=within)
    if not task.done():
        logger.warning("%s did not stop within %.1fs; leaving it to end on its own", what or task.get_name(), within)
        return False
    if not task.cancelled() and stop is not None:
        logger.info("%s ended on its stop flag: its cancellation was lost on the way", what or task.get_name())
    _log_failure(task, what)
    return True


async def drain_tasks(
    tasks: Iterable[asyncio.Task[Any]], *, grace: float, what: str, cancelled_grace: float = 5.0
) -> None:
    """A service's SIGTERM: give its run tasks ``grace`` seconds to stop at a step boundary and hand their runs back,
    then cancel the rest and wait ``cancelled_grace`` more (a cancelled run hands itself back); never hangs on one."""
    pending = set(tasks)
    if not pending:
        return
    logger.info("%s: draining %d run(s)", what, len(pending))
    _done, pending = await asyncio.wait(pending, timeout=grace)
    for task in pending:
        task.cancel()
    if pending:
        _done, stuck = await asyncio.wait(pending, timeout=cancelled_grace)
        if stuck:
            logger.warning(
                "%s: %d run task(s) did not end within %.0fs of their cancellation (%s); their leases will expire",
                what,
                len(stuck),
                cancelled_grace,
                ", ".join(sorted(task.get_name() for task in stuck)),
            )


async def bounded_step(step: Coroutine[Any, Any, object], *, within: float, what: str) -> bool:
    """Run one shutdown step for at most ``within`` seconds: True when it finished (an error it raised is logged), False
    when it had to be cancelled (logged, naming ``what``). Never raises but a cancellation aimed at the caller."""
    task = asyncio.ensure_future(step)
    try:
        await asyncio.wait({task}, timeout=within)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        logger.warning("%s did not finish within %.1fs; the shutdown goes on without it", what, within)
        return False
    _log_failure(task, what)
    return True


def _log_failure(task: asyncio.Task[Any], what: str | None) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        logger.warning("%s ended with an error", what or task.get_name(), exc_info=error)
