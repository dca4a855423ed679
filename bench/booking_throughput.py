"""Booking throughput and latency against a real stack, priced against baselines measured in the same run.

Run: ``python -m bench.booking_throughput`` (starts the five services itself: real ``concierge serve`` processes
on free ports, Postgres checkpointer on a fresh database, a unique Redis key prefix; all removed at the end), or
``--url http://host:port`` to load a booking-agent that is already running. ``--bookings 5000`` runs until that
many bookings are confirmed instead of for ``--duration`` seconds and checks that no service's memory grows.

Each of ``--clients`` clients loops: ``POST /bookings`` (a random city of the ten, a random check-in in the next
300 days, so inventory never runs out and no 409 distorts the numbers), then ``GET /bookings/{id}?wait=`` until the
booking is final. Latency is from sending the POST to reading ``confirmed``.

Baselines, measured in the same run on the same machine, in ``--rounds`` short rounds that alternate with the
unloaded bookings (so a slow minute of a shared machine weighs on both sides of the comparison alike):

- one bare loopback FastAPI→FastAPI hop: a tiny FastAPI app calls another tiny FastAPI app over httpx (both real
  uvicorn processes) and times the call itself, from sending to holding the decoded answer; p50 of that. It prices
  the booking's requests from one of our services to another;
- one direct request from the bench's client to the tiny backend: p50. It prices the client's own two requests
  (``POST /bookings`` and the long-poll). Earlier versions priced all eight as the client's request to the front
  (client → app → app: two legs for one); that figure is still printed, for comparison;
- the checkpointer's writes, through the saver and pool configuration the services use
  (``infra.checkpointer.open_checkpointer``), same database: p50 of ``aput`` of a real booking's final checkpoint,
  and p50 of ``aput_writes`` of a real node's result. A ``durability="sync"`` step makes both, in that order
  (task writes, then the checkpoint); the database tells how many of each a booking made.

Targets (2-core machine, fault-free providers): ≥ 25 bookings/s with 16 clients; the unloaded p50 ≤ 2 × (6 hops +
2 client requests + W checkpoints + B task-write batches, priced from the baselines); every service's RSS < 250 MB
and flat from the 1,000th to the 5,000th booking. The bound prices one booking's own path, so it is checked on
bookings made one at a time; the p50 under 16 clients is reported beside it, not judged: a closed loop of N clients
waits about N / throughput in queues (Little's law), and 16 clients within the bound would take 16 / bound, well
over a hundred bookings/s, less CPU per booking than its hops alone cost.
Prints a markdown table and writes ``bench/results/booking_throughput.json``. Exit status 1 when a target fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._stack import HopPair, cpu_seconds, hop_pair, machine_cpu_seconds, percentiles, rss_kib, service_stack
from providers.inventory import CITIES
from tests.stack import CORE, TEST_DATABASE_URL

RESULTS = Path(__file__).resolve().parent / "results" / "booking_throughput.json"

TARGET_BOOKINGS_PER_S = 25.0
TARGET_LATENCY_FACTOR = 2.0
TARGET_RSS_MB = 250.0
RSS_MARKS = (1_000, 5_000)
# Python's allocators hand pages back lazily, so a process that does not leak still moves by a few MB under
# concurrent load. 5% of a ~100 MB service is ~5 MB over 4,000 bookings: a leak of ≥ 1.3 KB per booking fails.
RSS_GROWTH_TOLERANCE = 0.05
BOOKING_HORIZON_DAYS = 300
LONG_POLL_S = 20.0
# BOOKING_BUDGET_S (60 s) plus slack: a booking still pending after this will not finish without recovery.
MAX_BOOKING_WAIT_S = 90.0
# No booking final for this long: the stack is wedged; end the phase instead of waiting forever.
STALL_S = 120.0

# The HTTP requests one booking cannot do without (read from agents/booking/app.py, agents/booking/graph.py, agents/search/app.py,
# agents/search/graph.py, agents/payment/app.py, agents/payment/graph.py), each one leg: a caller's request and the callee's answer.
# Six go from one of our FastAPI services to another (priced as the bare FastAPI→FastAPI hop); two are the
# client's own (priced as a direct client → FastAPI request). A long-poll that ends before the booking does adds
# one more; the bench counts the GETs it actually sent and prints the mean.
SERVICE_HOP = "FastAPI → FastAPI hop"
CLIENT_REQUEST = "client → FastAPI request"
HOPS: tuple[tuple[str, str], ...] = (
    (CLIENT_REQUEST, "client → booking-agent  POST /bookings"),
    (SERVICE_HOP, "booking-agent → search-agent  A2A search_hotels"),
    (SERVICE_HOP, "search-agent → hotel-api  GET /hotels"),
    (SERVICE_HOP, "booking-agent → hotel-api  POST /reservations"),
    (SERVICE_HOP, "booking-agent → payment-agent  A2A charge_payment"),
    (SERVICE_HOP, "payment-agent → payment-api  POST /charges"),
    (SERVICE_HOP, "booking-agent → hotel-api  POST /reservations/{id}/confirm"),
    (CLIENT_REQUEST, "client → booking-agent  GET /bookings/{id}?wait= (long-poll)"),
)
SERVICE_HOPS = sum(1 for kind, _ in HOPS if kind == SERVICE_HOP)
CLIENT_REQUESTS = len(HOPS) - SERVICE_HOPS


def unavoidable_ms(
    *, hop_ms: float, direct_ms: float, aput_ms: float, writes_ms: float, checkpoints: int, write_batches: int
) -> float:
    """The booking's unavoidable parts at these prices: each request one leg (a service's call to another at the
    hop's price, the client's own at a direct request's), and the checkpointer writes a ``durability="sync"`` step
    cannot skip (its task's writes, then its checkpoint)."""
    return SERVICE_HOPS * hop_ms + CLIENT_REQUESTS * direct_ms + checkpoints * aput_ms + write_batches * writes_ms


# Checkpoints (``aput``) a graph run writes with durability="sync": LangGraph saves the input (step -1) and the
# ``__start__`` step (0), then one checkpoint per super-step, i.e. per node on the path the run takes.
CHECKPOINTS_BEFORE_FIRST_NODE = 2


def happy_path(graph: Any, avoid: frozenset[str]) -> list[str]:
    """The nodes a successful run goes through: the longest START→END path of ``graph`` not touching ``avoid``."""
    successors: dict[str, list[str]] = {}
    for edge in graph.get_graph().edges:
        successors.setdefault(edge.source, []).append(edge.target)

    def longest(node: str, seen: frozenset[str]) -> list[str] | None:
        if node == "__end__":
            return [node]
        paths = [
            path
            for target in successors.get(node, [])
            if target not in avoid and target not in seen
            if (path := longest(target, seen | {target})) is not None
        ]
        return [node, *max(paths, key=len)] if paths else None

    path = longest("__start__", frozenset({"__start__"}))
    if path is None:
        raise RuntimeError("the graph has no path from START to END")
    return path[1:-1]


def checkpoints_from_code() -> dict[str, Any]:
    """Per booking: the booking graph's path to ``confirmed`` and the payment graph's ``charge`` path.

    The graphs are compiled, not run: their builders only keep the dependencies for later, so placeholders do.
    The search graph has no checkpointer and writes nothing.
    """
    from types import SimpleNamespace
    from typing import cast

    from agents.booking.graph import BookingDeps, build_booking_graph
    from agents.payment.graph import build_payment_graph

    placeholders = SimpleNamespace(redis=None, bookings=None, hotels=None, search_agent=None, payment_agent=None)
    booking = happy_path(build_booking_graph(cast(BookingDeps, placeholders)), frozenset({"compensate"}))
    payment = happy_path(build_payment_graph(cast(Any, None), cast(Any, None)), frozenset({"refund"}))
    return {
        "booking_path": booking,
        "payment_path": payment,
        "booking_checkpoints": CHECKPOINTS_BEFORE_FIRST_NODE + len(booking),
        "payment_checkpoints": CHECKPOINTS_BEFORE_FIRST_NODE + len(payment),
    }


# --------------------------------------------------------------------------------------------------- load


class _Unfinished(Exception):
    """A booking this client gave up on (refused, unknown, or never final); the message is the error's name."""


@dataclass
class Completed:
    started: float
    finished: float
    status: str
    polls: int
    notice_delay_s: float
    """From the moment the service recorded the final status (``updated_at``) to this client reading it."""

    @property
    def latency_s(self) -> float:
        return self.finished - self.started


@dataclass
class LoadResult:
    clients: int
    started: float
    window_end: float
    completed: list[Completed] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    rss_kib_at: dict[int, dict[str, int]] = field(default_factory=dict)
    confirmed_ids: list[str] = field(default_factory=list)

    def in_window(self) -> list[Completed]:
        return [c for c in self.completed if c.finished <= self.window_end]

    def confirmed_latencies_s(self) -> list[float]:
        return [c.latency_s for c in self.in_window() if c.status == "confirmed"]

    @property
    def window_s(self) -> float:
        return self.window_end - self.started

    def bookings_per_s(self) -> float:
        return len(self.confirmed_latencies_s()) / self.window_s if self.window_s > 0 else 0.0

    @classmethod
    def merge(cls, parts: Sequence[LoadResult]) -> LoadResult:
        """Several windows as one: their in-window bookings laid end to end, windows summed, errors added."""
        merged = cls(clients=parts[0].clients, started=0.0, window_end=0.0)
        for part in parts:
            shift = merged.window_end - part.started
            merged.completed += [
                dataclasses.replace(c, started=c.started + shift, finished=c.finished + shift) for c in part.in_window()
            ]
            merged.window_end += part.window_s
            merged.errors.update(part.errors)
            merged.confirmed_ids += part.confirmed_ids
        return merged

    def summary(self) -> dict[str, Any]:
        window = self.in_window()
        latencies = self.confirmed_latencies_s()
        return {
            "clients": self.clients,
            "window_s": self.window_s,
            "confirmed": len(latencies),
            "failed": sum(1 for c in window if c.status != "confirmed"),
            "bookings_per_s": self.bookings_per_s(),
            "latency_ms": percentiles(latencies, scale=1000),
            "mean_polls_per_booking": statistics.fmean(c.polls for c in window) if window else float("nan"),
            "notice_delay_ms": percentiles([c.notice_delay_s for c in window], scale=1000),
            "errors": dict(self.errors),
            "rss_kib_at_confirmed": {str(k): v for k, v in sorted(self.rss_kib_at.items())},
        }


def _epoch(iso: str) -> float:
    """``2025-01-31T12:00:00.123Z`` (how the booking API writes times) as a Unix timestamp."""
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class BookingFactory:
    """Bookings spread over the ten cities and the next 300 days, so no hotel runs out of rooms."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._today = dt.date.today()

    def __call__(self) -> dict[str, Any]:
        checkin = self._today + dt.timedelta(days=self._rng.randint(1, BOOKING_HORIZON_DAYS))
        checkout = checkin + dt.timedelta(days=self._rng.randint(1, 3))
        return {
            "city": self._rng.choice(CITIES),
            "checkin": checkin.isoformat(),
            "checkout": checkout.isoformat(),
            "guests": self._rng.randint(1, 2),
            "payment_token": "tok_visa",
        }


@dataclass(frozen=True)
class StopRule:
    seconds: float | None = None
    confirmed: int | None = None

    def describe(self) -> str:
        return f"{self.confirmed} confirmed bookings" if self.confirmed else f"{self.seconds:g} s"


async def run_load(
    http: httpx.AsyncClient,
    *,
    clients: int,
    stop: StopRule,
    new_booking: Callable[[], dict[str, Any]],
    pids: Mapping[str, int] | None = None,
    keep_ids: int = 0,
) -> LoadResult:
    """``clients`` closed-loop clients until ``stop``; bookings in flight then are finished but not counted."""
    loop = asyncio.get_running_loop()
    # perf_counter, not loop.time(): uvloop's clock moves in whole milliseconds, too coarse for a 40 ms booking
    now = time.perf_counter
    stopping = asyncio.Event()
    result = LoadResult(clients=clients, started=now(), window_end=float("inf"))
    confirmed = 0
    last_progress = now()

    def close_window() -> None:
        if not stopping.is_set():
            result.window_end = now()
            stopping.set()

    def on_confirmed(booking_id: str) -> None:
        nonlocal confirmed
        confirmed += 1
        if len(result.confirmed_ids) < keep_ids:
            result.confirmed_ids.append(booking_id)
        if pids and confirmed in RSS_MARKS:
            result.rss_kib_at[confirmed] = {name: rss_kib(pid) for name, pid in pids.items()}
        if stop.confirmed is not None and confirmed >= stop.confirmed:
            close_window()

    async def book(body: dict[str, Any]) -> tuple[str, dict[str, Any], int]:
        """POST, then long-poll until final: (booking id, final booking, GETs sent); ``_Unfinished`` otherwise."""
        response = await http.post("/bookings", json=body)
        if response.status_code != 202:
            raise _Unfinished(f"POST {response.status_code}")
        booking_id = str(response.json()["booking_id"])
        give_up = now() + MAX_BOOKING_WAIT_S
        polls = 0
        while True:
            polls += 1
            response = await http.get(f"/bookings/{booking_id}", params={"wait": LONG_POLL_S})
            if response.status_code != 200:
                raise _Unfinished(f"GET {response.status_code}")
            booking: dict[str, Any] = response.json()
            if booking["status"] in {"confirmed", "failed"}:
                return booking_id, booking, polls
            if now() >= give_up:
                # without a recovery worker a run that crashed stays pending forever; this client moves on
                raise _Unfinished(f"not final after {MAX_BOOKING_WAIT_S:g} s")

    async def one_client() -> None:
        nonlocal last_progress
        while not stopping.is_set():
            started = now()
            try:
                booking_id, booking, polls = await book(new_booking())
            except (_Unfinished, httpx.HTTPError) as exc:
                result.errors[str(exc) if isinstance(exc, _Unfinished) else type(exc).__name__] += 1
                await asyncio.sleep(0.05)  # a refusing service must not turn this loop into a busy spin
                continue
            last_progress = now()
            status = str(booking["status"])
            notice_delay = time.time() - _epoch(booking["updated_at"])
            result.completed.append(Completed(started, now(), status, polls, notice_delay))
            if status == "confirmed":
                on_confirmed(booking_id)
            else:
                result.errors[f"failed: {(booking.get('error') or {}).get('code')}"] += 1

    async def watchdog() -> None:
        while not stopping.is_set():
            await asyncio.sleep(1.0)
            if now() - last_progress > STALL_S:
                result.errors[f"stalled: nothing final for {STALL_S:g} s"] += 1
                close_window()

    tasks = [asyncio.create_task(one_client(), name=f"client-{i}") for i in range(clients)]
    tasks.append(asyncio.create_task(watchdog(), name="watchdog"))
    timer = loop.call_later(stop.seconds, close_window) if stop.seconds is not None else None
    try:
        await stopping.wait()
        await asyncio.gather(*tasks)
    finally:
        if timer is not None:
            timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


# --------------------------------------------------------------------------------------------------- baselines


async def timed_requests(
    http: httpx.AsyncClient,
    url: str,
    samples: int,
    pids: Sequence[int],
    warmup: int = 100,
    on_answer: Callable[[httpx.Response], None] | None = None,
) -> tuple[list[float], float]:
    """Seconds per sequential ``GET url`` (after a warm-up that fills connection pools on both sides), and the
    CPU milliseconds per request used by ``pids`` together. ``on_answer`` sees each timed answer."""
    for _ in range(warmup):
        (await http.get(url)).raise_for_status()
    times = []
    cpu_before = sum(cpu_seconds(pid) for pid in pids)
    for _ in range(samples):
        start = time.perf_counter()
        response = await http.get(url)
        times.append(time.perf_counter() - start)
        response.raise_for_status()
        if on_answer is not None:
            on_answer(response)
    cpu_ms = (sum(cpu_seconds(pid) for pid in pids) - cpu_before) * 1000 / samples
    return times, cpu_ms


class HopSampler:
    """The bare FastAPI→FastAPI hop and a direct client request, sampled in several short rounds.

    ``GET front/hop``: the front calls the backend and answers how long that call took (``hop_s``, the hop); the
    bench also times its whole request (client → front → backend, two legs). ``GET backend/pong``: one leg, a
    client's request to a FastAPI app.
    """

    def __init__(self, pair: HopPair, http: httpx.AsyncClient) -> None:
        self.pair, self.http = pair, http
        self.hop: list[float] = []
        self.through_front: list[float] = []
        self.direct: list[float] = []
        self.hop_cpu_s = self.direct_cpu_s = 0.0

    async def sample(self, samples: int, warmup: int = 20) -> None:
        through_front, hop_cpu_ms = await timed_requests(
            self.http,
            f"{self.pair.front}/hop",
            samples,
            self.pair.pids,
            warmup,
            on_answer=lambda answer: self.hop.append(float(answer.json()["hop_s"])),
        )
        self.through_front += through_front
        self.hop_cpu_s += hop_cpu_ms * samples / 1000
        direct, direct_cpu_ms = await timed_requests(
            self.http, f"{self.pair.backend}/pong", samples, self.pair.pids[1:], warmup
        )
        self.direct += direct
        self.direct_cpu_s += direct_cpu_ms * samples / 1000

    def summary(self) -> dict[str, Any]:
        return {
            "samples": len(self.hop),
            "hop_ms": percentiles(self.hop, scale=1000),
            "through_front_ms": percentiles(self.through_front, scale=1000),
            "through_front_server_cpu_ms": self.hop_cpu_s * 1000 / max(len(self.hop), 1),
            "direct_request_ms": percentiles(self.direct, scale=1000),
            "direct_server_cpu_ms": self.direct_cpu_s * 1000 / max(len(self.direct), 1),
        }


class CheckpointSampler:
    """The two writes a ``durability="sync"`` step makes, priced one at a time through
    ``infra.checkpointer.open_checkpointer`` (the saver and pool configuration the services use):

    - ``aput`` of a real booking's final checkpoint (all its channels) onto a fresh thread;
    - ``aput_writes`` of a median-sized task-write batch that booking stored (what one node returned), under a
      fresh task id.
    """

    def __init__(self, database_url: str, booking_id: str) -> None:
        self.database_url, self.booking_id = database_url, booking_id
        self.times: list[float] = []
        self.write_times: list[float] = []
        self.cpu_s = 0.0
        self._run = uuid.uuid4().hex[:8]
        self._threads: list[str] = []

    @contextlib.asynccontextmanager
    async def opened(self) -> AsyncIterator[CheckpointSampler]:
        from infra.checkpointer import open_checkpointer

        async with open_checkpointer(self.database_url) as saver:
            stored = await saver.aget_tuple({"configurable": {"thread_id": self.booking_id, "checkpoint_ns": ""}})
            if stored is None:
                raise RuntimeError(f"no checkpoint for booking {self.booking_id}: is the stack using this database?")
            self._saver, self._stored = saver, stored
            self.channels = len(stored.checkpoint["channel_versions"])
            self.serialized_bytes = sum(
                len(saver.serde.dumps_typed(v)[1]) for v in stored.checkpoint["channel_values"].values()
            )
            batches: list[list[tuple[str, Any]]] = []
            async for item in saver.alist({"configurable": {"thread_id": self.booking_id, "checkpoint_ns": ""}}):
                by_task: dict[str, list[tuple[str, Any]]] = {}
                for task_id, channel, value in item.pending_writes or []:
                    by_task.setdefault(task_id, []).append((channel, value))
                batches += by_task.values()
            if not batches:
                raise RuntimeError(f"booking {self.booking_id} stored no task writes")
            # a typical node's result: the median-sized batch (the input's, the largest, would flatter the bound)
            self._writes = sorted(batches, key=len)[len(batches) // 2]
            self.write_channels = [channel for channel, _ in self._writes]
            try:
                for _ in range(50):
                    await self._put()
                    await self._put_writes()
                yield self
            finally:
                # with --url this is somebody's database: leave nothing behind
                for thread in self._threads:
                    await saver.adelete_thread(thread)

    async def _put(self) -> float:
        thread = f"bench-baseline-{self._run}-{len(self._threads)}"
        self._threads.append(thread)
        checkpoint, metadata = self._stored.checkpoint, self._stored.metadata
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        start = time.perf_counter()
        await self._saver.aput(config, checkpoint, metadata, dict(checkpoint["channel_versions"]))  # type: ignore[arg-type]
        return time.perf_counter() - start

    async def _put_writes(self) -> float:
        thread = self._threads[-1]  # the thread of the last aput: writes hang off a stored checkpoint
        config = {
            "configurable": {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": self._stored.checkpoint["id"]}
        }
        start = time.perf_counter()
        await self._saver.aput_writes(config, self._writes, uuid.uuid4().hex)  # type: ignore[arg-type]
        return time.perf_counter() - start

    async def sample(self, samples: int) -> None:
        cpu_before = time.process_time()
        for _ in range(samples):
            self.times.append(await self._put())
            self.write_times.append(await self._put_writes())
        self.cpu_s += time.process_time() - cpu_before

    def summary(self) -> dict[str, Any]:
        return {
            "samples": len(self.times),
            "channels": self.channels,
            "serialized_bytes": self.serialized_bytes,
            "aput_ms": percentiles(self.times, scale=1000),
            "write_channels": self.write_channels,
            "aput_writes_ms": percentiles(self.write_times, scale=1000),
            "client_cpu_ms_per_pair": self.cpu_s * 1000 / max(len(self.times), 1),
        }


async def checkpoints_written(database_url: str, booking_ids: Sequence[str]) -> dict[str, Any]:
    """What the database says one booking wrote: checkpoints (``aput``) and task-write batches (``aput_writes``)."""
    import psycopg

    per_booking: list[dict[str, int]] = []
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for booking_id in booking_ids:
            counts: dict[str, int] = {}
            for graph, thread in (("booking", booking_id), ("payment", f"{booking_id}:charge")):
                cur = await conn.execute(
                    "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''", (thread,)
                )
                row = await cur.fetchone()
                counts[f"{graph}_checkpoints"] = int(row[0]) if row else 0
                cur = await conn.execute(
                    "SELECT count(DISTINCT (checkpoint_id, task_id)) FROM checkpoint_writes "
                    "WHERE thread_id = %s AND checkpoint_ns = ''",
                    (thread,),
                )
                row = await cur.fetchone()
                counts[f"{graph}_write_batches"] = int(row[0]) if row else 0
            per_booking.append(counts)
    if not per_booking:
        return {"bookings_checked": 0}
    most_common = Counter(json.dumps(c, sort_keys=True) for c in per_booking).most_common(1)[0][0]
    typical: dict[str, int] = json.loads(most_common)
    return {
        "bookings_checked": len(per_booking),
        "all_alike": all(c == typical for c in per_booking),
        **typical,
        "checkpoints": typical["booking_checkpoints"] + typical["payment_checkpoints"],
        "write_batches": typical["booking_write_batches"] + typical["payment_write_batches"],
    }


# --------------------------------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class Options:
    url: str | None
    clients: int
    duration_s: float
    bookings: int | None
    warmup_s: float
    unloaded: int
    hop_samples: int
    checkpoint_samples: int
    rounds: int
    redis_url: str
    admin_database_url: str
    database_url: str | None
    seed: int
    output: Path


@dataclass(frozen=True)
class Target:
    name: str
    measured: str
    target: str
    ok: bool | None
    """None: could not be evaluated in this run (shown as n/a, not as a failure)."""


@dataclass(frozen=True)
class CpuSnapshot:
    services: dict[str, float]
    bench: float
    machine_busy: float
    machine_total: float

    @classmethod
    def take(cls, pids: Mapping[str, int]) -> CpuSnapshot:
        busy, total = machine_cpu_seconds()
        return cls({n: cpu_seconds(p) for n, p in pids.items()}, time.process_time(), busy, total)

    def per_booking_ms(self, before: CpuSnapshot, bookings: int) -> dict[str, float]:
        """CPU milliseconds per booking of each service, of this load generator, of the whole machine."""
        n = max(bookings, 1)
        out = {name: (self.services[name] - before.services[name]) * 1000 / n for name in self.services}
        out["bench (load generator)"] = (self.bench - before.bench) * 1000 / n
        out["whole machine"] = (self.machine_busy - before.machine_busy) * 1000 / n
        out["machine busy fraction"] = (self.machine_busy - before.machine_busy) / max(
            self.machine_total - before.machine_total, 1e-9
        )
        return out


def _share(total: int, rounds: int, i: int) -> int:
    """Round ``i``'s part of ``total`` split over ``rounds`` (the remainder goes to the first rounds)."""
    return total // rounds + (1 if i < total % rounds else 0)


def python_loop_seconds(iterations: int = 10_000_000) -> float:
    """Seconds for a plain Python loop: how fast this machine runs Python today, to compare runs across machines
    (the absolute targets, bookings/s, depend on it; the latency ratio mostly does not)."""
    start = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i
    return time.perf_counter() - start


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def measure(
    options: Options, booking_url: str, database_url: str | None, pids: Mapping[str, int]
) -> dict[str, Any]:
    new_booking = BookingFactory(options.seed)
    limits = httpx.Limits(max_connections=options.clients * 2, max_keepalive_connections=options.clients * 2)
    result: dict[str, Any] = {
        "loadavg_start": loadavg(),
        "python_loop_s": python_loop_seconds(),
        "checkpoints_from_code": checkpoints_from_code(),
    }
    async with httpx.AsyncClient(base_url=booking_url, timeout=LONG_POLL_S + 30, limits=limits) as http:
        log(f"warm-up: {options.clients} clients for {options.warmup_s:g} s")
        warm = await run_load(
            http,
            clients=options.clients,
            stop=StopRule(seconds=options.warmup_s),
            new_booking=new_booking,
            keep_ids=1,
        )
        if not warm.confirmed_ids:
            raise RuntimeError(f"no booking was confirmed during the warm-up: {dict(warm.errors)}")

        # The machine's speed drifts over minutes (it is shared): the baselines and the unloaded bookings are taken
        # in alternating short rounds, so a slow minute weighs on both sides of the comparison alike.
        rounds = options.rounds
        log(
            f"unloaded, in {rounds} rounds: {options.unloaded} bookings by 1 client, {options.hop_samples} bare hops"
            + (f", {options.checkpoint_samples} checkpoint writes" if database_url else "")
        )
        unloaded_parts: list[LoadResult] = []
        cpu_ms: dict[str, float] = {}
        async with contextlib.AsyncExitStack() as stack:
            pair = stack.enter_context(hop_pair())
            hops = HopSampler(pair, await stack.enter_async_context(httpx.AsyncClient(timeout=30)))
            checkpoints = (
                await stack.enter_async_context(CheckpointSampler(database_url, warm.confirmed_ids[0]).opened())
                if database_url
                else None
            )
            per_round: list[dict[str, float]] = []
            for i in range(rounds):
                seen = (len(hops.hop), len(checkpoints.times) if checkpoints is not None else 0)
                await hops.sample(_share(options.hop_samples, rounds, i))
                if checkpoints is not None:
                    await checkpoints.sample(_share(options.checkpoint_samples, rounds, i))
                cpu_before = CpuSnapshot.take(pids)
                part = await run_load(
                    http,
                    clients=1,
                    stop=StopRule(confirmed=_share(options.unloaded, rounds, i)),
                    new_booking=new_booking,
                    keep_ids=20,
                )
                spent = CpuSnapshot.take(pids).per_booking_ms(cpu_before, 1)
                for name, ms in spent.items():
                    cpu_ms[name] = cpu_ms.get(name, 0.0) + ms
                unloaded_parts.append(part)
                per_round.append(
                    {
                        "hop_p50_ms": statistics.median(hops.hop[seen[0] :]) * 1000,
                        "direct_p50_ms": statistics.median(hops.direct[seen[0] :]) * 1000,
                        "aput_p50_ms": statistics.median(checkpoints.times[seen[1] :]) * 1000
                        if checkpoints is not None
                        else float("nan"),
                        "booking_p50_ms": part.summary()["latency_ms"]["p50"],
                    }
                )
                log(
                    "round {}: hop {hop_p50_ms:.2f} ms, direct {direct_p50_ms:.2f} ms, aput {aput_p50_ms:.2f} ms, "
                    "booking {booking_p50_ms:.1f} ms".format(i + 1, **per_round[-1])
                )
            result["rounds"] = per_round
            result["hop_baseline"] = hops.summary()
            if checkpoints is not None:
                result["checkpoint_baseline"] = checkpoints.summary()
        unloaded = LoadResult.merge(unloaded_parts)
        result["unloaded"] = unloaded.summary()
        done = max(len(unloaded.completed), 1)
        result["unloaded"]["cpu_ms_per_booking"] = {
            name: (ms / rounds if name == "machine busy fraction" else ms / done) for name, ms in cpu_ms.items()
        }

        stop = StopRule(confirmed=options.bookings) if options.bookings else StopRule(seconds=options.duration_s)
        log(f"load: {options.clients} clients until {stop.describe()}")
        rss_before = {name: rss_kib(pid) for name, pid in pids.items()}
        cpu_before = CpuSnapshot.take(pids)
        loaded = await run_load(http, clients=options.clients, stop=stop, new_booking=new_booking, pids=pids)
        result["loaded"] = loaded.summary()
        result["loaded"]["cpu_ms_per_booking"] = CpuSnapshot.take(pids).per_booking_ms(
            cpu_before, len(loaded.completed)
        )
        result["rss_kib"] = {
            "after_warmup": rss_before,
            **{f"at_{mark}": loaded.rss_kib_at[mark] for mark in RSS_MARKS if mark in loaded.rss_kib_at},
            "end": {name: rss_kib(pid) for name, pid in pids.items()},
        }
        if database_url:
            result["writes_per_booking"] = await checkpoints_written(database_url, unloaded.confirmed_ids)
    result["loadavg_end"] = loadavg()
    return result


def evaluate(options: Options, result: dict[str, Any]) -> tuple[list[Target], dict[str, Any]]:
    loaded, unloaded = result["loaded"], result["unloaded"]
    hop_ms = result["hop_baseline"]["hop_ms"]["p50"]
    direct_ms = result["hop_baseline"]["direct_request_ms"]["p50"]
    through_front_ms = result["hop_baseline"]["through_front_ms"]["p50"]
    written = result.get("writes_per_booking", {})
    from_code = result["checkpoints_from_code"]
    w_code = from_code["booking_checkpoints"] + from_code["payment_checkpoints"]
    # what the database holds wins: it is what the run did
    w = int(written.get("checkpoints") or w_code)
    # every step but the last stores its task's writes before its checkpoint (durability="sync")
    b = int(written.get("write_batches") or w_code - 2)
    k, hops, requests = len(HOPS), SERVICE_HOPS, CLIENT_REQUESTS
    parts: dict[str, Any] = {
        "K_requests": k,
        "S_service_hops": hops,
        "C_client_requests": requests,
        "W_checkpoint_writes": w,
        "W_from_code": w_code,
        "B_task_write_batches": b,
        "hop_p50_ms": hop_ms,
        "direct_request_p50_ms": direct_ms,
        "through_front_p50_ms": through_front_ms,
    }
    targets = [
        Target(
            f"throughput, {options.clients} clients",
            f"{loaded['bookings_per_s']:.1f} bookings/s",
            f"≥ {TARGET_BOOKINGS_PER_S:g}",
            loaded["bookings_per_s"] >= TARGET_BOOKINGS_PER_S,
        )
    ]
    if "checkpoint_baseline" in result:
        aput_ms = result["checkpoint_baseline"]["aput_ms"]["p50"]
        writes_ms = result["checkpoint_baseline"]["aput_writes_ms"]["p50"]
        checkpoints_ms = w * aput_ms + b * writes_ms
        unavoidable = unavoidable_ms(
            hop_ms=hop_ms, direct_ms=direct_ms, aput_ms=aput_ms, writes_ms=writes_ms, checkpoints=w, write_batches=b
        )
        bound = TARGET_LATENCY_FACTOR * unavoidable
        # how earlier versions priced it: every request as the client's request through the front (two legs)
        two_legs = k * through_front_ms + checkpoints_ms
        p50 = unloaded["latency_ms"]["p50"]
        parts.update(
            aput_p50_ms=aput_ms,
            aput_writes_p50_ms=writes_ms,
            unavoidable_ms=unavoidable,
            latency_bound_ms=bound,
            unavoidable_two_legs_per_hop_ms=two_legs,
            unloaded_p50_over_two_legs_per_hop=p50 / two_legs,
        )
        targets.append(
            Target(
                "p50 latency to confirmed, 1 client (unloaded)",
                f"{p50:.1f} ms ({p50 / unavoidable:.2f}× parts)",
                f"≤ {bound:.1f} ms (2 × {hops}·{hop_ms:.2f} + {requests}·{direct_ms:.2f} + {w}·{aput_ms:.2f} + "
                f"{b}·{writes_ms:.2f})",
                p50 <= bound,
            )
        )
        # Reported, not judged: the bound prices one booking's own path. With N closed-loop clients the p50 is
        # about N / throughput whatever the stack does (Little's law), so under 16 clients this bound would need
        # 16 / bound bookings/s: well over a hundred, less CPU per booking on two cores than its hops alone.
        p50_loaded = loaded["latency_ms"]["p50"]
        queueing_ms = 1000 * options.clients / loaded["bookings_per_s"] if loaded["bookings_per_s"] else float("nan")
        targets.append(
            Target(
                f"p50 latency to confirmed, {options.clients} clients",
                f"{p50_loaded:.1f} ms ({p50_loaded / unavoidable:.2f}× parts)",
                f"reported: {options.clients} clients / throughput = {queueing_ms:.0f} ms (Little's law)",
                None,
            )
        )
    rss = result.get("rss_kib", {})
    for service in rss.get("end", {}):
        peak_mb = max(sample[service] for sample in rss.values()) / 1024
        targets.append(
            Target(f"RSS {service}", f"{peak_mb:.0f} MB peak", f"< {TARGET_RSS_MB:g} MB", peak_mb < TARGET_RSS_MB)
        )
    first, last = (f"at_{mark}" for mark in RSS_MARKS)
    for service in rss.get("end", {}):
        if first in rss and last in rss:
            before, after = rss[first][service] / 1024, rss[last][service] / 1024
            growth = after - before
            targets.append(
                Target(
                    f"RSS {service}, #{RSS_MARKS[0]:,} → #{RSS_MARKS[1]:,}",
                    f"{before:.0f} → {after:.0f} MB ({growth:+.1f})",
                    f"≤ +{RSS_GROWTH_TOLERANCE:.0%}",
                    growth <= RSS_GROWTH_TOLERANCE * before,
                )
            )
        else:
            targets.append(Target(f"RSS {service}, #{RSS_MARKS[0]:,} → #{RSS_MARKS[1]:,}", "not reached", "flat", None))
    return targets, parts


def report(options: Options, result: dict[str, Any], targets: list[Target], parts: dict[str, Any]) -> None:
    hop, loaded, unloaded = result["hop_baseline"], result["loaded"], result["unloaded"]
    print(f"\n# booking throughput: {options.clients} clients, {platform.node()} ({os.cpu_count()} CPUs)\n")
    print(
        f"load average {result['loadavg_start']} at start, {result['loadavg_end']} at end; a 10M-iteration Python"
        f" loop took {result['python_loop_s']:.2f} s"
        " (the machine is shared: numbers are noisy when it is busy)\n"
    )
    print(
        "| phase | confirmed | bookings/s | p50 ms | p95 ms | p99 ms | max ms | GETs/booking "
        "| final→client p50 ms | errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for label, s in ((f"{options.clients} clients", loaded), ("1 client", unloaded)):
        lat = s["latency_ms"]
        print(
            f"| {label} | {s['confirmed']} | {s['bookings_per_s']:.1f} | {lat['p50']:.1f} | {lat['p95']:.1f} "
            f"| {lat['p99']:.1f} | {lat['max']:.1f} | {s['mean_polls_per_booking']:.2f} "
            f"| {s['notice_delay_ms']['p50']:.1f} | {s['errors'] or '-'} |"
        )
    print("\n| baseline (same run) | p50 ms | p95 ms | server CPU ms |")
    print("|---|---:|---:|---:|")
    print(
        f"| bare FastAPI→FastAPI hop, timed in the calling app (prices a service's call) | {hop['hop_ms']['p50']:.2f} "
        f"| {hop['hop_ms']['p95']:.2f} | |"
    )
    print(
        f"| client → FastAPI request (prices the client's own requests) | {hop['direct_request_ms']['p50']:.2f} "
        f"| {hop['direct_request_ms']['p95']:.2f} | {hop['direct_server_cpu_ms']:.2f} |"
    )
    print(
        f"| client → FastAPI → FastAPI, both legs (for comparison) | {hop['through_front_ms']['p50']:.2f} "
        f"| {hop['through_front_ms']['p95']:.2f} | {hop['through_front_server_cpu_ms']:.2f} |"
    )
    if "checkpoint_baseline" in result:
        cp = result["checkpoint_baseline"]
        print(
            f"| checkpoint write (`aput`), booking-sized ({cp['channels']} channels, {cp['serialized_bytes']} B) "
            f"| {cp['aput_ms']['p50']:.2f} | {cp['aput_ms']['p95']:.2f} | "
            f"{cp['client_cpu_ms_per_pair']:.2f} (client, both writes) |"
        )
        print(
            f"| task writes (`aput_writes`), a node's result ({', '.join(cp['write_channels'])}) "
            f"| {cp['aput_writes_ms']['p50']:.2f} | {cp['aput_writes_ms']['p95']:.2f} | |"
        )
    if result.get("rounds"):
        print("\n| unloaded round | hop p50 ms | client request p50 ms | aput p50 ms | booking p50 ms |")
        print("|---:|---:|---:|---:|---:|")
        for i, r in enumerate(result["rounds"], 1):
            print(
                f"| {i} | {r['hop_p50_ms']:.2f} | {r['direct_p50_ms']:.2f} | {r['aput_p50_ms']:.2f} "
                f"| {r['booking_p50_ms']:.1f} |"
            )
    print(f"\n| CPU ms per booking | {options.clients} clients | 1 client |")
    print("|---|---:|---:|")
    for name, ms in loaded["cpu_ms_per_booking"].items():
        alone = unloaded["cpu_ms_per_booking"][name]
        if name == "machine busy fraction":
            print(f"| {name} | {ms:.0%} | {alone:.0%} |")
        else:
            print(f"| {name} | {ms:.1f} | {alone:.1f} |")
    machine_ms = loaded["cpu_ms_per_booking"]["whole machine"]
    print(
        f"\n{os.cpu_count()} CPUs / {machine_ms:.1f} CPU ms per booking (whole machine, other users included) → "
        f"at most {(os.cpu_count() or 1) * 1000 / machine_ms:.1f} bookings/s at this cost"
    )
    print(
        f"\nK = {parts['K_requests']} HTTP requests per booking: S = {parts['S_service_hops']} service hops, "
        f"C = {parts['C_client_requests']} client requests"
    )
    for kind, hop_name in HOPS:
        print(f"  - {hop_name}  ({kind})")
    written = result.get("writes_per_booking")
    code = result["checkpoints_from_code"]
    print(
        f"W = {parts['W_checkpoint_writes']} checkpoint writes per booking; from the code: booking "
        f"{CHECKPOINTS_BEFORE_FIRST_NODE} + {len(code['booking_path'])} ({' → '.join(code['booking_path'])}) = "
        f"{code['booking_checkpoints']}, payment {CHECKPOINTS_BEFORE_FIRST_NODE} + {len(code['payment_path'])} "
        f"({' → '.join(code['payment_path'])}) = {code['payment_checkpoints']}"
    )
    if written and written.get("bookings_checked"):
        print(
            f"  database, {written['bookings_checked']} bookings: {written['booking_checkpoints']} booking + "
            f"{written['payment_checkpoints']} payment checkpoints (all alike: {written['all_alike']}), and "
            f"B = {written['write_batches']} task-write batches"
        )
    if "unavoidable_ms" in parts:
        bound = parts["latency_bound_ms"]
        print(
            f"unavoidable parts = {parts['S_service_hops']} × {parts['hop_p50_ms']:.2f} (hops) + "
            f"{parts['C_client_requests']} × {parts['direct_request_p50_ms']:.2f} (client requests) + "
            f"{parts['W_checkpoint_writes']} × {parts['aput_p50_ms']:.2f} (checkpoints) + "
            f"{parts['B_task_write_batches']} × {parts['aput_writes_p50_ms']:.2f} (task writes) = "
            f"{parts['unavoidable_ms']:.1f} ms; bound = 2 × that = {bound:.1f} ms"
        )
        print(
            f"priced as earlier versions did, every request as client → app → app (two legs, "
            f"{parts['through_front_p50_ms']:.2f} ms): {parts['unavoidable_two_legs_per_hop_ms']:.1f} ms; the 1-client "
            f"p50 is {parts['unloaded_p50_over_two_legs_per_hop']:.2f}× that"
        )
        # Little's law for a closed loop: clients = throughput × latency, whatever the stack does.
        print(
            f"with {options.clients} closed-loop clients, p50 ≈ {options.clients} / throughput: a p50 of "
            f"{bound:.0f} ms needs ≈ {options.clients * 1000 / bound:.0f} bookings/s"
        )
    print("\n| target | measured | target | result |")
    print("|---|---|---|---|")
    for t in targets:
        verdict = "n/a" if t.ok is None else ("PASS" if t.ok else "FAIL")
        print(f"| {t.name} | {t.measured} | {t.target} | {verdict} |")


def _json_safe(value: Any) -> Any:
    """NaN (a phase with no samples) as null: strict JSON readers refuse NaN."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def target_stack(options: Options) -> Iterator[tuple[str, str | None, dict[str, int]]]:
    """(booking-agent URL, checkpointer database URL or None, service pids): given, or a stack started here."""
    if options.url:
        yield options.url.rstrip("/"), options.database_url, {}
        return
    log("starting the stack: " + ", ".join(CORE))
    with service_stack(redis_url=options.redis_url, admin_database_url=options.admin_database_url) as stack:
        services = stack.services.values()
        try:
            yield stack.url("booking-agent"), stack.env["DATABASE_URL"], {p.name: p.pid for p in services}
        except BaseException:
            log("the run failed; the services' logs end with:\n" + "\n".join(p.log_tail() for p in services))
            raise
        finally:
            log("stopping the stack, dropping its database and Redis keys")


def new_event_loop() -> asyncio.AbstractEventLoop:
    # the load generator shares two cores with the stack: the cheaper its loop, the less it distorts the numbers
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.booking_throughput", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--url", help="booking-agent of a running stack (default: start one)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    parser.add_argument("--bookings", type=int, help="run until this many are confirmed instead (e.g. 5000)")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of unmeasured load first (default 3)")
    parser.add_argument("--unloaded", type=int, default=40, help="bookings by one client alone (default 40)")
    parser.add_argument("--hop-samples", type=int, default=1000)
    parser.add_argument("--checkpoint-samples", type=int, default=300)
    parser.add_argument(
        "--rounds", type=int, default=5, help="the unloaded bookings and the baselines alternate in this many rounds"
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument(
        "--database-url", help="with --url: the stack's checkpointer database (for the aput baseline and W)"
    )
    parser.add_argument("--seed", type=int, default=20240917)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or (args.bookings is not None and args.bookings < 1):
        parser.error("--clients, --duration and --bookings must be positive")
    if args.rounds < 1 or min(args.unloaded, args.hop_samples) < args.rounds:
        parser.error("--rounds must be at least 1, and --unloaded and --hop-samples at least --rounds")
    if args.checkpoint_samples < args.rounds:
        parser.error("--checkpoint-samples must be at least --rounds")
    return Options(
        url=args.url,
        clients=args.clients,
        duration_s=args.duration,
        bookings=args.bookings,
        warmup_s=args.warmup,
        unloaded=args.unloaded,
        hop_samples=args.hop_samples,
        checkpoint_samples=args.checkpoint_samples,
        rounds=args.rounds,
        redis_url=args.redis_url,
        admin_database_url=args.admin_database_url,
        database_url=args.database_url,
        seed=args.seed,
        output=args.output,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    with target_stack(options) as (booking_url, database_url, pids), asyncio.Runner(loop_factory=new_event_loop) as r:
        result = r.run(measure(options, booking_url, database_url, pids))
    targets, parts = evaluate(options, result)
    report(options, result, targets, parts)
    summary = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        **result,
        "parts": parts,
        "hops": [{"kind": kind, "request": name} for kind, name in HOPS],
        "targets": [asdict(t) for t in targets],
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(_json_safe(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(f"\nwrote {options.output}")
    return 0 if all(t.ok is not False for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
