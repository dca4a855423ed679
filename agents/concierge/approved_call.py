"""One approved tool call as a run of its own, for a caller that brings its own model (an MCP host): the approval
the chat's turns use, then the same once-per-approval effect, then the outcome recorded on the call's chat.

::

    START ─▶ approval ─▶ book ─▶ record → END
      └────(given up)──────────────▲

The run is a chat's turn in all but the model: its thread is a chat of the person's (``approval_requested`` in its
journal, ``pending_approval`` in ``GET /chats/{id}``), parked at ``approval`` like a turn, decided through
``RunStore.decide`` by whoever answers first (the MCP host's retry, the console, ``concierge chat``), and its
``book`` step is the concierge's own (``@idempotent_node`` per approval, booking-agent's key per call).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Final

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.concierge.context import ConciergeDeps
from agents.concierge.graph import approval, book_node
from agents.concierge.state import ConciergeState, Pending
from domain.chat import ChatEventKind, TurnOutcome
from graph.tracing import traced_node

__all__ = ["APPROVED_CALL_BUILDERS", "APPROVED_CALL_GRAPH", "build_approved_call_graph", "call_input"]

APPROVED_CALL_GRAPH: Final = "approved_call"
"""``RunRecord.graph`` of one approved call made for a caller with a model of its own (MCP)."""


def call_input(chat_id: str, turn_id: str, pending: Pending) -> dict[str, Any]:
    """The run's input: the call parked for its approval (terms, expiry; never a payment token)."""
    return {
        "chat_id": chat_id,
        "turn_id": turn_id,
        "text": "",
        "pending": pending,
        "decision": None,
        "done": None,
        "error": None,
        "outcome": None,
    }


def _result(done: Mapping[str, Any] | None) -> Any:
    content = (done or {}).get("content")
    try:
        return json.loads(content) if isinstance(content, str) else None
    except ValueError:
        return {"message": content}


async def record(state: ConciergeState, config: RunnableConfig, *, deps: ConciergeDeps) -> dict[str, Any]:
    """The call's outcome on its chat (``last_turn.result``: what the caller is answered) and ``turn_finished``."""
    chat_id, turn_id = state["chat_id"], state["turn_id"]
    error = state.get("error")
    done = state.get("done")
    outcome = TurnOutcome.FAILED if error else TurnOutcome.ANSWERED
    booking_id = (done or {}).get("booking_id")
    last_turn = {"turn_id": turn_id, "outcome": str(outcome), "error": error, "usage": {}, "result": _result(done)}
    await deps.chats.record_turn(
        chat_id, messages=[], bookings=[str(booking_id)] if booking_id else [], last_turn=last_turn, usage={}
    )
    await deps.feed.emit(
        chat_id,
        ChatEventKind.TURN_FINISHED,
        once=f"{turn_id}:finished",
        turn_id=turn_id,
        outcome=str(outcome),
        error=error,
        usage={},
    )
    return {"outcome": str(outcome)}


async def _first(state: ConciergeState) -> str:
    return "record" if state.get("error") or not state.get("pending") else "approval"


def build_approved_call_graph(
    deps: ConciergeDeps, checkpointer: BaseCheckpointSaver[str] | None = None
) -> CompiledStateGraph[ConciergeState, None, ConciergeState, ConciergeState]:
    def bound(step: Any) -> Any:
        return functools.partial(step, deps=deps)

    builder = StateGraph(ConciergeState)
    builder.add_node("approval", approval)
    builder.add_node("book", book_node(deps))  # the concierge's own step, once per approval
    builder.add_node("record", traced_node("record")(bound(record)))
    builder.add_conditional_edges(START, _first, ["approval", "record"])
    builder.add_edge("approval", "book")
    builder.add_edge("book", "record")
    builder.add_edge("record", END)
    return builder.compile(checkpointer=checkpointer, name=APPROVED_CALL_GRAPH)


APPROVED_CALL_BUILDERS: Final = (build_approved_call_graph,)
"""Every version of the approved-call graph this code runs, current first (docs/upgrades.md)."""
