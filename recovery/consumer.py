"""The recovery consumer: takes orphaned runs off the recovery queue and drives each one to a final state.

For every delivery::

    take (reliable) ─▶ run record? ──none / final──▶ ack "skipped"
                          │
                          ▼
                   RunStore.acquire (fenced) ──held by a live owner──▶ ack "skipped" (the holder answers for it)
                          │
                          ├─ its graph version is none this worker runs ─▶ set aside (``awaiting_version``), ack
                          ▼  ack "recovered" at once: from here the lease stands for the run
                   attempt n (n = run record's attempts + 1), inside the ``recovery_worker`` bulkhead:
                       prepare (recreate what the run expects, e.g. the booking record)
                       aget_state: no checkpoint → run from the stored input · steps left → resume (input None)
                                   · final → mark done
                       failed → full-jitter backoff (holding the lease) → attempt n + 1
                   attempts exhausted (``RECOVERY_MAX_ATTEMPTS``) → give up:
                       compensate: update the state with the graph's "give up" error so the saga routes to its
                       compensation, and run it once more → DLQ (``max_attempts``, last error)
                       compensation failed too → DLQ, run ``dead_lettered``, booking as it stands: an operator
                       requeues it

**Ack right after the lease, not visibility extensions.** The run lease already is a heartbeat with fencing, and
its expiry already sends the run back through the orphan scanner. Keeping the delivery open as well would be a
second liveness signal with a second timeout: a worker that dies mid-run would be noticed only when the *later* of
the two ran out (``RECOVERY_VISIBILITY_TIMEOUT``, 30 s, against ``RUN_LEASE_TTL``, 5 s), and the two could
disagree about who owns the run. With the ack at acquisition a dead worker's run is recovered after lease TTL +
scan interval, exactly like a dead booking-agent's, and the visibility timeout only covers the short window between
``take`` and ``acquire``. Consequences:

- ``recovered_total`` (queue stats) counts runs a consumer *took over*; a run that then exhausts its attempts is
  counted in ``dead_lettered_total`` as well;
- the attempt counter lives on the run record (fenced ``increment_attempts``), not on the delivery, so it survives
  worker crashes: a run that kills every worker that resumes it still reaches the DLQ after
  ``RECOVERY_MAX_ATTEMPTS`` takes. A DLQ requeue resets it.

**Compensation when recovery gives up** follows the saga's own path rather than undoing side effects here: the
booking shows ``failed`` only after its compensation node ran (holds cancelled, charges refunded). If that run fails
too (the dependency that broke the resumes is still broken), the booking is left as it stands and the run stays in
the DLQ, ``dead_lettered``; ``concierge dlq requeue <thread id>`` gives it a fresh set of attempts once the cause is
fixed, from its last checkpoint: if the give-up error could not even be written (the checkpoint store was what
broke), the booking can still complete normally; if it was written, the requeue finishes the compensation. The DLQ
entry is written before the run is marked ``dead_lettered``: a crash in between leaves a run the operator can still
see, never a dead-lettered run outside the DLQ.

A checkpoint whose step finished but was never saved (the store failed right after a side effect) keeps that step's
result as pending writes: a resume applies them instead of running the step again, and a give-up records them with
the error so the compensation sees, say, the hold it must cancel.

**Graph versions.** ``graphs`` names, per graph, every version this worker runs (the current builder and the earlier
ones kept while runs of them may be in flight). A run is resumed, and given up on, only by the version it started
on; a run of another is set aside, and the take loop wakes the runs waiting for a version it runs (a rollback, an
old replica), each exactly once (``RunStore.wake`` is fenced). The current version takes over the runs of the
versions it declares migrations from (``RecoverableGraph.migrations``): their checkpoint is migrated first (an
incomplete migration dead-letters the run untouched, ``migration_failed``). A graph with no next step whose run is
not final (``RecoverableGraph.is_final``) is never marked done; past the point of no return (``committed``) giving
up sends the run to the DLQ as it stands, never into compensation. docs/upgrades.md.

**Shutdown** (``stop``): no new takes; a run in a graph step has that step cancelled and is handed back
(lease released, run re-enqueued at once, so another worker does not wait for the TTL); a run waiting out a backoff
is handed back the same way; whatever is still busy after the grace period is cancelled, which hands it back too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot

from domain.booking import JournalKind
from graph import Migration, MigrationError, apply_migration
from infra.error_table import is_outage
from infra.journal import writer
from infra.metrics import observe_recovery
from infra.settings import Settings, get_settings
from process.tasks import drain_tasks
from recovery.errors import RecoveryStoreError
from recovery.queue import AckOutcome, Delivery, QueueGuard, RecoveryQueue
from resilience import Bulkhead, RetryConfig, backoff_delay, bulkhead_registry
from resilience.budget import detached_budget
from runs.errors import LeaseLostError, RunError, RunNotFinalError
from runs.leases import RunLease, RunRecord, RunStatus, RunStore
from runs.runner import Finished, RunOutcome, RunResult, execute_run, run_config, set_aside
from runs.versions import graph_fingerprint, legacy_version, version_label

__all__ = [
    "BULKHEAD_NAME",
    "DLQ_REASON_MAX_ATTEMPTS",
    "DLQ_REASON_MIGRATION_FAILED",
    "DLQ_REASON_UNKNOWN_GRAPH",
    "ConsumerConfig",
    "RecoverableGraph",
    "RecoveryConsumer",
    "RecoveryOutcome",
    "Versions",
]

logger = logging.getLogger(__name__)

BULKHEAD_NAME = "recovery_worker"
DLQ_REASON_MAX_ATTEMPTS = "max_attempts"
DLQ_REASON_UNKNOWN_GRAPH = "unknown_graph"
DLQ_REASON_MIGRATION_FAILED = "migration_failed"
_MAX_ERROR_CHARS = 500

Sleep = Callable[[float], Awaitable[object]]
Graph = CompiledStateGraph[Any, Any, Any, Any]


class RecoveryOutcome(StrEnum):
    RECOVERED = "recovered"
    """The run reached a final state (resumed to the end, or its checkpoint was already final)."""
    SKIPPED = "skipped"
    """Nothing to do: no run record, already final, or a live owner holds the lease."""
    HANDED_BACK = "handed_back"
    """This consumer is stopping: the run was released and re-enqueued for another consumer."""
    LOST = "lost"
    """Another owner took the run over mid-way; it is theirs now."""
    COMPENSATED = "compensated"
    """Gave up after the last attempt; the compensation ran (the run is final) and the DLQ keeps the record."""
    DEAD_LETTERED = "dead_lettered"
    """Gave up and could not compensate either: the run waits in the DLQ for an operator."""
    FAILED = "failed"
    """The consumer itself could not proceed (Redis unreachable); the run comes back by redelivery or its lease."""
    WAITING = "waiting_for_version"
    """Its graph version is none this worker runs: set aside until a process that runs it wakes it."""


@dataclass(frozen=True)
class RecoverableGraph:
    """What the consumer needs to know about one kind of run (``RunRecord.graph`` names it)."""

    graph: Graph
    give_up_update: Callable[[Mapping[str, Any], str], dict[str, Any]]
    """The state update that sends the run to its compensation when recovery gives up, from the current state
    values and the last error; empty when the run is in its compensation already (it is run again as it stands)."""
    prepare: Callable[[RunRecord], Awaitable[object]] | None = None
    """Recreate what the run expects to exist before it resumes (the booking record for bookings); idempotent."""
    starts_over: Callable[[RunRecord, StateSnapshot], bool] | None = None
    """Whether the thread's checkpoint is an earlier run's (a chat's previous turn, ``RunStore.begin``): the run then
    starts from its stored input, as one with no checkpoint at all does."""
    promised_until: Callable[[RunRecord], float] | None = None
    """When the run promised its caller an end (seconds since the epoch): a resumed attempt waits out an outage only
    until then (``execute_run``), its fresh budget notwithstanding."""
    is_final: Finished | None = None
    """Whether the graph's last values are final for what the run is for: a graph with no next step and values that
    are not is stranded (``RunNotFinalError``), never ``done``."""
    committed: Callable[[RunRecord], Awaitable[bool]] | None = None
    """Whether the run passed its point of no return: giving up then dead-letters it as it stands, uncompensated."""
    migrations: Sequence[Migration] = ()
    """The earlier versions whose runs this one takes over, their checkpoints migrated first (``graph.migrations``)."""

    @property
    def version(self) -> str:
        """The fingerprint of ``graph``'s shape (``runs.versions``): the runs it may resume."""
        return graph_fingerprint(self.graph)


Versions = RecoverableGraph | Sequence[RecoverableGraph]
"""One graph's versions this worker runs: the current one first, then the earlier ones kept (docs/upgrades.md)."""


@dataclass(frozen=True)
class ConsumerConfig:
    max_attempts: int = 3
    """Attempts per run before giving up (``RECOVERY_MAX_ATTEMPTS``)."""
    budget_s: float = 60.0
    """Each attempt's own timeout budget (``BOOKING_BUDGET_S``)."""
    backoff: RetryConfig = field(default_factory=lambda: RetryConfig(base_delay=1.0, max_delay=10.0))
    """Only the delay fields are used: the wait between two attempts of one run."""
    outage_backoff: RetryConfig = field(default_factory=lambda: RetryConfig(base_delay=1.0, max_delay=30.0))
    """The wait between two attempts that failed on an outage (``RECOVERY_OUTAGE_MAX_DELAY`` caps it)."""
    outage_horizon_s: float = 6 * 3600.0
    """How long attempts failing on an outage are retried without counting (``RECOVERY_OUTAGE_HORIZON``)."""
    take_wait: float = 0.25
    """How long one ``take`` polls; also how quickly the take loop notices ``stop``."""
    wake_interval: float = 1.0
    """How often the take loop looks for runs waiting for a graph version this worker runs."""
    poll_interval: float = 0.05
    idle_backoff: float = 1.0
    """Pause after the queue itself failed (Redis unreachable) before taking again."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be positive, got {self.budget_s!r}")
        if self.take_wait < 0 or self.poll_interval <= 0 or self.idle_backoff < 0:
            raise ValueError("take_wait and idle_backoff must not be negative, poll_interval must be positive")

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> ConsumerConfig:
        settings = settings or get_settings()
        return cls(
            max_attempts=settings.recovery_max_attempts,
            budget_s=settings.booking_budget_s,
            outage_backoff=RetryConfig(base_delay=1.0, max_delay=settings.recovery_outage_max_delay_s),
            outage_horizon_s=settings.recovery_outage_horizon_s,
        )


class _Outage:
    """Whether a failed attempt met an outage rather than a failing run, and how long to wait before the next one.

    An outage is what ``infra.error_table.is_outage`` says it is: Redis or Postgres unreachable, a provider or peer
    down (also when a peer reports its own provider down), an open circuit, a full bulkhead, a timeout. Such attempts back off (``outage_backoff``)
    and do not count toward ``max_attempts`` until the outage has lasted ``outage_horizon_s``; what reaches the DLQ
    is a run that keeps failing while its dependencies answer.
    """

    def __init__(self, config: ConsumerConfig, clock: Callable[[], float]) -> None:
        self._config = config
        self._clock = clock
        self._since: float | None = None
        self._waits = 0

    def goes_on(self, error: BaseException | None) -> bool:
        if error is None or not is_outage(error):
            self._since, self._waits = None, 0
            return False
        if self._since is None:
            self._since = self._clock()
        return self._clock() - self._since < self._config.outage_horizon_s

    def next_delay(self) -> float:
        self._waits += 1
        return backoff_delay(self._waits - 1, self._config.outage_backoff)


def _describe(error: BaseException | None) -> str:
    """One line for logs, run records and DLQ entries."""
    if error is None:
        return "unknown error"
    text = f"{type(error).__name__}: {error}".replace("\n", " ")
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


class RecoveryConsumer:
    """Takes runs off ``queue`` and recovers them, up to the bulkhead's ``max_concurrent`` at a time.

        ``runs``/``queue``/``guard`` must share one key prefix; ``graphs`` maps ``RunRecord.graph`` to what resumes it
        (one ``RecoverableGraph``, or its versions, current first);
        ``consumer_id`` is both the queue consumer and the lease owner. ``bulkhead`` defaults to the registry's
        ``recovery_worker`` (3 slots, 120 s per attempt). ``sleep`` is what backoffs wait with, ``clock`` what measures
    how long an outage has lasted.
    """

    def __init__(
        self,
        *,
        runs: RunStore,
        queue: RecoveryQueue,
        guard: QueueGuard,
        graphs: Mapping[str, Versions],
        consumer_id: str,
        bulkhead: Bulkhead | None = None,
        config: ConsumerConfig | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runs = runs
        self.queue = queue
        self.guard = guard
        self.versions: dict[str, dict[str, RecoverableGraph]] = {
            name: {target.version: target for target in ([found] if isinstance(found, RecoverableGraph) else found)}
            for name, found in graphs.items()
        }
        """Graph name → fingerprint → what resumes runs of that version (insertion order: current first)."""
        self.graphs = {name: next(iter(versions.values())) for name, versions in self.versions.items()}
        """Graph name → its current version."""
        self.migrations: dict[str, dict[str, tuple[Migration, RecoverableGraph]]] = {
            name: {
                migration.from_version: (migration, target)
                for target in versions.values()
                for migration in target.migrations
                if migration.from_version not in versions
            }
            for name, versions in self.versions.items()
        }
        """Graph name → a version this worker does not run → the migration that takes its runs to one it does."""
        self._next_wake = 0.0
        self.consumer_id = consumer_id
        self.bulkhead = bulkhead or bulkhead_registry.get(BULKHEAD_NAME)
        self.config = config or ConsumerConfig.from_settings()
        self.stopping = asyncio.Event()
        self._sleep = sleep
        self._clock = clock
        # Runs in hand (taken, not finished) never outnumber the bulkhead's slots: a run taken without a slot to
        # run in would hold its lease doing nothing while another worker could have recovered it.
        self._slots = asyncio.Semaphore(self.bulkhead.cfg.max_concurrent)
        self._tasks: set[asyncio.Task[RecoveryOutcome]] = set()

    @property
    def in_flight(self) -> int:
        """Runs this consumer is working on right now."""
        return len(self._tasks)

    # ----------------------------------------------------------------------------------------- the take loop

    async def run(self) -> None:
        """Take and recover runs until ``stop()`` (returns once the runs in hand are done or handed back).

        Redis failures are logged and retried, never fatal.
        """
        while True:
            await self._slots.acquire()
            if self.stopping.is_set():
                self._slots.release()
                return
            woken = await self._wake_next()
            if woken is not None:
                self._track(asyncio.create_task(self._recover_woken(*woken), name=f"wake:{woken[1].thread_id}"))
                continue
            try:
                delivery = await self.queue.take(
                    self.consumer_id, wait=self.config.take_wait, poll_interval=self.config.poll_interval
                )
            except RecoveryStoreError as exc:
                self._slots.release()
                logger.warning("recovery queue unavailable (%s); retrying in %.1fs", exc, self.config.idle_backoff)
                await self._wait_for_stop(self.config.idle_backoff)
                continue
            except BaseException:
                self._slots.release()
                raise
            if delivery is None:
                self._slots.release()
                continue
            if self.stopping.is_set():
                # taken while stop() was being called (e.g. a run another task just handed back): give it back
                self._slots.release()
                await self._give_back(delivery)
                return
            self._track(asyncio.create_task(self._process_in_slot(delivery), name=f"recover:{delivery.thread_id}"))

    def _track(self, task: asyncio.Task[RecoveryOutcome]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake_next(self) -> tuple[RecoverableGraph, RunRecord, RunLease, Migration | None] | None:
        """A run waiting for a graph version this worker runs, taken up (every ``wake_interval``, then until none)."""
        if self._clock() < self._next_wake:
            return None
        try:
            for name, versions in self.versions.items():
                runnable: list[tuple[str, RecoverableGraph, Migration | None]]
                runnable = [(version, target, None) for version, target in versions.items()]
                runnable += [(version, target, found) for version, (found, target) in self.migrations[name].items()]
                for version, target, migration in runnable:
                    for thread_id in await self.runs.awaiting(version, limit=10):
                        lease = await self.runs.wake(thread_id, version, self.consumer_id)
                        if lease is None:
                            continue
                        record = await self.runs.get(thread_id)
                        if record is None:
                            continue
                        logger.info("run %s: woken for graph version %s", thread_id, version_label(name, version))
                        return target, record, lease, migration
        except RunError as exc:
            logger.warning("could not look for runs waiting for a graph version (%s)", exc)
        self._next_wake = self._clock() + self.config.wake_interval
        return None

    async def _recover_woken(
        self, target: RecoverableGraph, record: RunRecord, lease: RunLease, migration: Migration | None
    ) -> RecoveryOutcome:
        try:
            return await self._recover(target, record, lease, migration)
        except LeaseLostError as exc:
            logger.warning("run %s: %s; leaving it to the new owner", record.thread_id, exc)
            return RecoveryOutcome.LOST
        except Exception:
            logger.exception("recovering woken run %s failed unexpectedly", record.thread_id)
            return RecoveryOutcome.FAILED
        finally:
            self._slots.release()

    async def _give_back(self, delivery: Delivery) -> None:
        try:
            await self.queue.nack(delivery)
        except RunError as exc:
            logger.warning("run %s: could not give it back (%s); redelivered later", delivery.thread_id, exc)

    async def _process_in_slot(self, delivery: Delivery) -> RecoveryOutcome:
        try:
            return await self.process(delivery)
        except Exception:
            logger.exception("recovering run %s failed unexpectedly", delivery.thread_id)
            return RecoveryOutcome.FAILED
        finally:
            self._slots.release()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking; runs cancel their step and are handed back (within ``grace``, else their tasks are cancelled)."""
        self.stopping.set()
        await drain_tasks(self._tasks, grace=grace, what="recovery consumer")

    async def _wait_for_stop(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if ``stop()`` was called meanwhile."""
        if self.stopping.is_set():
            return True
        waiter = asyncio.ensure_future(self.stopping.wait())
        sleeper = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            sleeper.cancel()
            await asyncio.wait({waiter, sleeper})
        return self.stopping.is_set()

    # ----------------------------------------------------------------------------------------- one delivery

    async def process(self, delivery: Delivery) -> RecoveryOutcome:
        """Recover the run of one delivery (see the module docstring). Raises only ``CancelledError``."""
        thread_id = delivery.thread_id
        try:
            record = await self.runs.get(thread_id)
            if record is None or record.is_final:
                await self.queue.ack(delivery, AckOutcome.SKIPPED)
                logger.info("run %s: %s; nothing to recover", thread_id, "no record" if record is None else "final")
                return RecoveryOutcome.SKIPPED
            versions = self.versions.get(record.graph)
            recorded = record.version or legacy_version(record.graph)
            if versions is None and recorded is None:
                error = f"this worker cannot resume graph {record.graph!r} (knows {', '.join(sorted(self.graphs))})"
                await self.queue.dead_letter(delivery, DLQ_REASON_UNKNOWN_GRAPH, error)
                return RecoveryOutcome.DEAD_LETTERED
            if versions is None:
                target = None
            else:
                target = versions.get(recorded) if recorded is not None else self.graphs[record.graph]
            lease = await self.runs.acquire(thread_id, self.consumer_id)
            if lease is None:
                await self.queue.ack(delivery, AckOutcome.SKIPPED)
                logger.info("run %s: leased by a live owner (or just finished); leaving it to them", thread_id)
                return RecoveryOutcome.SKIPPED
            migrating = None
            if target is None:
                assert recorded is not None
                migrating = self.migrations.get(record.graph, {}).get(recorded)
                if migrating is None:
                    current = self.graphs.get(record.graph)
                    await set_aside(lease, record.graph, recorded, None if current is None else current.version)
                    await self.queue.ack(delivery, AckOutcome.SKIPPED)
                    return RecoveryOutcome.WAITING
                target = migrating[1]
        except RunError as exc:
            # the delivery stays in flight and comes back after its visibility timeout
            logger.warning("run %s: could not start its recovery (%s); it will be redelivered", thread_id, exc)
            return RecoveryOutcome.FAILED
        logger.info("run %s: taken over (fence %d, delivery %d)", thread_id, lease.fence, delivery.attempts)
        try:
            await self.queue.ack(delivery, AckOutcome.RECOVERED)
        except BaseException:
            # not acked: the delivery comes back after its visibility timeout; do not sit on the lease till then
            await asyncio.shield(self._hand_back_quietly(lease))
            raise
        try:
            return await self._recover(target, record, lease, None if migrating is None else migrating[0])
        except LeaseLostError as exc:
            logger.warning("run %s: %s; leaving it to the new owner", thread_id, exc)
            return RecoveryOutcome.LOST
        except RunError as exc:
            logger.warning("run %s: recovery interrupted (%s); handed back", thread_id, exc)
            return RecoveryOutcome.FAILED

    async def _recover(
        self, target: RecoverableGraph, record: RunRecord, lease: RunLease, migration: Migration | None = None
    ) -> RecoveryOutcome:
        holder = [lease]
        try:
            if migration is not None:
                migrated = await self._migrate(target, record, lease, migration)
                if migrated is None:
                    return RecoveryOutcome.DEAD_LETTERED
                record = migrated
            return await self._attempts(target, record, holder)
        except BaseException:
            # Redis failed, or a forced shutdown cancelled us between two graph runs: hand the run on (if the lease
            # is still ours) rather than let it sit until the lease expires
            await asyncio.shield(self._hand_back_quietly(holder[0]))
            raise

    async def _migrate(
        self, target: RecoverableGraph, record: RunRecord, lease: RunLease, migration: Migration
    ) -> RunRecord | None:
        """The run's checkpoint migrated to ``target``'s version, then its record: the new record, or ``None`` when
        the migration itself fails (the run waits in the DLQ as it stands, for an operator)."""
        thread_id, to_version = record.thread_id, target.version
        was, now = version_label(record.graph, migration.from_version), version_label(record.graph, to_version)
        try:
            async with lease.keep_alive():
                await lease.ensure_owned()
                await apply_migration(target.graph, thread_id, migration, to_version)
        except Exception as exc:
            if is_outage(exc):
                raise  # the checkpoint store is down: handed back, migrated when it is up
            error = f"migrating from graph version {was} to {now} failed: {_describe(exc)}"
            # an incomplete migration is said in one line; anything else is a bug worth its traceback
            logger.error(
                "run %s: %s; dead-lettered as it stands", thread_id, error, exc_info=not isinstance(exc, MigrationError)
            )
            await self.queue.dlq.send_to_dlq(thread_id, DLQ_REASON_MIGRATION_FAILED, error, 0)
            await lease.finish(RunStatus.DEAD_LETTERED, error=error)
            return None
        # the checkpoint first: a worker that dies in between finds it migrated already and records the version
        await lease.set_version(to_version)
        logger.info("run %s: migrated from graph version %s to %s", thread_id, was, now)
        _journal(thread_id, JournalKind.MIGRATED, **{"from": was, "to": now, "fence": lease.fence})
        return dataclasses.replace(record, version=to_version)

    async def _attempts(self, target: RecoverableGraph, record: RunRecord, holder: list[RunLease]) -> RecoveryOutcome:
        """The retry loop; ``holder[0]`` is the lease currently held (a failed attempt releases it, we take it back)."""
        thread_id = record.thread_id
        last_error = record.last_error or "the previous owner stopped without recording an error"
        current = holder[0]
        outage = _Outage(self.config, self._clock)
        while True:
            attempt = await current.increment_attempts()
            if attempt > self.config.max_attempts:
                # every attempt was used up by earlier takes (e.g. a worker died during its last one)
                return await self._give_up(target, record, current, last_error, attempt - 1)
            logger.info("run %s: recovery attempt %d/%d", thread_id, attempt, self.config.max_attempts)
            try:
                result = await self._in_bulkhead(self._attempt, target, record, current)
            except Exception as exc:
                result = RunResult(RunOutcome.FAILED, error=exc)
            if result.outcome in (RunOutcome.DONE, RunOutcome.PARKED):
                logger.info("run %s: recovered on attempt %d (%s)", thread_id, attempt, result.outcome.value)
                return RecoveryOutcome.RECOVERED
            if result.outcome is RunOutcome.HANDED_OFF:
                return RecoveryOutcome.HANDED_BACK
            if result.outcome is RunOutcome.LOST:
                return RecoveryOutcome.LOST
            if result.outcome is RunOutcome.WAITING:
                return RecoveryOutcome.WAITING
            last_error = _describe(result.error)
            waiting_out = outage.goes_on(result.error)
            if not waiting_out:
                logger.warning("run %s: attempt %d failed: %s", thread_id, attempt, last_error)
            if not current.lost:
                # failed before the graph ran (execute_run records its own errors): keep the cause on the record
                await current.set_status(RunStatus.RUNNING, error=last_error)
            if current.lost:
                # A failed run is released (so that it is never stuck); take it back at once so the scanner does not
                # hand it to another consumer while we back off. If someone was faster, it is theirs.
                reacquired = await self.runs.acquire(thread_id, self.consumer_id)
                if reacquired is None:
                    return RecoveryOutcome.LOST
                current = holder[0] = reacquired
            if waiting_out:
                # not the run failing: something it needs is down; this attempt does not count. One line, no
                # traceback: nobody needs to act on an outage that is being waited out
                attempt = await current.increment_attempts(by=-1)
                delay = outage.next_delay()
                logger.warning("run %s: waiting out an outage (%s); again in %.1fs", thread_id, last_error, delay)
            elif attempt >= self.config.max_attempts:
                return await self._give_up(target, record, current, last_error, attempt)
            else:
                delay = backoff_delay(attempt - 1, self.config.backoff)
            async with current.keep_alive():
                stopped = await self._wait_for_stop(delay)
            if stopped:
                await self._hand_back(current)
                return RecoveryOutcome.HANDED_BACK

    async def _in_bulkhead(
        self,
        fn: Callable[[RecoverableGraph, RunRecord, RunLease], Awaitable[RunResult]],
        target: RecoverableGraph,
        record: RunRecord,
        lease: RunLease,
    ) -> RunResult:
        # The bulkhead bounds execution by min(its timeout, remaining budget); outside any scope the remaining budget
        # is the process default (30 s), so give the call a budget of exactly the bulkhead's timeout. The run itself
        # gets its own detached budget inside execute_run.
        with detached_budget(self.bulkhead.cfg.timeout):
            return await self.bulkhead.run(fn, target, record, lease)

    async def _attempt(self, target: RecoverableGraph, record: RunRecord, lease: RunLease) -> RunResult:
        graph = target.graph
        config = run_config(record.thread_id, target.version)
        async with lease.keep_alive():
            if target.prepare is not None:
                await target.prepare(record)
            snapshot = await graph.aget_state(config)
        resumed = {"owner": lease.owner, "previous_owner": record.owner, "fence": lease.fence}
        if not _is_final(snapshot) and record.lease_expires_at is not None:
            # owner lost (its lease ran out, or it handed the run off) → resumed here (the lease's end is on Redis's
            # clock, ours is compared with it: one host, or NTP)
            observe_recovery(time.time() - record.lease_expires_at)
        if snapshot.created_at is None or _starts_over(target, record, snapshot):
            run_input: dict[str, Any] | None = dict(record.input)
            logger.info("run %s: no checkpoint; starting from the stored input", record.thread_id)
            _journal(record.thread_id, JournalKind.RESUMED, **resumed, at_step="search", checkpoint_id=None)
        elif _is_final(snapshot):
            stranded = _stranded(target, record, snapshot)
            if stranded is not None:
                return RunResult(RunOutcome.FAILED, error=stranded)
            await lease.finish(RunStatus.DONE)
            logger.info("run %s: checkpoint already final; marked done", record.thread_id)
            return RunResult(RunOutcome.DONE, dict(snapshot.values))
        else:
            run_input = None
            # ``next`` leaves out tasks that finished but whose step checkpoint was never written (their writes are
            # pending); resuming applies those writes instead of running the tasks again
            where = ", ".join(task.name for task in snapshot.tasks)
            logger.info("run %s: resuming at %s", record.thread_id, where)
            checkpoint_id = snapshot.config.get("configurable", {}).get("checkpoint_id")
            _journal(record.thread_id, JournalKind.RESUMED, **resumed, at_step=where, checkpoint_id=checkpoint_id)
        return await execute_run(
            graph,
            lease,
            run_input,
            budget_s=self.config.budget_s,
            stop=self.stopping,
            hand_off=self.guard.safe_enqueue,
            promised_until=None if target.promised_until is None else target.promised_until(record),
            is_final=target.is_final,
        )

    # ----------------------------------------------------------------------------------------- giving up

    async def _give_up(
        self, target: RecoverableGraph, record: RunRecord, lease: RunLease, last_error: str, attempts: int
    ) -> RecoveryOutcome:
        thread_id = record.thread_id
        logger.error("run %s: giving up after %d attempt(s): %s", thread_id, attempts, last_error)
        if target.committed is not None and await target.committed(record):
            return await self._forward_only(record, lease, last_error, attempts)
        outage = _Outage(self.config, self._clock)
        while True:
            try:
                result = await self._in_bulkhead(self._compensate_factory(last_error), target, record, lease)
            except Exception as exc:
                result = RunResult(RunOutcome.FAILED, error=exc)
            if result.outcome is not RunOutcome.FAILED or not outage.goes_on(result.error):
                break
            # the compensation needs a provider that is down: it is retried until it is done, not dead-lettered
            if lease.lost:
                reacquired = await self.runs.acquire(thread_id, self.consumer_id)
                if reacquired is None:
                    return RecoveryOutcome.LOST
                lease = reacquired
            delay = outage.next_delay()
            logger.warning("run %s: compensation waits out an outage; again in %.1fs", thread_id, delay)
            async with lease.keep_alive():
                stopped = await self._wait_for_stop(delay)
            if stopped:
                await self._hand_back(lease)
                return RecoveryOutcome.HANDED_BACK
        if result.outcome is RunOutcome.HANDED_OFF:
            return RecoveryOutcome.HANDED_BACK  # stopping: the next consumer gives up (and compensates) again
        if result.outcome is RunOutcome.LOST:
            return RecoveryOutcome.LOST
        if result.outcome is RunOutcome.WAITING:
            return RecoveryOutcome.WAITING
        await self.queue.dlq.send_to_dlq(thread_id, DLQ_REASON_MAX_ATTEMPTS, last_error, attempts)
        if result.outcome is RunOutcome.DONE:
            logger.error("run %s: compensated and dead-lettered (%s)", thread_id, DLQ_REASON_MAX_ATTEMPTS)
            return RecoveryOutcome.COMPENSATED
        logger.error(
            "run %s: compensation failed too (%s); left as it is in the DLQ until an operator requeues it",
            thread_id,
            _describe(result.error),
        )
        holder = lease if not lease.lost else await self.runs.acquire(thread_id, self.consumer_id)
        if holder is not None:
            await holder.finish(RunStatus.DEAD_LETTERED, error=last_error)
        return RecoveryOutcome.DEAD_LETTERED

    async def _forward_only(
        self, record: RunRecord, lease: RunLease, last_error: str, attempts: int
    ) -> RecoveryOutcome:
        """Past the point of no return nothing is undone: the run waits in the DLQ as it stands, and a requeue
        finishes it forward from its last checkpoint."""
        error = f"past the point of no return, not compensated: {last_error}"
        logger.error("run %s: %s; dead-lettered for an operator to requeue", record.thread_id, error)
        await self.queue.dlq.send_to_dlq(record.thread_id, DLQ_REASON_MAX_ATTEMPTS, error, attempts)
        holder = lease if not lease.lost else await self.runs.acquire(record.thread_id, self.consumer_id)
        if holder is not None:
            await holder.finish(RunStatus.DEAD_LETTERED, error=error)
        return RecoveryOutcome.DEAD_LETTERED

    def _compensate_factory(
        self, last_error: str
    ) -> Callable[[RecoverableGraph, RunRecord, RunLease], Awaitable[RunResult]]:
        async def compensate(target: RecoverableGraph, record: RunRecord, lease: RunLease) -> RunResult:
            return await self._compensate(target, record, lease, last_error)

        return compensate

    async def _compensate(
        self, target: RecoverableGraph, record: RunRecord, lease: RunLease, last_error: str
    ) -> RunResult:
        """Steer the run into its compensation and run it once more. ``DONE`` means compensated (or already final)."""
        graph = target.graph
        config = run_config(record.thread_id, target.version)
        async with lease.keep_alive():
            if target.prepare is not None:
                await target.prepare(record)
            snapshot = await graph.aget_state(config)
            fresh = _starts_over(target, record, snapshot)
            if snapshot.created_at is not None and _is_final(snapshot) and not fresh:
                stranded = _stranded(target, record, snapshot)
                if stranded is not None:
                    return RunResult(RunOutcome.FAILED, error=stranded)
                await lease.finish(RunStatus.DONE)
                return RunResult(RunOutcome.DONE, dict(snapshot.values))
            # state writes outside a node are not fenced by the graph: check we still own the run right before
            await lease.ensure_owned()
            if snapshot.created_at is None or fresh:
                # nothing ran yet: record the input first, so the compensation has a state to work from
                await graph.aupdate_state(config, dict(record.input))
                snapshot = await graph.aget_state(config)
            update = target.give_up_update(dict(snapshot.values), last_error)
            if update:  # empty: the run is in its compensation already, run it again as it stands
                await self._steer(graph, config, snapshot, update)
        return await execute_run(
            graph,
            lease,
            None,
            budget_s=self.config.budget_s,
            stop=self.stopping,
            hand_off=self.guard.safe_enqueue,
            is_final=target.is_final,
        )

    @staticmethod
    async def _steer(graph: Graph, config: RunnableConfig, snapshot: StateSnapshot, update: dict[str, Any]) -> None:
        """Record ``update`` so that the run's next step is its compensation."""
        as_node = None
        finished = [task for task in snapshot.tasks if task.name not in snapshot.next]
        step = (snapshot.metadata or {}).get("step", 0)
        if len(finished) == 1 and not snapshot.next:
            # The step ran but its checkpoint was never written. An update discards such pending writes, and the
            # compensation must see them (a hold the step made, say): record them with the error, as that node.
            as_node = finished[0].name
            result = finished[0].result
            update = {**(result if isinstance(result, dict) else {}), **update}
        elif isinstance(step, int) and step <= 0 and len(snapshot.next) == 1:
            # no node has finished: an update "as the input" would re-run the entry node, which may reset the
            # error; recording it as the entry node's own result routes straight to the compensation instead
            as_node = snapshot.next[0]
        await graph.aupdate_state(config, update, as_node=as_node)

    async def _hand_back(self, lease: RunLease) -> None:
        if await lease.release():  # not ours any more: whoever holds it answers for it
            await self.guard.safe_enqueue(lease.thread_id)
            logger.info("run %s handed back for another consumer", lease.thread_id)

    async def _hand_back_quietly(self, lease: RunLease) -> None:
        """``_hand_back`` for error paths: bounded, never raises; a lease already given up is left alone."""
        if lease.lost:
            return
        try:
            async with asyncio.timeout(2):
                await self._hand_back(lease)
        except Exception:
            logger.warning("run %s: could not hand it back; its lease will expire", lease.thread_id, exc_info=True)


def _starts_over(target: RecoverableGraph, record: RunRecord, snapshot: StateSnapshot) -> bool:
    return snapshot.created_at is not None and target.starts_over is not None and target.starts_over(record, snapshot)


def _stranded(target: RecoverableGraph, record: RunRecord, snapshot: StateSnapshot) -> RunNotFinalError | None:
    """The error of a checkpoint with no next step whose run is not final (another shape's), else ``None``."""
    if target.is_final is None or target.is_final(snapshot.values or {}):
        return None
    values = snapshot.values or {}
    detail = f"status {values.get('status')!r}, outcome {values.get('outcome')!r}, at {snapshot.next!r}"
    return RunNotFinalError(record.thread_id, detail)


def _is_final(snapshot: StateSnapshot) -> bool:
    # not ``next``: it omits finished tasks whose step checkpoint is missing, and those still have to be applied
    return not snapshot.tasks


def _journal(thread_id: str, kind: JournalKind, **fields: Any) -> None:
    journal = writer()
    if journal is not None:
        journal.record(thread_id, kind, **fields)
