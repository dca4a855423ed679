"""``concierge book``: create a booking and follow it, step by step, to its final state; ``concierge cancel``.

    concierge book --city Lisbon --checkin 2027-01-10 --nights 2 --guests 2 [--card tok_visa] [--hotel ID]
    concierge cancel <booking id> [--wait] [--url URL]

Posts to the booking-agent with an ``Idempotency-Key``, so retrying the POST after a lost answer (the agent was
restarting) never books twice, then follows the booking's journal (``GET /bookings/{id}/events``, SSE) and prints
every status (pending → searching → reserving → paying → confirming → confirmed) with the story between them: an
owner lost, the recovery worker resuming, a provider replaying a call instead of acting twice. A booking-agent that is down for a moment
(killed, restarting) is waited for, on any of its replicas, and meanwhile the story goes on from the journal in
Redis (the stack's, as the console reads it): the owner lost, the recovery worker resuming, the outcome, each as it is
written. Every line shows the entry's own time since the command started (``+1.91 s``), not the time it was printed.
Exit 0 only when the booking is confirmed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import uuid
from datetime import date, datetime, timedelta
from typing import Any

import httpx

from domain import currency_code, describe_cancellation, hotel_named
from domain.booking import (
    FINAL_BOOKING_STATUSES,
    MAX_NIGHTS,
    PROGRESS,
    JournalKind,
    check_checkin,
    parse_iso_date,
)
from infra.journal import journal_key, parse_entries
from infra.redis import create_sync_redis
from infra.settings import get_settings
from stack.console import EXIT_FAILURE, EXIT_OK, Subparsers, one_line_errors
from stack.errors import StackError, UsageError
from stack.journal import STATUS_OF_STEP, describe, is_final, sse_entries, story_worthy
from stack.people import add_user_option, person_headers
from stack.target import adopt_stack_redis, refusal, service_urls

__all__ = [
    "JournalInRedis",
    "booking_agent_urls",
    "booking_body",
    "entry_offset",
    "register_book",
    "register_cancel",
    "steps_between",
]

# Steps take tens of milliseconds: poll fast while things move, slower while a step waits (a slow provider).
POLL_FIRST_S = 0.02
POLL_MAX_S = 0.25
REQUEST_TIMEOUT_S = 5.0
REDIS_TIMEOUT_S = 2.0
STREAM_READ_TIMEOUT_S = 40.0
"""The journal stream sends a keep-alive every 15 s: this long without a byte means the connection is dead."""


def register_book(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("book", help="book a hotel and follow the booking to its final state")
    parser.add_argument("--city", required=True, help="e.g. Lisbon, Porto, Madrid, Paris")
    parser.add_argument("--checkin", required=True, metavar="YYYY-MM-DD")
    parser.add_argument("--nights", default="1", metavar="N", help="default 1")
    parser.add_argument("--guests", default="2", metavar="N", help="default 2")
    parser.add_argument("--card", default="tok_visa", metavar="TOKEN", help="payment token (tok_visa, tok_declined...)")
    parser.add_argument("--hotel", default=None, metavar="ID", help="a specific hotel (default: the cheapest)")
    parser.add_argument("--url", default=None, help="booking-agent URL (default: the running stack's)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S", help="give up after S seconds")
    add_user_option(parser)
    parser.set_defaults(handler=_book)


def _positive_int(value: str, option: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{option} must be a whole number, got {value!r}") from None
    if number < 1:
        raise UsageError(f"{option} must be at least 1, got {number}")
    return number


def _checkin(value: str) -> date:
    try:
        return check_checkin(parse_iso_date(value), date.today())
    except ValueError as exc:
        raise UsageError(f"bad date {value!r} for --checkin: {exc}") from None


def booking_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /bookings body for the command's arguments (``UsageError`` for a bad date or number)."""
    checkin = _checkin(args.checkin)
    nights = _positive_int(args.nights, "--nights")
    if nights > MAX_NIGHTS:
        raise UsageError(f"--nights must be at most {MAX_NIGHTS}, got {nights}")
    guests = _positive_int(args.guests, "--guests")
    body: dict[str, Any] = {
        "city": args.city,
        "checkin": checkin.isoformat(),
        "checkout": (checkin + timedelta(days=nights)).isoformat(),
        "guests": guests,
        "payment_token": args.card,
    }
    if args.hotel:
        body["hotel_id"] = args.hotel
    return body


