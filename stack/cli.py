"""``concierge``: the command line (console script ``stack.cli:main``).

Each subcommand lives behind a ``register(subparsers)`` function that adds its parser and sets
``handler=<callable(args) -> exit code>``. Adding a command (``up``, ``down``, ``status``, ``book``...) means
writing its module with such a function and appending it to ``COMMANDS``; nothing else here changes.
Commands report errors as one line on stderr and an exit code, never a traceback.

    concierge serve <service> [--host H] [--port P]   run one service of the table in the foreground

``serve`` refuses to start a service without a usable ``CONCIERGE_SERVICE_SECRET`` (one line, exit 1) before
uvicorn is even imported; the service shell checks it again at start-up for a service run by other means.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from infra.auth import MissingSecretError, service_secret
from infra.settings import get_settings
from stack.book import register_book, register_cancel
from stack.bookings import register_bookings, register_show
from stack.chaos import register_chaos
from stack.chat import register_ask, register_chat
from stack.demo import register_demo
from stack.dlq import register_dlq, register_recovery
from stack.down import register_down
from stack.ops import register_fault, register_kill, register_start, register_stop
from stack.people import register_issuer, register_token
from stack.services import SERVICES, UnknownServiceError, get_service
from stack.status import register_status
from stack.up import register_up
from stack.verify import register_verify

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction

__all__ = [
    "COMMANDS",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "GRACEFUL_SHUTDOWN_S",
    "Registrar",
    "build_parser",
    "main",
    "register_serve",
]

Registrar = Callable[[Subparsers], None]

EXIT_FAILURE = 1
EXIT_USAGE = 2
GRACEFUL_SHUTDOWN_S = 10
"""After SIGTERM: how long in-flight requests may finish before the lifespan shutdown runs anyway."""


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"port out of range: {port}")
    return port


def register_serve(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="run one service in the foreground",
        description=f"Run one service in the foreground (uvicorn). Services: {', '.join(SERVICES)}.",
    )
    parser.add_argument("service", help="service name from the table")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=None, help="port (default: the service's port)")
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default: info)")
    parser.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one log line per request (default: $CONCIERGE_ACCESS_LOG, off)",
    )
    parser.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    try:
        spec = get_service(args.service)
    except UnknownServiceError as exc:
        print(f"concierge serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        service_secret()
    except MissingSecretError as exc:
        print(f"concierge serve {spec.name}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    import uvicorn  # only this command needs it

    # uvicorn turns SIGTERM/SIGINT into a graceful stop that runs the lifespan shutdown.
    uvicorn.run(
        spec.app,
        host=args.host,
        port=args.port or spec.port,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_level=args.log_level,
        access_log=get_settings().access_log if args.access_log is None else args.access_log,
    )
    return 0


COMMANDS: list[Registrar] = [
    register_serve,
    register_up,
    register_down,
    register_status,
    register_book,
    register_cancel,
    register_ask,
    register_chat,
    register_show,
    register_bookings,
    register_token,
    register_issuer,
    register_kill,
    register_stop,
    register_start,
    register_fault,
    register_dlq,
    register_recovery,
    register_verify,
    register_chaos,
    register_demo,
]


def build_parser(commands: Sequence[Registrar] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge", description="Run and drive the concierge stack.")
    subparsers = parser.add_subparsers(title="commands", metavar="<command>")
    for register in COMMANDS if commands is None else commands:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
