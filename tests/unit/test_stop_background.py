"""A helper task that swallows its cancellation must not hold the node that owns it."""

import asyncio
import contextlib

from graph.idempotency import _stop_background


async def test_a_renewal_that_swallows_its_cancellation_still_stops() -> None:
    stop = asyncio.Event()
    turns = 0

    async def stubborn_renewal() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            # a library call that turns our cancellation into "try again later"
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    task = asyncio.create_task(stubborn_renewal(), name="stubborn")
    await asyncio.sleep(0.01)
    await asyncio.wait_for(_stop_background(task, stop), timeout=5)
    await asyncio.wait_for(task, timeout=1)
    assert task.done() and not task.cancelled()


async def test_an_ordinary_renewal_is_cancelled_at_once() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    await _stop_background(task, stop)
    assert task.cancelled()
