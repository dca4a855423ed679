"""Bounded stops: a task that ignores its cancellation, or a step that never ends, is named and left behind."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from process.tasks import bounded_step, stop_task


async def test_a_loop_that_loses_its_cancellation_ends_on_its_flag(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # a library that ate the cancellation
                await asyncio.sleep(0.01)

    task = asyncio.create_task(loop(), name="the loop")
    await asyncio.sleep(0)
    with caplog.at_level(logging.INFO, logger="process.tasks"):
        assert await stop_task(task, stop=stop, within=5)
    assert task.done() and not task.cancelled()
    assert "the loop ended on its stop flag" in caplog.text


async def test_a_task_that_does_not_stop_is_named_and_left_behind(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.01)

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="process.tasks"):
        assert not await stop_task(task, within=0.05, what="the stubborn loop")
    assert "the stubborn loop did not stop" in caplog.text
    release.set()
    await asyncio.wait({task}, timeout=5)


async def test_an_ordinary_task_is_cancelled_and_its_error_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    sleeper = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    assert await stop_task(sleeper, within=5)
    assert sleeper.cancelled()

    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails(), name="failing")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="process.tasks"):
        assert await stop_task(failed, within=5)
    assert "failing ended with an error" in caplog.text


async def test_a_step_that_never_ends_is_cut_off_and_named(caplog: pytest.LogCaptureFixture) -> None:
    never = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="process.tasks"):
        assert not await bounded_step(never.wait(), within=0.05, what="closing the thing")
    assert "closing the thing did not finish" in caplog.text
    assert await bounded_step(asyncio.sleep(0), within=5, what="a quick step")
