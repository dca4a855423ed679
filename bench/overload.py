"""Goodput under overload: booking-agent's adaptive door against fixed ``BOOKING_MAX_IN_FLIGHT`` limits, one stack.

Run: ``python -m bench.overload`` (starts the five services itself, as ``bench.booking_throughput`` does; all removed
at the end). ``--loads 0.5,1,2,4,8 --limits 2,4,8,16,32 --phase-s 8`` are the defaults.

In one run, on one stack (hotel-api, payment-api, search-agent, payment-agent), with one booking-agent replica per
door (the adaptive one, each fixed limit, and a wide ``BOOKING_MAX_IN_FLIGHT=40``), all started at once and warmed
up (``--warmup`` bookings each):

1. **Capacity**: ``--capacity-clients`` closed-loop clients through the wide door, which 16 clients never fill,
   until ``--capacity-bookings`` are confirmed: confirmed bookings/s over the window's last two thirds is C.
2. **Unloaded p99**: ``--unloaded`` bookings one at a time, each from its POST to reading it final.
3. For each offered load, lowest first, each door in turn (their order rotated from one load to the next): an
   **open loop** of Poisson arrivals at load × C for ``--phase-s`` against that door's replica. Each arrival POSTs
   once (a refused client gives up: retries would only add load) and long-polls an accepted booking until it is
   final. The adaptive door keeps what it learned from one load to the next, as it would in service.

Per phase: goodput (bookings sent in the phase and confirmed, per second), the accepted bookings' p50/p99 from POST
to confirmed, what was refused and how (429 with ``Retry-After``, anything else, 5xx), and the adaptive door's
limit (``GET /health/door``, sampled every 0.5 s). Targets: at 4× and 8×, goodput ≥ 90% of the same door's 1×
goodput and p99 ≤ 2× the unloaded p99, every refusal a 429 with ``Retry-After`` and no 5xx; the adaptive door's
goodput (mean of 4× and 8×) within 10% of the best fixed limit's. Prints a markdown table, writes
``bench/results/overload.json`` and the plot (``--plot``, default ``docs/overload.png``). Exit status 1 when a
target fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._stack import cpu_seconds, machine, percentiles, service_stack, write_results
from bench.booking_throughput import BookingFactory, LoadResult, StopRule, new_event_loop, run_load
from tests.procs import free_port
from tests.stack import CORE, TEST_DATABASE_URL, Stack

RESULTS = Path(__file__).resolve().parent / "results" / "overload.json"
PLOT = Path(__file__).resolve().parent.parent / "docs" / "overload.png"

WIDE_DOOR = 40
"""The capacity and the unloaded latency are measured behind the default cap: 16 clients never reach it."""
GOODPUT_KEEP = 0.90
P99_FACTOR = 2.0
ADAPTIVE_WITHIN = 0.10
OVERLOADS = (4.0, 8.0)
START_TIMEOUT_S = 180.0
LONG_POLL_S = 20.0
MAX_WAIT_S = 90.0
"""BOOKING_BUDGET_S (60 s) plus slack: an accepted booking not final by then is counted lost."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Arrival:
    sent: float
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None
    final: str | None = None
    latency_s: float | None = None
    """From sending the POST to reading the booking final (accepted bookings only)."""


@dataclass
class Phase:
    door: str
    load: float
    rate_per_s: float
    seconds: float
    arrivals: list[Arrival] = field(default_factory=list)
    limits: list[int] = field(default_factory=list)
    client_cpu_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        statuses = Counter(a.status for a in self.arrivals if a.status is not None)
        refused = [a for a in self.arrivals if a.status is not None and a.status != 202]
        confirmed = [a.latency_s for a in self.arrivals if a.final == "confirmed" and a.latency_s is not None]
        shed = [a for a in refused if a.status == 429]
        return {
            "door": self.door,
            "load": self.load,
            "offered_per_s": len(self.arrivals) / self.seconds,
            "goodput_per_s": len(confirmed) / self.seconds,
            "accepted": statuses.get(202, 0),
            "confirmed": len(confirmed),
            "failed": sum(1 for a in self.arrivals if a.final == "failed"),
            "lost": sum(1 for a in self.arrivals if a.status == 202 and a.final is None),
            "refused": len(refused),
            "refused_429_retry_after": sum(1 for a in shed if a.retry_after),
            "refused_other": {str(s): n for s, n in statuses.items() if s not in (202, 429)},
            "server_errors": sum(n for s, n in statuses.items() if s >= 500),
            "transport_errors": dict(Counter(a.error for a in self.arrivals if a.error)),
            "latency_ms": percentiles(confirmed, scale=1000),
            "door_limit": {
                "min": min(self.limits, default=None),
                "mean": sum(self.limits) / len(self.limits) if self.limits else None,
                "max": max(self.limits, default=None),
            },
            "client_cpu_share": self.client_cpu_s / self.seconds,
        }


