"""The concierge: a tool-calling LangGraph agent that books through the other agents, every side effect once.

``graph.concierge.graph`` is the graph (one chat turn per run, thread id = chat id), ``graph.concierge.tools`` the
tools offered to the model and the calls behind them, ``graph.concierge.history`` the message history's repair and
transcript. docs/concierge.md tells the whole story.
"""

from graph.concierge.graph import (
    CONCIERGE_GRAPH,
    ConciergeDeps,
    ConciergeState,
    Model,
    build_concierge_graph,
    give_up_update,
    open_concierge_deps,
    starts_over,
    turn_input,
)
from graph.concierge.tools import TOOLS, booking_key_for

__all__ = [
    "CONCIERGE_GRAPH",
    "TOOLS",
    "ConciergeDeps",
    "ConciergeState",
    "Model",
    "booking_key_for",
    "build_concierge_graph",
    "give_up_update",
    "open_concierge_deps",
    "starts_over",
    "turn_input",
]
