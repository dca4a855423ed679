"""An MCP host's calls of the concierge's tools: reads run at once, for the person; a ``book_hotel`` or
``cancel_booking`` becomes an approval the server keeps, then its outcome, waited for within a budget.

An approved call is a chat of the person's whose one run is ``agents.concierge.approved_call``: the approval is
journaled and parked exactly like a turn's (same ``APPROVAL_TTL_S``, same terms, the approved total the booking's
ceiling), decided through ``ConciergeService.decide`` (the first decision stands, whoever sends it: the host's retry
on any replica, the console, ``concierge chat --chat ID``), and booked once by the concierge's own ``book`` step.
No SDK here: ``agents.concierge.mcp_server`` speaks MCP and calls this.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from agents.concierge.approved_call import APPROVED_CALL_GRAPH, call_input
from agents.concierge.graph import ask_approval
from agents.concierge.state import Approval
from agents.concierge.tools import Tool, ToolContext
from domain.booking import FINAL_BOOKING_STATUSES
from domain.chat import InvalidToolCallError
from identity.auth import acting_for
from infra.settings import get_settings
from runs.leases import RunRecord, RunStatus

if TYPE_CHECKING:
    from agents.concierge.app import ConciergeService

__all__ = ["Asked", "Outcome", "Progress", "ask", "pending_of", "read", "wait_outcome"]

POLL_S: Final = 0.1
"""How often a waiting call looks at its run and its booking (any replica, or the recovery worker, runs them)."""
PARK_WAIT_S: Final = 10.0
"""The longest an asking call waits for its run to park (it is started just before)."""

Progress = Callable[[float, str], Awaitable[None]]
"""Told each step the call passes while it waits (a progress notification): how far, and in words."""


class CallRefusedError(InvalidToolCallError):
    """The retry names an approval that is not the caller's, or not for these terms: nothing is decided."""

    code: str = "approval_refused"


@dataclass(frozen=True)
class Asked:
    """An approval the server keeps: the call's chat and the terms the person is asked to consent to."""

    chat_id: str
    approval: Approval


@dataclass(frozen=True)
class Outcome:
    """What an approved call ended in (``result``, structured), or ``pending`` with what to follow."""

    result: dict[str, Any]
    final: bool


def _context(service: ConciergeService, chat_id: str) -> ToolContext:
    return ToolContext(service.deps, chat_id, frozenset())


async def read(service: ConciergeService, person: str, tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
    """A read-only tool's result, for ``person`` only (booking-agent answers for them, ``acting_for``)."""
    assert tool.run is not None
    with acting_for(person):
        content = json.loads(await tool.run(_context(service, ""), args))
    return dict(content) if isinstance(content, dict) else {"result": content}


async def ask(service: ConciergeService, person: str, tool: Tool, args: dict[str, Any]) -> Asked:
    """Quote the call's terms for ``person`` (a refusal raises, nothing kept), keep its approval on a new chat of
    theirs (``PERSON_MAX_CHATS``), and park its run: from here any replica, the console or the CLI may decide it."""
    assert tool.approval is not None
    deps = service.deps
    chat_id = "mcp-" + uuid.uuid4().hex
    turn_id = uuid.uuid4().hex
    call_id = "mcp-" + uuid.uuid4().hex[:24]
    with acting_for(person):
        pending = await ask_approval(
            deps, {"chat_id": chat_id, "turn_id": turn_id}, _context(service, chat_id), tool, call_id, args
        )
    await deps.chats.create(chat_id, person, max_chats=get_settings().person_max_chats)
    if tool.approval.action == "book":
        # the person's card on file: an MCP host never names one (the chat's token key, with its TTL)
        await deps.chats.put_token(chat_id, get_settings().mcp_payment_token)
    run_input = call_input(chat_id, turn_id, pending)
    begun = await service.runs.begin(
        chat_id, APPROVED_CALL_GRAPH, run_input, service.instance, turn=turn_id, version=service.calls_version
    )
    assert begun.lease is not None  # a new chat has no run yet
    service.start(begun.lease, run_input, graph=APPROVED_CALL_GRAPH)
    approval = pending["approval"]
    deadline = time.monotonic() + PARK_WAIT_S
    while time.monotonic() < deadline:
        record = await service.runs.get(chat_id)
        if record is not None and (record.status is RunStatus.PARKED or record.is_final):
            break
        await asyncio.sleep(POLL_S / 2)
    return Asked(chat_id, approval)


async def pending_of(
    service: ConciergeService, person: str, chat_id: str, approval_id: str, tool: Tool, args: Mapping[str, Any]
) -> RunRecord:
    """The run of the approval a retry names, if it is ``person``'s and for exactly these terms (the tool and its
    arguments as first called); ``CallRefusedError`` otherwise, whatever the request state said."""
    exists, owner = await service.deps.chats.owner(chat_id)
    record = await service.runs.get(chat_id) if exists and owner == person else None
    pending = ((record.input or {}).get("pending") or {}) if record is not None else {}
    if (
        record is None
        or record.graph != APPROVED_CALL_GRAPH
        or pending.get("tool") != tool.name
        or (pending.get("approval") or {}).get("approval_id") != approval_id
        or pending.get("args") != dict(args)
    ):
        raise CallRefusedError("request_state: no approval of yours for this call and these terms; nothing decided")
    return record


async def wait_outcome(service: ConciergeService, chat_id: str, progress: Progress) -> Outcome:
    """The decided call's outcome: the run's result, then its booking's final status, within ``MCP_WAIT_S``;
    otherwise ``pending`` with the booking id (or the chat) to follow. ``progress`` hears each step."""
    deadline = time.monotonic() + get_settings().mcp_wait_s
    told: str | None = None
    step = 0.0

    async def tell(words: str) -> None:
        nonlocal told, step
        if words != told:
            told, step = words, step + 1
            await progress(step, words)

    record = await service.runs.get(chat_id)
    while record is not None and not record.is_final and time.monotonic() < deadline:
        await tell("booking" if record.status is RunStatus.RUNNING else f"the call is {record.status.value}")
        await asyncio.sleep(POLL_S)
        record = await service.runs.get(chat_id)
    chat = await service.deps.chats.get(chat_id) or {}
    result = (chat.get("last_turn") or {}).get("result") if record is not None and record.is_final else None
    booking_id = next(iter(chat.get("bookings") or []), None)
    if not isinstance(result, dict):
        follow = {"status": "pending", "chat_id": chat_id, "booking_id": booking_id}
        return Outcome({**follow, "message": _follow(booking_id, chat_id)}, final=False)
    if booking_id is None:
        return Outcome(result, final=True)  # declined, expired, or refused before booking-agent took it
    while True:
        booking = await service.deps.bookings.get(str(booking_id))
        status = (booking or {}).get("status")
        if booking is None or status in FINAL_BOOKING_STATUSES:
            return Outcome({**result, **({"status": status} if status else {})}, final=True)
        if time.monotonic() >= deadline:
            follow = {"status": "pending", "booking_id": booking_id, "message": _follow(booking_id, chat_id)}
            return Outcome({**result, **follow}, final=False)
        await tell(f"booking {booking_id}: {status}")
        await asyncio.sleep(POLL_S)


def _follow(booking_id: object, chat_id: str) -> str:
    if booking_id:
        return f"not final yet: follow it with get_booking {{'booking_id': '{booking_id}'}}"
    return f"not decided yet: the approval waits in chat {chat_id} (the console, or `concierge chat --chat {chat_id}`)"
