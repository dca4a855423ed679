"""``concierge ask`` and ``concierge chat``: talk to concierge-agent from a terminal, a turn at a time.

    concierge ask "<text>" [--chat ID] [--approve] [--payment-token TOKEN] [--url URL] [--timeout S]
    concierge chat [--chat ID] [--payment-token TOKEN] [--url URL] [--timeout S]

A turn is ``POST /chats/{id}/messages`` (with an ``Idempotency-Key``: a retry after a lost answer is the same turn),
then the chat's journal followed over SSE from the last entry seen before the post (``Last-Event-ID``): the model's
tokens are written as they arrive, tool calls and results one line each, the booking's own steps as they happen.
A dropped stream (a replica killed mid-turn) is opened again on any replica after the last entry seen, so a turn
resumed by a peer prints on without a gap or a repeat. An approval is answered with ``--approve`` (``ask``) or y/n
(``chat``); the payment token goes on the approval, never through the model. Exit codes: ``EXIT_CODES``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from domain import currency_code, quoted
from domain.approvals import describe_approval
from domain.booking import FINAL_BOOKING_STATUSES, JournalKind
from infra.settings import get_settings
from stack.book import booking_agent_urls
from stack.console import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Subparsers, one_line_errors
from stack.errors import StackError, UsageError
from stack.journal import STATUS_OF_STEP, describe, sse_entries, story_worthy
from stack.people import add_user_option, person_headers
from stack.target import refusal, service_urls

__all__ = [
    "DEFAULT_PAYMENT_TOKEN",
    "EXIT_AWAITING_APPROVAL",
    "EXIT_CODES",
    "MAX_TEXT_BYTES",
    "ChatClient",
    "TurnOutcome",
    "check_text",
    "concierge_agent_urls",
    "register_ask",
    "register_chat",
    "run_turn",
]

EXIT_AWAITING_APPROVAL = 3
EXIT_CODES: Mapping[int, str] = {
    EXIT_OK: "the turn was answered, and every booking it made is confirmed",
    EXIT_FAILURE: "the turn failed (its error code is printed), a booking it made is not confirmed, or "
    "concierge-agent could not be reached",
    EXIT_USAGE: "bad input (empty or too long a text, a bad chat id): nothing was sent",
    EXIT_AWAITING_APPROVAL: "the turn waits for an approval nobody gave (`ask` without --approve, or end of input "
    "at `chat`'s y/n): the chat keeps it until it expires",
    EXIT_INTERRUPTED: "Ctrl-C",
}
MAX_TEXT_BYTES = 8 * 1024
"""concierge-agent refuses a longer message (422); said here first, in one line."""
DEFAULT_PAYMENT_TOKEN = "tok_visa"
"""The card ``concierge book`` pays with unless told otherwise: payment-api's test token that is always accepted."""
CHAT_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
REQUEST_TIMEOUT_S = 10.0
STREAM_READ_TIMEOUT_S = 40.0
"""The journal stream sends a keep-alive every 15 s: this long without a byte means the connection is dead."""
RETRY_PAUSE_S = 0.2
BOOKING_WAIT_S = 30.0
PARK_WAIT_S = 20.0


