"""The concierge graph: one chat turn, a tool-calling loop whose every side effect happens once, and only as the
person approved it.

::

    START → call_model ─┬─(tool calls)─▶ tools ─┬─▶ call_model
               ▲        │                  ▲   └─(book / cancel)─▶ approval ─▶ book ─┐
               │        └─(text, error)─▶ finish → END                                │
               │                           └──────────────────────────────────────────┘
               └── (every call answered)

``tools`` runs the model's calls in order; a call that needs approval parks the turn (``approval``), ``book`` makes
its effect once per approval, and ``tools`` goes on with the calls after it. docs/concierge.md says why.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import interrupt

from agents.concierge.context import ConciergeDeps
from agents.concierge.history import call_ids, repair_history, transcript
from agents.concierge.journal import TokenEvents, note_call, note_result, tool_result
from agents.concierge.prompts import system_prompt
from agents.concierge.state import Approval, ConciergeState, Done, Pending, failure
from agents.concierge.tools import Tool, ToolContext, answer_error, offer_for, repeat_answer, tool_named
from agents.concierge.views import tool_error
from domain.chat import ChatEventKind, InvalidToolCallError, TurnOutcome, approval_id_for
from domain.errors import ErrorCode
from domain.llm import BOOK_HOTEL
from graph.idempotency import idempotent_node
from graph.migrations import Migration
from graph.tracing import traced_node
from identity.auth import acting_for
from identity.people import QuotaExceededError
from infra.error_table import answer_for
from infra.llm import Budget, ModelError, Usage
from infra.settings import get_settings

__all__ = [
    "CONCIERGE_BUILDERS",
    "CONCIERGE_GRAPH",
    "CONCIERGE_MIGRATIONS",
    "OUT_OF_STEPS",
    "approval",
    "ask_approval",
    "book",
    "build_concierge_graph",
    "give_up_update",
    "starts_over",
    "turn_is_final",
]

CONCIERGE_GRAPH: Final = "concierge"
"""``RunRecord.graph`` of chat turns."""


def _usage(value: Mapping[str, Any] | None) -> Usage:
    value = value or {}
    return Usage(int(value.get("input_tokens", 0)), int(value.get("output_tokens", 0)), int(value.get("calls", 0)))


OUT_OF_STEPS: Final = "Sorry, I could not finish this in the steps I am allowed. Please ask again, more precisely."
"""The turn's answer when the model still calls tools on its last allowed call (LangGraph's ``is_last_step``)."""


def _out_of_steps(message: AIMessage) -> AIMessage:
    """The last allowed call's answer in words: its tool calls dropped (none runs, the history has none unanswered)."""
    dropped = len(call_ids(message))
    return AIMessage(
        content=OUT_OF_STEPS,
        id=message.id,
        response_metadata=message.response_metadata,
        additional_kwargs={"dropped_tool_calls": dropped},
    )


def _last_ai(state: ConciergeState) -> AIMessage | None:
    return next((m for m in reversed(state.get("messages") or []) if isinstance(m, AIMessage)), None)


# ----------------------------------------------------------------------------------------------------- nodes


