"""What the stack commands share: one-line failures and exit codes, plain-text tables, the stack's table.

Every handler is wrapped by ``one_line_errors``: a ``StackError`` (or an unknown service) becomes
``concierge <command>: <message>`` on stderr and exit 1 (2 for usage errors); Ctrl-C exits 130; anything else
is still one line, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pydantic import ValidationError

from infra.settings import get_settings
from stack.errors import StackError, UsageError
from stack.login import login_url
from stack.services import UnknownServiceError
from stack.state import StackPaths, StackState

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "Handler",
    "Subparsers",
    "format_duration",
    "one_line_errors",
    "render_stack",
    "render_table",
    "stack_paths",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def stack_paths() -> StackPaths:
    return StackPaths.at(get_settings().data_dir)


def one_line_errors(command: str) -> Callable[[Handler], Handler]:
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        def run(args: argparse.Namespace) -> int:
            def fail(message: str, code: int) -> int:
                print(f"concierge {command}: {message}", file=sys.stderr)
                return code

            try:
                return handler(args)
            except UsageError as exc:
                return fail(str(exc), EXIT_USAGE)
            except UnknownServiceError as exc:
                return fail(str(exc), EXIT_USAGE)
            except StackError as exc:
                return fail(str(exc), EXIT_FAILURE)
            except ValidationError as exc:
                first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
                where = ".".join(str(part) for part in first.get("loc", ()))
                return fail(f"invalid configuration: {where}: {first.get('msg')}", EXIT_FAILURE)
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
            except BrokenPipeError:
                # `concierge status | head`: the reader left; say nothing more, and nothing at exit either
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return EXIT_FAILURE
            except Exception as exc:
                return fail(f"unexpected {type(exc).__name__}: {exc}", EXIT_FAILURE)

        return run

    return decorate


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[["-" if c is None else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def format_duration(seconds: float | None) -> str:
    if seconds is None or seconds < 0:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def render_stack(state: StackState, service_secret: str | None = None) -> str:
    """The table ``up`` prints once everything is ready: services, URLs, pids, and where things live; with the
    stack's ``service_secret``, the console's one-time login link too."""
    rows = [(i.name, i.url, i.pid, i.status) for i in state.instances]
    redis = f"{state.redis.url} (" + (
        f"started by concierge, pid {state.redis.pid})" if state.redis.own else "external)"
    )
    lines = [
        render_table(("SERVICE", "URL", "PID", "STATE"), rows),
        "",
        *(
            f"front        {service} {url} (each connection to a replica that is up)"
            for service, url in state.fronts.items()
        ),
        *(
            f"console      {login_url(i.url, service_secret, get_settings().console_login_ttl_s)} "
            "(one-time login; `concierge console-url` prints another)"
            for i in state.instances
            if i.service == "console" and service_secret
        ),
        f"redis        {redis}",
        f"checkpoints  {state.checkpointer}",
        f"logs         {state.data_dir}/logs/",
        f"supervisor   pid {state.supervisor_pid} · started {time.strftime('%H:%M:%S', time.localtime(state.started_at))}",
    ]
    return "\n".join(lines)
