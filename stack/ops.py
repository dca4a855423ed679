"""Break things on purpose: ``concierge kill|stop|start <service>`` and ``concierge fault <provider>``.

``kill`` is a crash (SIGKILL to the process group; the supervisor restarts it after its backoff unless
``--no-restart``); ``stop`` is a graceful stop (SIGTERM) that holds the instance down; ``start`` brings a stopped
instance back and waits until it is ready. A name selects every replica (``booking-agent``) or one
(``booking-agent:2``). ``fault`` drives a simulated provider's ``/admin/faults`` (llm-api's options:
``stack.llm_faults``; search-agent's, ``agents.search_faults``: ``--latency`` and ``--hang`` only): the local stack's, or, with none running, the one ``HOTEL_API_URL``/``PAYMENT_API_URL``/
``LLM_API_URL`` name (where docker-compose publishes them). It presents the
admin token of the local stack (``<data dir>/secrets.json``), or ``CONCIERGE_ADMIN_TOKEN`` for any other provider.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from typing import Any

import httpx

from stack.console import EXIT_OK, Subparsers, one_line_errors, stack_paths
from stack.control import call
from stack.errors import StackError, UsageError
from stack.llm_faults import add_llm_options, check_model, describe_llm_faults, llm_fault_body, llm_options_given
from stack.services import get_service
from stack.target import admin_token, provider_url

__all__ = ["FAULTY_SERVICES", "fault_body", "register_fault", "register_kill", "register_start", "register_stop"]

FAULTY_SERVICES = ("hotel-api", "payment-api", "llm-api", "search-agent")


def _check_target(target: str) -> None:
    get_service(target.partition(":")[0])  # unknown names fail before we look for a stack


def register_kill(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("kill", help="SIGKILL a service (restarted after a backoff)")
    parser.add_argument("service", help="service name, or NAME:N for one replica")
    parser.add_argument("--no-restart", action="store_true", help="leave it down until `concierge start`")
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


@one_line_errors("kill")
def _kill(args: argparse.Namespace) -> int:
    _check_target(args.service)
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
    add_llm_options(parser)
    parser.set_defaults(handler=_fault)


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
    if args.latency is None and args.error_rate is None and not args.hang:
        return None
    return {
        "latency_s": _number(args.latency, "--latency", 0, 300),
        "error_rate": _number(args.error_rate, "--error-rate", 0, 1),
        "hang": bool(args.hang),
    }


def _describe(faults: dict[str, Any]) -> str:
    if not (faults.get("latency_s") or faults.get("error_rate") or faults.get("hang")):
        return "none"
    return (
        f"latency {faults.get('latency_s', 0):g}s · error rate {faults.get('error_rate', 0):g}"
        f" · hang {'on' if faults.get('hang') else 'off'}"
    )


@one_line_errors("fault")
def _fault(args: argparse.Namespace) -> int:
    if args.service not in FAULTY_SERVICES:
        get_service(args.service)  # an unknown name gets the usual message
        raise UsageError(f"{args.service} takes no faults; choose {', '.join(FAULTY_SERVICES)}")
    llm = args.service == "llm-api"
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