async def call_model(state: ConciergeState, config: RunnableConfig, *, deps: ConciergeDeps) -> dict[str, Any]:
    """One model call, checkpointed (``durability="sync"``) before any tool runs: a kill after it never asks again.
    The last call ``LLM_MAX_CALLS_PER_TURN`` allows ends the turn in words, whatever the model answered; guided
    (LLM_GUIDED_TOOLS), the model is offered only the tools the chat's state lets succeed (``offer_for``)."""
    if state.get("error"):
        return {}  # recovery gave up on the turn (``give_up_update``): straight to ``finish``
    chat_id, turn_id = state["chat_id"], state["turn_id"]
    calls = int(state.get("model_calls") or 0)
    if calls == 0:
        await deps.feed.emit(
            chat_id, ChatEventKind.USER_MESSAGE, once=f"{turn_id}:user", turn_id=turn_id, text=state["text"]
        )
    if calls >= get_settings().llm_max_calls_per_turn:  # a turn checkpointed before its last call answered in words
        message = f"the model was asked {calls} times in this turn without an answer"
        return {"error": failure(ErrorCode.MODEL_CALLS_EXHAUSTED, message)}
    history, added = repair_history(list(state.get("messages") or []))
    for result in added:
        await note_result(deps.feed, chat_id, turn_id, result)
    spent_turn = _usage(state.get("usage"))
    guided = get_settings().llm_guides_tools
    owner = (await deps.chats.owner(chat_id))[1] if deps.quotas is not None or guided else None
    try:
        if deps.quotas is not None and owner is not None:
            await deps.quotas.check_tokens(owner)  # the owner's model tokens of the day (PERSON_TOKENS_PER_DAY)
        # the booking tools, once the person has a booking (from any chat): one ZCARD, only when guiding
        has_booking = bool(state.get("bookings")) or (guided and await deps.bookings.has_bookings(owner))
        offer = offer_for(history, has_booking, guided=guided, first_call=calls == 0)
        reply = await deps.model.respond(
            [SystemMessage(content=system_prompt()), *history],
            offer.tools,
            tool_choice=offer.tool_choice,
            budget=Budget.from_settings(get_settings()),
            events=TokenEvents(deps.feed, chat_id, turn_id, calls + 1),
            spent_turn=spent_turn,
            spent_chat=_usage(state.get("chat_usage")) + spent_turn,
        )
    except (ModelError, QuotaExceededError) as exc:
        answer = answer_for(exc)
        return {"model_calls": calls + 1, "error": failure(answer.code, answer.message), "messages": added}
    if deps.quotas is not None and owner is not None:
        await deps.quotas.spend_tokens(owner, reply.usage.total)
    said = reply.message
    if calls + 1 >= get_settings().llm_max_calls_per_turn and call_ids(said):
        said = _out_of_steps(said)  # the last allowed call: its tool calls are not run, the turn answers
    said.additional_kwargs["turn_id"] = turn_id
    usage = (spent_turn + reply.usage).as_dict()
    return {"messages": [*added, said], "model_calls": calls + 1, "usage": usage}


async def tools(state: ConciergeState, config: RunnableConfig, *, deps: ConciergeDeps) -> dict[str, Any]:
    """The last answer's calls in order, each validated then run; one that needs approval parks the turn, and the
    calls after it wait their turn (``book`` brings its result back here)."""
    message = _last_ai(state)
    assert message is not None  # the edges send only an answer with tool calls here
    chat_id, turn_id = state["chat_id"], state["turn_id"]
    bookings = list(state.get("bookings") or [])
    results: list[ToolMessage] = []
    done = state.get("done")
    if done:
        results.append(tool_result(done["tool_call_id"], done["content"]))
        if done.get("booking_id") and done["booking_id"] not in bookings:
            bookings.append(str(done["booking_id"]))
    answered = {m.tool_call_id for m in state.get("messages") or [] if isinstance(m, ToolMessage)}
    answered |= {r.tool_call_id for r in results}
    contents = {m.tool_call_id: str(m.content) for m in state.get("messages") or [] if isinstance(m, ToolMessage)}
    seen = dict(state.get("answered_calls") or {})
    repeated: set[str] = set()
    chat = await deps.chats.get(chat_id) or {}
    context = ToolContext(deps, chat_id, frozenset([*bookings, *(chat.get("bookings") or [])]))
    with acting_for(chat.get("owner")):  # booking-agent sees the chat's owner, never the concierge itself
        pending: Pending | None = None
        for bad in message.invalid_tool_calls:
            call_id = str(bad.get("id") or "")
            if call_id not in answered:
                await note_call(
                    deps.feed, chat_id, turn_id, call_id, str(bad.get("name") or ""), {"raw": bad.get("args")}
                )
                why = f"arguments: not valid JSON ({bad.get('error') or 'unparsable'})"
                results.append(tool_result(call_id, tool_error(why)))
        for call in message.tool_calls:
            call_id, name = str(call["id"]), call["name"]
            if call_id in answered:
                continue
            await note_call(deps.feed, chat_id, turn_id, call_id, name, call["args"])
            key: str | None = None  # a read's call key, remembered once it succeeds
            try:
                tool = tool_named(name)
                args = tool.validate(call["args"])
                key = tool.call_key(args) if tool.answers_repeats else None
                earlier = seen.get(key) if key is not None else None
                if earlier is not None and earlier in contents:
                    content = repeat_answer(name, contents[earlier])  # not run again: no peer is asked
                    repeated.add(call_id)
                    key = None
                elif tool.approval is not None:
                    pending = await ask_approval(deps, state, context, tool, call_id, args)
                    break  # the calls after this one wait for its decision
                else:
                    assert tool.run is not None
                    content = await tool.run(context, args)
            except InvalidToolCallError as exc:
                content = answer_error(exc)
            except Exception as exc:
                answer = answer_for(exc)
                if answer.code in (ErrorCode.INTERNAL, ErrorCode.DEPENDENCY_UNAVAILABLE):
                    raise  # our own stores: the run pauses and the step runs again
                content = tool_error(answer.message, answer.code)
            result = tool_result(call_id, content)
            results.append(result)
            contents[call_id] = content
            if key is not None and result.status == "success":
                seen[key] = call_id
    for result in results:
        await note_result(deps.feed, chat_id, turn_id, result, repeated=result.tool_call_id in repeated)
    return {"messages": results, "pending": pending, "done": None, "bookings": bookings, "answered_calls": seen}


