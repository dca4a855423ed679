"""``concierge chaos``: random faults against the running stack under a closed-loop load, then heal and judge.

    concierge chaos [--duration S] [--every MIN-MAX] [--seed N] [--faults KIND,...] [--at-once N]
                    [--clients N] [--cancel-rate R] [--cancel-confirmed R] [--chats N] [--settle S] [--strict]
                    [--json PATH]

Every ``--every`` seconds (3–8 by default) one fault starts, unless ``--at-once`` (3) are already running: ``kill``
(kill -9 of a service; the supervisor restarts it), ``pause`` (SIGSTOP for 2–6 s, then SIGCONT), ``restart``
(SIGTERM, down 1–4 s, start again), ``redis`` (kill -9 of the Redis ``up`` started, restarted from its append-only
file), ``postgres`` (``pg_terminate_backend`` of every other connection to ``DATABASE_URL``'s database), ``errors``
/ ``slow`` (a provider answering 30% 503s / 2 s late for 5–15 s, through its ``/admin/faults`` as ``concierge fault``
does), ``cut`` (llm-api dropping its answers mid-stream). Meanwhile ``--clients`` (8) book one stay after another,
each waiting for its booking to be final, cancelling a ``--cancel-rate`` share of them in flight and a
``--cancel-confirmed`` (0) share of the confirmed ones afterwards (each followed until it is cancelled), and
``--chats`` (0) conversations ask concierge-agent for stays and approve or refuse them (``stack.chaos_chats``);
with chats, llm-api is faulted too. Then everything is healed, every booking waited for (``--settle``) and the
verdict printed (``stack.chaos_verdict``). Exit 1 when a promise broke (a booking not final, a ledger disagreement,
a 5xx other than 503, a cancelled stay not refunded total − fee exactly once), or with ``--strict`` when a target
was missed. A compose stack (no local supervisor) gets the faults that need no process of ours: provider faults
and, with ``DATABASE_URL``, Postgres. ``docs/chaos.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, TypeVar

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

from domain.booking import FINAL_BOOKING_STATUSES, MAX_DAYS_AHEAD, JournalKind
from infra.bookings import BookingStore
from infra.journal import read_journal
from infra.redis import create_redis
from infra.settings import get_settings
from providers.inventory import CITIES
from recovery.queue import DeadLetterQueue
from stack.book import booking_agent_urls
from stack.chaos_chats import TRY_AGAIN, Conversations, retry_after
from stack.chaos_verdict import (
    ACCEPTED_CANCEL,
    ApprovalRecord,
    BookingOutcome,
    ChatJudgement,
    ChatRecord,
    FaultRecord,
    RefundJudgement,
    StayCancel,
    iso_epoch,
    judge_chats,
    judge_refunds,
    refusal_to_failed,
    render_verdict,
    summarize,
)
from stack.chat import concierge_agent_urls
from stack.console import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, Subparsers, stack_paths
from stack.control import call, supervisor_running
from stack.dlq import CommandError, redis_command
from stack.errors import StackError
from stack.state import InstanceState, StackPaths, StackState, is_stack_process
from stack.target import admin_token, provider_url
from stack.verify import check_ledgers, ledger_charges, ledger_refunds

__all__ = ["FAULT_KINDS", "PROCESS_FAULTS", "ChaosPlan", "parse_range", "register_chaos"]

FAULT_KINDS = ("kill", "pause", "restart", "redis", "postgres", "errors", "slow", "cut")
PROCESS_FAULTS = frozenset({"kill", "pause", "restart", "redis"})
"""The faults that need the local supervisor's processes (``concierge up``)."""
SPARED = frozenset({"console", "llm-api"})
"""Never faulted: the console shows the run (and may have started it); no booking talks to llm-api (with
``--chats``, the conversations do: llm-api is faulted then)."""
PROVIDERS = ("hotel-api", "payment-api")
LLM_API = "llm-api"
LLM_FAULTS = frozenset({"cut"})
"""The faults only llm-api carries: they need conversations to mean anything."""
LLM_ERROR_STATUSES = (500, 503, 529)
CUT_AFTER_TOKENS = (0, 12)
ERROR_RATE = 0.3
SLOW_S = 2.0
PAUSE_S = (2.0, 6.0)
DOWN_S = (1.0, 4.0)
PROVIDER_FAULT_S = (5.0, 15.0)
CANCEL_AFTER_S = (0.0, 3.0)
STAY_CANCEL_STATUSES = frozenset({"cancelling", "cancelled"})
"""A cancel answered with one of these and a ``refund`` cancelled a confirmed stay (not a booking in flight)."""
LONG_POLL_S = 10.0
REQUEST_TIMEOUT_S = 5.0
HEAL_TIMEOUT_S = 90.0
JUDGE_ATTEMPTS = 10
_ERROR_LINE = re.compile(rb"\bERROR\b")
T = TypeVar("T")


