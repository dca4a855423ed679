"""People at the command line: ``concierge token`` and ``concierge issuer``, and the bearer token every person's
command sends (``book``, ``ask``, ``chat``, ``show``, ``cancel``, ``bookings``).

A command acts as ``--user NAME`` (default ``$CONCIERGE_USER``, else ``me``) and mints that person's token from the
machine's local issuer (``concierge up`` makes it in its data directory; ``$CONCIERGE_AUTH_ISSUER_DIR`` names another),
so the README's commands stay short. ``$CONCIERGE_TOKEN`` (a token from a real OIDC provider) wins over minting.

    concierge token [--user NAME] [--ttl S]   print a person's token (for curl: -H "Authorization: Bearer ...")
    concierge token --mcp [--url URL]          the same token in an MCP host's JSON config of concierge-agent's /mcp
    concierge issuer [--dir D]                 make (or keep) a local issuer; print the services' settings for it
    concierge console-url [--ttl S]            print a one-time login link to the web console (the operator's)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from identity.auth import MissingSecretError, service_secret
from identity.people import LOCAL_ISSUER, LocalIssuer
from infra.settings import get_settings
from stack.console import EXIT_OK, Subparsers, one_line_errors, stack_paths
from stack.control import supervisor_running
from stack.errors import StackError, UsageError
from stack.login import login_url
from stack.services import SERVICES
from stack.state import read_secrets, read_state

__all__ = [
    "DEFAULT_USER",
    "TOKEN_TTL_S",
    "add_user_option",
    "console_login_url",
    "default_user",
    "issuer_dir",
    "local_issuer",
    "mcp_host_config",
    "person_headers",
    "person_token",
    "register_console_url",
    "register_issuer",
    "register_token",
]

DEFAULT_USER = "me"
TOKEN_TTL_S = 3600.0
"""A minted token's life when ``--ttl`` is not given: an hour."""


def max_ttl_s() -> float:
    """The longest a minted token may live: what the services accept (``CONCIERGE_AUTH_MAX_TOKEN_AGE_S``)."""
    return get_settings().auth_max_token_age_s


def issuer_dir() -> Path:
    """Where the local issuer's key pair lives: ``$CONCIERGE_AUTH_ISSUER_DIR``, else ``<data dir>/issuer``."""
    named = os.environ.get("CONCIERGE_AUTH_ISSUER_DIR")
    return Path(named) if named else get_settings().data_dir / "issuer"


def local_issuer(*, create: bool = False, directory: Path | None = None) -> LocalIssuer | None:
    """The machine's issuer (made when ``create``), or ``None`` when there is none and none is to be made."""
    where = directory or issuer_dir()
    if not create and not (where / LocalIssuer.KEY_FILE).exists():
        return None
    return LocalIssuer(where, LOCAL_ISSUER)


def default_user() -> str:
    return os.environ.get("CONCIERGE_USER") or DEFAULT_USER


def person_token(user: str | None = None, ttl_s: float = TOKEN_TTL_S) -> str | None:
    """``$CONCIERGE_TOKEN``, else a token for ``user`` from the local issuer, else ``None`` (the services then
    answer 401 unless they run with ``CONCIERGE_AUTH=off``)."""
    given = os.environ.get("CONCIERGE_TOKEN")
    if given:
        return given
    issuer = local_issuer()
    if issuer is None:
        return None
    return issuer.mint(user or default_user(), audience=get_settings().auth_audience, ttl_s=ttl_s)


def person_headers(user: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer`` of ``user`` for a person's request (empty when there is no token to send)."""
    token = person_token(user)
    return {"Authorization": f"Bearer {token}"} if token else {}


def add_user_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user",
        default=None,
        metavar="NAME",
        help=f"act as this person (default: $CONCIERGE_USER, else {DEFAULT_USER!r}); their token is minted here",
    )


