"""The approved effects on booking-agent: a booking capped at the approved total, a cancel, and the booking's journal
relayed into the chat's as it is written.

Each runs in the ``book`` step (once per approval, ``agents.concierge.graph``); booking-agent's ``Idempotency-Key``
(``booking_key_for``) makes the booking one however often that step runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any, Final

from agents.concierge.context import ConciergeDeps
from agents.concierge.state import Approval, Done, Pending
from agents.concierge.views import booking_view, third_party_text, tool_error
from domain.chat import ChatEventKind
from domain.errors import ErrorCode
from graph.outages import raise_if_waited_out
from identity.auth import person_acted_for
from infra.error_table import answer_for
from infra.journal import is_final, read_journal
from process.tasks import stop_task
from resilience import policy_for
from resilience.budget import remaining_budget

__all__ = ["RELAY_POLL_S", "book", "booking_key_for", "cancel"]

RELAY_POLL_S: Final = 0.05
RELAY_STOP_S: Final = 1.0
"""How long the book step waits for its relay to stop once booking-agent has answered."""
"""How often ``book`` looks for the booking's new journal entries while booking-agent works on it."""


def booking_key_for(chat_id: str, tool_call_id: str) -> str:
    """booking-agent's ``Idempotency-Key`` for one approved ``book_hotel`` call: the same on every replay, replica
    and recovery, so however often the step runs there is one booking."""
    return "concierge-" + hashlib.sha256(f"{chat_id}\x00{tool_call_id}".encode()).hexdigest()[:32]


async def _accepted(deps: ConciergeDeps, chat_id: str, booking_id: str) -> None:
    """A booking booking-agent accepted is the chat's at once (``GET /chats/{id}`` shows it; its tools may read it)."""
    await deps.chats.add_booking(chat_id, booking_id)


def _answered(exc: Exception, call_id: str) -> Done:
    """A failure that answers the call (the tool's error). Our own stores' failures raise: the step runs again; so
    does booking-agent being down or full while the turn's budget can wait for it (an approved booking is a promise)."""
    answer = answer_for(exc)
    if answer.code in (ErrorCode.INTERNAL, ErrorCode.DEPENDENCY_UNAVAILABLE):
        raise exc
    raise_if_waited_out(exc, "booking_agent")
    return {"tool_call_id": call_id, "content": tool_error(answer.message, answer.code)}


async def book(deps: ConciergeDeps, chat_id: str, pending: Pending) -> Done:
    """booking-agent's ``book_hotel`` on the approved terms, the approved total its ceiling; relayed as it goes."""
    approval = pending["approval"]
    call_id = pending["tool_call_id"]
    token = await deps.chats.token(chat_id)
    if token is None:
        message = "payment_token: the person gave none (on a message or the approval); nothing was booked"
        return {"tool_call_id": call_id, "content": tool_error(message)}
    client_key = booking_key_for(chat_id, call_id)
    request = {
        "city": approval.get("city"),
        "checkin": approval.get("checkin"),
        "checkout": approval.get("checkout"),
        "guests": approval.get("guests"),
        "hotel_id": approval.get("hotel_id"),
        # the approved terms are the ceiling: booking-agent charges nothing above them (it fails ``price_changed``)
        "max_price_per_night": approval.get("price_per_night"),
        "max_total_price": approval.get("total_price"),
        "currency": approval.get("currency"),
        "payment_token": token,
        "idempotency_key": client_key,
    }
    stop_relay = asyncio.Event()
    relay = asyncio.create_task(_relay(deps, chat_id, client_key, stop_relay), name=f"relay:{chat_id}")
    try:
        booking = await policy_for("booking_agent").call(deps.booking_agent.call, "book_hotel", request)
    except Exception as exc:
        return _answered(exc, call_id)
    finally:
        # bounded, and the flag ends its loop even if a Redis call below swallowed the cancellation (seen: a relay
        # "cancelling" yet polling for a booking booking-agent never made, and the step waiting on it for good)
        await stop_task(relay, within=RELAY_STOP_S, what=f"the relay of chat {chat_id}", stop=stop_relay)
    booking_id = str(booking.get("booking_id") or "")
    if booking_id:
        await _accepted(deps, chat_id, booking_id)
        await _relay_entries(deps, chat_id, booking_id, None, until_final=True)
    if booking.get("status") == "confirmed":
        await deps.chats.drop_token(chat_id)  # charged: the token is not needed any more
    done: Done = {"tool_call_id": call_id, "booking_id": booking_id or None, "status": booking.get("status")}
    raw_error = booking.get("error")
    error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
    if booking.get("status") == "failed" and error.get("code") == ErrorCode.PRICE_CHANGED:
        done["content"] = _price_changed(booking_id, approval, error)
    else:
        done["content"] = json.dumps(booking_view(booking))
    return done