async def follow(http: httpx.AsyncClient, booking_id: str, give_up: float) -> str | None:
    """Long-poll until final: its status, or None if it never was within ``MAX_WAIT_S``."""
    while time.perf_counter() < give_up:
        response = await http.get(f"/bookings/{booking_id}", params={"wait": LONG_POLL_S})
        if response.status_code == 200 and response.json()["status"] in {"confirmed", "failed"}:
            return str(response.json()["status"])
    return None


async def arrive(http: httpx.AsyncClient, body: dict[str, Any], arrival: Arrival) -> None:
    try:
        response = await http.post("/bookings", json=body)
        arrival.status = response.status_code
        arrival.retry_after = response.headers.get("Retry-After")
        if response.status_code == 202:
            arrival.final = await follow(http, response.json()["booking_id"], arrival.sent + MAX_WAIT_S)
            if arrival.final is not None:
                arrival.latency_s = time.perf_counter() - arrival.sent
    except httpx.HTTPError as exc:
        arrival.error = type(exc).__name__


async def sample_door(http: httpx.AsyncClient, phase: Phase, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            phase.limits.append(int((await http.get("/health/door")).json()["limit"]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def open_loop(http: httpx.AsyncClient, phase: Phase, new_booking: BookingFactory, rng: random.Random) -> None:
    """Poisson arrivals at ``phase.rate_per_s`` for ``phase.seconds``, each followed to its end (not counted in time)."""
    tasks: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_door(http, phase, stop))
    cpu = cpu_seconds(os.getpid())
    start = time.perf_counter()
    at = start
    try:
        while True:
            at += rng.expovariate(phase.rate_per_s)
            if at - start >= phase.seconds:
                break
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            arrival = Arrival(sent=time.perf_counter())
            phase.arrivals.append(arrival)
            tasks.append(asyncio.create_task(arrive(http, new_booking(), arrival)))
        await asyncio.sleep(max(0.0, start + phase.seconds - time.perf_counter()))
        phase.client_cpu_s = cpu_seconds(os.getpid()) - cpu
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, sampler, return_exceptions=True)


def steady_rate(load: LoadResult) -> float:
    """Confirmed bookings/s over the window's last two thirds: in its first moments no closed-loop client has
    finished a booking yet, which would count the start-up against the capacity."""
    settled = load.started + load.window_s / 3
    done = [c for c in load.in_window() if c.status == "confirmed" and c.finished >= settled]
    return len(done) / (load.window_end - settled)


async def unloaded_latencies(http: httpx.AsyncClient, count: int, new_booking: BookingFactory) -> list[float]:
    latencies = []
    for _ in range(count):
        arrival = Arrival(sent=time.perf_counter())
        await arrive(http, new_booking(), arrival)
        if arrival.final == "confirmed" and arrival.latency_s is not None:
            latencies.append(arrival.latency_s)
    return latencies


def client(url: str) -> httpx.AsyncClient:
    # one pool for every arrival: accepted bookings hold a long-poll each, refused ones a connection for a moment
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=256)
    return httpx.AsyncClient(base_url=url, timeout=LONG_POLL_S + 30, limits=limits)


