"""Break things on purpose: ``concierge kill|stop|start <service>`` and ``concierge fault <provider>``.

``kill`` is a crash (SIGKILL to the process group; the supervisor restarts it after its backoff unless
``--no-restart``); ``kill --when booking:STATUS`` waits until some booking is at STATUS (booking-agent's
``GET /bookings?status=``, a booking already there counts) and kills then, so a walkthrough kills mid-payment on a
quiet and on a loaded machine alike; ``stop`` is a graceful stop (SIGTERM) that holds the instance down; ``start`` brings a stopped
instance back and waits until it is ready. A name selects every replica (``booking-agent``) or one
(``booking-agent:2``). ``fault`` drives a simulated provider's ``/admin/faults`` (llm-api's options:
``stack.llm_faults``; search-agent's, ``agents.search.faults``: ``--latency`` and ``--hang`` only; hotel-api's also
``--price-change`` and ``--name-suffix``): the local stack's, or, with none running, the one ``HOTEL_API_URL``/``PAYMENT_API_URL``/
``LLM_API_URL`` name (where docker-compose publishes them). It presents the
admin token of the local stack (``<data dir>/secrets.json``), or ``CONCIERGE_ADMIN_TOKEN`` for any other provider.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from typing import Any

import httpx

from domain.booking import BookingStatus
from providers.faults import MAX_NAME_SUFFIX, MAX_PRICE_CHANGE_PCT, MIN_PRICE_CHANGE_PCT
from stack.book import booking_agent_urls
from stack.console import EXIT_OK, Subparsers, one_line_errors, stack_paths
from stack.control import call, supervisor_running
from stack.errors import StackError, StackNotRunningError, UsageError
from stack.llm_faults import add_llm_options, check_model, describe_llm_faults, llm_fault_body, llm_options_given
from stack.services import get_service
from stack.target import admin_token, provider_url

__all__ = [
    "FAULTY_SERVICES",
    "fault_body",
    "parse_when",
    "register_fault",
    "register_kill",
    "register_start",
    "register_stop",
    "wait_for_booking_status",
]

FAULTY_SERVICES = ("hotel-api", "payment-api", "llm-api", "search-agent")
WHEN_TIMEOUT_S = 120.0
"""``kill --when``: generous, a loaded machine may take a while to get a booking to its payment."""
WHEN_POLL_S = 0.1
"""A step that is worth killing during (a slow provider's call) lasts far longer than this."""
_WHEN_REQUEST_TIMEOUT_S = 5.0


def _check_target(target: str) -> None:
    get_service(target.partition(":")[0])  # unknown names fail before we look for a stack


def register_kill(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("kill", help="SIGKILL a service (restarted after a backoff)")
    parser.add_argument("service", help="service name, or NAME:N for one replica")
    parser.add_argument("--no-restart", action="store_true", help="leave it down until `concierge start`")
    statuses = ", ".join(s.value for s in BookingStatus)
    parser.add_argument(
        "--when",
        default=None,
        metavar="booking:STATUS",
        help=f"first wait until some booking is at STATUS ({statuses}); one already there counts",
    )
    parser.add_argument(
        "--timeout",
        default=None,
        metavar="S",
        help=f"with --when: give up (exit 1, nothing killed) after S seconds (default {WHEN_TIMEOUT_S:g})",
    )
    parser.set_defaults(handler=_kill)


def register_stop(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("stop", help="SIGTERM a service and keep it down")
    parser.add_argument("service", help="service name, or NAME:N for one replica")
    parser.set_defaults(handler=_stop)


def register_start(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("start", help="start a stopped service again and wait until it is ready")
    parser.add_argument("service", help="service name, or NAME:N for one replica")
    parser.set_defaults(handler=_start)


def _pids(entries: list[dict[str, Any]]) -> str:
    return ", ".join(f"{e['name']} (pid {e['pid']})" if e.get("pid") else f"{e['name']} (not running)" for e in entries)


def parse_when(value: str) -> BookingStatus:
    """``booking:STATUS`` → the status; anything else is a ``UsageError`` naming the valid statuses."""
    kind, colon, status = value.partition(":")
    statuses = ", ".join(s.value for s in BookingStatus)
    if kind != "booking" or not colon:
        raise UsageError(f"--when must be booking:STATUS (STATUS one of {statuses}), got {value!r}")
    try:
        return BookingStatus(status)
    except ValueError:
        raise UsageError(f"--when {value!r}: unknown booking status {status!r}; valid: {statuses}") from None


def _when_timeout(value: str | None) -> float:
    if value is None:
        return WHEN_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(f"--timeout must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"--timeout must be a positive number of seconds, got {value}")
    return seconds


def wait_for_booking_status(status: BookingStatus, timeout_s: float) -> str:
    """The id of a booking at ``status``, as soon as booking-agent lists one; ``StackError`` after ``timeout_s``.

    Any replica lists every booking (they share Redis); one that does not answer (restarting) is skipped, and so is a
    moment with none answering: the deadline decides.
    """
    deadline = time.monotonic() + timeout_s
    urls = booking_agent_urls(None)
    last = "no booking-agent answered"
    token = admin_token(explicit_url=False)  # the operator's view: every person's bookings
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=_WHEN_REQUEST_TIMEOUT_S, headers=headers) as http:
        while True:
            for url in urls:
                try:
                    response = http.get(f"{url}/bookings", params={"status": status.value, "limit": 1})
                except httpx.HTTPError as exc:
                    last = f"booking-agent at {url} unreachable ({type(exc).__name__})"
                    continue
                if response.status_code != 200:
                    last = f"booking-agent at {url} answered HTTP {response.status_code}"
                    continue
                bookings: list[dict[str, Any]] = response.json()["bookings"]
                if bookings:
                    return str(bookings[0]["booking_id"])
                last = f"no booking {status.value} yet"
                break
            if time.monotonic() >= deadline:
                raise StackError(f"no booking reached {status.value} within {timeout_s:g} s ({last}); nothing killed")
            time.sleep(WHEN_POLL_S)


@one_line_errors("kill")
def _kill(args: argparse.Namespace) -> int:
    _check_target(args.service)
    if args.when is None and args.timeout is not None:
        raise UsageError("--timeout goes with --when booking:STATUS")
    if args.when is not None:
        status, timeout_s = parse_when(args.when), _when_timeout(args.timeout)
        paths = stack_paths()
        if not supervisor_running(paths):  # before the wait, not after it: nothing to kill
            raise StackNotRunningError(
                f"stack not running (no supervisor for {paths.root}); start it with `concierge up`"
            )
        booking_id = wait_for_booking_status(status, timeout_s)
        print(f"booking {booking_id} is {status.value}")
    answer = asyncio.run(call(stack_paths(), "kill", target=args.service, restart=not args.no_restart))
    then = "held down; `concierge start` brings it back" if args.no_restart else "the supervisor restarts it"
    print(f"killed {_pids(answer['killed'])}; {then}")
    return EXIT_OK


@one_line_errors("stop")
def _stop(args: argparse.Namespace) -> int:
    _check_target(args.service)
    answer = asyncio.run(call(stack_paths(), "stop", target=args.service, answer_within_s=120))
    print(f"stopped {_pids(answer['stopped'])}; `concierge start {args.service}` brings it back")
    return EXIT_OK


@one_line_errors("start")
def _start(args: argparse.Namespace) -> int:
    _check_target(args.service)
    answer = asyncio.run(call(stack_paths(), "start", target=args.service, answer_within_s=120))
    started = answer["started"]
    late = [e["name"] for e in started if not e.get("ready")]
    if late:
        raise StackError(f"started but not ready: {', '.join(late)}")
    print(f"started {_pids(started)}; ready")
    return EXIT_OK


# ----------------------------------------------------------------------------------------------------- fault


def register_fault(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "fault",
        help="inject latency, errors or hangs into hotel-api, payment-api, llm-api or search-agent",
        description="Without options: show the provider's current faults. Options replace them all (llm-api: "
        "those of --model, or of every model).",
    )
    parser.add_argument("service", help=", ".join(FAULTY_SERVICES))
    parser.add_argument("--latency", default=None, metavar="S", help="delay every request by S seconds")
    parser.add_argument("--error-rate", default=None, metavar="R", help="answer 503 to a fraction R (0-1)")
    parser.add_argument("--hang", action="store_true", help="hold requests until the client gives up")
    parser.add_argument("--clear", action="store_true", help="remove every fault")
    parser.add_argument("--url", default=None, help="the provider's URL (default: the running stack's)")
    hotel = parser.add_argument_group("hotel-api only")
    hotel.add_argument(
        "--price-change",
        default=None,
        metavar="PCT",
        help=f"holds cost PCT%% more than search showed ({MIN_PRICE_CHANGE_PCT:g} to {MAX_PRICE_CHANGE_PCT:g})",
    )
    hotel.add_argument(
        "--name-suffix",
        default=None,
        metavar="TEXT",
        help=f"append TEXT to every hotel name it answers (at most {MAX_NAME_SUFFIX} characters)",
    )
    add_llm_options(parser)
    parser.set_defaults(handler=_fault)


HOTEL_OPTIONS = ("price_change", "name_suffix")
"""The options only hotel-api takes."""


def _hotel_options_given(args: argparse.Namespace) -> list[str]:
    return ["--" + name.replace("_", "-") for name in HOTEL_OPTIONS if getattr(args, name, None) is not None]


def _number(value: str | None, option: str, low: float, high: float) -> float:
    if value is None:
        return 0.0
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{option} must be a number, got {value!r}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise UsageError(f"{option} must be between {low:g} and {high:g}, got {value}")
    return number


def fault_body(args: argparse.Namespace) -> dict[str, Any] | None:
    """The PUT body, or None for "show" (no options) — ``--clear`` is handled by the caller."""
    price_change = getattr(args, "price_change", None)
    name_suffix = getattr(args, "name_suffix", None)
    if args.latency is None and args.error_rate is None and not args.hang and price_change is name_suffix is None:
        return None
    body: dict[str, Any] = {
        "latency_s": _number(args.latency, "--latency", 0, 300),
        "error_rate": _number(args.error_rate, "--error-rate", 0, 1),
        "hang": bool(args.hang),
    }
    if price_change is not None:
        body["price_change_pct"] = _number(price_change, "--price-change", MIN_PRICE_CHANGE_PCT, MAX_PRICE_CHANGE_PCT)
    if name_suffix is not None:
        if len(name_suffix) > MAX_NAME_SUFFIX:
            raise UsageError(f"--name-suffix must be at most {MAX_NAME_SUFFIX} characters, got {len(name_suffix)}")
        body["name_suffix"] = name_suffix
    return body


def _describe(faults: dict[str, Any]) -> str:
    parts = []
    if faults.get("latency_s") or faults.get("error_rate") or faults.get("hang"):
        parts.append(
            f"latency {faults.get('latency_s', 0):g}s · error rate {faults.get('error_rate', 0):g}"
            f" · hang {'on' if faults.get('hang') else 'off'}"
        )
    if faults.get("price_change_pct"):
        parts.append(f"price change {faults['price_change_pct']:+g}%")
    if faults.get("name_suffix"):
        parts.append(f"name suffix {faults['name_suffix'][:40]!r}" + (" …" if len(faults["name_suffix"]) > 40 else ""))
    return " · ".join(parts) or "none"


@one_line_errors("fault")
def _fault(args: argparse.Namespace) -> int:
    if args.service not in FAULTY_SERVICES:
        get_service(args.service)  # an unknown name gets the usual message
        raise UsageError(f"{args.service} takes no faults; choose {', '.join(FAULTY_SERVICES)}")
    llm = args.service == "llm-api"
    hotel_only = _hotel_options_given(args)
    if hotel_only and args.service != "hotel-api":
        raise UsageError(f"{hotel_only[0]} is a hotel-api option; {args.service} does not take it")
    if llm:
        body = llm_fault_body(args)
        model = check_model(args)
    else:
        foreign = llm_options_given(args)
        if foreign:
            raise UsageError(f"{foreign[0]} is an llm-api option; {args.service} takes --latency, --error-rate, --hang")
        body, model = fault_body(args), None
        if args.service == "search-agent" and body is not None:
            if args.error_rate is not None:
                raise UsageError("search-agent takes --latency and --hang, not --error-rate")
            body.pop("error_rate")
    if args.clear and body is not None:
        raise UsageError("--clear cannot be combined with other fault options")
    base, guessed = provider_url(args.service, args.url)
    url = f"{base}/admin/faults"
    token = admin_token(bool(args.url))
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    params = {"model": model} if model else {}
    try:
        with httpx.Client(timeout=5.0, headers=headers) as http:
            if args.clear:
                response = http.delete(url, params=params)
            elif body is None:
                response = http.get(url)
            else:
                response = http.put(url, json=body)
    except httpx.TransportError as exc:
        hint = "; stack not running? (`concierge up`, or pass --url)" if guessed else ""
        raise StackError(f"{args.service} at {base} is unreachable ({type(exc).__name__}){hint}") from None
    if response.status_code == 401:
        what = "the admin token" if token is not None else "a request without an admin token"
        raise StackError(f"{args.service} at {base} refused {what} (HTTP 401); set CONCIERGE_ADMIN_TOKEN to its token")
    if response.status_code == 404:
        raise StackError(f"{args.service} at {base} has no admin routes: it runs without CONCIERGE_ADMIN_TOKEN")
    if response.status_code != 200:
        raise StackError(f"{args.service} refused the faults: HTTP {response.status_code} {response.text[:200]}")
    shown = describe_llm_faults(response.json(), model) if llm else _describe(response.json())
    print(f"{args.service} faults: {shown}")
    return EXIT_OK
