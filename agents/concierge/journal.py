"""What the concierge graph writes to the chat's journal besides its steps: streamed tokens, tool calls and results.

Entries a replayed step would write again carry once-keys (``infra.chats.ChatFeed``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from langchain_core.messages import ToolMessage

from domain.chat import ChatEventKind
from infra.chats import ChatFeed
from infra.journal import current_scope

__all__ = ["TokenEvents", "note_call", "note_result", "tool_result"]

logger = logging.getLogger(__name__)


def _fence() -> int | None:
    scope = current_scope()
    return scope.fence if scope is not None else None


class TokenEvents:
    """``infra.llm.ModelEvents`` into the chat's journal: each streamed piece of text as a ``token`` entry, at once.

    ``call`` is the turn's model call, ``fence`` the run's owner (a call asked again after a takeover has a higher
    one), ``attempt`` the model client's own retry: a reader keeps the text of the last (fence, attempt) per call.
    """

    def __init__(self, feed: ChatFeed, chat_id: str, turn_id: str, call: int) -> None:
        self.feed = feed
        self.chat_id = chat_id
        self.turn_id = turn_id
        self.call = call
        self.fence = _fence()

    async def token(self, text: str, attempt: int) -> None:
        await self.feed.emit(
            self.chat_id,
            ChatEventKind.TOKEN,
            text=text,
            turn_id=self.turn_id,
            call=self.call,
            attempt=attempt,
            fence=self.fence,
        )

    async def switched(self, reason: str, from_model: str, to_model: str, attempt: int) -> None:
        logger.info("chat %s call %d: model %s → %s (%s)", self.chat_id, self.call, from_model, to_model, reason)
        await self.feed.emit(
            self.chat_id,
            ChatEventKind.MODEL_SWITCHED,
            reason=reason,
            from_model=from_model,
            to_model=to_model,
            turn_id=self.turn_id,
            call=self.call,
            attempt=attempt,
            fence=self.fence,
        )


def tool_result(call_id: str, content: str) -> ToolMessage:
    failed = '"error"' in content[:10]
    return ToolMessage(content=content, tool_call_id=call_id, status="error" if failed else "success")


async def note_call(feed: ChatFeed, chat_id: str, turn_id: str, call_id: str, name: str, args: Any) -> None:
    await feed.emit(
        chat_id,
        ChatEventKind.TOOL_CALL,
        once=f"call:{call_id}",
        name=name,
        arguments=args,
        tool_call_id=call_id,
        turn_id=turn_id,
    )


async def note_result(
    feed: ChatFeed, chat_id: str, turn_id: str, result: ToolMessage, *, repeated: bool = False
) -> None:
    """``repeated``: the call repeated an earlier one of the turn and was answered from its result, not run."""
    try:
        content: Any = json.loads(str(result.content))
    except ValueError:
        content = str(result.content)
    await feed.emit(
        chat_id,
        ChatEventKind.TOOL_RESULT,
        once=f"result:{result.tool_call_id}",
        tool_call_id=result.tool_call_id,
        status=result.status,
        content=content,
        repeated=repeated,
        turn_id=turn_id,
    )
