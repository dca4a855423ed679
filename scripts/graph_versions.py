"""The graph versions this code runs, against the committed list runs/graph_versions.json.

    python scripts/graph_versions.py            exit 1, naming each builder whose shape is not recorded
    python scripts/graph_versions.py --record   append the current shapes to the list (a decision: docs/upgrades.md)

A shape not in the list is a new version: runs started on the old one wait for a process that runs it, so the old
builder must be kept (``BOOKING_BUILDERS``) or a migration declared before the new code is deployed. The graphs are
the ones the recovery worker runs: those the packages of ``DURABLE_AGENTS`` declare (``recovery.registry``), and the
optional rows' of the service table (``concierge up --with``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.settings import get_settings
from recovery.registry import load_durable_graphs
from runs.versions import VERSIONS_FILE, graph_fingerprint, graph_shape
from stack.services import SERVICES


def families() -> dict[str, Sequence[Callable[..., Any]]]:
    """Graph name → its builders, current first: what the recovery worker runs (with the optional rows of the
    service table that ``concierge up --with`` adds to it: docs/new-agent.md's example)."""
    packages = list(get_settings().durable_agents)
    packages += [s.package for s in SERVICES.values() if s.optional and s.durable and s.package not in packages]
    return {graph.name: graph.builders for graph in load_durable_graphs(packages)}


def shapes() -> Iterator[tuple[str, int, str, dict[str, Any]]]:
    """(graph name, builder index, fingerprint, shape) of every builder, built without dependencies."""
    for name, builders in families().items():
        for index, build in enumerate(builders):
            graph = build(None)  # the deps are bound, never called, when a graph is compiled
            yield name, index, graph_fingerprint(graph), graph_shape(graph)


def unrecorded(recorded: dict[str, list[str]]) -> list[str]:
    """One line per builder whose shape the list lacks."""
    lines = []
    for name, index, fingerprint, shape in shapes():
        if fingerprint not in recorded.get(name, []):
            which = "the current builder" if index == 0 else f"kept builder {index}"
            lines.append(f"{name}: {which} has shape {fingerprint}, not in {VERSIONS_FILE.name}: {json.dumps(shape)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", action="store_true", help="append the unrecorded shapes to the list")
    args = parser.parse_args(argv)
    recorded: dict[str, list[str]] = json.loads(VERSIONS_FILE.read_text()) if VERSIONS_FILE.exists() else {}
    missing = unrecorded(recorded)
    if not missing:
        print("every graph shape is recorded")
        return 0
    if not args.record:
        print("\n".join(missing), file=sys.stderr)
        print(
            "a new shape is a new version: keep the old builder or declare a migration (docs/upgrades.md), then "
            "python scripts/graph_versions.py --record",
            file=sys.stderr,
        )
        return 1
    for name, _, fingerprint, _ in shapes():
        if fingerprint not in recorded.setdefault(name, []):
            recorded[name].append(fingerprint)
            print(f"recorded {name}@{len(recorded[name])}: {fingerprint}")
    VERSIONS_FILE.write_text(json.dumps(recorded, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
