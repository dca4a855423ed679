"""Executing one graph run under its lease; shared by booking-agent (first run) and the recovery worker (resumes).

``execute_run`` owns everything between "I hold the lease" and "the run is final or handed back":

- a heartbeat keeps the lease alive however long a node takes;
- ``fence_scope(lease.ensure_owned)``: every idempotent node checks the lease before its side effect, so an owner
  that lost it (paused process, partition) stops instead of running alongside the new owner;
- a detached budget: the run was accepted, so it gets its own time, not the budget of the request that created it;
  and ``wait_for_slots``: a full bulkhead on its way is waited out within that budget, never a failure;
- ``wait_out_outages``: a step that meets an open breaker (ours or a peer's) raises ``OutageWaitError`` and the run
  pauses until the breaker may let a probe through (with jitter), holding nothing but its lease (no slot, no
  connection, no call in progress), then runs the step again from the last checkpoint (deduplicated as every re-run
  is). A pause that does not fit the budget is not taken: the step runs once more without waiting and takes the
  outage as its answer (the booking fails, compensated). One WARNING line per pause, no traceback;
- ``durability="sync"``: each step's checkpoint is on disk before the next step starts;
- ``journal_scope``: the steps, calls and handoff of the run go in its booking's journal (thread id = booking id);
- the ``stop`` event cancels the step in progress: a graceful shutdown hands the run back at once (lease released,
  enqueued for recovery) instead of waiting for the step, or the lease. The cancelled step runs again on the next
  owner from the last checkpoint; its side effects are deduplicated there (idempotent nodes, provider keys), and an
  idempotent node frees its claim when cancelled, so the resume does not wait for it.

Every resume (``input`` not a fresh dict) first compares the run's recorded graph version with ``graph``'s
(``runs.versions``): a run of another shape is set aside (``awaiting_version``) for a process that runs its version,
never resumed here. A graph that runs out of steps while ``is_final`` says no is an error (``RunNotFinalError``),
never ``done``. docs/upgrades.md.

``input=None`` resumes from the last checkpoint (``ainvoke(None)`` semantics); a dict starts the graph; a
``Command(resume=...)`` answers the ``interrupt()`` the run stopped at.

A run that reaches an ``interrupt()`` (the concierge's approval) is *parked* (``RunLease.park``): not done, not
failed, not recoverable; its record keeps what it waits for until ``RunStore.decide`` records the answer and takes it
up again. Whoever then resumes it from the last checkpoint (that caller, or the recovery worker after a crash) finds
the answer on the record and resumes with ``Command(resume=answer)`` while the checkpoint still waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, Interrupt

from domain.booking import JournalKind
from domain.errors import ErrorCode
from graph.idempotency import fence_scope
from infra.error_table import answer_for, is_outage
from infra.journal import flush as journal_flush
from infra.journal import journal_scope, note
from resilience.budget import detached_budget, remaining_budget
from resilience.bulkhead import wait_for_slots
from resilience.errors import BudgetExhaustedError, OutageWaitError
from resilience.outages import outage_pause, pause_fits, wait_out_outages
from runs.errors import LeaseLostError, RunNotFinalError
from runs.leases import RunLease, RunStatus
from runs.versions import graph_fingerprint, legacy_version, version_label

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
    PARKED = "parked"
    """Stopped at an ``interrupt()``, waiting for a person; ``values`` holds the interrupt's payload."""
    WAITING = "waiting_for_version"
    """Not resumed: the run started on another version of the graph; set aside for a process that runs it."""


@dataclass(frozen=True)
class RunResult:
    outcome: RunOutcome
    values: dict[str, Any] | None = None
    error: BaseException | None = None


def run_config(thread_id: str, version: str | None = None) -> RunnableConfig:
    """The thread's config; ``version`` (the graph's fingerprint) goes into every checkpoint's metadata."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    if version:
        config["metadata"] = {"graph_version": version}
    return config


Finished = Callable[[Mapping[str, Any]], bool]
"""Whether a run's final values are final for what it runs for (the booking's status, the turn's outcome)."""


RunInput = dict[str, Any] | Command[Any] | None


