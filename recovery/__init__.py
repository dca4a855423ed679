"""Recovery building blocks: fenced run leases, a reliable bounded recovery queue with a DLQ, the orphan scanner.

A booking that got its 202 has a run record and a lease (``RunStore.create``); its owner keeps the lease alive
(``RunLease.keep_alive``). If the owner dies the lease expires, an ``OrphanScanner`` hands the run to the
``QueueGuard`` (bounded; overflow goes to the ``DeadLetterQueue``), and a consumer takes it from the
``RecoveryQueue`` (redelivered if that consumer dies too), acquires the lease with a higher fence and resumes it.

``execute_run`` runs or resumes one graph run under its lease (booking-agent and the consumer share it);
``RecoveryConsumer`` is the consumer side, and ``recovery.worker`` the service that runs scanner and consumer
(not imported here: importing it builds the ASGI app).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.lazy import lazy_exports
from recovery.errors import (
    LeaseLostError,
    RecoveryError,
    RecoveryStoreError,
    RunFinalError,
    RunNotFoundError,
)
from recovery.leases import (
    FINAL_STATUSES,
    RECOVERY_TAG,
    ActiveRun,
    RunLease,
    RunRecord,
    RunStatus,
    RunStore,
    active_index_key,
    run_key,
)
from recovery.queue import (
    AckOutcome,
    DeadLetterQueue,
    Delivery,
    DLQEntry,
    EnqueueOutcome,
    EnqueueResult,
    QueueConfig,
    QueueGuard,
    RecoveryQueue,
)
from recovery.scanner import OrphanScanner

if TYPE_CHECKING:
    from recovery.consumer import ConsumerConfig, RecoverableGraph, RecoveryConsumer, RecoveryOutcome
    from recovery.runner import RunOutcome, RunResult, execute_run, run_config

# The consumer and the runner pull in LangGraph (about a second of imports): loaded on first use, so that the
# operator commands (``concierge dlq``) and the scanner start fast.
_LAZY = {
    **dict.fromkeys(("ConsumerConfig", "RecoverableGraph", "RecoveryConsumer", "RecoveryOutcome"), "recovery.consumer"),
    **dict.fromkeys(("RunOutcome", "RunResult", "execute_run", "run_config"), "recovery.runner"),
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "FINAL_STATUSES",
    "RECOVERY_TAG",
    "AckOutcome",
    "ActiveRun",
    "ConsumerConfig",
    "DLQEntry",
    "DeadLetterQueue",
    "Delivery",
    "EnqueueOutcome",
    "EnqueueResult",
    "LeaseLostError",
    "OrphanScanner",
    "QueueConfig",
    "QueueGuard",
    "RecoverableGraph",
    "RecoveryConsumer",
    "RecoveryError",
    "RecoveryOutcome",
    "RecoveryQueue",
    "RecoveryStoreError",
    "RunFinalError",
    "RunLease",
    "RunNotFoundError",
    "RunOutcome",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RunStore",
    "active_index_key",
    "execute_run",
    "run_config",
    "run_key",
]