def steps_between(previous: str | None, current: str) -> list[str]:
    """The happy-path steps a poll jumped over between ``previous`` and ``current`` (none for ``failed``)."""
    if current not in PROGRESS:
        return []
    start = PROGRESS.index(previous) + 1 if previous in PROGRESS else 0
    return list(PROGRESS[start : PROGRESS.index(current)])


def booking_agent_urls(explicit: str | None) -> list[str]:
    return service_urls("booking-agent", explicit, get_settings().booking_agent_url)


class _Client:
    """Talks to whichever booking-agent replica answers, waiting out restarts until the deadline."""

    def __init__(self, urls: list[str], deadline: float, user: str | None = None) -> None:
        self.urls = urls
        self.deadline = deadline
        self.user = user
        self.http = httpx.Client(timeout=REQUEST_TIMEOUT_S, headers=person_headers(user))
        self.index = 0
        self._warned = False
        self.started_at = time.time()
        """When the command started (epoch): every line's ``+s`` is from here."""
        self.journal = JournalInRedis()

    def wait_a_moment(self, problem: str) -> None:
        """After a failure: say so once, move to the next replica, pause a little."""
        if not self._warned:
            print(f"         … booking-agent {problem}; still trying", flush=True)
            self._warned = True
        self.index += 1
        time.sleep(0.25)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        while True:
            url = self.urls[self.index % len(self.urls)]
            try:
                response = self.http.request(method, f"{url}{path}", **kwargs)
            except httpx.TransportError as exc:
                problem = f"{url} unreachable ({type(exc).__name__})"
            else:
                if response.status_code not in (502, 503, 504):
                    self._warned = False
                    return response
                problem = f"{url} answered {response.status_code}"
            if time.monotonic() > self.deadline:
                raise StackError(f"booking-agent {problem}; is the stack running? (`concierge up`)")
            self.wait_a_moment(problem)


class JournalInRedis:
    """A booking's journal read straight from Redis, for while no booking-agent answers (the console does the same).

    The stack's Redis and key prefix (``adopt_stack_redis``), else ``REDIS_URL``; connected on first use. Any Redis
    trouble reads as "nothing new": the stream, once booking-agent is back, tells the rest.
    """

    def __init__(self) -> None:
        self._client: Any = None

    def after(self, booking_id: str, last_id: str | None) -> list[dict[str, Any]]:
        try:
            if self._client is None:
                adopt_stack_redis()
                self._client = create_sync_redis(
                    get_settings().redis_url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
                )
            start = "-" if last_id is None else f"({last_id}"
            return parse_entries(self._client.xrange(journal_key(booking_id), min=start, max="+", count=100))
        except Exception:
            return []

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()


def entry_offset(entry: dict[str, Any], started_at: float) -> float | None:
    """Seconds from ``started_at`` (epoch) to the entry's own time (``at``), or None when it has none."""
    at = entry.get("at")
    if not isinstance(at, str):
        return None
    try:
        return datetime.fromisoformat(at).timestamp() - started_at
    except ValueError:
        return None


@one_line_errors("book")
def _book(args: argparse.Namespace) -> int:
    body = booking_body(args)
    started = time.monotonic()
    client = _Client(booking_agent_urls(args.url), started + args.timeout, args.user)
    try:
        return _follow(client, body, started, args.timeout)
    finally:
        client.http.close()
        client.journal.close()