def register_token(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("token", help="print a person's bearer token (from the local issuer)")
    add_user_option(parser)
    parser.add_argument("--ttl", default=None, metavar="S", help=f"seconds it lives (default {TOKEN_TTL_S:g})")
    parser.add_argument(
        "--mcp", action="store_true", help="print an MCP host's JSON config with the token instead (docs/mcp.md)"
    )
    parser.add_argument("--url", default=None, help="with --mcp: concierge-agent's URL (default: the running stack's)")
    parser.set_defaults(handler=_token)


@one_line_errors("token")
def _token(args: argparse.Namespace) -> int:
    ttl = TOKEN_TTL_S
    if args.ttl is not None:
        try:
            ttl = float(args.ttl)
        except ValueError:
            raise UsageError(f"--ttl must be a number of seconds, got {args.ttl!r}") from None
        if not 1 <= ttl <= max_ttl_s():
            raise UsageError(f"--ttl must be between 1 and {max_ttl_s():g} seconds, got {args.ttl}")
    user = args.user if args.user is not None else default_user()
    if not user.strip() or len(user) > 255:
        raise UsageError("--user must be a name of 1 to 255 characters")
    issuer = local_issuer()
    if issuer is None:
        raise StackError(f"no local issuer in {issuer_dir()}: run `concierge up` (or `concierge issuer`) first")
    token = issuer.mint(user, audience=get_settings().auth_audience, ttl_s=ttl)
    print(mcp_host_config(token, args.url) if args.mcp else token)
    return EXIT_OK


def mcp_host_config(token: str, url: str | None = None) -> str:
    """An MCP host's JSON config of concierge-agent's ``/mcp`` (``mcpServers``, as desktop and IDE hosts read it):
    its URL and the person's bearer token (docs/mcp.md)."""
    import json

    from stack.target import service_urls

    base = service_urls("concierge-agent", url, get_settings().concierge_agent_url)[0].rstrip("/")
    server = {"type": "http", "url": f"{base}/mcp", "headers": {"Authorization": f"Bearer {token}"}}
    return json.dumps({"mcpServers": {"concierge": server}}, indent=2)


def register_issuer(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("issuer", help="make (or keep) this machine's token issuer; print its settings")
    parser.add_argument("--dir", default=None, help="where its key pair lives (default: <data dir>/issuer)")
    parser.set_defaults(handler=_issuer)


@one_line_errors("issuer")
def _issuer(args: argparse.Namespace) -> int:
    directory = Path(args.dir) if args.dir else issuer_dir()
    issuer = local_issuer(create=True, directory=directory)
    assert issuer is not None
    print(f"CONCIERGE_AUTH_ISSUER={issuer.issuer}")
    print(f"CONCIERGE_AUTH_JWKS_FILE={issuer.jwks_path.resolve()}")
    return EXIT_OK


def console_login_url(ttl_s: float | None = None) -> str:
    """A one-time login link to the console: the running stack's (its secrets, the console's address), else one
    signed with ``CONCIERGE_SERVICE_SECRET`` for ``CONSOLE_URL`` (a compose stack started with that secret)."""
    ttl = ttl_s if ttl_s is not None else get_settings().console_login_ttl_s
    paths = stack_paths()
    state = read_state(paths) if supervisor_running(paths) else None
    stack_secrets = read_secrets(paths) if state is not None else None
    if state is not None and stack_secrets is not None:
        url = next((i.url for i in state.instances if i.service == "console"), None)
        if url is None:
            raise StackError("the running stack has no console")
        return login_url(url, stack_secrets.service_secret, ttl)
    try:
        secret = service_secret(get_settings())
    except MissingSecretError as exc:
        raise StackError(f"no stack runs here and {exc}: set the console's stack's secret") from None
    configured = os.environ.get("CONSOLE_URL") or f"http://127.0.0.1:{SERVICES['console'].port}"
    return login_url(configured, secret, ttl)


def register_console_url(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("console-url", help="print a one-time login link to the web console")
    parser.add_argument(
        "--ttl", default=None, metavar="S", help="seconds it can be opened (default CONSOLE_LOGIN_TTL_S)"
    )
    parser.set_defaults(handler=_console_url)


@one_line_errors("console-url")
def _console_url(args: argparse.Namespace) -> int:
    ttl = None
    if args.ttl is not None:
        try:
            ttl = float(args.ttl)
        except ValueError:
            raise UsageError(f"--ttl must be a number of seconds, got {args.ttl!r}") from None
        if not 1 <= ttl <= 86_400:
            raise UsageError(f"--ttl must be between 1 and 86400 seconds, got {args.ttl}")
    print(console_login_url(ttl))
    return EXIT_OK
