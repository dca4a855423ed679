"""``concierge runs [--by-version] [--json]``: every run not final yet, with the graph version it started on.

What is left of each version tells when an earlier builder may be retired (docs/upgrades.md): none of its runs
running, parked or ``awaiting_version``. ``concierge status`` and ``concierge verify`` show the waiting ones from the
same reading (``version_summary``).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

from redis.asyncio import Redis

from runs.leases import RunRecord, RunStatus, RunStore
from runs.versions import legacy_version, version_label
from stack.console import EXIT_OK, Subparsers, render_table
from stack.dlq import redis_command

__all__ = ["VersionRow", "awaiting_runs", "open_runs", "register_runs", "version_summary", "waiting_lines"]

_LIMIT = 10_000


@dataclass(frozen=True)
class VersionRow:
    graph: str
    version: str
    """The readable label (``booking@1``)."""
    fingerprint: str | None
    statuses: Counter[str] = field(default_factory=Counter)
    waiting: tuple[str, ...] = ()
    """The thread ids of its ``awaiting_version`` runs."""

    def to_json(self) -> dict[str, object]:
        return {
            "graph": self.graph,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "runs": dict(self.statuses),
            "waiting": list(self.waiting),
        }


async def open_runs(redis: Redis) -> list[RunRecord]:
    """Every run that is not final: active (running or pending), parked, or awaiting its graph version."""
    store = RunStore(redis)
    ids = [run.thread_id for run in await store.active_runs()]
    ids += [thread_id for thread_id in await store.awaiting(limit=_LIMIT) if thread_id not in ids]
    ids += [t for t in (await _waiting_ids(redis, store)) if t not in ids]
    records = [await store.get(thread_id) for thread_id in ids]
    return [record for record in records if record is not None and not record.is_final]


async def awaiting_runs(redis: Redis) -> list[RunRecord]:
    """Only the runs ``awaiting_version``: one read each, what ``status`` can afford every second."""
    store = RunStore(redis)
    records = [await store.get(thread_id) for thread_id in await store.awaiting(limit=_LIMIT)]
    return [record for record in records if record is not None and record.status is RunStatus.AWAITING_VERSION]


async def _waiting_ids(redis: Redis, store: RunStore) -> list[str]:
    members = await redis.zrange(store.waiting_key, 0, _LIMIT - 1)
    return [member.decode() if isinstance(member, bytes) else str(member) for member in members]


def version_summary(records: Iterable[RunRecord]) -> list[VersionRow]:
    """The runs grouped by (graph, version), their statuses counted; oldest label first."""
    groups: dict[tuple[str, str | None], tuple[Counter[str], list[str]]] = {}
    for record in records:
        fingerprint = record.version or legacy_version(record.graph)
        statuses, waiting = groups.setdefault((record.graph, fingerprint), (Counter(), []))
        statuses[record.status.value] += 1
        if record.status is RunStatus.AWAITING_VERSION:
            waiting.append(record.thread_id)
    rows = [
        VersionRow(graph, version_label(graph, fingerprint), fingerprint, statuses, tuple(sorted(waiting)))
        for (graph, fingerprint), (statuses, waiting) in groups.items()
    ]
    return sorted(rows, key=lambda row: (row.graph, row.version))


def waiting_lines(rows: Iterable[VersionRow]) -> list[str]:
    """One line per version some runs wait for: what status, verify and an upgrade say."""
    return [
        f"{len(row.waiting)} run(s) wait for graph version {row.version}, which no running process runs: "
        f"{', '.join(row.waiting[:5])}{' …' if len(row.waiting) > 5 else ''} (docs/upgrades.md)"
        for row in rows
        if row.waiting
    ]


def register_runs(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "runs",
        help="the runs not final yet, with their graph versions",
        description="Every run not final yet (running, parked, awaiting its graph version) and its graph version.",
    )
    parser.add_argument("--by-version", action="store_true", help="one line per graph version: how many are left")
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.set_defaults(handler=redis_command("runs", _runs))


async def _runs(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    records = await open_runs(redis)
    if args.by_version:
        rows = version_summary(records)
        if args.json:
            out.write(json.dumps([row.to_json() for row in rows], indent=2) + "\n")
            return EXIT_OK
        table: list[tuple[object, ...]] = [
            (row.graph, row.version, sum(row.statuses.values()), _counts(row.statuses), row.fingerprint or "-")
            for row in rows
        ]
        out.write(render_table(("GRAPH", "VERSION", "RUNS", "BY STATUS", "FINGERPRINT"), table) + "\n")
        out.writelines(line + "\n" for line in waiting_lines(rows))
        if not rows:
            out.write("no run in flight: every earlier graph version may be retired\n")
        return EXIT_OK
    if args.json:
        out.write(json.dumps([_record_json(record) for record in records], indent=2) + "\n")
        return EXIT_OK
    table = [
        (
            record.thread_id,
            version_label(record.graph, record.version or legacy_version(record.graph)),
            record.status.value,
            record.owner or "-",
            record.attempts,
        )
        for record in records
    ]
    out.write(render_table(("RUN", "VERSION", "STATUS", "OWNER", "ATTEMPTS"), table) + "\n")
    out.write(f"{len(records)} run(s) not final\n")
    return EXIT_OK


def _counts(statuses: Counter[str]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))


def _record_json(record: RunRecord) -> dict[str, object]:
    fingerprint = record.version or legacy_version(record.graph)
    return {
        "thread_id": record.thread_id,
        "graph": record.graph,
        "version": version_label(record.graph, fingerprint),
        "fingerprint": fingerprint,
        "status": record.status.value,
        "owner": record.owner,
        "attempts": record.attempts,
    }
