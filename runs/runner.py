"""Executing one graph run under its lease; shared by booking-agent (first run) and the recovery worker (resumes).

``execute_run`` owns everything between "I hold the lease" and "the run is final or handed back":

- a heartbeat keeps the lease alive however long a node takes;
- ``fence_scope(lease.ensure_owned)``: every idempotent node checks the lease before its side effect, so an owner
  that lost it (paused process, partition) stops instead of running alongside the new owner;
- a detached budget: the run was accepted, so it gets its own time, not the budget of the request that created it;
  and ``wait_for_slots``: a full bulkhead on its way is waited out within that budget, never a failure;
- ``durability="sync"``: each step's checkpoint is on disk before the next step starts;
- ``journal_scope``: the steps, calls and handoff of the run go in its booking's journal (thread id = booking id);
- the ``stop`` event cancels the step in progress: a graceful shutdown hands the run back at once (lease released,
  enqueued for recovery) instead of waiting for the step, or the lease. The cancelled step runs again on the next
  owner from the last checkpoint; its side effects are deduplicated there (idempotent nodes, provider keys), and an
  idempotent node frees its claim when cancelled, so the resume does not wait for it.

``input=None`` resumes from the last checkpoint (``ainvoke(None)`` semantics); a dict starts the graph.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph

from domain.booking import ErrorCode, JournalKind
from graph.idempotency import fence_scope
from infra.error_table import answer_for
from infra.journal import flush as journal_flush
from infra.journal import journal_scope, note
from resilience.budget import detached_budget, remaining_budget
from resilience.bulkhead import wait_for_slots
from resilience.errors import BudgetExhaustedError
from runs.errors import LeaseLostError
from runs.leases import RunLease, RunStatus

logger = logging.getLogger(__name__)

HandOff = Callable[[str], Awaitable[object]]
"""Gives a released run (by thread id) to whoever resumes it next: the recovery queue, passed down by the caller."""

PAUSE_FIRST_S = 0.1
PAUSE_MAX_S = 2.0
"""How often a paused run asks whether the stores are back (doubling from the first to the last)."""

INTERRUPT_KEY = "__interrupt__"
"""The key of an interrupt in a stream's ``updates`` (LangGraph's ``INTERRUPT`` channel)."""


class RunOutcome(StrEnum):
    DONE = "done"
    """The graph reached END; the run is final."""
    HANDED_OFF = "handed_off"
    """Stopped for a shutdown (its step cancelled); lease released and the run enqueued for recovery."""
    LOST = "lost"
    """Another owner holds the run now; we stopped before our next side effect."""
    FAILED = "failed"
    """The attempt raised; the lease is released so the run can be retried."""


@dataclass(frozen=True)
class RunResult:
    outcome: RunOutcome
    values: dict[str, Any] | None = None
    error: BaseException | None = None


def run_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


async def execute_run(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    input: dict[str, Any] | None,
    *,
    budget_s: float,
    stop: asyncio.Event | None = None,
    hand_off: HandOff | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> RunResult:
    """Run (or resume) ``lease.thread_id`` to the end, to a handoff, or to a failure. Never raises but CancelledError.

    A step that fails because Redis or Postgres is unreachable (``dependency_unavailable`` in the error table, ours
    or a peer's) does not fail the run: it pauses until the stores answer and the lease is still ours, then resumes from the last
    checkpoint. The pause counts against the run's budget; a lease taken over meanwhile ends it as ``LOST``.
    """
    with journal_scope(lease.thread_id, fence=lease.fence):
        return await _execute(graph, lease, input, budget_s=budget_s, stop=stop, hand_off=hand_off, sleep=sleep)


async def _execute(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    input: dict[str, Any] | None,
    *,
    budget_s: float,
    stop: asyncio.Event | None,
    hand_off: HandOff | None,
    sleep: Callable[[float], Awaitable[None]],
) -> RunResult:
    config = run_config(lease.thread_id)
    run_input = input
    pauses = 0
    try:
        # an accepted run is a promise: a full bulkhead on its way delays it within its budget, never fails it
        with detached_budget(budget_s), wait_for_slots():
            while True:
                try:
                    return await _stream_to_the_end(graph, lease, run_input, config, stop, hand_off)
                except LeaseLostError:
                    raise
                except Exception as exc:
                    if answer_for(exc).code != ErrorCode.DEPENDENCY_UNAVAILABLE or (stop is not None and stop.is_set()):
                        raise
                    logger.warning("run %s paused: %s; resuming when the stores answer", lease.thread_id, exc)
                    # backs off across pauses too: a peer's store that stays down while ours answers is not polled
                    first = min(PAUSE_FIRST_S * 2**pauses, PAUSE_MAX_S)
                    pauses += 1
                    if not await _wait_for_the_stores(lease, stop, sleep, first=first):
                        await _hand_off_quietly(lease, hand_off)  # shutting down meanwhile
                        return RunResult(RunOutcome.HANDED_OFF)
                    run_input = None  # from the last checkpoint: the failed step runs again, its effects deduplicated
    except LeaseLostError as exc:
        logger.warning("run %s: lease lost (%s); leaving it to the new owner", lease.thread_id, exc)
        note(JournalKind.OWNER_LOST, owner=lease.owner, noticed_by=lease.owner, reason=str(exc))
        return RunResult(RunOutcome.LOST, error=exc)
    except asyncio.CancelledError:
        # forced shutdown after the drain period: hand back what we can without blocking the cancellation
        await asyncio.shield(_hand_off_quietly(lease, hand_off))
        raise
    except Exception as exc:
        logger.exception("run %s: attempt failed", lease.thread_id)
        await _release_quietly(lease, error=exc)
        return RunResult(RunOutcome.FAILED, error=exc)


async def _stream_to_the_end(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    run_input: dict[str, Any] | None,
    config: RunnableConfig,
    stop: asyncio.Event | None,
    hand_off: HandOff | None,
) -> RunResult:
    async with lease.keep_alive():
        # No status write here: creating or acquiring a lease already marks the run ``running``.
        with fence_scope(lease.ensure_owned, lease.fence):
            values = await _unless_stopped(_stream(graph, lease, run_input, config, stop), stop)
        if values is None:
            return await _hand_off(lease, hand_off)
        await lease.finish(RunStatus.DONE)
        return RunResult(RunOutcome.DONE, values)


async def _stream(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    run_input: dict[str, Any] | None,
    config: RunnableConfig,
    stop: asyncio.Event | None,
) -> dict[str, Any] | None:
    """The run's final values, or ``None`` when ``stop`` was seen at a step boundary."""
    # "values" gives the final state without reading the checkpoint back (a query per run);
    # "updates" shows an interrupt, the only way a run stops short of END without raising
    stream = graph.astream(run_input, config, stream_mode=["updates", "values"], durability="sync")
    values: dict[str, Any] = {}
    async with aclosing(stream):  # type: ignore[type-var]
        async for mode, item in stream:
            chunk = cast(dict[str, Any], item)
            if mode == "values":
                values = dict(chunk)
            elif INTERRUPT_KEY in chunk:
                # our graphs have none; a run that stopped there must not be reported done
                raise RuntimeError(f"run {lease.thread_id} stopped before END: {chunk[INTERRUPT_KEY]!r}")
            if stop is not None and stop.is_set():
                return None
    return values


async def _unless_stopped(
    work: Coroutine[Any, Any, dict[str, Any] | None], stop: asyncio.Event | None
) -> dict[str, Any] | None:
    """``await work``, but cancel it as soon as ``stop`` is set (``None`` then, unless it finished meanwhile)."""
    if stop is None:
        return await work
    task = asyncio.create_task(work)
    waiter = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            task.cancel()
            # let the step unwind (an idempotent node frees its claim on the way out), bounded like a handoff
            await asyncio.wait({task}, timeout=2)
        if task.done() and not task.cancelled():
            return task.result()
        return None
    finally:
        for pending in (task, waiter):
            pending.cancel()


async def _wait_for_the_stores(
    lease: RunLease, stop: asyncio.Event | None, sleep: Callable[[float], Awaitable[None]], *, first: float
) -> bool:
    """Back off until the run store answers and still names us the owner (``LeaseLostError`` if it does not);
    False when a shutdown began meanwhile.

    The heartbeat keeps running, so a Postgres outage with Redis up does not cost the lease; the budget bounds the
    whole pause (``BudgetExhaustedError`` once it is spent, which fails the attempt as any timeout does).
    """
    delay = first
    async with lease.keep_alive():
        while True:
            await sleep(min(delay, max(0.0, remaining_budget())))
            if stop is not None and stop.is_set():
                return False
            if remaining_budget() <= 0:
                raise BudgetExhaustedError(f"run {lease.thread_id}: the stores did not come back within its budget")
            try:
                await lease.ensure_owned()
            except LeaseLostError:
                raise
            except Exception as exc:
                if answer_for(exc).code != ErrorCode.DEPENDENCY_UNAVAILABLE:
                    raise
                delay = min(delay * 2, PAUSE_MAX_S)
                continue
            return True


async def _hand_off(lease: RunLease, hand_off: HandOff | None) -> RunResult:
    await lease.release()
    note(JournalKind.HANDED_OFF, owner=lease.owner, reason="shutdown")
    # this process's entries of the run land before whoever takes it next writes its own (``resumed``)
    await journal_flush()
    if hand_off is not None:
        await hand_off(lease.thread_id)
    logger.info("run %s handed off for recovery", lease.thread_id)
    return RunResult(RunOutcome.HANDED_OFF)


async def _hand_off_quietly(lease: RunLease, hand_off: HandOff | None) -> None:
    try:
        async with asyncio.timeout(2):
            await _hand_off(lease, hand_off)
    except Exception:
        logger.exception("run %s: handoff after cancellation failed; the scanner will find it", lease.thread_id)


async def _release_quietly(lease: RunLease, *, error: BaseException) -> None:
    try:
        await lease.set_status(RunStatus.PENDING, error=f"{type(error).__name__}: {error}")
    except Exception:
        logger.debug("run %s: could not record the error", lease.thread_id, exc_info=True)
    try:
        await lease.release()
    except Exception:
        logger.exception("run %s: could not release the lease; it will expire", lease.thread_id)