async def execute_run(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    input: RunInput,
    *,
    budget_s: float,
    stop: asyncio.Event | None = None,
    hand_off: HandOff | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    promised_until: float | None = None,
    is_final: Finished | None = None,
) -> RunResult:
    """Run (or resume) ``lease.thread_id`` to the end, to a handoff, or to a failure. Never raises but CancelledError.

    A step that fails because Redis or Postgres is unreachable (``dependency_unavailable`` in the error table, ours
    or a peer's) does not fail the run: it pauses until the stores answer and the lease is still ours, then resumes
    from the last checkpoint. The pause counts against the run's budget; a lease taken over meanwhile ends it as
    ``LOST``. A step meeting an open breaker pauses only while the pause fits the budget and ends before
    ``promised_until`` (seconds since the epoch: the accepted booking's own deadline, which a resumed attempt keeps).
    """
    with journal_scope(lease.thread_id, fence=lease.fence):
        return await _execute(
            graph,
            lease,
            input,
            budget_s=budget_s,
            stop=stop,
            hand_off=hand_off,
            sleep=sleep,
            promised_until=promised_until,
            is_final=is_final,
        )


async def set_aside_unless_ours(graph: CompiledStateGraph[Any, Any, Any, Any], lease: RunLease) -> RunResult | None:
    """``WAITING`` (the run set aside) when the run's recorded version is not ``graph``'s; ``None`` when it is.

    A record older than versions counts as its graph's first recorded version (``runs.versions.legacy_version``).
    """
    record = await lease.store.get(lease.thread_id)
    if record is None:
        return None
    recorded = record.version or legacy_version(record.graph)
    ours = graph_fingerprint(graph)
    if recorded is None or recorded == ours:
        return None
    await set_aside(lease, record.graph, recorded, ours)
    return RunResult(RunOutcome.WAITING, {"version": version_label(record.graph, recorded)})


async def set_aside(lease: RunLease, graph_name: str, version: str, runs: str | None) -> None:
    """Set the run aside for ``version`` and say so in its journal and the log (``runs``: what this code runs)."""
    label = version_label(graph_name, version)
    running = version_label(graph_name, runs) if runs else "no version of it"
    await lease.set_aside(version)
    logger.warning(
        "run %s: started on graph version %s, this process runs %s: it waits", lease.thread_id, label, running
    )
    with journal_scope(lease.thread_id, fence=lease.fence):
        note(JournalKind.WAITING_FOR_VERSION, version=label, fingerprint=version, runs=running, graph=graph_name)
    await journal_flush()


async def _execute(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    input: RunInput,
    *,
    budget_s: float,
    stop: asyncio.Event | None,
    hand_off: HandOff | None,
    sleep: Callable[[float], Awaitable[None]],
    promised_until: float | None,
    is_final: Finished | None,
) -> RunResult:
    config = run_config(lease.thread_id, graph_fingerprint(graph))
    run_input = input
    pauses = 0
    outage_pauses = 0
    patient = True  # False once an outage outlasted the budget: the step takes it as its answer
    try:
        # an accepted run is a promise: a full bulkhead on its way delays it within its budget, never fails it
        if not isinstance(input, dict):  # a resume: only on the graph the run started on
            waiting = await set_aside_unless_ours(graph, lease)
            if waiting is not None:
                return waiting
        with detached_budget(budget_s), wait_for_slots():
            while True:
                try:
                    if run_input is None:
                        run_input = await _resume_input(graph, lease, config)
                    with wait_out_outages(patient, until=promised_until):
                        return await _stream_to_the_end(graph, lease, run_input, config, stop, hand_off, is_final)
                except LeaseLostError:
                    raise
                except OutageWaitError as exc:
                    run_input = None  # from the last checkpoint: the step runs again, its effects deduplicated
                    if stop is not None and stop.is_set():
                        await _hand_off_quietly(lease, hand_off)
                        return RunResult(RunOutcome.HANDED_OFF)
                    wait = outage_pause(exc.retry_after, outage_pauses)
                    if not pause_fits(wait):
                        logger.warning(
                            "run %s: %s still unavailable and no pause of %.1fs fits its budget or its promise; "
                            "the step takes it as its answer",
                            lease.thread_id,
                            exc.dependency,
                            wait,
                        )
                        patient = False
                        continue
                    outage_pauses += 1
                    logger.warning(
                        "run %s paused: %s unavailable (%s); again in %.1fs (pause %d)",
                        lease.thread_id,
                        exc.dependency,
                        exc.reason,
                        wait,
                        outage_pauses,
                    )
                    note(JournalKind.PAUSED, dependency=exc.dependency, wait_s=round(wait, 2), attempt=outage_pauses)
                    if not await _pause(lease, stop, sleep, wait):
                        await _hand_off_quietly(lease, hand_off)  # shutting down meanwhile
                        return RunResult(RunOutcome.HANDED_OFF)
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
        if is_outage(exc):  # something it needs is down (a compensation's provider): whoever retries it says so
            logger.warning("run %s: attempt failed on an outage: %s: %s", lease.thread_id, type(exc).__name__, exc)
        else:
            logger.exception("run %s: attempt failed", lease.thread_id)
        await _release_quietly(lease, error=exc)
        return RunResult(RunOutcome.FAILED, error=exc)


