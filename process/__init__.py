"""A service process's life: SIGTERM acted on first (``process.signals``), background tasks stopped within a bound
(``process.tasks``), the garbage collector tuned for its lifetime (``process.gc_tuning``). Stdlib only, so every floor
above may use it.

::

    ShuttingDownError   the process is stopping: 503 ``shutting_down``, ``Retry-After``
"""

from process.gc_tuning import service_gc
from process.signals import ShuttingDownError, Stopping, on_terminate
from process.tasks import bounded_step, drain_tasks, stop_task

__all__ = ["ShuttingDownError", "Stopping", "bounded_step", "drain_tasks", "on_terminate", "service_gc", "stop_task"]
