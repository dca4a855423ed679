"""A chat's vocabulary, in one place: its statuses, a turn's outcomes, the kinds of its journal, the text limit, the
tool-argument rules and the errors a conversation answers with (their HTTP status: ``infra.error_table``).

concierge-agent, its graph (``graph.concierge``), the chat store (``infra.chats``) and the CLI speak it. The tool
names are the model's (``domain.llm``). Standard library only, so anything may import it.
"""

from __future__ import annotations

import hashlib
import math
from enum import StrEnum
from typing import Any, Final

from domain.booking import ErrorCode, JournalKind, validate_stay
from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, SEARCH_HOTELS, TOOL_NAMES

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
    "validate_tool_args",
]

MAX_TEXT_BYTES: Final = 8 * 1024
"""A message's ``text`` is at most 8 KB (UTF-8): more is refused at the door, naming the field."""


class ChatStatus(StrEnum):
    IDLE = "idle"
    """No turn runs: the chat takes a message."""
    RUNNING = "running"
    """A turn runs (on any replica, or the recovery worker)."""
    AWAITING_APPROVAL = "awaiting_approval"
    """A turn stopped at ``book_hotel``'s approval: it waits for the person's decision (or its expiry)."""


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
    {*(kind.value for kind in ChatEventKind), JournalKind.OWNER_LOST, JournalKind.RESUMED, JournalKind.HANDED_OFF}
)
"""The kinds a chat's journal shows: its own and the run's change of hands (the stream holds the run's step entries
too, which are the booking journal's vocabulary and are not shown)."""


def check_text(text: object) -> str:
    """A message's text, or ``ValueError`` saying why not (blank, or over ``MAX_TEXT_BYTES``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("must be a non-empty string")
    if len(text.encode()) > MAX_TEXT_BYTES:
        raise ValueError(f"must be at most {MAX_TEXT_BYTES} bytes (UTF-8)")
    return text


def approval_id_for(chat_id: str, tool_call_id: str) -> str:
    """The approval of one ``book_hotel`` call: the same on every replay of the step that asks for it."""
    return "ap_" + hashlib.sha256(f"{chat_id}\x00{tool_call_id}".encode()).hexdigest()[:24]


# ------------------------------------------------------------------------------------------------- tool arguments


class InvalidToolCallError(ValueError):
    """A tool call the model made that cannot run (unknown tool, malformed or rule-breaking arguments): its result
    is this message, sent back to the model as the tool's error."""


_ARGUMENTS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    # tool: (required, optional)
    SEARCH_HOTELS: (("city", "checkin", "checkout", "guests"), ("max_price_per_night",)),
    BOOK_HOTEL: (("hotel_id", "city", "checkin", "checkout", "guests"), ()),
    GET_BOOKING: (("booking_id",), ()),
    CANCEL_BOOKING: (("booking_id",), ()),
}


def _short_string(args: dict[str, Any], name: str, limit: int = 80) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise InvalidToolCallError(f"{name}: must be a non-empty string of at most {limit} characters")
    return value.strip()


def validate_tool_args(name: str, args: object) -> dict[str, Any]:
    """The arguments of a tool call, checked like a request body (the stay rules of ``domain.booking``).

    The model is data: whatever it sends is validated before anything is called, and a bad call raises
    ``InvalidToolCallError`` naming the argument.
    """
    if name not in TOOL_NAMES:
        raise InvalidToolCallError(f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}")
    if not isinstance(args, dict):
        raise InvalidToolCallError("arguments: must be a JSON object")
    required, optional = _ARGUMENTS[name]
    unknown = sorted(set(args) - set(required) - set(optional))
    if unknown:
        raise InvalidToolCallError(f"{unknown[0]}: not an argument of {name}")
    missing = [field for field in required if args.get(field) is None]
    if missing:
        raise InvalidToolCallError(f"{missing[0]}: required")
    if name in (GET_BOOKING, CANCEL_BOOKING):
        booking_id = _short_string(args, "booking_id", 64)
        if not all(ch.isalnum() or ch in "_-" for ch in booking_id):
            raise InvalidToolCallError("booking_id: letters, digits, _ and - only")
        return {"booking_id": booking_id}
    clean: dict[str, Any] = {"city": _short_string(args, "city")}
    guests = args["guests"]
    if isinstance(guests, float) and guests.is_integer():
        guests = int(guests)
    if isinstance(guests, bool) or not isinstance(guests, int):
        raise InvalidToolCallError("guests: must be a whole number")
    try:
        validate_stay(args["checkin"], args["checkout"], guests)
    except ValueError as exc:
        raise InvalidToolCallError(str(exc)) from None
    clean.update(checkin=args["checkin"], checkout=args["checkout"], guests=guests)
    if name == BOOK_HOTEL:
        clean["hotel_id"] = _short_string(args, "hotel_id", 64)
    elif args.get("max_price_per_night") is not None:
        price = args["max_price_per_night"]
        if isinstance(price, bool) or not isinstance(price, int | float) or not math.isfinite(price) or price <= 0:
            raise InvalidToolCallError("max_price_per_night: must be a positive number")
        clean["max_price_per_night"] = float(price)
    return clean


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
