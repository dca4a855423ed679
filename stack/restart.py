"""``concierge restart [SERVICE ...]``: a rolling upgrade of the local stack onto the code checked out now.

One instance at a time, in start-up order (providers before the agents that call them): the supervisor stops it
with SIGTERM (a booking-agent hands its runs to the recovery queue) and starts a new process, and the next one stops
only once that one is ready. Runs of a graph version the new code lacks are not resumed on it: they wait, and the
command ends by saying which (docs/upgrades.md).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from stack.console import EXIT_OK, Subparsers, one_line_errors, stack_paths
from stack.control import call
from stack.errors import StackError
from stack.layout import select_instances
from stack.services import get_service
from stack.state import InstanceState, StackPaths, StackState
from stack.status import collect_report

__all__ = ["register_restart", "restart_order"]

RESTART_ANSWER_S = 300.0
"""One instance: its drain (the stack's grace period) plus its start-up on a loaded machine."""
SETTLE_TIMEOUT_S = 60.0
"""How long the end waits for the runs handed off on the way to leave the recovery queue."""
SETTLE_STABLE_S = 3.0
"""Three of the recovery worker's wake rounds (``ConsumerConfig.wake_interval``)."""
SETTLE_POLL_S = 0.5


def register_restart(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "restart",
        help="rolling upgrade: restart each service on the current checkout, one at a time",
        description="Restart the stack's services (or the ones named) on the code checked out now, one instance at "
        "a time, each ready before the next stops; then say which runs wait for a graph version the new code lacks.",
    )
    parser.add_argument(
        "services", nargs="*", metavar="SERVICE", help="service name, or NAME:N for one replica (default: every one)"
    )
    parser.set_defaults(handler=_restart)


def restart_order(instances: Sequence[InstanceState], targets: Sequence[str]) -> list[InstanceState]:
    """The instances to restart, in start-up order; ``UsageError`` for a target that names none of them."""
    if not targets:
        return list(instances)
    chosen = {i.name for target in targets for i in select_instances(instances, target)}
    return [i for i in instances if i.name in chosen]


@one_line_errors("restart")
def _restart(args: argparse.Namespace) -> int:
    for target in args.services:
        get_service(target.partition(":")[0])  # before we look for a stack
    return asyncio.run(_roll(stack_paths(), args.services))


async def _roll(paths: StackPaths, targets: Sequence[str]) -> int:
    state = StackState.from_json((await call(paths, "status", answer_within_s=10))["state"])
    if state.phase != "ready":
        raise StackError(f"the stack is {state.phase}; restart it once it is ready")
    order = restart_order(state.instances, targets)
    for done, instance in enumerate(order):
        print(f"restarting {instance.name} (pid {instance.pid or '-'}) …", flush=True)
        answer = await call(paths, "restart", target=instance.name, answer_within_s=RESTART_ANSWER_S)
        (restarted,) = answer["restarted"]
        if not restarted.get("ready"):
            left = ", ".join(i.name for i in order[done + 1 :]) or "none"
            raise StackError(
                f"{instance.name} started but is not ready (see its log); stopped here, still on the code they "
                f"started with: {left}"
            )
        print(f"{instance.name} ready (pid {restarted['pid']})", flush=True)
    print(f"restarted {len(order)} instance(s) on the current checkout")
    for line in await _settled_waiting(paths):
        print(line)
    return EXIT_OK


async def _settled_waiting(paths: StackPaths) -> list[str]:
    """What waits for a graph version once things settle: the runs handed off on the way out of the recovery queue,
    and the waiting ones unchanged for ``SETTLE_STABLE_S`` (a worker that knows a version wakes its runs within it)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    seen: tuple[str, ...] | None = None
    since = time.monotonic()
    while True:
        report = await collect_report(paths)
        queued = [p for p in report.queue.values() if isinstance(p, dict) and (p.get("depth") or p.get("in_flight"))]
        waiting = tuple(report.waiting)
        if queued or waiting != seen:
            seen, since = waiting, time.monotonic()
        elif time.monotonic() - since >= SETTLE_STABLE_S:
            break
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(SETTLE_POLL_S)
    lines = [f"waiting: {line}" for line in waiting]
    if queued:
        depth = sum(int(p.get("depth") or 0) for p in queued)
        lines.append(f"{depth} run(s) still queued for recovery; `concierge status` shows where they end up")
    if not lines:
        lines.append("no run waits for a graph version: every run in flight is on one the running code knows")
    return lines