def _price_changed(booking_id: str, approval: Approval, error: dict[str, Any]) -> str:
    """The model's news of a hold dearer than the approval: the new total, so it may ask for a new approval."""
    held = error.get("held_total")
    currency = third_party_text(error.get("currency") or approval.get("currency"))
    approved = approval.get("total_price")
    now = f"the hotel now asks {float(held):.2f} {currency}" if isinstance(held, int | float) else "it costs more"
    message = (
        f"the price changed after the approval: {now}, not the approved {approved} {approval.get('currency')}; "
        "the hold was released and nothing was charged. A booking at the new price needs a new approval."
    )
    return tool_error(
        message,
        ErrorCode.PRICE_CHANGED,
        booking_id=booking_id,
        new_total_price=held if isinstance(held, int | float) else None,
        approved_total_price=approved,
        currency=currency,
    )


async def cancel(deps: ConciergeDeps, chat_id: str, pending: Pending) -> Done:
    """booking-agent's ``cancel_booking`` of the approved booking (a repeat finds it cancelled: nothing changes); a
    confirmed one with the approved fee as its ``max_fee`` (``fee_exceeds_limit``: nothing cancelled, and said)."""
    call_id = pending["tool_call_id"]
    booking_id = str(pending["approval"].get("booking_id") or "")
    request: dict[str, Any] = {"booking_id": booking_id}
    refund = pending["approval"].get("refund")
    if isinstance(refund, dict):  # a confirmed stay: never more than the fee the person approved
        request["max_fee"] = refund.get("fee")
    try:
        booking = await policy_for("booking_agent").call(deps.booking_agent.call, "cancel_booking", request)
    except Exception as exc:
        return _answered(exc, call_id)
    return {
        "tool_call_id": call_id,
        "content": json.dumps(booking_view(booking)),
        "booking_id": booking_id,
        "status": booking.get("status"),
    }


async def _relay(deps: ConciergeDeps, chat_id: str, client_key: str, stop: asyncio.Event) -> None:
    """While booking-agent works: find the booking its key made, then relay its journal entries as they come."""
    booking_id: str | None = None
    owner = person_acted_for()  # this task was started inside the book step's ``acting_for``: the chat's owner
    while booking_id is None:
        if stop.is_set():
            return  # booking-agent answered (or refused) before its booking could be found
        booking_id = await deps.bookings.booking_for_key(client_key, owner)
        if booking_id is None:
            await asyncio.sleep(RELAY_POLL_S)
    await _accepted(deps, chat_id, booking_id)
    await _relay_entries(deps, chat_id, booking_id, None, until_final=True)


async def _relay_entries(
    deps: ConciergeDeps, chat_id: str, booking_id: str, after: str | None, *, until_final: bool
) -> None:
    """Each of the booking's journal entries into the chat's, once (its once-key is the entry's id)."""
    deadline = time.monotonic() + max(0.0, min(remaining_budget(), 5.0) if until_final else 0.0)
    while True:
        entries = await read_journal(deps.redis, booking_id, after=after, count=200)
        for entry in entries:
            after = entry["id"]
            await deps.feed.emit(
                chat_id,
                ChatEventKind.BOOKING,
                once=f"booking:{booking_id}:{entry['id']}",
                booking_id=booking_id,
                entry=entry,
            )
            if is_final(entry):
                return
        if not entries and (not until_final or time.monotonic() > deadline):
            return
        if not entries:
            await asyncio.sleep(RELAY_POLL_S)
