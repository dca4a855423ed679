"""A chat's vocabulary, in one place: its statuses, a turn's outcomes, the kinds of its journal, the text limit, the
approval ids and the errors a conversation answers with (their HTTP status: ``infra.error_table``).

concierge-agent, its graph (``agents.concierge.graph``), the chat store (``infra.chats``) and the CLI speak it. The tools
themselves (arguments, rules, runners) are records in ``agents.concierge.tools``. Standard library only.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Any, Final

from domain.booking import JournalKind
from domain.errors import ErrorCode

__all__ = [
    "CHAT_EVENT_KINDS",
    "MAX_TEXT_BYTES",
    "ApprovalExpiredError",
    "ApprovalPendingError",
    "ChatConflictError",
    "ChatEventKind",
    "ChatStatus",
    "InvalidToolCallError",
    "TurnInProgressError",
    "TurnOutcome",
    "approval_id_for",
    "check_text",
]

MAX_TEXT_BYTES: Final = 8 * 1024
"""A message's ``text`` is at most 8 KB (UTF-8): more is refused at the door, naming the field."""


class ChatStatus(StrEnum):
    IDLE = "idle"
    """No turn runs: the chat takes a message."""
    RUNNING = "running"
    """A turn runs (on any replica, or the recovery worker)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """A turn stopped at a booking's or a cancel's approval: it waits for the person's decision (or its expiry)."""


class TurnOutcome(StrEnum):
    ANSWERED = "answered"
    AWAITING_APPROVAL = "awaiting_approval"
    FAILED = "failed"
    """The turn ended with an error code (``last_turn.error``); the chat is ``idle`` again."""


class ChatEventKind(StrEnum):
    """What a chat's journal entry tells (``GET /chats/{id}/events``; docs/concierge.md has the fields)."""

    USER_MESSAGE = "user_message"
    TOKEN = "token"
    """The model's text as it streams: ``text``, ``call`` (the turn's model call) and ``attempt`` (its try)."""
    MODEL_SWITCHED = "model_switched"
    """The model client gave up an attempt that may have streamed (``reason``, ``from_model``, ``to_model``, ``call``,
    ``attempt``: the discarded one): its ``token`` entries are not part of the answer; the next attempt's are."""
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    BOOKING = "booking"
    """One of the booked booking's own journal entries, relayed once (``entry``)."""
    TURN_FINISHED = "turn_finished"


CHAT_EVENT_KINDS: Final = frozenset(
    {
        *(kind.value for kind in ChatEventKind),
        JournalKind.OWNER_LOST,
        JournalKind.RESUMED,
        JournalKind.HANDED_OFF,
        JournalKind.PAUSED,
    }
)
"""The kinds a chat's journal shows: its own, the run's change of hands and its pauses for an outage (the stream
holds the run's step entries too, which are the booking journal's vocabulary and are not shown)."""


def check_text(text: object) -> str:
    """A message's text, or ``ValueError`` saying why not (blank, or over ``MAX_TEXT_BYTES``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("must be a non-empty string")
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise ValueError(f"must be at most {MAX_TEXT_BYTES} bytes (UTF-8)")
    return text


def approval_id_for(chat_id: str, tool_call_id: str) -> str:
    """The approval of one ``book_hotel`` or ``cancel_booking`` call: the same on every replay of the step that asks
    for it."""
    return "ap_" + hashlib.sha256(f"{chat_id}\x00{tool_call_id}".encode()).hexdigest()[:24]


class InvalidToolCallError(ValueError):
    """A tool call the model made that cannot run (unknown tool, malformed or rule-breaking arguments): its result
    is this message, sent back to the model as the tool's error (``code``: its ``ErrorCode``)."""

    code: str = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, **details: Any) -> None:
        """``details``: data the error's JSON carries beside its message (a model reads data better than prose)."""
        super().__init__(message)
        self.details = details


# ------------------------------------------------------------------------------------------------- errors


class ChatConflictError(Exception):
    """The chat cannot take this now (HTTP 409); ``code`` says why (an ``ErrorCode``).

    ChatConflictError
     ├── TurnInProgressError     a turn runs: wait for it (``GET /chats/{id}?wait=``)
     ├── ApprovalPendingError    a booking waits for the person's approval: decide it first
     └── ApprovalExpiredError    the approval is older than ``APPROVAL_TTL_S``: nothing was booked
    """

    code: str = ErrorCode.REJECTED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TurnInProgressError(ChatConflictError):
    code = ErrorCode.TURN_IN_PROGRESS


class ApprovalPendingError(ChatConflictError):
    code = ErrorCode.APPROVAL_PENDING


class ApprovalExpiredError(ChatConflictError):
    code = ErrorCode.APPROVAL_EXPIRED
