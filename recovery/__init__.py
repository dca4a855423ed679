"""Recovery building blocks: fenced run leases, a reliable bounded recovery queue with a DLQ, the orphan scanner.

A booking that got its 202 has a run record and a lease (``RunStore.create``); its owner keeps the lease alive
(``RunLease.keep_alive``). If the owner dies the lease expires, an ``OrphanScanner`` hands the run to the
``QueueGuard`` (bounded; overflow goes to the ``DeadLetterQueue``), and a consumer takes it from the
``RecoveryQueue`` (redelivered if that consumer dies too), acquires the lease with a higher fence and resumes it.
"""

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

__all__ = [
    "FINAL_STATUSES",
    "RECOVERY_TAG",
    "AckOutcome",
    "ActiveRun",
    "DLQEntry",
    "DeadLetterQueue",
    "Delivery",
    "EnqueueOutcome",
    "EnqueueResult",
    "LeaseLostError",
    "OrphanScanner",
    "QueueConfig",
    "QueueGuard",
    "RecoveryError",
    "RecoveryQueue",
    "RecoveryStoreError",
    "RunFinalError",
    "RunLease",
    "RunNotFoundError",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "active_index_key",
    "run_key",
]
