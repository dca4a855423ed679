"""A chat's message history: repaired before it is sent, and shown to people as a transcript.

Providers refuse (400) a history where an assistant message's tool call has no tool result after it. This graph
never checkpoints one on its way (the model's answer and the tools' results are separate steps, and a crash between
them resumes the tools), but a turn that ended abnormally (recovery gave up on it) can leave one behind; the next
model call then records the failure as that call's result instead of sending the history as it is.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agents.concierge.views import tool_error

__all__ = ["call_ids", "repair_history", "transcript"]

INTERRUPTED = "this tool call did not finish (the turn that made it ended first); it was not run to completion"


def call_ids(message: AIMessage) -> list[str]:
    """Every tool call id of an assistant message: the valid calls and the ones whose arguments did not parse."""
    ids = [str(call["id"]) for call in message.tool_calls if call.get("id")]
    ids += [str(call["id"]) for call in message.invalid_tool_calls if call.get("id")]
    return ids


def repair_history(messages: list[BaseMessage]) -> tuple[list[BaseMessage], list[ToolMessage]]:
    """``messages`` with a failure recorded as the result of each unanswered tool call, right after the assistant
    message that made it (where providers expect it); and those added results."""
    answered = {message.tool_call_id for message in messages if isinstance(message, ToolMessage)}
    out: list[BaseMessage] = []
    added: list[ToolMessage] = []
    for message in messages:
        out.append(message)
        if isinstance(message, AIMessage):
            for call_id in call_ids(message):
                if call_id not in answered:
                    result = ToolMessage(
                        content=tool_error(INTERRUPTED, "interrupted"), tool_call_id=call_id, status="error"
                    )
                    out.append(result)
                    added.append(result)
                    answered.add(call_id)
    return out, added


def transcript(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """What a person reads: the user's messages and the assistant's texts (tool traffic is in the journal)."""
    shown: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, HumanMessage):
            shown.append({"role": "user", "content": message.text, "turn_id": message.additional_kwargs.get("turn_id")})
        elif isinstance(message, AIMessage) and message.text.strip():
            shown.append(
                {"role": "assistant", "content": message.text, "turn_id": message.additional_kwargs.get("turn_id")}
            )
    return shown