async def _resume_input(
    graph: CompiledStateGraph[Any, Any, Any, Any], lease: RunLease, config: RunnableConfig
) -> RunInput:
    """``None`` (from the last checkpoint), or the recorded answer when the checkpoint still waits for it."""
    record = await lease.store.get(lease.thread_id)
    if record is None or record.resume is None:
        return None
    snapshot = await graph.aget_state(config)
    if any(task.interrupts for task in snapshot.tasks):
        return Command(resume=record.resume)
    return None


async def _stream_to_the_end(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    run_input: RunInput,
    config: RunnableConfig,
    stop: asyncio.Event | None,
    hand_off: HandOff | None,
    is_final: Finished | None,
) -> RunResult:
    async with lease.keep_alive():
        # No status write here: creating or acquiring a lease already marks the run ``running``.
        with fence_scope(lease.ensure_owned, lease.fence):
            streamed = await _unless_stopped(_stream(graph, lease, run_input, config, stop), stop)
        if streamed is None:
            return await _hand_off(lease, hand_off)
        values, waiting = streamed
        if waiting is not None:
            waiting = cast("Interrupt[Any]", waiting)
            payload = waiting.value if isinstance(waiting.value, dict) else {"value": waiting.value}
            await lease.park(
                payload, waiting_id=str(payload.get("waiting_id") or waiting.id), until=float(payload["until"])
            )
            return RunResult(RunOutcome.PARKED, payload)
        if is_final is not None and not is_final(values):
            # LangGraph ends at once, without an error, on a checkpoint whose next node the graph does not have
            raise RunNotFinalError(
                lease.thread_id, f"status {values.get('status')!r}, outcome {values.get('outcome')!r}"
            )
        await lease.finish(RunStatus.DONE)
        return RunResult(RunOutcome.DONE, values)


async def _stream(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    lease: RunLease,
    run_input: RunInput,
    config: RunnableConfig,
    stop: asyncio.Event | None,
) -> Streamed | None:
    """The run's final values and the interrupt it stopped at (if it did), or ``None`` when ``stop`` was seen at a
    step boundary."""
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
                interrupts = chunk[INTERRUPT_KEY]
                if not interrupts or not isinstance(interrupts[0].value, dict) or "until" not in interrupts[0].value:
                    # a run waits only for what says when the wait ends: anything else must not pass for done
                    raise RuntimeError(f"run {lease.thread_id} stopped before END: {interrupts!r}")
                return values, cast("Interrupt[Any]", interrupts[0])
            if stop is not None and stop.is_set():
                return None
    return values, None


Streamed = tuple[dict[str, Any], "Interrupt[Any] | None"]


async def _unless_stopped(work: Coroutine[Any, Any, Streamed | None], stop: asyncio.Event | None) -> Streamed | None:
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


async def _pause(
    lease: RunLease, stop: asyncio.Event | None, sleep: Callable[[float], Awaitable[None]], wait: float
) -> bool:
    """Sleep ``wait`` seconds keeping the lease alive (and nothing else); False when a shutdown began meanwhile."""
    async with lease.keep_alive():
        if stop is None:
            await sleep(wait)
            return True
        sleeper = asyncio.ensure_future(sleep(wait))
        waiter = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (sleeper, waiter):
                pending.cancel()
            await asyncio.wait({sleeper, waiter})
        return not stop.is_set()


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
