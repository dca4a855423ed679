"""``concierge show <id>`` (a booking's timeline, from its journal) and ``concierge bookings`` (the list).

Both read booking-agent (``GET /bookings/{id}/events``, ``GET /bookings``): any replica serves any booking.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import httpx

from domain import currency_code, describe_cancellation, hotel_named
from domain.booking import BookingStatus
from stack.book import booking_agent_urls
from stack.console import EXIT_OK, Subparsers, one_line_errors
from stack.errors import StackError, UsageError
from stack.journal import describe, is_final, seconds_between
from stack.people import add_user_option, person_headers

__all__ = ["register_bookings", "register_show"]

REQUEST_TIMEOUT_S = 10.0


def _agent_url(explicit: str | None) -> str:
    return booking_agent_urls(explicit)[0]


def _get(url: str, user: str | None, params: Mapping[str, Any] | None = None) -> httpx.Response:
    try:
        return httpx.get(url, params=params, timeout=REQUEST_TIMEOUT_S, headers=person_headers(user))
    except httpx.HTTPError as exc:
        raise StackError(f"booking-agent unreachable at {url} ({type(exc).__name__}): is the stack running?") from None


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list) and detail:
        first = detail[0]
        return f"{'.'.join(str(p) for p in first.get('loc', ())[1:])}: {first.get('msg')}"
    return str(detail or body)


# ------------------------------------------------------------------------------------------------- show


def register_show(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("show", help="a booking's timeline, from its journal")
    parser.add_argument("booking_id")
    parser.add_argument("--json", action="store_true", help="the journal entries as JSON")
    parser.add_argument("--url", default=None, help="booking-agent URL (default: the running stack's)")
    add_user_option(parser)
    parser.set_defaults(handler=_show)


@one_line_errors("show")
def _show(args: argparse.Namespace) -> int:
    url = _agent_url(args.url)
    response = _get(f"{url}/bookings/{args.booking_id}/events", args.user)
    if response.status_code == 404:
        raise StackError(f"no booking {args.booking_id}")
    if response.status_code == 422:
        raise UsageError(f"bad booking id {args.booking_id!r}: {_detail(response)}")
    if response.status_code != 200:
        raise StackError(f"could not read booking {args.booking_id}: {_detail(response)}")
    entries: list[dict[str, Any]] = response.json()["events"]
    if args.json:
        print(json.dumps(entries, indent=2))
        return EXIT_OK
    print(f"booking {args.booking_id}")
    booking = _get(f"{url}/bookings/{args.booking_id}", args.user)
    if booking.status_code == 200 and (view := booking.json()).get("hotel_id"):
        price = view.get("total_price")
        total = f"{price:.2f} {currency_code(view.get('currency'))}" if isinstance(price, int | float) else "-"
        print(f"  {view['status']}: {total} · {hotel_named(view['hotel_id'], view.get('hotel_name'))}")
        print(f"  {describe_cancellation(view.get('cancellation'))}")
    start = entries[0]["at"] if entries else ""
    for entry in entries:
        offset = f"+{seconds_between(start, entry['at']):.3f}s"
        print(f"  {entry['at']}  {offset:>9}  {entry['kind']:<20} {describe(entry)}")
    if not entries or not is_final(entries[-1]):
        print("  (still running: `concierge show` again, or `curl -H 'Accept: text/event-stream'` to follow it)")
    return EXIT_OK


# --------------------------------------------------------------------------------------------- bookings


def register_bookings(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("bookings", help="the bookings, newest first")
    parser.add_argument("--status", default=None, help=f"only these ({', '.join(s.value for s in BookingStatus)})")
    parser.add_argument("--limit", default="20", metavar="N", help="at most N (1-200, default 20)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--url", default=None, help="booking-agent URL (default: the running stack's)")
    add_user_option(parser)
    parser.set_defaults(handler=_bookings)


@one_line_errors("bookings")
def _bookings(args: argparse.Namespace) -> int:
    statuses = {s.value for s in BookingStatus}
    if args.status is not None and args.status not in statuses:
        raise UsageError(f"--status must be one of {', '.join(sorted(statuses))}, got {args.status!r}")
    try:
        limit = int(args.limit)
    except ValueError:
        raise UsageError(f"--limit must be a whole number, got {args.limit!r}") from None
    if not 1 <= limit <= 200:
        raise UsageError(f"--limit must be from 1 to 200, got {limit}")
    params: dict[str, Any] = {"limit": limit}
    if args.status is not None:
        params["status"] = args.status
    response = _get(f"{_agent_url(args.url)}/bookings", args.user, params)
    if response.status_code != 200:
        raise StackError(f"could not list bookings: {_detail(response)}")
    bookings: list[dict[str, Any]] = response.json()["bookings"]
    if args.json:
        print(json.dumps(bookings, indent=2))
        return EXIT_OK
    if not bookings:
        print("no bookings" + (f" {args.status}" if args.status else ""))
        return EXIT_OK
    print(f"{'booking':<34} {'status':<13} {'created':<25} updated")
    for item in bookings:
        print(
            f"{item['booking_id']:<34} {item['status']:<13} {item['created_at'] or '-':<25} {item['updated_at'] or '-'}"
        )
    return EXIT_OK