@dataclass(frozen=True)
class ChaosPlan:
    duration_s: float
    every_s: tuple[float, float]
    seed: int
    kinds: tuple[str, ...]
    at_once: int
    clients: int
    cancel_rate: float
    settle_s: float
    budget_s: float
    chats: int = 0
    cancel_confirmed: float = 0.0
    """The share of the confirmed bookings (no in-flight cancel sent) cancelled afterwards, under their policy."""


def default_settle_s(*, chats: bool) -> float:
    """How long the run waits after the heal: a booking may take its whole budget, and with chats, a turn that met a
    paused model before the heal may take its whole ``CONCIERGE_TURN_BUDGET_S`` after it; then a minute of slack."""
    settings = get_settings()
    longest = max(settings.booking_budget_s, settings.concierge_turn_budget_s) if chats else settings.booking_budget_s
    return longest + 60


def parse_range(value: str, option: str) -> tuple[float, float]:
    """``3-8`` or ``5`` → (low, high) seconds; ``StackError`` naming the option otherwise."""
    low_text, _, high_text = value.partition("-")
    try:
        low = float(low_text)
        high = float(high_text) if high_text else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option} takes seconds as MIN-MAX (e.g. 3-8), got {value!r}") from None
    if not 0.1 <= low <= high <= 3600:
        raise argparse.ArgumentTypeError(f"{option} must be 0.1 ≤ MIN ≤ MAX ≤ 3600, got {value!r}")
    return low, high


def _kinds(value: str) -> tuple[str, ...]:
    kinds = tuple(dict.fromkeys(k.strip() for k in value.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown fault kind {unknown or value!r}; choose from {','.join(FAULT_KINDS)}"
        )
    return kinds


def _bounded(kind: type[float] | type[int], low: float, high: float) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {value}")
        return number

    return parse


def register_chaos(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "chaos",
        help="random faults against the running stack under load, then the verdict",
        description="Kill, pause and restart services, kill Redis, drop Postgres connections and break providers "
        "at random while clients book; then heal, wait for every booking and judge (docs/chaos.md).",
    )
    parser.add_argument("--duration", type=_bounded(float, 1, 86400), default=300.0, metavar="S", help="default 300")
    parser.add_argument(
        "--every", type=lambda v: parse_range(v, "--every"), default=(3.0, 8.0), metavar="MIN-MAX",
        help="seconds between faults, drawn at random (default 3-8)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a random one, printed)")
    parser.add_argument("--faults", type=_kinds, default=FAULT_KINDS, metavar="KIND,...", help=",".join(FAULT_KINDS))
    parser.add_argument("--at-once", type=_bounded(int, 1, 3), default=3, metavar="N", help="faults at once, ≤ 3")
    parser.add_argument("--clients", type=_bounded(int, 0, 64), default=8, metavar="N", help="0: no load (default 8)")
    parser.add_argument("--cancel-rate", type=_bounded(float, 0, 1), default=0.05, metavar="R", help="default 0.05")
    parser.add_argument(
        "--cancel-confirmed", type=_bounded(float, 0, 1), default=0.0, metavar="R",
        help="share of the confirmed bookings then cancelled under their policy, each waited for (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--chats", type=_bounded(int, 0, 16), default=0, metavar="N",
        help="conversations with concierge-agent beside the clients, approving or refusing at random (default 0)",
    )  # fmt: skip
    parser.add_argument(
        "--settle", type=_bounded(float, 1, 3600), default=None, metavar="S",
        help="after the heal, how long bookings and chat turns may take to end (default: the longer budget + 60)",
    )  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="exit 1 on a missed target too")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the verdict there as JSON")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    return redis_command("chaos", _chaos)(args)


async def _chaos(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    budget = get_settings().booking_budget_s
    plan = ChaosPlan(
        duration_s=args.duration,
        every_s=args.every,
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000),
        kinds=tuple(args.faults),
        at_once=args.at_once,
        clients=args.clients,
        cancel_rate=args.cancel_rate,
        settle_s=args.settle if args.settle is not None else default_settle_s(chats=args.chats > 0),
        budget_s=budget,
        chats=args.chats,
        cancel_confirmed=args.cancel_confirmed,
    )
    paths = stack_paths()
    await redis.ping()  # no Redis, no verdict: say so now, in one line, not after the run
    try:
        world = await World.find(paths, chats=plan.chats > 0)
    except StackError as exc:
        raise CommandError(str(exc)) from exc
    await world.reachable()
    if plan.chats:
        await world.concierge_reachable()
    run = Run(plan, world, out)
    verdict_json = await run.main(redis)
    if args.json is not None:
        args.json.write_text(json.dumps(verdict_json, indent=2) + "\n", encoding="utf-8")
    broken, misses = verdict_json["broken_promises"], verdict_json["target_misses"]
    if broken or (args.strict and misses):
        return EXIT_FAILURE
    return EXIT_INTERRUPTED if run.interrupted else EXIT_OK


# ------------------------------------------------------------------------------------------------ the stack


