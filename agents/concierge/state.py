"""The concierge graph's state: one chat turn, typed, so each node says what it reads and writes.

The thread is the chat: ``messages`` and ``bookings`` carry over from turn to turn, the rest is the turn's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, TypedDict

from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

__all__ = [
    "Approval",
    "ConciergeState",
    "Decision",
    "Done",
    "Pending",
    "TurnError",
    "failure",
    "turn_input",
]


class TurnError(TypedDict):
    """Why a turn ended ``failed`` (``last_turn.error``): an ``ErrorCode`` and a sentence."""

    code: str
    message: str


class Approval(TypedDict):
    """What the person is asked to consent to (journaled as ``approval_requested``, shown as ``pending_approval``):
    exact terms, so a decision can never apply to another hotel, stay, price or booking."""

    approval_id: str
    action: Literal["book", "cancel"]
    expires_at: str
    hotel_id: NotRequired[str | None]
    hotel_name: NotRequired[str | None]
    city: NotRequired[str | None]
    checkin: NotRequired[str | None]
    checkout: NotRequired[str | None]
    guests: NotRequired[int | None]
    total_price: NotRequired[float | None]
    price_per_night: NotRequired[float | None]
    currency: NotRequired[str | None]
    cancellation: NotRequired[dict[str, Any] | None]
    """The stay's cancellation policy (``domain.cancellation``): what cancelling later would cost."""
    booking_id: NotRequired[str]
    """A cancel's booking."""
    refund: NotRequired[dict[str, Any] | None]
    """A confirmed booking's cancel: ``{amount, fee, currency}`` its policy gives now; the fee is the cancel's
    ``max_fee``, so a fee that rose meanwhile cancels nothing."""


class Pending(TypedDict):
    """The tool call parked for its approval (``until``: when the approval expires, seconds since the epoch)."""

    tool: str
    tool_call_id: str
    args: dict[str, Any]
    approval: Approval
    until: float


class Decision(TypedDict, total=False):
    """The person's answer, as ``Command(resume=)`` brings it (``expired``: nobody answered in time)."""

    approve: bool
    expired: bool


class Done(TypedDict, total=False):
    """An approved call's result as the ``book`` step stored it (plain data: a replay returns it as it was)."""

    tool_call_id: str
    content: str
    booking_id: str | None
    status: str | None


class ConciergeState(TypedDict, total=False):
    chat_id: str
    turn_id: str
    text: str
    """The user's message of the turn (the run's input, which also adds it to ``messages``)."""
    messages: Annotated[list[AnyMessage], add_messages]
    model_calls: int
    """Model calls made in this turn."""
    usage: dict[str, int]
    """This turn's usage (``infra.llm.Usage`` fields)."""
    chat_usage: dict[str, int]
    """Every earlier turn's usage."""
    error: TurnError | None
    pending: Pending | None
    decision: Decision | None
    done: Done | None
    bookings: list[str]
    """The bookings booking-agent accepted in this chat: the only ones its tools may read or cancel."""
    answered_calls: dict[str, str]
    """This turn's reads that succeeded: ``Tool.call_key`` → the tool call id whose result answers a repeat."""
    outcome: str | None


def failure(code: str, message: str) -> TurnError:
    return {"code": str(code), "message": message}


def turn_input(chat_id: str, turn_id: str, text: str) -> dict[str, Any]:
    """The run input of one turn, applied as its first state update (also what its run record stores, as JSON: no
    payment token). ``add_messages`` makes the message dict a ``HumanMessage``; its id makes a replay a no-op."""
    message = {"role": "user", "content": text, "id": f"{turn_id}:user", "turn_id": turn_id}
    return {
        "chat_id": chat_id,
        "turn_id": turn_id,
        "text": text,
        "messages": [message],
        "model_calls": 0,
        "usage": {},
        "error": None,
        "pending": None,
        "decision": None,
        "done": None,
        "answered_calls": {},
        "outcome": None,
    }
