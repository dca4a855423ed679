"""What happens after an owner dies: the orphan scanner, the bounded recovery queue with its DLQ, the consumer.

A run whose lease expired is found by the ``OrphanScanner`` and handed to the ``QueueGuard`` (bounded; overflow
goes to the ``DeadLetterQueue``); a ``RecoveryConsumer`` takes it from the ``RecoveryQueue`` (redelivered if that
consumer dies too), acquires the lease with a higher fence and resumes it with ``runs.execute_run``. The service
that runs scanner and consumer is ``agents.recovery_worker``.

The consumer lives in ``recovery.consumer``, imported by that path: it pulls in LangGraph (about a second), which
the operator commands on the queue and the DLQ (``concierge dlq``) do not need.
"""

from recovery.errors import RecoveryError, RecoveryStoreError
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
    "AckOutcome",
    "DLQEntry",
    "DeadLetterQueue",
    "Delivery",
    "EnqueueOutcome",
    "EnqueueResult",
    "OrphanScanner",
    "QueueConfig",
    "QueueGuard",
    "RecoveryError",
    "RecoveryQueue",
    "RecoveryStoreError",
]
