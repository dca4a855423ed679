"""A decision written out as OpenAI answers it: the whole ``chat.completion``, or the chunks of a stream.

Text streams one token per chunk (``delta.content``); a tool call streams as OpenAI streams it: a first fragment
with ``index``, ``id``, ``type``, ``function.name`` and empty ``arguments``, then the arguments one token per
fragment. ``completion_tokens`` counts what streams: the text's tokens, or 1 for a call's name plus its arguments'
tokens. An answer longer than ``max_tokens`` is cut there, ``finish_reason: "length"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from providers.llm.conversation import Decision
from providers.llm.tokens import split_tokens
from providers.llm.wire import ChunkWriter, call_id, completion_id

__all__ = ["FINGERPRINT", "Reply", "render"]

FINGERPRINT = "fp_concierge_sim_1"
"""``system_fingerprint``: the version of the rules that answered."""


@dataclass(frozen=True)
class Reply:
    """What one answer sends, before any fault changes how."""

    pieces: tuple[str, ...]
    """The text's tokens, or the call's argument fragments."""
    finish_reason: str
    prompt_tokens: int
    tool_name: str | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str | None:
        return None if self.tool_name else "".join(self.pieces)

    @property
    def arguments(self) -> str:
        return "".join(self.pieces) if self.tool_name else ""

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces) + (1 if self.tool_name else 0)

    @property
    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def completion(self, model: str) -> dict[str, Any]:
        """The ``chat.completion`` body."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.tool_name:
            message["tool_calls"] = [
                {
                    "id": self.tool_call_id,
                    "type": "function",
                    "function": {"name": self.tool_name, "arguments": self.arguments},
                }
            ]
        return {
            "id": completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": FINGERPRINT,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }

    def chunks(self, writer: ChunkWriter) -> Iterator[tuple[bool, dict[str, Any]]]:
        """``(is_token, chunk)`` in order: the role chunk goes with the first token; the finish chunk and the
        usage chunk (when asked for) carry no token."""
        if self.tool_name:
            opening = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": self.tool_call_id,
                        "type": "function",
                        "function": {"name": self.tool_name, "arguments": ""},
                    }
                ],
            }
            yield True, writer.delta(opening)
            for piece in self.pieces:
                yield True, writer.delta({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        else:
            yield False, writer.delta({"role": "assistant", "content": "", "refusal": None})
            for piece in self.pieces:
                yield True, writer.delta({"content": piece})
        yield False, writer.delta({}, self.finish_reason)
        if writer.include_usage:
            yield False, writer.usage(self.usage)


def render(decision: Decision, *, prompt_tokens: int, limit: int, arguments: str | None = None) -> Reply:
    """``decision`` as at most ``limit`` completion tokens; ``arguments`` replaces the call's JSON (a fault)."""
    if decision.call is None:
        assert decision.text is not None
        pieces = split_tokens(decision.text)
        finish = "length" if len(pieces) > limit else "stop"
        return Reply(tuple(pieces[:limit]), finish, prompt_tokens)
    raw = arguments if arguments is not None else json.dumps(decision.call.arguments, separators=(",", ":"))
    pieces = split_tokens(raw)
    room = max(0, limit - 1)
    finish = "length" if len(pieces) > room else "tool_calls"
    return Reply(tuple(pieces[:room]), finish, prompt_tokens, decision.call.name, call_id())