@dataclass
class World:
    """What the run can reach: the local supervisor (or none: compose), the providers, the booking-agents."""

    paths: StackPaths
    local: bool
    booking_agents: list[str]
    providers: dict[str, str]
    """The providers faults may hit: hotel-api, payment-api, and llm-api when there are conversations."""
    token: str | None
    database_url: str | None
    concierge_agents: list[str] = field(default_factory=list)
    """Empty without conversations."""

    @classmethod
    async def find(cls, paths: StackPaths, *, chats: bool = False) -> World:
        local = supervisor_running(paths)
        if local:
            await call(paths, "ping")
        providers = {name: provider_url(name, None)[0] for name in (*PROVIDERS, *([LLM_API] if chats else []))}
        token = admin_token(explicit_url=False)
        concierges = concierge_agent_urls(None) if chats else []
        return cls(paths, local, booking_agent_urls(None), providers, token, get_settings().database_url, concierges)

    async def reachable(self) -> None:
        """Some booking-agent answers (any status): else there is no stack to run against."""
        async with httpx.AsyncClient(timeout=3.0) as http:
            for url in self.booking_agents:
                with contextlib.suppress(httpx.HTTPError):
                    await http.get(f"{url}/health")
                    return
        where = ", ".join(self.booking_agents)
        raise CommandError(f"booking-agent at {where} is unreachable: stack not running? (`concierge up`)")

    async def concierge_reachable(self) -> None:
        """With conversations, some concierge-agent answers too."""
        async with httpx.AsyncClient(timeout=3.0) as http:
            for url in self.concierge_agents:
                with contextlib.suppress(httpx.HTTPError):
                    await http.get(f"{url}/health")
                    return
        where = ", ".join(self.concierge_agents)
        raise CommandError(f"concierge-agent at {where} is unreachable: --chats needs it (`concierge up`)")

    async def state(self) -> StackState:
        return StackState.from_json((await call(self.paths, "status"))["state"])

    async def victims(self) -> list[InstanceState]:
        spared = SPARED - {LLM_API} if LLM_API in self.providers else SPARED
        return [i for i in (await self.state()).instances if i.service not in spared and i.status == "up" and i.pid]


