"""What recovery needs of concierge-agent's graphs, a chat turn (``concierge``) and an MCP host's approved call
(``approved_call``), read by the recovery worker through
``DURABLE_AGENTS`` (``recovery.registry``)."""

from __future__ import annotations

from typing import Any, Final

from agents.concierge.approved_call import APPROVED_CALL_BUILDERS, APPROVED_CALL_GRAPH
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
    # an MCP host's approved call (agents.concierge.approved_call): resumed, given up on and finished like a turn
    DurableGraph(APPROVED_CALL_GRAPH, APPROVED_CALL_BUILDERS, open_concierge_deps, concierge_recovery, ()),
)
