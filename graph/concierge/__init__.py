"""The concierge: a tool-calling LangGraph agent that books through the other agents, every side effect once and
only as the person approved it.

Laid out as LangGraph's agent template: ``state``, ``context`` (deps), ``prompts``, ``tools`` (one record per tool),
``booking`` (the approved effects on booking-agent), ``graph``. docs/concierge.md tells the whole story.
"""

from graph.concierge.booking import booking_key_for
from graph.concierge.context import ConciergeDeps, Model, open_concierge_deps
from graph.concierge.graph import (
    CONCIERGE_BUILDERS,
    CONCIERGE_GRAPH,
    CONCIERGE_MIGRATIONS,
    OUT_OF_STEPS,
    build_concierge_graph,
    give_up_update,
    starts_over,
    turn_is_final,
)
from graph.concierge.state import ConciergeState, turn_input
from graph.concierge.tools import TOOLS, offer_for

__all__ = [
    "CONCIERGE_BUILDERS",
    "CONCIERGE_GRAPH",
    "CONCIERGE_MIGRATIONS",
    "OUT_OF_STEPS",
    "TOOLS",
    "ConciergeDeps",
    "ConciergeState",
    "Model",
    "booking_key_for",
    "build_concierge_graph",
    "give_up_update",
    "offer_for",
    "open_concierge_deps",
    "starts_over",
    "turn_input",
    "turn_is_final",
]