@dataclass
class Run:
    plan: ChaosPlan
    world: World
    out: TextIO
    faults: list[FaultRecord] = field(default_factory=list)
    bookings: dict[str, BookingOutcome] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)
    retried: Counter[str] = field(default_factory=Counter)
    http_5xx: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.rng = random.Random(self.plan.seed)
        self.started = time.monotonic()
        self.busy: set[str] = set()
        self.paused: dict[str, int] = {}
        self.stop_faults = asyncio.Event()
        self.stop_load = asyncio.Event()
        self.give_up = asyncio.Event()
        self.active: set[asyncio.Task[None]] = set()
        self.statuses: dict[str, str] = {}
        """Every booking's status, as verify read it: the conversations' bookings are judged with them."""

    def say(self, message: str) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        self.out.write(f"{now} +{time.monotonic() - self.started:6.1f}s  {message}\n")
        self.out.flush()

    # ------------------------------------------------------------------------------------------- the run

    async def main(self, redis: Redis) -> dict[str, Any]:
        kinds = self._usable_kinds()
        log_sizes = _log_sizes(self.world.paths) if self.world.local else {}
        started_wall = time.time()
        load_at_start = os.getloadavg()[0]
        self.say(
            f"chaos seed {self.plan.seed}: {self.plan.duration_s:g}s, a fault every {self.plan.every_s[0]:g}-"
            f"{self.plan.every_s[1]:g}s (≤ {self.plan.at_once} at once) of {','.join(kinds) or 'none'}; "
            f"{self.plan.clients} client(s), {self.plan.cancel_rate:.0%} cancelled"
            f"{f', {after:.0%} of the confirmed cancelled after' if (after := self.plan.cancel_confirmed) else ''}"
            f"{f'; {self.plan.chats} chat(s)' if self.plan.chats else ''}"
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._interrupt)
        # the operator's load: its bookings and chats are the operator's (no person's quota), read back the same way
        operator = {"Authorization": f"Bearer {self.world.token}"} if self.world.token else {}
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, headers=operator) as http:
            self.http = http
            self.conversations = Conversations(
                self.plan.chats,
                self.plan.seed,
                self.world.concierge_agents,
                http,
                self.stop_load,
                self.give_up,
                self._answered,
                self.say,
            )
            clients = [asyncio.create_task(self._client(n)) for n in range(self.plan.clients)]
            clients += [asyncio.create_task(self.conversations.converse(n)) for n in range(self.plan.chats)]
            try:
                await self._inject(kinds)
            finally:
                self.stop_load.set()
                await self._heal()
            self.say(f"healed; waiting up to {self.plan.settle_s:g}s for every booking to be final")
            settle = loop.call_later(self.plan.settle_s, self.give_up.set)
            await asyncio.gather(*clients, return_exceptions=True)
            settle.cancel()
            conversations = await self.conversations.records() if self.plan.chats else None
            # the client of the start may hold connections to a Redis killed since: judge on a new one
            judge = create_redis(get_settings().redis_url, socket_connect_timeout=3.0, socket_timeout=10.0)
            stuck, dlq, found = 0, 0, []
            records: dict[str, dict[str, Any] | None] | None = None
            try:
                stuck = await self._retrying("count bookings in flight", lambda: BookingStore(judge).in_flight())
                await self._retrying("read the journals", lambda: self._journals(judge))
                found = await self._verify(judge)
                dlq = len(await self._retrying("read the DLQ", lambda: DeadLetterQueue(judge).list()))
                records = await self._retrying("read the cancelled stays", lambda: self._stay_records(judge))
            except CommandError as exc:
                found = [*found, str(exc)]  # what cannot be checked is not proven: a broken promise
            finally:
                await judge.aclose()
            chats = None
            if conversations is not None:
                chats, unproven = await self._judge_chats(*conversations)
                found = [*found, *unproven]
            refunds = None
            if self.plan.cancel_confirmed or any(b.stay_cancel for b in self.bookings.values()):
                refunds, unproven = await self._judge_refunds(records)
                found = [*found, *unproven]
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        error_lines = _error_lines(self.world.paths, log_sizes) if self.world.local else {}
        if not self.world.local:
            self.notes.append("no local stack: ERROR lines not counted (read the containers' logs)")
        verdict = summarize(
            seed=self.plan.seed,
            duration_s=self.plan.duration_s,
            clients=self.plan.clients,
            budget_s=self.plan.budget_s,
            bookings=self.bookings.values(),
            faults=self.faults,
            refused=self.refused,
            retried=self.retried,
            disagreements=found,
            stuck_in_redis=stuck,
            dlq=dlq,
            http_5xx=self.http_5xx,
            error_lines_by_log=error_lines,
            minutes=(time.time() - started_wall) / 60 if self.world.local else None,
            notes=self.notes,
            load={"start": load_at_start, "end": os.getloadavg()[0], "cores": float(os.cpu_count() or 0)},
            chats=chats,
            refunds=refunds,
        )
        self.out.write(render_verdict(verdict) + "\n")
        self.out.flush()
        return verdict.to_json()

    def _interrupt(self) -> None:
        if self.interrupted:
            self.give_up.set()  # a second Ctrl-C: stop waiting for bookings too
            return
        self.interrupted = True
        self.say("interrupted: healing, then the verdict (Ctrl-C again: stop waiting for bookings)")
        self.stop_faults.set()

    def _usable_kinds(self) -> list[str]:
        kinds = list(self.plan.kinds)
        if not self.world.local:
            skipped = [k for k in kinds if k in PROCESS_FAULTS]
            if skipped:
                self.notes.append(f"no local supervisor (compose?): skipped {','.join(skipped)}")
            kinds = [k for k in kinds if k not in PROCESS_FAULTS]
        if "postgres" in kinds and not (self.world.database_url or "").startswith("postgres"):
            self.notes.append("DATABASE_URL is not Postgres: skipped postgres")
            kinds.remove("postgres")
        if LLM_API not in self.world.providers:
            kinds = [k for k in kinds if k not in LLM_FAULTS]  # nothing talks to llm-api without conversations
        if {"errors", "slow", *LLM_FAULTS} & set(kinds) and self.world.token is None:
            self.notes.append("no admin token (CONCIERGE_ADMIN_TOKEN): skipped errors,slow,cut")
            kinds = [k for k in kinds if k not in ("errors", "slow", *LLM_FAULTS)]
        for note in self.notes:
            self.say(note)
        return kinds

    async def _inject(self, kinds: list[str]) -> None:
        deadline = self.started + self.plan.duration_s
        while not self.stop_faults.is_set():
            wait = min(self.rng.uniform(*self.plan.every_s), deadline - time.monotonic())
            if wait <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_faults.wait(), wait)
            if self.stop_faults.is_set() or time.monotonic() >= deadline or not kinds:
                continue
            if len(self.active) >= self.plan.at_once:
                self.say(f"({len(self.active)} faults running: none added)")
                continue
            kind = self.rng.choice(kinds)
            task = asyncio.create_task(self._fault(kind))
            self.active.add(task)
            task.add_done_callback(self.active.discard)
        self.stop_faults.set()
        if self.active:
            self.say(f"time is up: letting {len(self.active)} running fault(s) end")
            await asyncio.gather(*self.active, return_exceptions=True)

    async def _fault(self, kind: str) -> None:
        started = time.time()
        try:
            outcome = await FAULTS[kind](self)
        except (StackError, OSError, httpx.HTTPError) as exc:
            self.say(f"{kind}: could not inject ({type(exc).__name__}: {exc})")
            return
        if outcome is not None:
            target, detail = outcome
            self.faults.append(FaultRecord(kind, target, started, time.time(), detail))

    # ------------------------------------------------------------------------------------------- faults

    async def _victim(self) -> InstanceState | None:
        free = [i for i in await self.world.victims() if i.name not in self.busy]
        if not free:
            self.say("(every service is already faulted or down: none added)")
            return None
        return self.rng.choice(free)

    async def _kill(self) -> tuple[str, str] | None:
        victim = await self._victim()
        if victim is None:
            return None
        answer = await call(self.world.paths, "kill", target=victim.name, restart=True)
        pids = ",".join(str(e.get("pid")) for e in answer["killed"])
        self.say(f"kill -9 {victim.name} (pid {pids}); the supervisor restarts it")
        return victim.name, f"pid {pids}"

    async def _pause(self) -> tuple[str, str] | None:
        victim = await self._victim()
        if victim is None or victim.pid is None:
            return None
        seconds = round(self.rng.uniform(*PAUSE_S), 1)
        self.busy.add(victim.name)
        try:
            os.killpg(victim.pid, signal.SIGSTOP)
            self.paused[victim.name] = victim.pid
            self.say(f"SIGSTOP {victim.name} (pid {victim.pid}) for {seconds:g}s")
            await self._sleep(seconds)
            self._cont(victim.name)
        finally:
            self.busy.discard(victim.name)
        return victim.name, f"{seconds:g}s"

    def _cont(self, name: str) -> None:
        pid = self.paused.pop(name, None)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
            self.say(f"SIGCONT {name} (pid {pid})")

    async def _restart(self) -> tuple[str, str] | None:
        victim = await self._victim()
        if victim is None:
            return None
        down = round(self.rng.uniform(*DOWN_S), 1)
        self.busy.add(victim.name)
        try:
            self.say(f"SIGTERM {victim.name} (pid {victim.pid}); down {down:g}s, then started again")
            stopping = time.monotonic()
            await call(self.world.paths, "stop", target=victim.name, answer_within_s=120)
            self.say(f"{victim.name} stopped after {time.monotonic() - stopping:.1f}s")
            await self._sleep(down)
            await self._start(victim.name)
        finally:
            self.busy.discard(victim.name)
        return victim.name, f"down {down:g}s"

    async def _start(self, name: str) -> None:
        answer = await call(self.world.paths, "start", target=name, answer_within_s=120)
        late = [e["name"] for e in answer["started"] if not e.get("ready")]
        self.say(f"{name} started again{' (not ready yet: ' + ','.join(late) + ')' if late else ''}")

    async def _redis(self) -> tuple[str, str] | None:
        state = await self.world.state()
        if not state.redis.own or state.redis.pid is None:
            self.notes.append("Redis is not the stack's own (REDIS_URL answered): no redis fault injected")
            self.say("redis: not started by `up`; skipped")
            return None
        if "redis" in self.busy or not is_stack_process(state.redis.pid):
            return None
        self.busy.add("redis")
        try:
            os.killpg(state.redis.pid, signal.SIGKILL)
            self.say(f"kill -9 redis (pid {state.redis.pid}); the supervisor restarts it from its append-only file")
            await self._sleep(1.0)  # one at a time: the supervisor's backoff grows with kills in a row
        finally:
            self.busy.discard("redis")
        return "redis", f"pid {state.redis.pid}"

    async def _postgres(self) -> tuple[str, str] | None:
        import psycopg  # only this fault needs it

        url = self.world.database_url or ""
        async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            row = await cursor.fetchone()
        dropped = int(row[0]) if row else 0
        self.say(f"pg_terminate_backend: {dropped} connection(s) to the checkpointer's database dropped")
        return "postgres", f"{dropped} connection(s)"

    async def _provider(self, kind: str) -> tuple[str, str] | None:
        """``errors``/``slow`` on a provider not faulted now (llm-api too, with conversations); ``cut`` on llm-api."""
        names = [LLM_API] if kind in LLM_FAULTS else list(self.world.providers)
        free = [p for p in names if p not in self.busy]
        if not free:
            return None
        provider = self.rng.choice(free)
        seconds = round(self.rng.uniform(*PROVIDER_FAULT_S), 1)
        body: dict[str, Any]
        if provider == LLM_API:  # per model, in OpenAI's terms: every model here
            body, what = self._llm_faults(kind)
        else:
            body = {
                "latency_s": SLOW_S if kind == "slow" else 0.0,
                "error_rate": ERROR_RATE if kind == "errors" else 0.0,
                "hang": False,
            }
            what = f"{ERROR_RATE:.0%} errors" if kind == "errors" else f"{SLOW_S:g}s slow"
        self.busy.add(provider)
        try:
            await self._admin_faults(provider, "PUT", body)
            self.say(f"{provider}: {what} for {seconds:g}s")
            await self._sleep(seconds)
            await self._admin_faults(provider, "DELETE", None)
            self.say(f"{provider}: faults cleared")
        finally:
            self.busy.discard(provider)
        return provider, what

    def _llm_faults(self, kind: str) -> tuple[dict[str, Any], str]:
        if kind == "cut":
            tokens = self.rng.randint(*CUT_AFTER_TOKENS)
            return {"model": None, "cut_after_tokens": tokens}, f"answers cut after {tokens} token(s)"
        if kind == "slow":
            return {"model": None, "first_token_latency_s": SLOW_S}, f"{SLOW_S:g}s to the first token"
        status = self.rng.choice(LLM_ERROR_STATUSES)
        return {"model": None, "error_rate": ERROR_RATE, "error_status": status}, f"{ERROR_RATE:.0%} errors {status}"

    async def _errors(self) -> tuple[str, str] | None:
        return await self._provider("errors")

    async def _cut(self) -> tuple[str, str] | None:
        return await self._provider("cut")

    async def _slow(self) -> tuple[str, str] | None:
        return await self._provider("slow")

    async def _admin_faults(self, provider: str, method: str, body: dict[str, Any] | None) -> None:
        headers = {"Authorization": f"Bearer {self.world.token}"}
        url = f"{self.world.providers[provider]}/admin/faults"
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while True:  # the provider may be down (killed a moment ago): its faults must still be set or cleared
            try:
                response = await self.http.request(method, url, json=body, headers=headers)
                if response.status_code in (200, 204):
                    return
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = type(exc).__name__
            if time.monotonic() > deadline:
                raise StackError(f"{provider} refused its faults: {problem}")
            await asyncio.sleep(0.5)

    async def _sleep(self, seconds: float) -> None:
        """A fault's own wait, cut short when the faults stop (time is up, or Ctrl-C)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop_faults.wait(), seconds)

    # ------------------------------------------------------------------------------------------- heal

    async def _heal(self) -> None:
        """Every paused process continued, every provider's faults cleared, every instance up and ready."""
        for name in list(self.paused):
            self._cont(name)
        if self.active:
            await asyncio.gather(*self.active, return_exceptions=True)
        if self.world.token is not None:
            for provider in self.world.providers:
                with contextlib.suppress(StackError):
                    await self._admin_faults(provider, "DELETE", None)
        if not self.world.local:
            return
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while time.monotonic() < deadline:
            state = await self.world.state()
            held = [i.name for i in state.instances if i.status == "stopped"]
            for name in held:
                await self._start(name)
            down = [i.name for i in state.instances if i.status != "up"]
            if not down:
                return
            await asyncio.sleep(0.5)
        self.notes.append(f"not every service came back within {HEAL_TIMEOUT_S:g}s of the heal")

    # ------------------------------------------------------------------------------------------- load

    def _body(self, rng: random.Random) -> dict[str, Any]:
        checkin = date.today() + timedelta(days=rng.randint(7, MAX_DAYS_AHEAD - 40))
        nights = rng.randint(1, 3)
        return {
            "city": rng.choice(CITIES),
            "checkin": checkin.isoformat(),
            "checkout": (checkin + timedelta(days=nights)).isoformat(),
            "guests": rng.randint(1, 3),
            "payment_token": "tok_visa",
        }

    async def _client(self, number: int) -> None:
        rng = random.Random(f"{self.plan.seed}:{number}")
        # a draw of its own: --cancel-confirmed leaves the bookings and in-flight cancels of a seed as they were
        after_sale = random.Random(f"{self.plan.seed}:{number}:cancel-confirmed")
        urls = self.world.booking_agents
        while not self.stop_load.is_set():
            booking_id = await self._book(rng, urls)
            if booking_id is None:
                continue
            cancel: asyncio.Task[None] | None = None
            if rng.random() < self.plan.cancel_rate:
                self.bookings[booking_id].cancel_sent = True
                cancel = asyncio.create_task(self._cancel(booking_id, rng.uniform(*CANCEL_AFTER_S), urls))
            await self._wait_final(booking_id, urls)
            if cancel is not None:
                await asyncio.gather(cancel, return_exceptions=True)
            outcome = self.bookings[booking_id]
            if outcome.stay_cancel is not None:  # the in-flight cancel came after the confirm: the stay is cancelled
                await self._wait_cancelled(booking_id, urls)
            elif (
                self.plan.cancel_confirmed
                and outcome.status == "confirmed"
                and not outcome.cancel_sent
                and after_sale.random() < self.plan.cancel_confirmed
                and not self.stop_load.is_set()
            ):
                await self._cancel_stay(booking_id, urls)

    def _answered(self, route: str, response: httpx.Response) -> None:
        if response.status_code >= 500 and response.status_code != 503:
            self.http_5xx[f"{route} → {response.status_code}"] += 1

    async def _request(self, urls: list[str], method: str, path: str, route: str, **kwargs: Any) -> httpx.Response:
        """One request to any booking-agent, retried over transport errors (a replica killed or paused)."""
        attempt = 0
        while True:
            url = urls[attempt % len(urls)]
            attempt += 1
            try:
                response = await self.http.request(method, f"{url}{path}", **kwargs)
            except httpx.TransportError:
                if self.give_up.is_set():
                    raise
                await asyncio.sleep(0.25)
                continue
            self._answered(route, response)
            return response

    async def _book(self, rng: random.Random, urls: list[str]) -> str | None:
        body = self._body(rng)
        headers = {"Idempotency-Key": f"chaos-{uuid.uuid4().hex}"}
        while True:
            try:
                response = await self._request(urls, "POST", "/bookings", "POST /bookings", json=body, headers=headers)
            except httpx.TransportError:
                return None
            if response.status_code in (200, 202):
                booking_id = str(response.json()["booking_id"])
                self.bookings.setdefault(booking_id, BookingOutcome(booking_id, time.time()))
                return booking_id
            if response.status_code in TRY_AGAIN and not self.stop_load.is_set():
                # the door is shut for now (overload, a dependency's breaker, a replica stopping): the same key again
                self.retried[_code(response)] += 1
                await asyncio.sleep(retry_after(response))
                continue
            self.refused[_code(response)] += 1
            if response.status_code not in TRY_AGAIN:
                await asyncio.sleep(0.5)  # a refusal that is not about load: do not spin on it
            return None

    async def _cancel(self, booking_id: str, after_s: float, urls: list[str]) -> None:
        await asyncio.sleep(after_s)
        with contextlib.suppress(httpx.TransportError):
            for _ in range(20):
                path = f"/bookings/{booking_id}/cancel"
                response = await self._request(urls, "POST", path, "POST /bookings/{id}/cancel")
                if response.status_code not in TRY_AGAIN:
                    view = _json_object(response)
                    if view.get("status") in STAY_CANCEL_STATUSES and isinstance(view.get("refund"), dict):
                        # confirmed before the cancel came: a stay's cancel, held to its refund as --cancel-confirmed's
                        stay = self.bookings[booking_id].stay_cancel = StayCancel("in_flight")
                        _answered_stay(stay, response, view)
                    return
                await asyncio.sleep(retry_after(response))

    async def _cancel_stay(self, booking_id: str, urls: list[str]) -> None:
        """``--cancel-confirmed``: a confirmed booking cancelled by its owner, sent again through restarts and "not
        now" answers until one sticks, then followed to its end, so the verdict judges a cancel that had its time."""
        stay = self.bookings[booking_id].stay_cancel = StayCancel("asked")
        path = f"/bookings/{booking_id}/cancel"
        while True:
            try:
                response = await self._request(urls, "POST", path, "POST /bookings/{id}/cancel")
            except httpx.TransportError:
                return  # the run gave up before any answer
            if response.status_code in TRY_AGAIN and not self.give_up.is_set():
                await asyncio.sleep(retry_after(response))
                continue
            break
        _answered_stay(stay, response, _json_object(response))
        if stay.accepted:
            await self._wait_cancelled(booking_id, urls)

    async def _wait_cancelled(self, booking_id: str, urls: list[str]) -> None:
        """A stay's accepted cancel followed until it ends ``cancelled``, or ``confirmed`` again with ``cancel_error``
        (the hotel refused): a ``confirmed`` without it is the stay before the cancel shows, looked at again."""
        stay = self.bookings[booking_id].stay_cancel
        assert stay is not None

        def ended(view: dict[str, Any]) -> bool:
            status = view.get("status")
            return status == "cancelled" or (status == "confirmed" and bool(view.get("cancel_error")))

        view = await self._poll_booking(booking_id, urls, ended)
        if view is not None:
            error = view.get("cancel_error")
            stay.status = str(view.get("status"))
            stay.cancel_error = str(error.get("code")) if isinstance(error, dict) else None
            stay.final_at = iso_epoch(view.get("updated_at")) or time.time()

    async def _wait_final(self, booking_id: str, urls: list[str]) -> None:
        outcome = self.bookings[booking_id]
        view = await self._poll_booking(booking_id, urls, lambda seen: seen.get("status") in FINAL_BOOKING_STATUSES)
        if view is not None:
            outcome.status = str(view["status"])
            error = view.get("error")
            outcome.error_code = str(error.get("code")) if isinstance(error, dict) else None
            outcome.accepted_at = iso_epoch(view.get("created_at")) or outcome.accepted_at
            outcome.final_at = iso_epoch(view.get("updated_at")) or time.time()

    async def _poll_booking(
        self, booking_id: str, urls: list[str], done: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any] | None:
        """The booking's view once ``done`` says so (long polls on any replica, through restarts); ``None`` when the
        run gave up or no replica answered."""
        while not self.give_up.is_set():
            try:
                response = await self._request(
                    urls,
                    "GET",
                    f"/bookings/{booking_id}",
                    "GET /bookings/{id}?wait=",
                    params={"wait": LONG_POLL_S},
                    timeout=LONG_POLL_S + REQUEST_TIMEOUT_S,
                )
            except httpx.TransportError:
                return None
            if response.status_code != 200:
                await asyncio.sleep(retry_after(response) if response.status_code == 503 else 0.25)
                continue
            view: dict[str, Any] = response.json()
            if done(view):
                return view
            if view.get("status") in FINAL_BOOKING_STATUSES:  # answered at once, yet not done: do not spin on it
                await asyncio.sleep(0.5)
        return None

    # ------------------------------------------------------------------------------------------- judging

    async def _retrying(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """Redis just came back (or not): a few tries, then ``CommandError``, a verdict that cannot be proven."""
        for attempt in range(JUDGE_ATTEMPTS):
            try:
                return await op()
            except (RedisError, OSError) as exc:
                if attempt == JUDGE_ATTEMPTS - 1:
                    raise CommandError(
                        f"could not {what} in Redis after the heal: {type(exc).__name__}: {exc}"
                    ) from exc
                await asyncio.sleep(1.0)
        raise AssertionError("unreachable")

    async def _journals(self, redis: Redis) -> None:
        """From each booking's journal: how often it paused, and for a failed one, its last refusal to ``failed``."""
        for outcome in self.bookings.values():
            entries = await read_journal(redis, outcome.booking_id)
            outcome.pauses = sum(1 for e in entries if e.get("kind") == JournalKind.PAUSED)
            if outcome.status == "failed":
                outcome.refusal_to_failed_s = refusal_to_failed(entries)

    async def _verify(self, redis: Redis) -> list[str]:
        try:
            bookings, found = await self._retrying("verify the bookings", lambda: check_ledgers(redis))
        except CommandError as exc:
            return [f"verify could not run: {exc}"]
        self.say(f"verify: {len(bookings)} booking(s) against both ledgers, {len(found)} disagreement(s)")
        self.statuses = bookings
        return [f"{d.reference} {d.status}: {d.problem}" for d in found]

    async def _stay_records(self, redis: Redis) -> dict[str, dict[str, Any] | None]:
        """The records of the stays the run cancelled, as they stand after the settle (None: gone)."""
        store = BookingStore(redis)
        return {b.booking_id: await store.get(b.booking_id) for b in self.bookings.values() if b.stay_cancel}

    async def _judge_refunds(
        self, records: dict[str, dict[str, Any] | None] | None
    ) -> tuple[RefundJudgement, list[str]]:
        """The cancelled stays against payment-api's refunds; records or refunds that could not be read, apart (not
        proven: a broken promise)."""
        if records is None:
            return judge_refunds(self.bookings.values(), {}, []), ["the cancelled stays' records unread"]
        try:
            refunds = await ledger_refunds()
        except CommandError as exc:
            return judge_refunds(self.bookings.values(), records, []), [f"refunds unread: {exc}"]
        judged = judge_refunds(self.bookings.values(), records, refunds)
        self.say(
            f"refunds: {judged['asked']} cancelled stay(s) held to {len(refunds)} refund(s) in payment-api's ledger"
        )
        return judged, []

    async def _judge_chats(
        self, chats: list[ChatRecord], approvals: list[ApprovalRecord]
    ) -> tuple[ChatJudgement, list[str]]:
        """The conversations against their promises: their chats and approvals as concierge-agent told them, the
        bookings' statuses (Redis, as verify read them) and payment-api's charges; what could not be read, apart."""
        try:
            charges = await ledger_charges()
        except CommandError as exc:
            return judge_chats(chats, approvals, self.statuses, []), [f"charges unread: {exc}"]
        self.say(f"chats: {len(chats)} read, {len(approvals)} approval(s) asked, {len(charges)} charge(s) held to them")
        return judge_chats(chats, approvals, self.statuses, charges), []


FaultFn = Callable[[Run], Awaitable[tuple[str, str] | None]]
FAULTS: dict[str, FaultFn] = {
    "kill": Run._kill,
    "pause": Run._pause,
    "restart": Run._restart,
    "redis": Run._redis,
    "postgres": Run._postgres,
    "errors": Run._errors,
    "slow": Run._slow,
    "cut": Run._cut,
}


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _answered_stay(stay: StayCancel, response: httpx.Response, view: dict[str, Any]) -> None:
    """What a stay's cancel was answered: accepted (202/200, with the refund promised) or refused, and its code."""
    stay.answer = str(response.status_code) if str(response.status_code) in ACCEPTED_CANCEL else _code(response)
    if stay.accepted:
        refund = view.get("refund")
        stay.quoted = refund if isinstance(refund, dict) else None
        stay.accepted_at = time.time()


def _code(response: httpx.Response) -> str:
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("code"):
            return f"{response.status_code} {error['code']}"
    except ValueError:
        pass
    return f"HTTP {response.status_code}"


def _log_sizes(paths: StackPaths) -> dict[str, int]:
    return {log.name: log.stat().st_size for log in paths.logs.glob("*.log")}


def _error_lines(paths: StackPaths, since: dict[str, int]) -> dict[str, int]:
    """ERROR lines each log gained during the run (a log that grew from nothing counts whole)."""
    counts: dict[str, int] = {}
    for log in paths.logs.glob("*.log"):
        with log.open("rb") as handle:
            handle.seek(since.get(log.name, 0))
            counts[log.stem] = sum(1 for line in handle if _ERROR_LINE.search(line))
    return counts