def start_doors(stack: Stack, doors: Sequence[str]) -> dict[str, str]:
    """One booking-agent replica per door, all at once, on the one stack: door → URL.

    Replicas of booking-agent are the supported deployment (any replica answers any booking), so each door's is a
    real one; the idle ones cost a heartbeat. Phases then switch between doors in seconds, not a restart each,
    and each load level's doors are measured minutes apart at most, on a machine whose load drifts.
    """
    stack.services["booking-agent"].terminate()  # the stack's own, started with whatever the shell said
    procs = {
        door: stack.procs.serve(
            "booking-agent",
            port=free_port(),
            env={} if door == "adaptive" else {"BOOKING_MAX_IN_FLIGHT": door},
            wait=False,
        )
        for door in doors
    }
    # a shared two-core machine under load can take a minute to import and start one service
    return {door: proc.wait_ready(START_TIMEOUT_S).url for door, proc in procs.items()}


@dataclass(frozen=True)
class Options:
    loads: tuple[float, ...]
    limits: tuple[int, ...]
    phase_s: float
    capacity_bookings: int
    capacity_clients: int
    unloaded: int
    warmup: int
    seed: int
    redis_url: str
    admin_database_url: str
    output: Path
    plot: Path | None


async def measure(options: Options, stack: Stack) -> dict[str, Any]:
    rng = random.Random(options.seed)
    new_booking = BookingFactory(options.seed)
    doors = ["adaptive", *map(str, options.limits)]
    log(f"starting booking-agent with each door: {', '.join(doors)}, and {WIDE_DOOR} for the capacity")
    urls = start_doors(stack, [*doors, str(WIDE_DOOR)] if str(WIDE_DOOR) not in doors else doors)
    for url in urls.values():
        async with client(url) as http:
            await run_load(http, clients=4, stop=StopRule(confirmed=options.warmup), new_booking=new_booking)
    async with client(urls[str(WIDE_DOOR)]) as http:
        # counted in bookings, not seconds: on a busy machine one booking under 16 clients can outlast a short window
        log(f"capacity: {options.capacity_clients} closed-loop clients until {options.capacity_bookings} confirmed")
        stop = StopRule(confirmed=options.capacity_bookings)
        load = await run_load(http, clients=options.capacity_clients, stop=stop, new_booking=new_booking)
        capacity = steady_rate(load)
        log(f"capacity {capacity:.1f} bookings/s; unloaded: {options.unloaded} bookings one at a time")
        unloaded = await unloaded_latencies(http, options.unloaded, new_booking)
    if capacity <= 0 or not unloaded:
        raise SystemExit(f"no capacity measured ({capacity:.1f}/s, {len(unloaded)} unloaded bookings): {load.errors}")
    phases: list[dict[str, Any]] = []
    for level, multiple in enumerate(options.loads):
        # each level's doors back to back, their order rotated from one level to the next so that no door is
        # always the one measured after the machine's neighbours woke up; the adaptive door keeps what it
        # learned from one level to the next, as it would in service
        for door in doors[level % len(doors) :] + doors[: level % len(doors)]:
            async with client(urls[door]) as http:
                phase = Phase(door, multiple, multiple * capacity, options.phase_s)
                await open_loop(http, phase, new_booking, rng)
            summary = phase.summary()
            phases.append(summary)
            log(
                f"door {door:>8} at {multiple:g}x: goodput {summary['goodput_per_s']:.1f}/s, p99 "
                f"{summary['latency_ms']['p99']:.0f} ms, refused {summary['refused']}, limit "
                f"{summary['door_limit']['mean']}"
            )
            await asyncio.sleep(1.0)  # the last runs give their slots back before the next phase starts
    phases.sort(key=lambda p: (doors.index(p["door"]), p["load"]))
    return {
        "capacity_per_s": capacity,
        "capacity_run": load.summary(),
        "unloaded_ms": percentiles(unloaded, scale=1000),
        "phases": phases,
    }


@dataclass
class Target:
    name: str
    ok: bool
    detail: str


