"""The run host: where a service's durable runs execute, one per process (booking-agent, concierge-agent).

A run accepted with its lease (``RunStore.create``/``begin``, before the 202) is started here as a task and executed
by ``execute_run`` to its end; SIGTERM sets ``stopping``, which hands each run back at its next step boundary (to the
recovery queue, ``hand_off``), and ``drain`` waits for that within its grace. ``hosted_instance`` names the process
and keeps its presence for as long as it runs. The agents say what to run; nothing of this is written twice.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from infra.journal import name_instance
from infra.settings import get_settings
from process.tasks import drain_tasks
from runs.leases import RunLease, instance_name
from runs.presence import Presence
from runs.runner import Finished, HandOff, RunInput, RunResult, execute_run

__all__ = ["RunHost", "hosted_instance"]


class RunHost:
    """The runs this process executes, each a task from its lease to its end or its handoff."""

    def __init__(self, hand_off: HandOff, *, what: str, drain_s: float) -> None:
        self.hand_off = hand_off
        self.what = what
        """Who drains, for the log (``booking-agent``)."""
        self.drain_s = drain_s
        self.stopping = asyncio.Event()
        """Set on SIGTERM: every run stops at its next step boundary and is handed off."""
        self.tasks: set[asyncio.Task[Any]] = set()

    def start(
        self,
        graph: Any,
        lease: RunLease,
        run_input: RunInput,
        *,
        budget_s: float,
        is_final: Finished,
        promised_until: float | None = None,
        then: Callable[[RunResult | None], None] | None = None,
        name: str = "run",
    ) -> None:
        """Execute the run in the background; ``then`` gets its result (``None`` when it raised or was cancelled)."""

        async def run() -> None:
            result: RunResult | None = None
            try:
                result = await execute_run(
                    graph,
                    lease,
                    run_input,
                    budget_s=budget_s,
                    stop=self.stopping,
                    hand_off=self.hand_off,
                    promised_until=promised_until,
                    is_final=is_final,
                )
            finally:
                if then is not None:
                    then(result)

        task = asyncio.create_task(run(), name=f"{name}:{lease.thread_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        """SIGTERM: cancel each run's current step, hand the runs to recovery, then return (within ``drain_s``)."""
        self.stopping.set()
        await drain_tasks(self.tasks, grace=self.drain_s, what=self.what)


@asynccontextmanager
async def hosted_instance(service: str) -> AsyncIterator[str]:
    """This process's instance name (what its leases and journal entries say), with its presence held meanwhile."""
    settings = get_settings()
    instance = instance_name(settings.instance_id or f"{service}-{uuid.uuid4().hex[:8]}")
    name_instance(instance)  # the journal names the process as its run leases do
    presence = Presence(instance) if settings.presence_enabled else None
    if presence is not None:
        await presence.start()  # registered before the first run, so every run is held by it
    try:
        yield instance
    finally:
        if presence is not None:
            await presence.stop()