def _follow_story(client: _Client, booking_id: str, started: float, timeout: float) -> bool:
    """Print the booking's story from its journal stream as it happens, until its final entry.

    Each step prints its status as it starts (the lines ``book`` always printed), and the story between them:
    a lost owner, the queue, the resume, a replayed call, retries, compensation. A dropped stream (the
    booking-agent was killed) is opened again on any replica after the last entry seen (``Last-Event-ID``), so
    nothing is missed or printed twice; while none answers, what is written meanwhile is read from Redis. False
    when the booking-agent has no journal stream (404/405).
    """
    last_id: str | None = None
    shown: set[str] = set()
    timeouts = httpx.Timeout(REQUEST_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        url = client.urls[client.index % len(client.urls)]
        problem: str
        try:
            with client.http.stream(
                "GET", f"{url}/bookings/{booking_id}/events", headers=headers, timeout=timeouts
            ) as response:
                if response.status_code in (404, 405) and last_id is None:
                    return False
                if response.status_code == 200:
                    problem = f"{url} ended the stream early"
                    for entry in sse_entries(response.iter_lines()):
                        if entry.get("id") is None:
                            # not a journal entry: the server's last word (``shutting_down``: reconnect elsewhere)
                            error = entry.get("error")
                            code = error.get("code") if isinstance(error, dict) else None
                            problem = f"{url} ended the stream early ({code or 'no entry id'})"
                            break
                        last_id = str(entry["id"])
                        _tell(entry, client.started_at, shown)
                        if is_final(entry):
                            return True
                else:
                    problem = f"{url} answered {response.status_code}"
        except httpx.TransportError as exc:
            problem = f"{url} unreachable ({type(exc).__name__})"
        # nobody streams it: the story goes on from Redis, as the others write it (the recovery worker's resume...)
        for entry in client.journal.after(booking_id, last_id):
            last_id = str(entry.get("id"))
            _tell(entry, client.started_at, shown)
            if is_final(entry):
                return True
        if time.monotonic() - started > timeout:
            raise StackError(f"booking {booking_id} not final after {timeout:g}s (booking-agent {problem})")
        client.wait_a_moment(f"{problem}; following the journal in Redis")


def _tell(entry: dict[str, Any], started_at: float, shown: set[str]) -> None:
    offset = entry_offset(entry, started_at)
    elapsed = f"{'+' + format(time.time() - started_at if offset is None else offset, '.2f'):>7} s"
    kind = entry.get("kind")
    status = "pending" if kind == JournalKind.ACCEPTED else None
    if kind == JournalKind.STEP_STARTED:
        status = STATUS_OF_STEP.get(str(entry.get("step")))
    if is_final(entry):
        status = str(kind)
    if status is not None and status not in shown:
        shown.add(status)
        print(f"  {elapsed}  {status}", flush=True)
    if story_worthy(entry) and not is_final(entry):
        print(f"  {elapsed}    … {describe(entry)}", flush=True)


def _poll_statuses(client: _Client, booking_id: str, started: float, timeout: float) -> None:
    seen: str | None = None
    interval = POLL_FIRST_S
    while True:
        response = client.request("GET", f"/bookings/{booking_id}")
        if response.status_code == 200:
            status = str(response.json().get("status"))
            if status != seen:
                for skipped in steps_between(seen, status):
                    print(f"  {'':>6}   {skipped}  (passed between two polls)", flush=True)
                print(f"  {time.monotonic() - started:6.2f}s  {status}", flush=True)
                seen = status
                interval = POLL_FIRST_S
            if seen in FINAL_BOOKING_STATUSES:
                return
        elif response.status_code != 404:  # 404: a replica that has not seen the record yet
            raise StackError(f"could not read booking {booking_id}: {refusal(response)}")
        if time.monotonic() - started > timeout:
            raise StackError(f"booking {booking_id} still {seen} after {timeout:g}s")
        time.sleep(interval)
        interval = min(POLL_MAX_S, interval * 1.25)


def _follow(client: _Client, body: dict[str, Any], started: float, timeout: float) -> int:
    headers = {"Idempotency-Key": f"cli-{uuid.uuid4().hex}"}
    # first attempt fails fast when nothing listens at all: "stack not running" beats a minute of retries
    try:
        response = client.http.post(f"{client.urls[0]}/bookings", json=body, headers=headers)
    except httpx.ConnectError:
        if len(client.urls) == 1:
            raise StackError(
                f"booking-agent at {client.urls[0]} is unreachable: stack not running? (`concierge up`)"
            ) from None
        response = client.request("POST", "/bookings", json=body, headers=headers)
    except httpx.TransportError:
        # the answer was lost, not the request refused: the same Idempotency-Key makes the retry safe
        response = client.request("POST", "/bookings", json=body, headers=headers)
    if response.status_code in (502, 503, 504):
        response = client.request("POST", "/bookings", json=body, headers=headers)
    if response.status_code != 202:
        raise StackError(f"booking refused: {refusal(response)}")
    booking_id = response.json()["booking_id"]
    print(
        f"booking {booking_id}: {body['city']} {body['checkin']} → {body['checkout']}, "
        f"{body['guests']} guest(s), card {body['payment_token']}",
        flush=True,
    )
    if not _follow_story(client, booking_id, started, timeout):
        _poll_statuses(client, booking_id, started, timeout)  # a booking-agent without the journal stream
    response = client.request("GET", f"/bookings/{booking_id}")
    if response.status_code != 200:
        raise StackError(f"could not read booking {booking_id}: {refusal(response)}")
    booking: dict[str, Any] = response.json()
    seen = str(booking.get("status"))
    if seen == "confirmed":
        price = booking.get("total_price")
        total = f"{price:.2f} {currency_code(booking.get('currency'))}" if isinstance(price, int | float) else "-"
        print(
            f"confirmed: {total} · reservation {booking.get('reservation_id')} · payment {booking.get('payment_id')} "
            f"· {describe_cancellation(booking.get('cancellation'))} · "
            f"{hotel_named(booking.get('hotel_id'), booking.get('hotel_name'))}"
        )
        return EXIT_OK
    if seen == "cancelled":
        print(f"concierge book: booking {booking_id} cancelled", file=sys.stderr)
        return EXIT_FAILURE
    error = booking.get("error") or {}
    code = error.get("code", "unknown") if isinstance(error, dict) else "unknown"
    message = error.get("message", "") if isinstance(error, dict) else str(error)
    print(f"concierge book: booking {booking_id} failed: {code}: {message}".rstrip(": "), file=sys.stderr)
    return EXIT_FAILURE


def register_cancel(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "cancel", help="cancel a booking in flight, or a confirmed one under its policy (a refund of total - fee)"
    )
    parser.add_argument("booking_id", metavar="BOOKING_ID")
    parser.add_argument(
        "--max-fee",
        default=None,
        metavar="AMOUNT",
        help="a confirmed booking: refuse (nothing changed) if its fee now is above AMOUNT",
    )
    parser.add_argument("--wait", action="store_true", help="wait until the booking is cancelled (exit 0 then)")
    parser.add_argument("--url", default=None, help="booking-agent URL (default: the running stack's)")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds")
    add_user_option(parser)
    parser.set_defaults(handler=_cancel)


@one_line_errors("cancel")
def _cancel(args: argparse.Namespace) -> int:
    """Exit 0 once the cancel is recorded (with ``--wait``: once the booking is ``cancelled``); 1 on 404 or 409."""
    booking_id = args.booking_id
    if not booking_id or len(booking_id) > 64 or not booking_id.replace("-", "").replace("_", "").isalnum():
        raise UsageError(f"not a booking id: {booking_id!r}")
    body = None if args.max_fee is None else {"max_fee": _max_fee(args.max_fee)}
    started = time.monotonic()
    client = _Client(booking_agent_urls(args.url), started + args.timeout, args.user)
    try:
        try:
            response = client.http.post(f"{client.urls[0]}/bookings/{booking_id}/cancel", json=body)
        except httpx.ConnectError:
            if len(client.urls) == 1:
                raise StackError(f"booking-agent at {client.urls[0]} is unreachable: stack not running?") from None
            response = client.request("POST", f"/bookings/{booking_id}/cancel", json=body)
        if response.status_code == 404:
            raise StackError(f"no booking {booking_id}")
        if response.status_code not in (200, 202):
            raise StackError(refusal(response))
        booking = response.json()
        refund = booking.get("refund")
        if isinstance(refund, dict):  # a confirmed stay: what its policy gives back
            print(
                f"booking {booking_id}: {booking.get('status')} · refund {refund['amount']:.2f} {refund['currency']}"
                f" (fee {refund['fee']:.2f} {refund['currency']})",
                flush=True,
            )
        elif response.status_code == 200:
            print(f"booking {booking_id}: cancelled")
            return EXIT_OK
        else:
            print(f"booking {booking_id}: cancelling (was {booking.get('status')})", flush=True)
        if not args.wait or booking.get("status") == "cancelled":
            return EXIT_OK
        while True:
            left = started + args.timeout - time.monotonic()
            if left <= 0:
                raise StackError(f"booking {booking_id} still {booking.get('status')} after {args.timeout:g}s")
            answer = client.request("GET", f"/bookings/{booking_id}", params={"wait": min(left, 20)})
            if answer.status_code != 200:
                raise StackError(f"could not read booking {booking_id}: {refusal(answer)}")
            booking = answer.json()
            if booking.get("status") in FINAL_BOOKING_STATUSES:
                break
    finally:
        client.http.close()
    kept = booking.get("cancel_error")
    why = f" (the cancel failed: {kept.get('code')}: {kept.get('message')})" if isinstance(kept, dict) else ""
    print(f"booking {booking_id}: {booking.get('status')}{why}")
    return EXIT_OK if booking.get("status") == "cancelled" else EXIT_FAILURE


def _max_fee(value: str) -> float:
    try:
        amount = float(value)
    except ValueError:
        raise UsageError(f"--max-fee must be an amount, got {value!r}") from None
    if not math.isfinite(amount) or amount < 0:
        raise UsageError(f"--max-fee must be an amount of at least 0, got {value}")
    return amount