def evaluate(options: Options, result: dict[str, Any]) -> tuple[list[Target], dict[str, Any]]:
    unloaded_p99 = result["unloaded_ms"]["p99"]
    by_door: dict[str, dict[float, dict[str, Any]]] = {}
    for phase in result["phases"]:
        by_door.setdefault(phase["door"], {})[phase["load"]] = phase
    targets: list[Target] = []
    overload_goodput: dict[str, float] = {}
    for door, loads in by_door.items():
        base = loads.get(1.0)
        over = [loads[m] for m in OVERLOADS if m in loads]
        if over:
            overload_goodput[door] = sum(p["goodput_per_s"] for p in over) / len(over)
        for phase in over:
            m = phase["load"]
            if base is not None:
                keep = phase["goodput_per_s"] / base["goodput_per_s"] if base["goodput_per_s"] else 0.0
                targets.append(Target(f"{door} {m:g}x goodput >= 90% of 1x", keep >= GOODPUT_KEEP, f"{keep:.0%}"))
            factor = phase["latency_ms"]["p99"] / unloaded_p99
            targets.append(Target(f"{door} {m:g}x p99 <= 2x unloaded", factor <= P99_FACTOR, f"{factor:.2f}x"))
        clean = all(
            p["refused_429_retry_after"] == p["refused"] and not p["server_errors"] and not p["transport_errors"]
            for p in loads.values()
        )
        targets.append(Target(f"{door}: every refusal 429 + Retry-After, no 5xx", clean, ""))
    fixed = {d: g for d, g in overload_goodput.items() if d != "adaptive"}
    best = max(fixed, key=lambda d: fixed[d], default=None)
    if best is not None and "adaptive" in overload_goodput:
        mean = overload_goodput["adaptive"]
        ratio = mean / fixed[best]
        targets.append(
            Target(
                f"adaptive within 10% of the best fixed limit ({best}) at 4x/8x",
                ratio >= 1.0 - ADAPTIVE_WITHIN,
                f"{ratio:.0%} ({mean:.1f} vs {fixed[best]:.1f}/s)",
            )
        )
    return targets, {"overload_goodput_per_s": overload_goodput, "best_fixed": best}


