"""The life of every run, first or resumed: run record, lease, heartbeat, fence, ``execute_run``.

booking-agent creates a run (record + lease) before it answers 202 and executes it; the recovery worker acquires
the same run with a higher fence and executes it again from its checkpoint. Both go through this package.
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
    run_key,
)
from runs.runner import HandOff, RunOutcome, RunResult, execute_run, run_config

__all__ = [
    "FINAL_RUN_STATUSES",
    "RECOVERY_TAG",
    "ActiveRun",
    "HandOff",
    "LeaseLostError",
    "RunError",
    "RunFinalError",
    "RunLease",
    "RunNotFoundError",
    "RunOutcome",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "RunStore",
    "RunStoreError",
    "active_index_key",
    "execute_run",
    "redis_errors",
    "run_config",
    "run_key",
]
