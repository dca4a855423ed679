"""What recovery needs of concierge-agent's graph, a chat turn (``concierge``), read by the recovery worker through
``DURABLE_AGENTS`` (``recovery.registry``)."""

from __future__ import annotations

from typing import Any, Final

from agents.concierge.context import open_concierge_deps
from agents.concierge.graph import (
    CONCIERGE_BUILDERS,
    CONCIERGE_GRAPH,
    CONCIERGE_MIGRATIONS,
    give_up_update,
    starts_over,
    turn_is_final,
)
from recovery.consumer import Graph, RecoverableGraph
from recovery.registry import DurableGraph

__all__ = ["DURABLE_GRAPHS", "concierge_recovery"]


def concierge_recovery(graph: Graph, deps: Any = None) -> RecoverableGraph:
    """How the consumer resumes chat turns: a turn with no step of its own yet starts from its input (the chat's
    checkpoint is the previous turn's), a parked one parks again, one given up on ends ``failed``."""
    return RecoverableGraph(graph=graph, give_up_update=give_up_update, starts_over=starts_over, is_final=turn_is_final)


DURABLE_GRAPHS: Final = (
    DurableGraph(CONCIERGE_GRAPH, CONCIERGE_BUILDERS, open_concierge_deps, concierge_recovery, CONCIERGE_MIGRATIONS),
)