async def ask_approval(
    deps: ConciergeDeps,
    state: Mapping[str, Any],
    context: ToolContext,
    tool: Tool,
    call_id: str,
    args: dict[str, Any],
) -> Pending:
    """The approval of one call, bound to its exact terms, journaled as ``approval_requested`` (a chat's turn, or an
    MCP host's call: ``agents.concierge.approved_call``)."""
    assert tool.approval is not None
    terms = await tool.approval.terms(context, args)
    until = time.time() + get_settings().approval_ttl_s
    approval: Approval = {
        "approval_id": approval_id_for(state["chat_id"], call_id),
        "action": tool.approval.action,
        **terms,  # type: ignore[typeddict-item]
        "expires_at": datetime.fromtimestamp(until, UTC).isoformat().replace("+00:00", "Z"),
    }
    await deps.feed.emit(
        state["chat_id"],
        ChatEventKind.APPROVAL_REQUESTED,
        once=f"approval:{approval['approval_id']}",
        approval=approval,
        tool_call_id=call_id,
        turn_id=state["turn_id"],
    )
    return {"tool": tool.name, "tool_call_id": call_id, "args": args, "approval": approval, "until": until}


async def approval(state: ConciergeState, config: RunnableConfig) -> dict[str, Any]:
    """Only the interrupt: LangGraph runs a resumed node again from its top, so nothing else happens here."""
    pending = state["pending"]
    assert pending is not None
    approval_ = pending["approval"]
    decision = interrupt({"waiting_id": approval_["approval_id"], "until": pending["until"], "approval": approval_})
    return {"decision": decision if isinstance(decision, dict) else {"approve": False}}


async def book(state: ConciergeState, config: RunnableConfig, *, deps: ConciergeDeps) -> dict[str, Any]:
    """The decided call: its effect after a yes (the tool's ``Approved.effect``), or the person's no."""
    pending = state["pending"]
    assert pending is not None
    decision = state.get("decision") or {}
    call_id, approval_id = pending["tool_call_id"], pending["approval"]["approval_id"]
    await deps.feed.emit(
        state["chat_id"],
        ChatEventKind.APPROVAL_DECIDED,
        once=f"decided:{approval_id}",
        approval_id=approval_id,
        approve=bool(decision.get("approve")),
        expired=bool(decision.get("expired")),
        turn_id=state["turn_id"],
    )
    nothing = "nothing was cancelled" if pending["approval"].get("action") == "cancel" else "nothing was booked"
    done: Done
    if decision.get("expired"):
        done = {"tool_call_id": call_id, "content": tool_error(f"the approval expired: {nothing}", "approval_expired")}
    elif not decision.get("approve"):
        declined = {"approved": False, "status": "declined", "message": f"the person declined: {nothing}"}
        done = {"tool_call_id": call_id, "content": json.dumps(declined)}
    else:
        approved = tool_named(pending.get("tool") or BOOK_HOTEL).approval
        assert approved is not None
        _, owner = await deps.chats.owner(state["chat_id"])
        with acting_for(owner):  # for the chat's owner, also when the recovery worker resumes the turn
            done = await approved.effect(deps, state["chat_id"], pending)
    return {"done": done, "pending": None, "decision": None}


