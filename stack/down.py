"""``concierge down``: stop the stack and make sure nothing of it is left.

Asks the supervisor to stop (it stops the services in reverse order, SIGTERM then SIGKILL after its grace
period), waits for it to exit, then sweeps: any process the last snapshot named that still runs (a supervisor
killed with -9 leaves its children behind) is killed with its process group. A pid is only killed while its
command line still looks like ours (``is_stack_process``), so a recycled pid is never hit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from dataclasses import replace

from stack.console import EXIT_OK, Subparsers, one_line_errors, stack_paths
from stack.control import call
from stack.errors import StackError, StackNotRunningError
from stack.state import StackPaths, StackState, is_stack_process, pid_alive, read_state, write_state

__all__ = ["DEFAULT_DOWN_TIMEOUT_S", "register_down", "stop_stack"]

DEFAULT_DOWN_TIMEOUT_S = 120.0


def register_down(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("down", help="stop the stack started by `concierge up`")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_DOWN_TIMEOUT_S,
        metavar="S",
        help="how long to wait for a graceful stop before killing (default 120)",
    )
    parser.set_defaults(handler=_down)


@one_line_errors("down")
def _down(args: argparse.Namespace) -> int:
    stopped = stop_stack(stack_paths(), timeout=args.timeout)
    print(f"stack stopped ({stopped} processes)")
    return EXIT_OK


def stop_stack(paths: StackPaths, *, timeout: float = DEFAULT_DOWN_TIMEOUT_S) -> int:
    """Stop everything; returns how many processes were running. ``StackNotRunningError`` if none was."""
    state = read_state(paths)
    if state is None:
        raise StackNotRunningError(f"stack not running (nothing in {paths.root})")
    running = [pid for pid in state.pids() if is_stack_process(pid)]
    if not running:
        raise StackNotRunningError(f"stack not running (last one in {paths.root} has stopped)")
    supervisor = state.supervisor_pid
    if supervisor in running:
        _ask_supervisor(paths, supervisor)
        if not _wait_gone(supervisor, timeout):
            _kill_group_or_pid(supervisor)
            _wait_gone(supervisor, 5)
    for pid in running:
        if pid != supervisor and is_stack_process(pid):
            _kill_group_or_pid(pid)
    leftovers = [pid for pid in running if not _wait_gone(pid, 5)]
    if leftovers:
        raise StackError(f"could not stop pid(s) {', '.join(map(str, leftovers))}")
    _mark_stopped(paths, state)
    return len(running)


def _ask_supervisor(paths: StackPaths, pid: int) -> None:
    try:
        asyncio.run(call(paths, "down", answer_within_s=5))
    except StackError:
        # no answer on the socket: the signal does the same thing
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kill_group_or_pid(pid: int) -> None:
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _mark_stopped(paths: StackPaths, state: StackState) -> None:
    """After a sweep the snapshot must not name processes that are gone (a supervisor killed -9 never said so)."""
    current = read_state(paths) or state
    if current.phase != "stopped" or any(i.pid for i in current.instances) or current.redis.pid:
        instances = tuple(replace(i, pid=None, status="stopped") for i in current.instances)
        write_state(
            paths, replace(current, phase="stopped", instances=instances, redis=replace(current.redis, pid=None))
        )
