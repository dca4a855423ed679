"""Operator commands for recovery, registered into the ``concierge`` command line::

    concierge dlq list [--json]              dead-lettered runs: thread id, reason, attempts, last error, age
    concierge dlq requeue <thread_id>|--all  back into the recovery queue with a fresh set of attempts
    concierge dlq purge                      drop every DLQ entry (no question asked); prints how many
    concierge recovery status [--json]       queue figures and the number of active runs

They talk to Redis directly: ``REDIS_URL`` and ``CONCIERGE_KEY_PREFIX`` when set, else the running local stack's
(``stack.target``). No service has to be up, which is the point when the recovery worker is the thing that is broken. Every failure is one line on stderr and exit code 1 (2 for
usage errors, from argparse); never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from errors.causes import causes
from infra.redis import create_redis
from infra.redis_url import redact_redis_url
from infra.settings import get_settings
from recovery.queue import DeadLetterQueue, DLQEntry, RecoveryQueue
from runs.errors import RunStoreError
from runs.leases import RunStore
from stack.errors import StackError
from stack.target import adopt_stack_redis

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subparsers = argparse._SubParsersAction

__all__ = ["EXIT_FAILURE", "EXIT_OK", "Command", "CommandError", "redis_command", "register_dlq", "register_recovery"]

EXIT_OK = 0
EXIT_FAILURE = 1
_ERROR_COLUMN = 60
# an operator's command should fail fast on a dead Redis rather than sit through the client's default retries
_CONNECT_TIMEOUT_S = 3.0
_COMMAND_TIMEOUT_S = 10.0

Command = Callable[[argparse.Namespace, Redis, TextIO], Awaitable[int]]


class CommandError(Exception):
    """A failure the operator must read: printed as one line, exit code 1."""


def register_dlq(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "dlq",
        help="inspect and requeue dead-lettered runs",
        description="The dead-letter queue: runs the recovery gave up on, waiting for an operator.",
    )
    commands = parser.add_subparsers(title="dlq commands", metavar="<dlq command>", required=True)

    listing = commands.add_parser("list", help="list dead-lettered runs", description="List dead-lettered runs.")
    listing.add_argument("--json", action="store_true", help="one JSON array instead of a table")
    listing.set_defaults(handler=redis_command("dlq list", _dlq_list))

    requeue = commands.add_parser(
        "requeue",
        help="put runs back into the recovery queue",
        description="Move runs from the DLQ back into the recovery queue; their attempt count starts again.",
    )
    target = requeue.add_mutually_exclusive_group(required=True)
    target.add_argument("thread_id", nargs="?", help="the run's thread id (the booking id)")
    target.add_argument("--all", action="store_true", help="every entry, oldest first, as far as the queue allows")
    requeue.set_defaults(handler=redis_command("dlq requeue", _dlq_requeue))

    purge = commands.add_parser(
        "purge", help="drop every DLQ entry", description="Drop every DLQ entry (run records are kept)."
    )
    purge.set_defaults(handler=redis_command("dlq purge", _dlq_purge))


def register_recovery(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "recovery", help="recovery queue status", description="The recovery queue and the runs in progress."
    )
    commands = parser.add_subparsers(title="recovery commands", metavar="<recovery command>", required=True)
    status = commands.add_parser(
        "status", help="queue figures and active runs", description="Queue figures and active runs."
    )
    status.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    status.set_defaults(handler=redis_command("recovery status", _recovery_status))


# --------------------------------------------------------------------------------------------------- plumbing


def redis_command(name: str, command: Command) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(_with_redis(command, args))
        except (CommandError, StackError) as exc:
            return _fail(name, str(exc))
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
            return _fail(name, f"invalid configuration: {problems}")
        except (RunStoreError, RedisError, OSError) as exc:
            return _fail(name, f"Redis at {_redis_location()} is unreachable or failing: {_cause(exc)}")
        except KeyboardInterrupt:
            return _fail(name, "interrupted", code=130)
        except Exception as exc:
            return _fail(name, f"unexpected {type(exc).__name__}: {exc}")

    return handle


async def _with_redis(command: Command, args: argparse.Namespace) -> int:
    adopt_stack_redis()  # with REDIS_URL unset: the running stack's Redis and key prefix, not the default
    settings = get_settings()
    redis = create_redis(
        settings.redis_url,
        socket_connect_timeout=_CONNECT_TIMEOUT_S,
        socket_timeout=_COMMAND_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=0,
    )
    try:
        return await command(args, redis, sys.stdout)
    finally:
        await redis.aclose()


def _fail(name: str, message: str, *, code: int = EXIT_FAILURE) -> int:
    print(f"concierge {name}: {message}", file=sys.stderr)
    return code


def _cause(exc: BaseException) -> str:
    """The innermost message: "Error 111 connecting to ..." rather than our own wrapper's prefix."""
    *_, innermost = (exc, *causes(exc))
    return " ".join(str(innermost).split()) or type(innermost).__name__


