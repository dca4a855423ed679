"""A decision written out as OpenAI answers it: the whole ``chat.completion``, or the chunks of a stream.

Text streams one token per chunk (``delta.content``); a tool call streams as OpenAI streams it: a first fragment
with ``index``, ``id``, ``type``, ``function.name`` and empty ``arguments``, then the arguments one token per
fragment (several calls one after the other, each under its own ``index``). ``completion_tokens`` counts what
streams: the text's tokens, or per call 1 for its name plus its arguments' tokens. An answer longer than
``max_tokens`` is cut there, ``finish_reason: "length"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from providers.llm.conversation import Decision
from providers.llm.tokens import split_tokens
from providers.llm.wire import ChunkWriter, call_id, completion_id

__all__ = ["FINGERPRINT", "Reply", "ReplyCall", "calls_reply", "render", "text_reply"]

FINGERPRINT = "fp_concierge_sim_1"
"""``system_fingerprint``: the version of the rules that answered."""


@dataclass(frozen=True)
class ReplyCall:
    """One tool call of an answer."""

    name: str
    id: str
    pieces: tuple[str, ...]
    """The arguments' fragments (their tokens)."""

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


@dataclass(frozen=True)
class Reply:
    """What one answer sends, before any fault changes how."""

    pieces: tuple[str, ...]
    """The text's tokens (none when the answer is tool calls)."""
    finish_reason: str
    prompt_tokens: int
    calls: tuple[ReplyCall, ...] = ()
    scripted: bool = False
    """Played from ``PUT /admin/script`` rather than decided (``providers.llm.script``)."""

    @property
    def text(self) -> str | None:
        return None if self.calls else "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        if self.calls:
            return sum(1 + len(call.pieces) for call in self.calls)
        return len(self.pieces)

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
        if self.calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.calls
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
        if self.calls:
            for index, call in enumerate(self.calls):
                opening: dict[str, Any] = {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }
                    ]
                }
                if index == 0:
                    opening = {"role": "assistant", "content": None, **opening}
                yield True, writer.delta(opening)
                for piece in call.pieces:
                    yield True, writer.delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        else:
            yield False, writer.delta({"role": "assistant", "content": "", "refusal": None})
            for piece in self.pieces:
                yield True, writer.delta({"content": piece})
        yield False, writer.delta({}, self.finish_reason)
        if writer.include_usage:
            yield False, writer.usage(self.usage)


def text_reply(text: str, *, prompt_tokens: int, limit: int, scripted: bool = False) -> Reply:
    """``text`` as at most ``limit`` completion tokens."""
    pieces = split_tokens(text)
    finish = "length" if len(pieces) > limit else "stop"
    return Reply(tuple(pieces[:limit]), finish, prompt_tokens, scripted=scripted)


def calls_reply(calls: Sequence[tuple[str, str]], *, prompt_tokens: int, limit: int, scripted: bool = False) -> Reply:
    """``(name, raw arguments)`` calls, in order, as at most ``limit`` completion tokens: a call that does not fit
    is cut (its name counts one token) and the ones after it are left out."""
    made: list[ReplyCall] = []
    room = limit
    finish = "tool_calls"
    for name, raw in calls:
        if room < 1:
            finish = "length"
            break
        pieces = split_tokens(raw)
        fits = pieces[: room - 1]
        made.append(ReplyCall(name, call_id(), tuple(fits)))
        room -= 1 + len(fits)
        if len(fits) < len(pieces):
            finish = "length"
            break
    return Reply((), finish, prompt_tokens, tuple(made), scripted=scripted)


def render(decision: Decision, *, prompt_tokens: int, limit: int, arguments: str | None = None) -> Reply:
    """``decision`` as at most ``limit`` completion tokens; ``arguments`` replaces the call's JSON (a fault)."""
    if decision.call is None:
        assert decision.text is not None
        return text_reply(decision.text, prompt_tokens=prompt_tokens, limit=limit)
    raw = arguments if arguments is not None else json.dumps(decision.call.arguments, separators=(",", ":"))
    return calls_reply([(decision.call.name, raw)], prompt_tokens=prompt_tokens, limit=limit)
