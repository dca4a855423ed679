"""llm-api's tokenizer: deterministic, offline, close enough to a real one to make usage and rate limits mean
something (docs/llm-api.md).

A token is a run of letters, up to three digits, one other visible character or a run of whitespace; a single
space before a word, a number or a sign belongs to it (as in GPT-2's pre-tokenizer). The tokens of a text join
back into exactly that text, which is how the answer streams: one token per chunk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_OVERHEAD",
    "count_tokens",
    "prompt_tokens",
    "split_tokens",
]

_TOKEN = re.compile(r" ?[^\W\d_]+| ?\d{1,3}| ?_+| ?[^\w\s]|\s+(?!\S)|\s+")
MESSAGE_OVERHEAD = 3
"""Tokens every message costs besides its text (its role and separators), as OpenAI counts them."""
REPLY_OVERHEAD = 3
"""Tokens that prime the reply, counted once per request."""


def split_tokens(text: str) -> list[str]:
    """``text`` as its tokens; ``"".join(split_tokens(text)) == text``."""
    return _TOKEN.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in _TOKEN.finditer(text))


def _texts(message: Mapping[str, Any]) -> Iterable[str]:
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            yield message[key]
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        yield str(function.get("name", ""))
        yield str(function.get("arguments", ""))


def prompt_tokens(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """What a request costs before the answer: every message's text (contents, names, tool calls and their
    arguments) plus ``MESSAGE_OVERHEAD`` each, the tools offered as compact JSON, and ``REPLY_OVERHEAD``."""
    total = REPLY_OVERHEAD
    for message in messages:
        total += MESSAGE_OVERHEAD + sum(count_tokens(text) for text in _texts(message))
    if tools:
        total += count_tokens(json.dumps(list(tools), separators=(",", ":"), sort_keys=True))
    return total