def report(result: dict[str, Any], targets: list[Target]) -> None:
    print(
        f"\ncapacity {result['capacity_per_s']:.1f} bookings/s; unloaded p50/p99 "
        f"{result['unloaded_ms']['p50']:.0f}/{result['unloaded_ms']['p99']:.0f} ms; loadavg "
        f"{result['environment']['loadavg'][0]:.1f}\n"
    )
    print("| door | load | offered/s | goodput/s | p50 ms | p99 ms | p99 ÷ unloaded | refused | 429+RA | 5xx | limit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    unloaded = result["unloaded_ms"]["p99"]
    for p in result["phases"]:
        lat = p["latency_ms"]
        limit = p["door_limit"]
        shown = f"{limit['min']}–{limit['max']}" if limit["min"] != limit["max"] else str(limit["min"])
        print(
            f"| {p['door']} | {p['load']:g}× | {p['offered_per_s']:.1f} | {p['goodput_per_s']:.1f} | "
            f"{lat['p50']:.0f} | {lat['p99']:.0f} | {lat['p99'] / unloaded:.2f} | {p['refused']} | "
            f"{p['refused_429_retry_after']} | {p['server_errors']} | {shown} |"
        )
    print("\n| target | met | figure |\n|---|---|---|")
    for t in targets:
        print(f"| {t.name} | {'yes' if t.ok else '**no**'} | {t.detail} |")


def plot(result: dict[str, Any], path: Path) -> None:
    """Goodput and accepted p99 against offered load, the adaptive door bold, each fixed limit thin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doors: dict[str, list[dict[str, Any]]] = {}
    for phase in result["phases"]:
        doors.setdefault(phase["door"], []).append(phase)
    fig, (good, late) = plt.subplots(1, 2, figsize=(11, 4.2))
    for door, phases in doors.items():
        loads = [p["load"] for p in phases]
        style: dict[str, Any] = {"marker": ".", "alpha": 0.8}
        if door == "adaptive":
            style = {"linewidth": 2.8, "color": "black", "marker": "o"}
        label = door if door == "adaptive" else f"fixed {door}"
        good.plot(loads, [p["goodput_per_s"] for p in phases], label=label, **style)
        late.plot(loads, [p["latency_ms"]["p99"] for p in phases], label=label, **style)
    good.axhline(result["capacity_per_s"], color="grey", linestyle=":", label="capacity (closed loop)")
    late.axhline(result["unloaded_ms"]["p99"], color="grey", linestyle=":", label="unloaded p99")
    late.axhline(P99_FACTOR * result["unloaded_ms"]["p99"], color="red", linestyle="--", label="target: 2× unloaded")
    multiples = sorted({p["load"] for p in result["phases"]})
    for axis, title in ((good, "goodput (confirmed bookings/s)"), (late, "accepted bookings' p99 (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(multiples, [f"{m:g}×" for m in multiples])
        axis.set_xlabel("offered load (× capacity)")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    late.set_yscale("log")
    late.legend(fontsize=7)
    fig.suptitle(
        f"booking-agent's door under overload (capacity {result['capacity_per_s']:.0f}/s, "
        f"{result['environment']['cpus']} cores, loadavg {result['environment']['loadavg'][0]:.1f})",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split(",") if v)


def _ints(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(",") if v)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("limits are integers >= 1")
    return values


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=_floats, default=(0.5, 1.0, 2.0, 4.0, 8.0), help="multiples of capacity")
    parser.add_argument("--limits", type=_ints, default=(2, 4, 8, 16, 32), help="fixed BOOKING_MAX_IN_FLIGHT swept")
    parser.add_argument("--phase-s", type=float, default=8.0)
    parser.add_argument(
        "--capacity-bookings", type=int, default=60, help="confirmed bookings the capacity is measured on"
    )
    parser.add_argument("--capacity-clients", type=int, default=16)
    parser.add_argument("--unloaded", type=int, default=50, help="bookings one at a time for the unloaded p99")
    parser.add_argument("--warmup", type=int, default=20, help="bookings after each booking-agent start, not counted")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--plot", type=Path, default=PLOT, help="the PNG; '' for none")
    parser.add_argument("--replot", type=Path, help="only draw --plot again from this results file, measure nothing")
    args = parser.parse_args(argv)
    if args.replot is not None:
        plot(json.loads(args.replot.read_text(encoding="utf-8")), args.plot)
        raise SystemExit(0)
    if not args.loads or any(m <= 0 for m in args.loads) or args.phase_s <= 0 or args.capacity_bookings < 3:
        parser.error("--loads and --phase-s must be positive, --capacity-bookings at least 3")
    return Options(
        loads=tuple(sorted(args.loads)),
        limits=args.limits,
        phase_s=args.phase_s,
        capacity_bookings=args.capacity_bookings,
        capacity_clients=args.capacity_clients,
        unloaded=args.unloaded,
        warmup=args.warmup,
        seed=args.seed,
        redis_url=args.redis_url,
        admin_database_url=args.admin_database_url,
        output=args.output,
        plot=args.plot if str(args.plot) not in ("", ".") else None,
    )


@contextlib.contextmanager
def stack_for(options: Options) -> Iterator[Stack]:
    # the door under test is chosen per phase; one inherited from this shell would silently fix the adaptive one
    os.environ.pop("BOOKING_MAX_IN_FLIGHT", None)
    log("starting the stack")
    with service_stack(
        redis_url=options.redis_url, admin_database_url=options.admin_database_url, services=()
    ) as stack:
        try:
            for service in CORE:
                # a shared two-core machine under load can take a minute to import and start one service
                stack.serve(service, wait=False).wait_ready(START_TIMEOUT_S)
            yield stack
        except BaseException:
            log(
                "the run failed; the services' logs end with:\n"
                + "\n".join(p.log_tail() for p in stack.services.values())
            )
            raise


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the stack's cleanup (processes, database, keys), as Ctrl-C does


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        with stack_for(options) as stack, asyncio.Runner(loop_factory=new_event_loop) as runner:
            result = runner.run(measure(options, stack))
    finally:
        signal.signal(signal.SIGTERM, previous)
    result["environment"] = machine()
    targets, parts = evaluate(options, result)
    report(result, targets)
    summary = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        **result,
        **parts,
        "targets": [asdict(t) for t in targets],
    }
    write_results(options.output, summary)
    if options.plot is not None:
        plot(result, options.plot)
    return 0 if all(t.ok for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
