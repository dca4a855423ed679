"""`make chaos`: ``concierge chaos`` against a fresh stack of its own, then the stack stopped and removed.

    python scripts/chaos_run.py [--port-base N] [--postgres ADMIN_URL | --sqlite] [--keep] [-- chaos options...]

A fresh stack: a new data directory, a Redis that ``up`` starts itself (so ``chaos`` may kill it; its append-only
file in the data directory), and a new Postgres database on ``ADMIN_URL``'s server (``CHAOS_POSTGRES_URL`` or
``TEST_DATABASE_URL``, default ``postgresql://postgres@127.0.0.1:5432/postgres``) when that server answers, so the
``postgres`` fault drops connections of this stack only; else the SQLite checkpointer. Exits with ``chaos``'s code;
the data directory (logs, verdict.json) is kept with ``--keep`` and printed either way. ``chaos`` gets ``--chats 2``
(two conversations beside the clients) unless its options name ``--chats``, and ``--cancel-confirmed 0.1`` (a tenth
of the confirmed stays cancelled and refunded under faults) unless they name ``--cancel-confirmed``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg

CONCIERGE = (sys.executable, "-m", "stack.cli")
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_CHATS = 2
"""Conversations a run drives unless told otherwise: the approvals and the model's faults in every `make chaos`."""
DEFAULT_CANCEL_CONFIRMED = "0.1"
"""The share of confirmed stays a run cancels unless told otherwise: the refund promise in every `make chaos`."""
UP_TIMEOUT_S = 240
"""A loaded machine starts the stack in minutes, not seconds: the run is not the place to fail on that."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _load() -> str:
    """The 1/5/15-minute load averages and the core count: a verdict's figures mean little without them."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


@contextlib.contextmanager
def fresh_database(admin_url: str | None) -> Iterator[str | None]:
    """A new database on ``admin_url``'s server, dropped afterwards; None when there is no server to use."""
    if admin_url is None:
        yield None
        return
    name = f"concierge_chaos_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        print(f"chaos: Postgres at {admin_url} unusable ({type(exc).__name__}); SQLite checkpoints", flush=True)
        yield None
        return
    try:
        yield f"{admin_url.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def chaos_options(given: list[str]) -> list[str]:
    """The options after ``--``, with this script's defaults before them for what they do not name themselves (``--x
    V`` or ``--x=V``): ``make chaos`` always drives conversations and cancels confirmed stays unless told not to."""
    options = [a for a in given if a != "--"]
    for option, default in (("--cancel-confirmed", DEFAULT_CANCEL_CONFIRMED), ("--chats", str(DEFAULT_CHATS))):
        if not any(a == option or a.startswith(f"{option}=") for a in options):
            options = [option, default, *options]
    return options


def main() -> int:
    parser = argparse.ArgumentParser(prog="chaos_run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port-base", type=int, default=None)
    parser.add_argument("--postgres", default=None, metavar="ADMIN_URL")
    parser.add_argument("--sqlite", action="store_true", help="no Postgres: the SQLite checkpointer")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("chaos", nargs=argparse.REMAINDER, help="options for `concierge chaos` (after --)")
    args = parser.parse_args()
    chaos_args = chaos_options(args.chaos)
    admin_url = None if args.sqlite else (
        args.postgres or os.environ.get("CHAOS_POSTGRES_URL") or os.environ.get("TEST_DATABASE_URL") or DEFAULT_ADMIN_URL
    )  # fmt: skip
    data_dir = Path(tempfile.mkdtemp(prefix="concierge-chaos-"))
    with fresh_database(admin_url) as database_url:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "CONCIERGE_SERVICE_SECRET", "CONCIERGE_ADMIN_TOKEN", "LLM_API_KEY")
        }
        # nothing answers on a port nobody uses: `up` starts its own redis-server there, which chaos may kill
        env |= {"CONCIERGE_DATA_DIR": str(data_dir), "REDIS_URL": f"redis://127.0.0.1:{_free_port()}/0"}
        if database_url is not None:
            env["DATABASE_URL"] = database_url
        up = [*CONCIERGE, "up", "--detach", "--timeout", str(UP_TIMEOUT_S)]
        if args.port_base is not None:
            up += ["--port-base", str(args.port_base)]
        print(
            f"chaos: a fresh stack in {data_dir} ({'Postgres' if database_url else 'SQLite'} checkpoints)", flush=True
        )
        started = subprocess.run(up, env=env, check=False)
        try:
            if started.returncode != 0:
                return started.returncode
            verdict = data_dir / "verdict.json"
            print(f"chaos: machine load before {_load()}", flush=True)
            code = subprocess.run([*CONCIERGE, "chaos", "--json", str(verdict), *chaos_args], env=env).returncode
            kept = f"; verdict {verdict}, logs {data_dir / 'logs'}" if args.keep else ""
            print(f"chaos: exit {code}; machine load after {_load()}{kept}", flush=True)
            return code
        finally:
            subprocess.run([*CONCIERGE, "down"], env=env, check=False, stdout=subprocess.DEVNULL)
            if not args.keep:
                shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