async def finish(state: ConciergeState, config: RunnableConfig, *, deps: ConciergeDeps) -> dict[str, Any]:
    """The turn's end: the assistant's text, the transcript, bookings and usage on the chat, ``turn_finished``."""
    chat_id, turn_id = state["chat_id"], state["turn_id"]
    error = state.get("error")
    outcome = TurnOutcome.FAILED if error else TurnOutcome.ANSWERED
    usage = _usage(state.get("usage"))
    chat_usage = _usage(state.get("chat_usage")) + usage
    message = _last_ai(state)
    if message is not None and not error and message.text.strip():
        await deps.feed.emit(
            chat_id, ChatEventKind.ASSISTANT_MESSAGE, once=f"{turn_id}:assistant", text=message.text, turn_id=turn_id
        )
    last_turn = {"turn_id": turn_id, "outcome": str(outcome), "error": error, "usage": usage.as_dict()}
    await deps.chats.record_turn(
        chat_id,
        messages=transcript(list(state.get("messages") or [])),
        bookings=list(state.get("bookings") or []),
        last_turn=last_turn,
        usage=chat_usage.as_dict(),
    )
    await deps.feed.emit(
        chat_id,
        ChatEventKind.TURN_FINISHED,
        once=f"{turn_id}:finished",
        turn_id=turn_id,
        outcome=str(outcome),
        error=error,
        usage=usage.as_dict(),
    )
    return {"outcome": str(outcome), "chat_usage": chat_usage.as_dict(), "usage": usage.as_dict()}


# ----------------------------------------------------------------------------------------------------- edges


async def _after_model(state: ConciergeState) -> str:
    message = _last_ai(state)
    return "tools" if not state.get("error") and message is not None and call_ids(message) else "finish"


async def _after_tools(state: ConciergeState) -> str:
    return "approval" if state.get("pending") and not state.get("error") else "call_model"


def book_node(deps: ConciergeDeps) -> Any:
    """The approved effect as a node, the same in every graph that books (a turn, an MCP host's approved call): once
    per approval, so a replay (crash, takeover, recovery) returns the stored result and calls nobody again."""
    once_per_approval = idempotent_node(lambda: deps.redis, "book", key_fields=["chat_id", "pending"])
    return traced_node("book")(once_per_approval(functools.partial(book, deps=deps)))


def build_concierge_graph(
    deps: ConciergeDeps, checkpointer: BaseCheckpointSaver[str] | None = None
) -> CompiledStateGraph[ConciergeState, None, ConciergeState, ConciergeState]:
    def bound(step: Any) -> Any:
        return functools.partial(step, deps=deps)

    builder = StateGraph(ConciergeState)
    builder.add_node("call_model", traced_node("call_model")(bound(call_model)))
    builder.add_node("tools", traced_node("tools")(bound(tools)))
    builder.add_node("approval", approval)
    builder.add_node("book", book_node(deps))
    builder.add_node("finish", traced_node("finish")(bound(finish)))
    builder.add_edge(START, "call_model")
    builder.add_conditional_edges("call_model", _after_model, ["tools", "finish"])
    builder.add_conditional_edges("tools", _after_tools, ["approval", "call_model"])
    builder.add_edge("approval", "book")
    builder.add_edge("book", "tools")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name=CONCIERGE_GRAPH)


# ----------------------------------------------------------------------------------------------------- recovery


def starts_over(record: Any, snapshot: Any) -> bool:
    """The recovery consumer's question: is the chat's checkpoint an earlier turn's (this one never got a step)?"""
    values = snapshot.values or {}
    return values.get("turn_id") != (record.input or {}).get("turn_id")


CONCIERGE_BUILDERS: Final = (build_concierge_graph,)
"""Every version of the concierge graph this code runs, current first (docs/upgrades.md)."""

CONCIERGE_MIGRATIONS: Final[tuple[Migration, ...]] = ()
"""How turns of an earlier shape move onto the current builder instead (``graph.migrations``; docs/upgrades.md)."""


def turn_is_final(values: Mapping[str, Any]) -> bool:
    """A turn is over once ``finish`` gave it an outcome (each turn's input resets it)."""
    return values.get("outcome") is not None


def give_up_update(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
    """When recovery gives up on a turn: end it ``failed`` (``finish`` runs next and tells the chat)."""
    if state.get("error"):
        return {}
    return {
        "error": failure(ErrorCode.INTERNAL, f"the turn could not be completed: {last_error}"),
        "pending": None,
        "done": None,
    }
