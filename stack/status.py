"""``concierge status [--watch] [--json]``: processes, breakers, bulkheads, the recovery queue, bookings in flight.

Processes and bookings in flight come from the supervisor (it knows the pids and shares the services' Redis and
key prefix); breakers and bulkheads from each running instance's ``/health/circuits`` and ``/health/bulkheads``;
queue and DLQ depth from the recovery worker's ``/health/queue``. An instance that does not answer shows as
``unreachable`` rather than failing the whole report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from stack.console import (
    EXIT_OK,
    Subparsers,
    format_duration,
    one_line_errors,
    render_table,
    stack_paths,
)
from stack.control import call
from stack.errors import StackError
from stack.state import InstanceState, StackPaths, StackState

__all__ = ["StackReport", "collect_report", "register_status", "render_report"]

HEALTH_TIMEOUT_S = 1.0
QUEUE_PATH = "/health/queue"
QUEUE_SERVICE = "recovery-worker"
_CLEAR = "\x1b[H\x1b[2J"

Probe = dict[str, Any] | str
"""A health answer, or why there is none."""


@dataclass(frozen=True)
class StackReport:
    state: StackState
    in_flight: int | None
    in_flight_error: str | None = None
    circuits: Mapping[str, Probe] = field(default_factory=dict)
    bulkheads: Mapping[str, Probe] = field(default_factory=dict)
    queue: Mapping[str, Probe] = field(default_factory=dict)
    waiting: Sequence[str] = ()
    """A line per graph version runs wait for (``stack.runs.waiting_lines``)."""

    def to_json(self) -> dict[str, Any]:
        state = self.state.to_json()
        return {
            "phase": state["phase"],
            "supervisor_pid": state["supervisor_pid"],
            "redis": state["redis"],
            "checkpointer": state["checkpointer"],
            "instances": state["instances"],
            "circuits": dict(self.circuits),
            "bulkheads": dict(self.bulkheads),
            "queue": dict(self.queue),
            "bookings_in_flight": self.in_flight,
            "waiting_for_versions": list(self.waiting),
        }


async def _get(http: httpx.AsyncClient, url: str) -> Probe:
    try:
        response = await http.get(url)
    except httpx.HTTPError as exc:
        return f"unreachable ({type(exc).__name__})"
    if response.status_code != 200:
        return f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        return "not JSON"
    return body if isinstance(body, dict) else "unexpected answer"


async def collect_report(paths: StackPaths) -> StackReport:
    answer = await call(paths, "status", answer_within_s=10)
    state = StackState.from_json(answer["state"])
    running = [i for i in state.instances if i.pid is not None]
    async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S) as http:
        circuits, bulkheads, queue = await asyncio.gather(
            asyncio.gather(*(_get(http, f"{i.url}/health/circuits") for i in running)),
            asyncio.gather(*(_get(http, f"{i.url}/health/bulkheads") for i in running)),
            asyncio.gather(*(_get(http, f"{i.url}{QUEUE_PATH}") for i in running if i.service == QUEUE_SERVICE)),
        )
    workers = [i for i in running if i.service == QUEUE_SERVICE]
    return StackReport(
        state=state,
        in_flight=answer.get("in_flight"),
        in_flight_error=answer.get("in_flight_error"),
        waiting=list(answer.get("waiting") or []),
        circuits={i.name: c for i, c in zip(running, circuits, strict=True)},
        bulkheads={i.name: b for i, b in zip(running, bulkheads, strict=True)},
        queue={i.name: q for i, q in zip(workers, queue, strict=True)},
    )


def _uptime(instance: InstanceState, now: float) -> str:
    return format_duration(now - instance.started_at) if instance.started_at and instance.pid else "-"


def render_report(report: StackReport, *, now: float | None = None) -> str:
    now = time.time() if now is None else now
    state = report.state
    sections = [
        f"stack {state.phase} · supervisor pid {state.supervisor_pid} · up {format_duration(now - state.started_at)}"
        f" · redis {state.redis.url} · checkpoints {state.checkpointer}",
        "",
        render_table(
            ("SERVICE", "STATE", "PID", "RESTARTS", "UPTIME", "URL"),
            [(i.name, i.status, i.pid, i.restarts, _uptime(i, now), i.url) for i in state.instances],
        ),
        *(f"front of {service}: {url} (its replicas that are up, in turn)" for service, url in state.fronts.items()),
    ]
    circuit_rows: list[tuple[object, ...]] = []
    for name, probe in report.circuits.items():
        if isinstance(probe, str):
            circuit_rows.append((name, "-", probe, "", ""))
            continue
        for circuit, stats in sorted(probe.items()):
            retry = stats.get("seconds_until_retry") or 0
            circuit_rows.append(
                (name, circuit, stats.get("state"), stats.get("failures"), f"{retry:.1f}s" if retry else "-")
            )
    if circuit_rows:
        sections += ["", render_table(("CIRCUITS", "BREAKER", "STATE", "FAILURES", "RETRY IN"), circuit_rows)]
    bulkhead_rows: list[tuple[object, ...]] = []
    for name, probe in report.bulkheads.items():
        if isinstance(probe, str):
            bulkhead_rows.append((name, "-", probe, "", ""))
            continue
        for bulkhead, stats in sorted(probe.items()):
            bulkhead_rows.append(
                (
                    name,
                    bulkhead,
                    f"{stats.get('in_use')}/{stats.get('max')}",
                    stats.get("waiting"),
                    stats.get("rejected"),
                )
            )
    if bulkhead_rows:
        sections += ["", render_table(("BULKHEADS", "NAME", "IN USE", "WAITING", "REJECTED"), bulkhead_rows)]
    sections.append("")
    if not report.queue:
        sections.append("recovery queue   no recovery-worker running")
    for name, probe in report.queue.items():
        if isinstance(probe, str):
            sections.append(f"recovery queue   {name}: {probe}")
            continue
        sections.append(
            f"recovery queue   depth {probe.get('depth')}/{probe.get('max_size')} · in flight {probe.get('in_flight')}"
            f" · oldest {probe.get('oldest_age_s')}s · recovered {probe.get('recovered_total')}"
            f" · DLQ {probe.get('dlq_depth')}   ({name})"
        )
    if report.in_flight is None:
        sections.append(f"bookings         in flight unknown ({report.in_flight_error})")
    else:
        sections.append(f"bookings         in flight {report.in_flight}")
    sections += [f"waiting          {line}" for line in report.waiting]
    return "\n".join(sections)


def register_status(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("status", help="show services, breakers, bulkheads, queue and bookings")
    parser.add_argument("-w", "--watch", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S", help="refresh period for --watch")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.set_defaults(handler=_status)


@one_line_errors("status")
def _status(args: argparse.Namespace) -> int:
    paths = stack_paths()
    if not args.watch:
        report = asyncio.run(collect_report(paths))
        print(json.dumps(report.to_json(), indent=2) if args.json else render_report(report))
        return EXIT_OK
    try:
        while True:
            try:
                report = asyncio.run(collect_report(paths))
                frame = json.dumps(report.to_json()) if args.json else render_report(report)
            except StackError as exc:
                frame = f"concierge status: {exc}"
            if not args.json and sys.stdout.isatty():
                sys.stdout.write(_CLEAR)
            print(frame, flush=True)
            time.sleep(max(0.1, args.interval))
    except KeyboardInterrupt:
        return EXIT_OK