def _redis_location() -> str:
    """``REDIS_URL`` without its password."""
    try:
        url = get_settings().redis_url
    except ValidationError:
        return "REDIS_URL"
    return redact_redis_url(url)


async def _server_now(redis: Redis) -> float:
    # DLQ timestamps come from the Redis server clock; ages must too, or a skewed laptop shows negative ages
    seconds, micros = await redis.time()
    return float(seconds) + float(micros) / 1e6


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"
    return f"{seconds // 86400:.0f}d{seconds % 86400 // 3600:02.0f}h"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        out.write("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() + "\n")


# --------------------------------------------------------------------------------------------------- commands


def _entry_json(entry: DLQEntry, now: float) -> dict[str, Any]:
    return {
        "thread_id": entry.thread_id,
        "reason": entry.reason,
        "attempts": entry.attempts,
        "error": entry.error,
        "count": entry.count,
        "first_at": entry.first_at,
        "last_at": entry.last_at,
        "age_s": round(max(0.0, now - entry.first_at), 3),
    }


async def _dlq_list(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    entries = await DeadLetterQueue(redis).list()
    now = await _server_now(redis)
    if args.json:
        out.write(json.dumps([_entry_json(entry, now) for entry in entries], indent=2) + "\n")
        return EXIT_OK
    if not entries:
        out.write("the DLQ is empty\n")
        return EXIT_OK
    rows = [
        [
            entry.thread_id,
            entry.reason,
            str(entry.attempts),
            _clip(entry.error, _ERROR_COLUMN),
            _age(now - entry.first_at),
        ]
        for entry in entries
    ]
    _table(["THREAD ID", "REASON", "ATTEMPTS", "LAST ERROR", "AGE"], rows, out)
    out.write(f"{len(entries)} dead-lettered run(s)\n")
    return EXIT_OK


async def _dlq_requeue(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    dlq = DeadLetterQueue(redis)
    if args.all:
        before = await dlq.depth()
        moved = await dlq.requeue_all()
        left = await dlq.depth()
        out.write(f"requeued {moved} run(s)\n")
        if left and moved < before:
            raise CommandError(
                f"{left} run(s) left in the DLQ: the recovery queue is full ({dlq.config.max_size} waiting runs); "
                "retry once it drains"
            )
        return EXIT_OK
    thread_id: str = args.thread_id
    if await dlq.get(thread_id) is None:
        raise CommandError(f"no DLQ entry for thread id {thread_id!r} (see `concierge dlq list`)")
    if not await dlq.requeue(thread_id):
        raise CommandError(
            f"the recovery queue is full ({dlq.config.max_size} waiting runs); {thread_id} stays in the DLQ"
        )
    out.write(f"requeued {thread_id}\n")
    return EXIT_OK


async def _dlq_purge(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    purged = await DeadLetterQueue(redis).purge()
    out.write(f"purged {purged} DLQ entr{'y' if purged == 1 else 'ies'}\n")
    return EXIT_OK


async def _recovery_status(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    stats = await RecoveryQueue(redis).stats()
    active = await RunStore(redis).active_runs()
    status: dict[str, int | float] = {**stats, "active_runs": len(active)}
    if args.json:
        out.write(json.dumps(status, indent=2) + "\n")
        return EXIT_OK
    rows = [
        ["waiting", f"{stats['depth']} / {stats['max_size']}"],
        ["oldest waiting", _age(float(stats["oldest_age_s"])) if stats["depth"] else "-"],
        ["in flight", str(stats["in_flight"])],
        ["delayed", str(stats["delayed"])],
        ["dead-lettered now", str(stats["dlq_depth"])],
        ["active runs", str(len(active))],
        ["enqueued (total)", str(stats["enqueued_total"])],
        ["recovered (total)", str(stats["recovered_total"])],
        ["skipped (total)", str(stats["skipped_total"])],
        ["redelivered (total)", str(stats["redelivered_total"])],
        ["dead-lettered (total)", str(stats["dead_lettered_total"])],
    ]
    _table(["RECOVERY QUEUE", f"prefix {get_settings().key_prefix}"], rows, out)
    return EXIT_OK
