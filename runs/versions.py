"""A graph's version is its shape: node names, edges (conditional ones by their targets) and state keys, hashed.

A run records the fingerprint of the graph it started on and is resumed only by a graph with the same fingerprint
(``runs.runner``, ``recovery.consumer``); LangGraph itself would resume it on whatever graph is deployed. The
readable label (``booking@2``) comes from the committed list ``runs/graph_versions.json``, which ``make test`` checks
against the code so that a change of shape is always a decision (docs/upgrades.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "VERSIONS_FILE",
    "GraphShape",
    "graph_fingerprint",
    "graph_shape",
    "legacy_version",
    "recorded_versions",
    "version_label",
]

VERSIONS_FILE = Path(__file__).with_name("graph_versions.json")
"""Graph name → its recorded fingerprints, oldest first: the n-th is ``<name>@<n>``."""

GraphShape = dict[str, Any]
"""What the fingerprint is made of, as data (``graph_shape``): shown when a test finds a shape unrecorded."""

_FINGERPRINTS: dict[int, tuple[Any, str]] = {}


def graph_shape(graph: Any) -> GraphShape:
    """The shape of a compiled LangGraph ``StateGraph``: what a checkpoint of it refers to by name."""
    builder = graph.builder
    edges = sorted([[start], end] for start, end in builder.edges)
    edges += sorted([sorted(starts), end] for starts, end in builder.waiting_edges)
    branches = sorted(
        [start, sorted(set((spec.ends or {}).values()))]
        for start, by_name in builder.branches.items()
        for spec in by_name.values()
    )
    return {
        "name": graph.name,
        "nodes": sorted(builder.nodes),
        "edges": edges,
        "branches": branches,
        "state": sorted(builder.channels),
    }


def graph_fingerprint(graph: Any) -> str:
    """16 hex digits of the shape's SHA-256; computed once per compiled graph."""
    cached = _FINGERPRINTS.get(id(graph))
    if cached is not None and cached[0] is graph:
        return cached[1]
    canonical = json.dumps(graph_shape(graph), sort_keys=True, separators=(",", ":"))
    fingerprint = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    _FINGERPRINTS[id(graph)] = (graph, fingerprint)
    return fingerprint


@cache
def recorded_versions() -> Mapping[str, tuple[str, ...]]:
    """The committed list; empty when the file is absent (a copy of the package without it)."""
    if not VERSIONS_FILE.exists():
        return {}
    data = json.loads(VERSIONS_FILE.read_text())
    return {name: tuple(fingerprints) for name, fingerprints in data.items()}


def version_label(name: str, fingerprint: str | None) -> str:
    """``booking@2`` for a recorded fingerprint, ``booking@<fingerprint>`` for one nobody recorded."""
    if not fingerprint:
        return f"{name}@?"
    recorded = recorded_versions().get(name, ())
    if fingerprint in recorded:
        return f"{name}@{recorded.index(fingerprint) + 1}"
    return f"{name}@{fingerprint}"


def legacy_version(name: str) -> str | None:
    """The version of a run recorded before runs carried one: the first recorded shape of its graph."""
    recorded = recorded_versions().get(name, ())
    return recorded[0] if recorded else None