def register_ask(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "ask",
        help="one turn with the concierge: stream its answer, answer its approval",
        description="Send one message to concierge-agent and stream the answer. Exit codes: "
        + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument(
        "text", help='what to say, e.g. "two nights in Lisbon from 10 March for two, book the cheapest"'
    )
    parser.add_argument("--chat", default=None, metavar="ID", help="continue this chat (default: a new one)")
    parser.add_argument("--approve", action="store_true", help="approve the booking the turn asks approval for")
    _common(parser)
    parser.set_defaults(handler=_ask)


def register_chat(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="talk with the concierge: type, watch the answer stream, answer approvals with y/n",
        description="An interactive chat with concierge-agent (reads lines from the terminal or a pipe; /quit or "
        "end of input leaves). Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument("--chat", default=None, metavar="ID", help="continue this chat (default: a new one)")
    _common(parser)
    parser.set_defaults(handler=_chat)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--payment-token",
        default=DEFAULT_PAYMENT_TOKEN,
        metavar="TOKEN",
        help=f"the card an approved booking is paid with (default {DEFAULT_PAYMENT_TOKEN}; never shown to the model)",
    )
    parser.add_argument("--url", default=None, help="concierge-agent URL (default: the running stack's)")
    parser.add_argument("--timeout", type=float, default=180.0, metavar="S", help="give up on a turn after S seconds")
    add_user_option(parser)


def check_text(text: str) -> str:
    """The message as sent, or ``UsageError`` for one concierge-agent would refuse (empty, over 8 KB)."""
    if not text.strip():
        raise UsageError("the message is empty")
    size = len(text.encode())
    if size > MAX_TEXT_BYTES:
        raise UsageError(f"the message is {size} bytes; at most {MAX_TEXT_BYTES}")
    return text


def _check_chat_id(chat_id: str | None) -> str | None:
    if chat_id is not None and not CHAT_ID.fullmatch(chat_id):
        raise UsageError(f"not a chat id: {chat_id!r}")
    return chat_id


def _check_token(token: str) -> str:
    if not re.fullmatch(r"tok_[A-Za-z0-9_]{1,60}", token):
        raise UsageError(f"not a payment token: {token!r} (e.g. tok_visa)")
    return token


def concierge_agent_urls(explicit: str | None) -> list[str]:
    """``--url``, else every concierge-agent replica of the running stack, else the settings' URL (compose)."""
    return service_urls("concierge-agent", explicit, get_settings().concierge_agent_url)


class ChatClient:
    """concierge-agent over HTTP, whichever replica answers; a restart is waited out until the deadline."""

    def __init__(self, urls: list[str], timeout_s: float, user: str | None = None) -> None:
        self.urls = urls
        self.timeout_s = timeout_s
        self.headers = person_headers(user)
        self.http = httpx.Client(timeout=REQUEST_TIMEOUT_S, headers=self.headers)
        self.index = 0
        self.deadline = time.monotonic() + timeout_s

    def close(self) -> None:
        self.http.close()

    def renew(self) -> None:
        """A new turn, a new deadline."""
        self.deadline = time.monotonic() + self.timeout_s

    @property
    def url(self) -> str:
        return self.urls[self.index % len(self.urls)]

    def _next(self, problem: str) -> None:
        if time.monotonic() > self.deadline:
            raise StackError(f"concierge-agent {problem}; is the stack running? (`concierge up`)")
        self.index += 1
        time.sleep(RETRY_PAUSE_S)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer of the first replica that gives one (502/503/504 and lost connections are tried again)."""
        first = True
        while True:
            url = self.url
            try:
                response = self.http.request(method, f"{url}{path}", **kwargs)
            except httpx.ConnectError as exc:
                if first and len(self.urls) == 1 and method == "POST" and path == "/chats":
                    raise StackError(
                        f"concierge-agent at {url} is unreachable: stack not running? (`concierge up`)"
                    ) from exc
                problem = f"{url} unreachable ({type(exc).__name__})"
            except httpx.TransportError as exc:
                problem = f"{url} unreachable ({type(exc).__name__})"
            else:
                if response.status_code not in (502, 503, 504):
                    return response
                problem = f"{url} answered {response.status_code}"
            first = False
            self._next(problem)

    def create_chat(self) -> str:
        response = self.request("POST", "/chats", headers={"Idempotency-Key": f"cli-{uuid.uuid4().hex}"})
        if response.status_code != 201:
            raise StackError(f"could not start a chat: {refusal(response)}")
        return str(response.json()["chat_id"])

    def chat(self, chat_id: str, wait: float = 0) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        response = self.request("GET", f"/chats/{chat_id}", params=params, timeout=REQUEST_TIMEOUT_S + wait)
        if response.status_code == 404:
            raise StackError(f"no chat {chat_id}")
        if response.status_code != 200:
            raise StackError(f"could not read chat {chat_id}: {refusal(response)}")
        body: dict[str, Any] = response.json()
        return body

    def last_event_id(self, chat_id: str) -> str | None:
        """The newest journal entry's id: the turn about to start is followed from just after it."""
        response = self.request("GET", f"/chats/{chat_id}/events", headers={"Accept": "application/json"})
        if response.status_code == 404:
            raise StackError(f"no chat {chat_id}")
        if response.status_code != 200:
            raise StackError(f"could not read chat {chat_id}'s events: {refusal(response)}")
        events = response.json().get("events") or []
        return str(events[-1]["id"]) if events else None

    def send(self, chat_id: str, text: str, payment_token: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text}
        if payment_token is not None:
            body["payment_token"] = payment_token
        # the same key on every try: a POST whose answer was lost (a replica killed) is the same turn, not a second
        headers = {"Idempotency-Key": f"cli-{uuid.uuid4().hex}"}
        response = self.request("POST", f"/chats/{chat_id}/messages", json=body, headers=headers)
        if response.status_code == 404:
            raise StackError(f"no chat {chat_id}")
        if response.status_code != 202:
            raise StackError(f"message refused: {refusal(response)}")
        turn: dict[str, Any] = response.json()
        return turn

    def decide(self, chat_id: str, approval_id: str, approve: bool, payment_token: str | None) -> None:
        body: dict[str, Any] = {"approve": approve}
        if approve and payment_token is not None:
            body["payment_token"] = payment_token
        response = self.request("POST", f"/chats/{chat_id}/approvals/{approval_id}", json=body)
        if response.status_code != 202:
            raise StackError(f"approval {approval_id} refused: {refusal(response)}")

    def events(self, chat_id: str, after: str | None) -> Iterator[dict[str, Any]]:
        """The chat's journal after ``after``, as it is written, until the caller stops: one unbroken sequence
        across dropped streams and replicas (``Last-Event-ID``: no gap, no repeat)."""
        last_id = after
        timeouts = httpx.Timeout(REQUEST_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            url = self.url
            try:
                with self.http.stream("GET", f"{url}/chats/{chat_id}/events", headers=headers, timeout=timeouts) as r:
                    if r.status_code == 404:
                        raise StackError(f"no chat {chat_id}")
                    if r.status_code == 200:
                        for entry in sse_entries(r.iter_lines()):
                            if entry.get("id") is not None:
                                last_id = str(entry["id"])
                            yield entry
                        problem = f"{url} ended the stream"
                    else:
                        problem = f"{url} answered {r.status_code}"
            except httpx.TransportError as exc:
                problem = f"{url} unreachable ({type(exc).__name__})"
            self._next(problem)


# ----------------------------------------------------------------------------------------------------- one turn


Decide = Callable[[Mapping[str, Any]], bool | None]
"""Given the pending approval: True approves, False refuses, None leaves it pending (the turn ends there)."""


@dataclass
class TurnOutcome:
    """How a turn ended, as the chat's ``last_turn`` and the bookings it made say."""

    outcome: str
    error: dict[str, Any] | None = None
    approval: dict[str, Any] | None = None
    bookings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.outcome == "awaiting_approval":
            return EXIT_AWAITING_APPROVAL
        if self.outcome != "answered":
            return EXIT_FAILURE
        if any(b.get("status") != "confirmed" for b in self.bookings):
            return EXIT_FAILURE
        return EXIT_OK


class Printer:
    """Writes a turn's journal for a person: tokens inline as they come, everything else a line of its own."""

    def __init__(self, out: TextIO, prefix: str = "") -> None:
        self.out = out
        self.prefix = prefix
        self.mid_line = False
        self.attempt: tuple[object, object] = (None, None)
        self.tools: dict[str, str] = {}
        """Each tool call's name by its id: a result names only the call it answers."""
        self.streamed = False

    def text(self, text: str) -> None:
        if not self.mid_line:
            self.out.write(self.prefix)
        self.out.write(text)
        self.out.flush()
        self.mid_line = not text.endswith("\n")

    def line(self, text: str) -> None:
        self.end_line()
        self.out.write(f"{text}\n")
        self.out.flush()

    def end_line(self) -> None:
        if self.mid_line:
            self.out.write("\n")
            self.out.flush()
            self.mid_line = False

    def entry(self, entry: Mapping[str, Any]) -> None:
        kind = entry.get("kind")
        if kind == "token":
            # a token carries its model call and that call's attempt: a new attempt of the same call is the answer
            # starting over (the stream broke off, or the fallback took over)
            attempt = (entry.get("call"), entry.get("attempt"))
            if self.streamed and attempt[0] == self.attempt[0] and attempt != self.attempt:
                self.line(f"  … the model's answer broke off; asked again (attempt {attempt[1]})")
            self.attempt = attempt
            self.streamed = True
            self.text(str(entry.get("text", entry.get("content", ""))))
        elif kind == "assistant_message":
            said = entry.get("text", entry.get("content"))
            if not self.streamed and said:
                self.text(str(said))
            self.end_line()
            self.streamed = False
        elif kind == "tool_call":
            self.tools[str(entry.get("tool_call_id"))] = str(entry.get("name"))
            arguments = entry.get("arguments") or entry.get("args") or {}
            shown = (
                ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items())
                if isinstance(arguments, dict)
                else arguments
            )
            self.line(f"  → {entry.get('name')}({shown})")
        elif kind == "tool_result":
            name = entry.get("name") or self.tools.get(str(entry.get("tool_call_id")), "tool")
            again = " (a repeat: the earlier result, not run again)" if entry.get("repeated") else ""
            self.line(f"  ← {name}: {_result_summary(entry)}{again}")
        elif kind == "approval_decided":
            self.line(f"  approval {entry.get('approval_id')}: {'approved' if entry.get('approve') else 'refused'}")
        elif kind == "booking":
            # the booking's own journal, told as `concierge book` tells it: each step's status, then the story
            inner = _nested(entry, "entry")
            if inner.get("kind") == JournalKind.STEP_STARTED:
                status = STATUS_OF_STEP.get(str(inner.get("step")))
                if status is not None:
                    self.line(f"  · booking {status}")
            elif inner.get("kind") == JournalKind.ACCEPTED:
                self.line("  · booking pending")
            elif story_worthy(inner):
                self.line(f"  · {describe(inner)}")
        elif kind in ("owner_lost", "resumed", "handed_off"):
            self.line(f"  … {describe(entry)}")


def _nested(entry: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``entry[key]`` when it is an object of its own, else the entry itself (its fields inline)."""
    inner = entry.get(key)
    return inner if isinstance(inner, Mapping) else entry


def _result_summary(entry: Mapping[str, Any]) -> str:
    result = entry.get("result", entry.get("content"))
    if isinstance(result, str):
        try:
            result = json.loads(result)
        except ValueError:
            return result[:120]
    if isinstance(result, dict):
        if isinstance(result.get("error"), dict):
            return f"error {result['error'].get('code')}: {result['error'].get('message', '')}".rstrip(": ")
        if "offers" in result:
            return f"{result.get('found', len(result['offers']))} offer(s)"
        if "booking_id" in result:
            return f"booking {result['booking_id']} {result.get('status', '')}".rstrip()
    text = json.dumps(result, separators=(",", ":"))
    return text if len(text) <= 120 else text[:117] + "..."


def run_turn(
    client: ChatClient,
    chat_id: str,
    text: str | None,
    *,
    decide: Decide,
    payment_token: str | None,
    printer: Printer,
    message_token: str | None = None,
) -> TurnOutcome:
    """Send ``text`` (None: answer the pending approval of the chat first) and follow the turn to its end."""
    client.renew()
    before = client.chat(chat_id)
    known = set(before.get("bookings") or [])
    after = client.last_event_id(chat_id)
    decided: set[str] = set()

    def answer(approval: Mapping[str, Any]) -> bool:
        """True when the turn goes on (approved or refused), False when it stays pending."""
        approval_id = str(approval.get("approval_id"))
        if approval_id in decided:
            return True
        printer.line(describe_approval(approval))
        choice = decide(approval)
        if choice is None:
            return False
        client.decide(chat_id, approval_id, choice, payment_token)
        decided.add(approval_id)
        return True

    if text is None:
        pending = before.get("pending_approval")
        if not pending:
            raise StackError(f"chat {chat_id} has no approval pending")
        if not answer(pending):
            return TurnOutcome("awaiting_approval", approval=dict(pending))
    else:
        client.send(chat_id, text, message_token)
    for entry in client.events(chat_id, after):
        kind = entry.get("kind")
        printer.entry(entry)
        if kind == "approval_requested":
            # the entry is written as the turn stops; the approval can be answered once the turn is parked
            approval = _parked(client, chat_id, _nested(entry, "approval"))
            if not answer(approval):
                printer.end_line()
                return TurnOutcome("awaiting_approval", approval=dict(approval))
        elif kind == "turn_finished":
            outcome = str(entry.get("outcome"))
            if outcome == "awaiting_approval":
                pending = client.chat(chat_id).get("pending_approval")
                if pending and not answer(pending):
                    printer.end_line()
                    return TurnOutcome("awaiting_approval", approval=dict(pending))
                continue  # decided: the turn goes on
            break
        if time.monotonic() > client.deadline:
            raise StackError(f"the turn did not finish within {client.timeout_s:g}s")
    printer.end_line()
    final = client.chat(chat_id)
    last = final.get("last_turn") or {}
    made = [b for b in final.get("bookings") or [] if b not in known]
    return TurnOutcome(
        str(last.get("outcome", "failed")),
        error=last.get("error"),
        bookings=[_booking(b, client.headers) for b in made],
    )


def _parked(client: ChatClient, chat_id: str, approval: Mapping[str, Any]) -> Mapping[str, Any]:
    """The approval as the chat holds it once the turn has stopped for it (``awaiting_approval``)."""
    while time.monotonic() < client.deadline:
        chat = client.chat(chat_id, wait=min(PARK_WAIT_S, max(0.1, client.deadline - time.monotonic())))
        pending = chat.get("pending_approval")
        if chat.get("status") != "running":
            if isinstance(pending, Mapping) and pending.get("approval_id") == approval.get("approval_id"):
                return pending
            return approval  # decided or expired meanwhile: answering it says so
    raise StackError(f"the turn did not stop for approval {approval.get('approval_id')} in {client.timeout_s:g}s")


def _booking(booking_id: str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The booking as booking-agent has it, once final (concierge-agent lists its id only)."""
    deadline = time.monotonic() + BOOKING_WAIT_S
    urls = booking_agent_urls(None)
    index = 0
    with httpx.Client(timeout=REQUEST_TIMEOUT_S + 10, headers=headers) as http:
        while True:
            try:
                response = http.get(f"{urls[index % len(urls)]}/bookings/{booking_id}", params={"wait": 10})
                if response.status_code == 200:
                    booking: dict[str, Any] = response.json()
                    if booking.get("status") in FINAL_BOOKING_STATUSES or time.monotonic() > deadline:
                        return booking
                    continue
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                return {"booking_id": booking_id, "status": "unknown"}
            index += 1
            time.sleep(RETRY_PAUSE_S)


def report(outcome: TurnOutcome, chat_id: str, printer: Printer) -> None:
    """The turn's last lines: each booking it made with its status, then the outcome."""
    for booking in outcome.bookings:
        price = booking.get("total_price")
        total = f" · {price:.2f} {currency_code(booking.get('currency'))}" if isinstance(price, int | float) else ""
        hotel = f" · hotel-api's name {quoted(booking.get('hotel_name'))}" if booking.get("hotel_name") else ""
        printer.line(f"booking {booking.get('booking_id')}: {booking.get('status')}{total}{hotel}")
    if outcome.outcome == "awaiting_approval":
        approval_id = (outcome.approval or {}).get("approval_id")
        printer.line(
            f"awaiting approval {approval_id} in chat {chat_id}: answer it with "
            f"`concierge chat --chat {chat_id}` or in the console"
        )
    elif outcome.outcome != "answered":
        error = outcome.error or {}
        printer.line(f"turn failed: {error.get('code', 'unknown')}: {error.get('message', '')}".rstrip(": "))
    else:
        printer.line(f"chat {chat_id}: answered")


# ----------------------------------------------------------------------------------------------------- commands


@one_line_errors("ask")
def _ask(args: argparse.Namespace) -> int:
    text = check_text(args.text)
    chat_id = _check_chat_id(args.chat)
    token = _check_token(args.payment_token)
    client = ChatClient(concierge_agent_urls(args.url), args.timeout, args.user)
    printer = Printer(sys.stdout)
    try:
        if chat_id is None:
            chat_id = client.create_chat()
        printer.line(f"chat {chat_id}")
        outcome = run_turn(
            client,
            chat_id,
            text,
            decide=lambda _approval: True if args.approve else None,
            payment_token=token,
            printer=printer,
        )
    finally:
        client.close()
    report(outcome, chat_id, printer)
    return outcome.exit_code


YES = frozenset({"y", "yes"})
NO = frozenset({"n", "no"})


def _read(prompt: str) -> str | None:
    """One line of input (None at its end); the prompt goes to stdout, as ``input`` writes it. Read from a pipe,
    the line is echoed after its prompt, so the transcript reads as it would have on a terminal."""
    try:
        line = input(prompt)
    except EOFError:
        return None
    if not sys.stdin.isatty():
        print(line, flush=True)
    return line


@one_line_errors("chat")
def _chat(args: argparse.Namespace) -> int:
    chat_id = _check_chat_id(args.chat)
    token = _check_token(args.payment_token)
    client = ChatClient(concierge_agent_urls(args.url), args.timeout, args.user)
    printer = Printer(sys.stdout, prefix="concierge> ")
    ended_pending = False

    def ask_person(_approval: Mapping[str, Any]) -> bool | None:
        nonlocal ended_pending
        while True:
            answer = _read("approve? [y/n] ")
            if answer is None:
                ended_pending = True
                return None
            if answer.strip().lower() in YES:
                return True
            if answer.strip().lower() in NO:
                return False
            print("  please answer y or n", flush=True)

    try:
        if chat_id is None:
            chat_id = client.create_chat()
            printer.line(f"chat {chat_id} (type a message; /quit or end of input leaves)")
        else:
            chat = client.chat(chat_id)
            printer.line(f"chat {chat_id}: {chat.get('status')} (type a message; /quit or end of input leaves)")
            if chat.get("pending_approval"):
                outcome = run_turn(client, chat_id, None, decide=ask_person, payment_token=token, printer=printer)
                report(outcome, chat_id, printer)
                if ended_pending:
                    return EXIT_AWAITING_APPROVAL
        code = EXIT_OK
        while True:
            line = _read("you> ")
            if line is None or line.strip() in ("/quit", "/exit"):
                print(flush=True)
                return code
            if not line.strip():
                continue
            try:
                text = check_text(line)
            except UsageError as exc:
                print(f"  {exc}", flush=True)
                continue
            outcome = run_turn(client, chat_id, text, decide=ask_person, payment_token=token, printer=printer)
            report(outcome, chat_id, printer)
            if ended_pending:
                return EXIT_AWAITING_APPROVAL
            code = outcome.exit_code
    finally:
        client.close()
