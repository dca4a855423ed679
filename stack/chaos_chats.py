"""``concierge chaos --chats N``: conversations with concierge-agent beside the booking clients, under the same faults.

Each conversation is one chat that, until the run's time is up, asks for a stay (a phrase llm-api's simulated model
turns into ``search_hotels`` → ``book_hotel``), follows the chat until its turn stops, and answers each approval it is
asked for: approve or refuse at random (from the seed), sometimes sending the same decision twice at once, as a retry
does. Every request is retried over lost connections and "not now" answers with the same ``Idempotency-Key`` (or the
same decision), on any replica. It records every approval, the server's answers and the bookings the chat relayed
for it, for ``stack.chaos_verdict.judge_chats`` (docs/chaos.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import httpx

from domain.booking import MAX_DAYS_AHEAD
from providers.inventory import CITIES
from stack.chaos_verdict import ApprovalRecord, ChatRecord
from stack.chat import DEFAULT_PAYMENT_TOKEN

__all__ = ["TRY_AGAIN", "Conversations", "ask_text", "retry_after"]

APPROVE_SHARE = 0.6
"""This share of the approvals is granted, the rest refused."""
TWICE_SHARE = 0.3
"""This share of the decisions is sent twice at once (the same one: a client's retry racing its first try)."""
THINK_S = (0.2, 1.5)
"""A person's pause before the next request."""
CHAT_WAIT_S = 10.0
REQUEST_TIMEOUT_S = 5.0
DECIDE_TIMEOUT_S = 20.0
"""A decision may wait up to 10 s for its turn to park (concierge-agent's ``PARK_WAIT_S``)."""
JUDGE_PATIENCE_S = 60.0
"""After the settle: how long a chat that cannot be read is tried again before the verdict calls it unreadable."""
TRY_AGAIN = frozenset({429, 502, 503, 504})
"""Answers that say "not now": the request is sent again, with the same ``Idempotency-Key``, after ``Retry-After``."""
Answered = Callable[[str, httpx.Response], None]


def ask_text(rng: random.Random, today: date) -> str:
    """A request for a stay the simulated model books at once (the cheapest offer), far enough ahead that rooms
    never run out."""
    checkin = today + timedelta(days=rng.randint(7, MAX_DAYS_AHEAD - 40))
    nights, guests = rng.randint(1, 3), rng.randint(1, 3)
    return (
        f"{nights} night{'s' if nights > 1 else ''} in {rng.choice(CITIES)} from {checkin.isoformat()} for {guests} "
        f"guest{'s' if guests > 1 else ''}, book the cheapest"
    )


@dataclass
class _Chat:
    chat_id: str
    turns: int = 0
    cursor: str | None = None
    """The last journal entry read (``Last-Event-ID``)."""
    decided: str | None = None
    """The approval decided last: the booking entries relayed after it are its booking's."""
    calls: dict[str, str] = field(default_factory=dict)
    """``book_hotel`` tool call id → its approval id (its tool result names the booking)."""
    relayed: list[str] = field(default_factory=list)
    """Every booking id the chat's journal relayed."""


@dataclass
class Conversations:
    """The run's conversations and what they recorded; ``stop`` ends the asking, ``give_up`` the following."""

    count: int
    seed: int
    urls: list[str]
    http: httpx.AsyncClient
    stop: asyncio.Event
    give_up: asyncio.Event
    answered: Answered
    """Told every answer (the run counts the 5xx other than 503, by route)."""
    say: Callable[[str], None]
    chats: dict[str, _Chat] = field(default_factory=dict)
    approvals: dict[str, ApprovalRecord] = field(default_factory=dict)
    choices: dict[str, bool] = field(default_factory=dict)
    """The decision drawn for each approval (a retry sends the same)."""

    async def converse(self, number: int) -> None:
        """One conversation: ask, follow, decide, until the time is up; then its turn followed to its end."""
        rng = random.Random(f"{self.seed}:chat:{number}")
        chat = await self._open()
        if chat is None:
            return
        while not self.stop.is_set():
            view = await self._follow(chat)
            if view is None:
                break
            await self._read_events(chat)
            if view.get("status") == "awaiting_approval" and view.get("pending_approval"):
                await self._answer(chat, view["pending_approval"], rng)
                continue
            await self._pause(rng.uniform(*THINK_S))
            if not self.stop.is_set():
                await self._ask(chat, ask_text(rng, date.today()))
        while not self.give_up.is_set():  # no new turn; a decision sent is waited for, one never sent stays so
            view = await self._follow(chat)
            pending = (view or {}).get("pending_approval") or {}
            if view is None or view.get("status") == "idle" or pending.get("approval_id") not in self.choices:
                break
            await self._answer(chat, pending, rng)
        await self._read_events(chat)

    # ----------------------------------------------------------------------------------------------- requests

    async def _request(
        self, method: str, path: str, route: str, *, until: float | None = None, **kwargs: Any
    ) -> httpx.Response | None:
        """One request to any replica, sent again over lost connections (a replica killed or paused); None once the
        run gives up (or, with ``until``, after that monotonic time)."""
        attempt = 0
        while True:
            url = self.urls[attempt % len(self.urls)]
            attempt += 1
            try:
                response = await self.http.request(method, f"{url}{path}", **kwargs)
            except httpx.TransportError:
                if (self.give_up.is_set() and until is None) or (until is not None and time.monotonic() > until):
                    return None
                await asyncio.sleep(0.25)
                continue
            self.answered(route, response)
            return response

    async def _open(self) -> _Chat | None:
        while not self.stop.is_set():
            response = await self._request("POST", "/chats", "POST /chats")
            if response is None:
                return None
            if response.status_code in (200, 201):
                chat = _Chat(str(response.json()["chat_id"]))
                self.chats[chat.chat_id] = chat
                self.say(f"chat {chat.chat_id} opened")
                return chat
            await asyncio.sleep(retry_after(response))
        return None

    async def _ask(self, chat: _Chat, text: str) -> None:
        """A new turn; over a lost answer or a "not now", the same message with the same key (the same turn)."""
        key = f"chaos-chat-{uuid.uuid4().hex}"
        path = f"/chats/{chat.chat_id}/messages"
        while not self.give_up.is_set():
            response = await self._request(
                "POST", path, "POST /chats/{id}/messages", json={"text": text}, headers={"Idempotency-Key": key}
            )
            if response is None:
                return
            if response.status_code in (200, 201, 202):
                chat.turns += 1
                return
            if response.status_code in TRY_AGAIN and not self.stop.is_set():
                await asyncio.sleep(retry_after(response))
                continue
            # 409: a turn still running or an approval pending (a recovered turn): the conversation follows it first
            await asyncio.sleep(0.5)
            return

    async def _follow(self, chat: _Chat) -> dict[str, Any] | None:
        """The chat once its turn is not running (None when the run gave up)."""
        while not self.give_up.is_set():
            response = await self._request(
                "GET",
                f"/chats/{chat.chat_id}",
                "GET /chats/{id}?wait=",
                params={"wait": CHAT_WAIT_S},
                timeout=CHAT_WAIT_S + REQUEST_TIMEOUT_S,
            )
            if response is None:
                return None
            if response.status_code != 200:
                await asyncio.sleep(retry_after(response))
                continue
            view: dict[str, Any] = response.json()
            if view.get("status") != "running":
                return view
        return None

    async def _answer(self, chat: _Chat, pending: dict[str, Any], rng: random.Random) -> None:
        """The pending approval decided (once drawn, always the same decision), sent once or twice at once; an
        approval decided already and still parked is sent its decision again (its first answer may have been lost)."""
        approval = self._approval(chat.chat_id, pending)
        if approval.approval_id not in self.choices:
            self.choices[approval.approval_id] = rng.random() < APPROVE_SHARE
            sends = 2 if rng.random() < TWICE_SHARE else 1
        elif approval.answers or approval.expired:
            await asyncio.sleep(0.5)  # recorded: its turn resumes (here, on a peer or by the recovery)
            return
        else:
            sends = 1
        approval.sent += sends
        verb = "approve" if self.choices[approval.approval_id] else "refuse"
        self.say(
            f"chat {chat.chat_id}: {verb} {approval.approval_id} ({approval.total_price:.2f} {approval.currency})"
            f"{' twice at once' if sends > 1 else ''}"
        )
        await asyncio.gather(*(self._decide(approval) for _ in range(sends)))

    async def _decide(self, approval: ApprovalRecord, until: float | None = None) -> None:
        approve = self.choices[approval.approval_id]
        body: dict[str, Any] = {"approve": approve}
        if approve:
            body["payment_token"] = DEFAULT_PAYMENT_TOKEN
        path = f"/chats/{approval.chat_id}/approvals/{approval.approval_id}"
        while not self.give_up.is_set() or until is not None:
            response = await self._request(
                "POST", path, "POST /chats/{id}/approvals/{id}", json=body, timeout=DECIDE_TIMEOUT_S, until=until
            )
            if response is None:
                return
            if response.status_code in (200, 202):
                approval.answers.append(bool(response.json().get("approve")))
                return
            if response.status_code == 409:
                approval.expired = True
                return
            if response.status_code in TRY_AGAIN and (until is None or time.monotonic() < until):
                await asyncio.sleep(retry_after(response))
                continue
            return  # 404: not (or no longer) pending; the journal and the judgement tell what became of it

    def _approval(self, chat_id: str, approval: dict[str, Any]) -> ApprovalRecord:
        approval_id = str(approval["approval_id"])
        if approval_id not in self.approvals:
            self.approvals[approval_id] = ApprovalRecord(
                chat_id, approval_id, float(approval.get("total_price") or 0), str(approval.get("currency"))
            )
        return self.approvals[approval_id]

    async def _read_events(self, chat: _Chat, until: float | None = None) -> bool:
        """The chat's journal since the last entry read: approvals asked and decided, bookings relayed."""
        headers = {"Last-Event-ID": chat.cursor} if chat.cursor else {}
        response = await self._request(
            "GET", f"/chats/{chat.chat_id}/events", "GET /chats/{id}/events", headers=headers, until=until
        )
        if response is None or response.status_code != 200:
            return False
        for entry in response.json().get("events") or []:
            self._note(chat, entry)
            chat.cursor = str(entry["id"])
        return True

    def _note(self, chat: _Chat, entry: dict[str, Any]) -> None:
        kind = entry.get("kind")
        if kind == "approval_requested" and isinstance(entry.get("approval"), dict):
            approval = self._approval(chat.chat_id, entry["approval"])
            if entry.get("tool_call_id"):
                chat.calls[str(entry["tool_call_id"])] = approval.approval_id
        elif kind == "approval_decided":
            chat.decided = str(entry.get("approval_id"))
            if entry.get("expired") and chat.decided in self.approvals:
                self.approvals[chat.decided].expired = True
        elif kind == "booking" and entry.get("booking_id"):
            booking_id = str(entry["booking_id"])
            chat.relayed.append(booking_id)
            if chat.decided in self.approvals:
                self.approvals[chat.decided].booking_ids.append(booking_id)
        elif kind == "tool_result" and str(entry.get("tool_call_id")) in chat.calls:
            content = entry.get("content")
            error = content.get("error") if isinstance(content, dict) else None
            if isinstance(error, dict) and error.get("code"):
                self.approvals[chat.calls[str(entry["tool_call_id"])]].tool_error = str(error["code"])
            if isinstance(content, dict) and content.get("booking_id"):
                booking_id = str(content["booking_id"])
                chat.relayed.append(booking_id)
                self.approvals[chat.calls[str(entry["tool_call_id"])]].booking_ids.append(booking_id)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    # ----------------------------------------------------------------------------------------------- judging

    async def records(self) -> tuple[list[ChatRecord], list[ApprovalRecord]]:
        """After the settle: each chat as it stands, its journal read to the end; a decision that never got an
        answer sent once more (a repeat answers the first decision, or that the approval expired)."""
        until = time.monotonic() + JUDGE_PATIENCE_S
        for approval in self.approvals.values():
            if approval.sent and not approval.answers and not approval.expired:
                await self._decide(approval, until=until)
        chats: list[ChatRecord] = []
        for chat in self.chats.values():
            await self._read_events(chat, until=until)
            response = await self._request("GET", f"/chats/{chat.chat_id}", "GET /chats/{id}", until=until)
            view: dict[str, Any] = response.json() if response is not None and response.status_code == 200 else {}
            pending = view.get("pending_approval") or {}
            listed = [b["booking_id"] if isinstance(b, dict) else b for b in view.get("bookings") or []]
            chats.append(
                ChatRecord(
                    chat.chat_id,
                    chat.turns,
                    view.get("status"),
                    pending.get("approval_id"),
                    list(dict.fromkeys([*map(str, listed), *chat.relayed])),
                )
            )
        return chats, list(self.approvals.values())


def retry_after(response: httpx.Response) -> float:
    try:
        return min(2.0, max(0.1, float(response.headers.get("Retry-After", "0.5"))))
    except ValueError:
        return 0.5
