"""A migration declared in code: how a checkpoint of an earlier version of a graph becomes one of the current version.

A run resumes only on the version it started on (``runs.versions``), unless its graph declares a migration from that
version: node renames, state-key renames and defaults for new keys. The recovery worker applies it to the thread's
last checkpoint, in place (its pending writes stay with the tasks whose names did not change), then resumes the run
on the current builder. A step whose name changed keeps its idempotency record's name (``idempotent_node``'s second
argument), so a replay after the migration finds what the old step did. docs/upgrades.md.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver, ChannelVersions, Checkpoint
from langgraph.graph.state import CompiledStateGraph

from graph.errors import MigrationError

__all__ = ["Migration", "apply_migration", "migrate_checkpoint", "unknown_names"]

Graph = CompiledStateGraph[Any, Any, Any, Any]

_BRANCH = "branch:to:"
_JOIN = "join:"
_SPECIAL_NODES = ("__input__", "__start__")


@dataclass(frozen=True)
class Migration:
    """From ``from_version`` (a fingerprint) to the version of the builder it is declared beside."""

    from_version: str
    nodes: Mapping[str, str] = field(default_factory=dict)
    """Old node name → new."""
    keys: Mapping[str, str] = field(default_factory=dict)
    """Old state key → new."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """New state key → its value in runs of the old version."""

    def channel(self, name: str) -> str:
        """A checkpoint channel's name in the new version: state keys, and the edges' trigger channels."""
        if name in self.keys:
            return self.keys[name]
        if name.startswith(_BRANCH):
            return _BRANCH + self._node(name.removeprefix(_BRANCH))
        if name.startswith(_JOIN):
            starts, _, end = name.removeprefix(_JOIN).rpartition(":")
            return f"{_JOIN}{'+'.join(self._node(start) for start in starts.split('+'))}:{self._node(end)}"
        return name

    def _node(self, name: str) -> str:
        return self.nodes.get(name, name)


def migrate_checkpoint(checkpoint: Checkpoint, migration: Migration) -> tuple[Checkpoint, ChannelVersions]:
    """The checkpoint as the new version names it, and the channel versions to store again (renamed or added)."""
    migrated: Any = copy.deepcopy(dict(checkpoint))
    rename = migration.channel
    values = {rename(name): value for name, value in checkpoint["channel_values"].items()}
    versions = {rename(name): version for name, version in checkpoint["channel_versions"].items()}
    latest = max(versions.values(), key=str, default=None)
    for key, value in migration.defaults.items():
        if key not in values and latest is not None:
            values[key] = copy.deepcopy(value)
            versions[key] = latest
    migrated["channel_values"] = values
    migrated["channel_versions"] = versions
    migrated["versions_seen"] = {
        migration.nodes.get(node, node): {rename(name): version for name, version in seen.items()}
        for node, seen in checkpoint["versions_seen"].items()
    }
    if checkpoint.get("updated_channels") is not None:
        migrated["updated_channels"] = [rename(name) for name in checkpoint["updated_channels"] or []]
    before = checkpoint["channel_versions"]
    return migrated, {name: version for name, version in versions.items() if before.get(name) != version}


def unknown_names(checkpoint: Checkpoint, graph: Graph) -> list[str]:
    """What the checkpoint names that ``graph`` has neither as a channel (state keys, edges) nor as a node."""
    channels = set(graph.channels)
    nodes = {*graph.nodes, *_SPECIAL_NODES}
    unknown = {f"channel {name!r}" for name in checkpoint["channel_versions"] if name not in channels}
    unknown |= {f"node {name!r}" for name in checkpoint["versions_seen"] if name not in nodes}
    return sorted(unknown)


async def apply_migration(graph: Graph, thread_id: str, migration: Migration, to_version: str) -> bool:
    """Rewrite the thread's last checkpoint for ``graph`` (of ``to_version``); False when there is none, or it is
    migrated already (a worker died between the checkpoint and the run record). ``MigrationError`` when the result
    names what ``graph`` lacks: nothing is written then."""
    saver = graph.checkpointer
    if not isinstance(saver, BaseCheckpointSaver):
        raise TypeError(f"graph {graph.name!r} has no checkpointer to migrate run {thread_id!r} in")
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    found = await saver.aget_tuple(config)
    if found is None or (found.metadata or {}).get("graph_version") == to_version:
        return False
    checkpoint, versions = migrate_checkpoint(found.checkpoint, migration)
    unknown = unknown_names(checkpoint, graph)
    if unknown:
        raise MigrationError(thread_id, unknown)
    metadata: Any = {**(found.metadata or {}), "graph_version": to_version, "migrated_from": migration.from_version}
    # the same checkpoint id, written again: the pending writes of its tasks stay attached to it
    await saver.aput(found.parent_config or config, checkpoint, metadata, versions)
    return True
