"""``concierge``: the command line (console script ``stack.cli:run``, which is ``main`` in a process of its own).

Each subcommand lives behind a ``register(subparsers)`` function that adds its parser and sets
``handler=<callable(args) -> exit code>``. Adding a command (``up``, ``down``, ``status``, ``book``...) means
writing its module with such a function and naming it in ``_COMMAND_MODULES`` (command name → module and
function); nothing else here changes. A command's module is imported only when its parser is built: ``main`` builds
the one command named first on the command line (``concierge serve`` imports no other command's module before
uvicorn imports the app, docs/benchmarks.md#start-up), and the whole parser for anything else (``--help``, no
command, an unknown one), so every usage, help and error text is the same either way.
Commands report errors as one line on stderr and an exit code, never a traceback.

    concierge serve <service> [--host H] [--port P]   run one service of the table in the foreground

``serve`` refuses to start a service without a usable ``CONCIERGE_SERVICE_SECRET`` (one line, exit 1) before
uvicorn is even imported; the service shell checks it again at start-up for a service run by other means.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from identity.auth import MissingSecretError, service_secret
from infra.settings import get_settings
from stack.services import SERVICES, UnknownServiceError, get_service

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction

__all__ = [
    "COMMANDS",
    "COMMAND_REGISTRARS",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "GRACEFUL_SHUTDOWN_S",
    "Registrar",
    "build_parser",
    "main",
    "parser_for",
    "register_serve",
    "run",
    "without_trio",
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
        service_secret(get_settings())
    except MissingSecretError as exc:
        print(f"concierge serve {spec.name}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    from infra.service.server import run_server  # only this command serves

    run_server(
        spec.app,
        host=args.host,
        port=args.port or spec.port,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        log_level=args.log_level,
        access_log=get_settings().access_log if args.access_log is None else args.access_log,
    )
    return 0


_COMMAND_MODULES: dict[str, tuple[str, str]] = {
    # command name → (module, its register function), in the order ``--help`` lists them
    "up": ("stack.up", "register_up"),
    "down": ("stack.down", "register_down"),
    "status": ("stack.status", "register_status"),
    "book": ("stack.book", "register_book"),
    "cancel": ("stack.book", "register_cancel"),
    "ask": ("stack.chat", "register_ask"),
    "chat": ("stack.chat", "register_chat"),
    "show": ("stack.bookings", "register_show"),
    "bookings": ("stack.bookings", "register_bookings"),
    "token": ("stack.people", "register_token"),
    "issuer": ("stack.people", "register_issuer"),
    "console-url": ("stack.people", "register_console_url"),
    "kill": ("stack.ops", "register_kill"),
    "stop": ("stack.ops", "register_stop"),
    "start": ("stack.ops", "register_start"),
    "restart": ("stack.restart", "register_restart"),
    "fault": ("stack.ops", "register_fault"),
    "dlq": ("stack.dlq", "register_dlq"),
    "recovery": ("stack.dlq", "register_recovery"),
    "runs": ("stack.runs", "register_runs"),
    "verify": ("stack.verify", "register_verify"),
    "chaos": ("stack.chaos", "register_chaos"),
    "demo": ("stack.demo", "register_demo"),
}


class _LazyRegistrar:
    """A command's ``register`` function, its module imported when the command's parser is built."""

    def __init__(self, module: str, function: str) -> None:
        self.module = module
        self.function = function

    def __call__(self, subparsers: Subparsers) -> None:
        register: Registrar = getattr(importlib.import_module(self.module), self.function)
        register(subparsers)

    def __repr__(self) -> str:
        return f"<register {self.module}:{self.function}>"


COMMAND_REGISTRARS: dict[str, Registrar] = {"serve": register_serve}
COMMAND_REGISTRARS.update((name, _LazyRegistrar(*where)) for name, where in _COMMAND_MODULES.items())
"""Command name → the registrar that adds its parser (and imports its module only then)."""

COMMANDS: list[Registrar] = list(COMMAND_REGISTRARS.values())


def build_parser(commands: Sequence[Registrar] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="concierge", description="Run and drive the concierge stack.")
    subparsers = parser.add_subparsers(title="commands", metavar="<command>")
    for register in COMMANDS if commands is None else commands:
        register(subparsers)
    return parser


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser ``main`` parses ``argv`` with: only the command ``argv`` starts with (its module alone imported),
    or every command when it starts with none (``--help``, nothing, a name that is no command). Usage, help and
    errors read the same from either: the top level's usage names no command (``<command>``)."""
    if argv and argv[0] in COMMAND_REGISTRARS:
        return build_parser([COMMAND_REGISTRARS[argv[0]]])
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = parser_for(argv)
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        build_parser().print_help(sys.stderr)  # every command, whichever parser parsed
        return EXIT_USAGE
    return handler(args)


def without_trio() -> None:
    """Mark trio absent in this process. None of ours runs under trio, yet httpcore imports it wherever it is installed
    (selenium brings it into the dev environment): 0.1 s of start-up and an ``ldconfig`` fork in every process that
    builds an HTTP client (docs/benchmarks.md#start-up). Process entry points call it, never a library."""
    sys.modules.setdefault("trio", None)  # type: ignore[arg-type]  # None: "import trio" raises ModuleNotFoundError


def run() -> int:
    """The process entry point (console script ``concierge``, ``python -m stack.cli``, each service ``up`` starts)."""
    without_trio()
    return main()


if __name__ == "__main__":
    sys.exit(run())
