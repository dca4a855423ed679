"""What can go wrong when running the stack, as one hierarchy a command turns into one line and an exit code.

::

    StackError                      exit 1: "concierge <command>: <message>"
    ├── UsageError                  exit 2: a bad argument (a date, a --scale item, a port)
    ├── StackNotRunningError        no supervisor answers in CONCIERGE_DATA_DIR
    ├── StackAlreadyRunningError    ``up`` while a supervisor holds the data directory
    ├── RedisUnavailableError       REDIS_URL unreachable and no redis-server to start
    ├── PortInUseError              a planned port is taken before ``up`` starts anything
    ├── StartupError                a service exited or was not ready in time during ``up``
    └── ControlError                the supervisor refused a request (or its answer was unreadable)
"""

from __future__ import annotations

__all__ = [
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
