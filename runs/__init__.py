"""The life of every run, first or resumed: run record, lease, heartbeat, fence, ``execute_run``.

booking-agent creates a run (record + lease) before it answers 202 and executes it; the recovery worker acquires
the same run with a higher fence and executes it again from its checkpoint. Both go through this package.

Presence (``runs.presence``: one named connection and one instance lease per process) is re-exported here too.

``execute_run`` and its results live in ``runs.runner``, imported by that path: it pulls in LangGraph (about a
second), which the operator commands that read run records (``concierge dlq``, ``recovery status``) do not need.
"""

from runs.errors import LeaseLostError, RunError, RunFinalError, RunNotFoundError, RunStoreError, redis_errors
from runs.leases import (
    FINAL_RUN_STATUSES,
    RECOVERY_TAG,
    ActiveRun,
    RunLease,
    RunRecord,
    RunStatus,
    RunStore,
    active_index_key,
    instance_name,
    run_key,
)
from runs.presence import Presence, PresenceMonitor, SweepResult

__all__ = [
    "FINAL_RUN_STATUSES",
    "RECOVERY_TAG",
    "ActiveRun",
    "LeaseLostError",
    "Presence",
    "PresenceMonitor",
    "RunError",
    "RunFinalError",
    "RunLease",
    "RunNotFoundError",
    "RunRecord",
    "RunStatus",
    "RunStore",
    "RunStoreError",
    "SweepResult",
    "active_index_key",
    "instance_name",
    "redis_errors",
    "run_key",
]
