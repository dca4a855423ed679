"""What can go wrong when running the stack, as one hierarchy a command turns into one line and an exit code.

::

    StackError                      exit 1: "concierge <command>: <message>"
    ├── UsageError                  exit 2: a bad argument (a date, a --scale item, a port)
    ├── StackNotRunningError        no supervisor answers in CONCIERGE_DATA_DIR
    ├── StackAlreadyRunningError    ``up`` while a supervisor holds the data directory
    ├── RedisUnavailableError       REDIS_URL unreachable and no redis-server to start
    ├── PortInUseError              a planned port is taken before ``up`` starts anything
    ├── StartupError                a service exited or was not ready in time during ``up``
    ├── ControlError                the supervisor refused a request (or its answer was unreadable)
    └── ConsoleRefusedError         the web console will not pass a request on (also a ``NonRetryableError``:
        │                           the service shell answers it through the error table, with its ``code``)
        └── ConsoleForbiddenError   not here: no supervisor to drive, no admin token for the faults
"""

from __future__ import annotations

from domain.errors import ErrorCode
from resilience import NonRetryableError

__all__ = [
    "ConsoleForbiddenError",
    "ConsoleRefusedError",
    "ControlError",
    "PortInUseError",
    "RedisUnavailableError",
    "StackAlreadyRunningError",
    "StackError",
    "StackNotRunningError",
    "StartupError",
    "UsageError",
]


class StackError(Exception):
    """A failure a command explains in one line."""


class UsageError(StackError):
    """A bad argument; exit code 2 like argparse's own errors."""


class StackNotRunningError(StackError):
    pass


class StackAlreadyRunningError(StackError):
    pass


class RedisUnavailableError(StackError):
    pass


class PortInUseError(StackError):
    pass


class StartupError(StackError):
    pass


class ControlError(StackError):
    pass


class ConsoleRefusedError(StackError, NonRetryableError):
    """A console request refused (``code``: its answer, from the error table's own-code row)."""

    code: str = ErrorCode.REJECTED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConsoleForbiddenError(ConsoleRefusedError):
    code = ErrorCode.FORBIDDEN
