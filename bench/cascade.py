"""The thesis, measured: a slow or dead dependency under load, with the resilience layers on and off, one stack.

Run: ``python -m bench.cascade [--short] [--scenarios search-slow,search-hung,hotel-failing,payment-slow]``.

One stack (the five services, ``bench._stack.service_stack``). First the capacity: closed-loop clients, more each
step, until goodput stops growing; the offered load is then the fewest clients reaching 90% of the best goodput.
Then, for each scenario and each arm (layers on, layers off: ``infra.service.vitals.layers_switched_off``, the same
processes), a calm phase, the fault for ``--fault-s``, the fault cleared, a recovery phase; between arms the bench
waits until no run is in flight. Clients are patient up to ``PATIENCE_FACTOR`` × the booking budget, then give up
on the booking (the run goes on server-side) and start another, as people do.

Sampled every second: bookings started / confirmed / failed (by the second they became final) and their time to
final; the unaffected work's latency, probed all along (``GET /bookings/{id}`` of a confirmed booking,
``GET /bookings``, ``/health/ready``, the journal's SSE stream of a confirmed booking to its end, a cancel of a
confirmed booking until its refund made it ``cancelled``); every service's ``/health`` vitals (loop lag, RSS, Redis
connections, slots held, calls and runs in flight) and the breakers of ``/health/circuits``.

Prints the table, writes ``bench/results/cascade.json`` and one PNG per scenario (``docs/cascade-<scenario>.png``).
Why each figure and what the arms differ by: ``docs/cascade.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._stack import machine, percentiles, service_stack, write_results
from bench.booking_throughput import BookingFactory, new_event_loop
from infra.dependencies import DEPENDENCIES
from infra.redis import create_sync_redis
from infra.service.vitals import layers_switched_off
from tests.stack import CORE, Stack

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cascade.json"
DOCS = ROOT / "docs"

BUDGET_S = 8.0
"""``BOOKING_BUDGET_S`` of the bench's stack: short, so a phase holds many budgets."""
STEPS = 4
"""The saga's outbound calls (search, reserve, charge, confirm): a search's share of the budget is BUDGET_S/STEPS."""
SLOW_FACTOR = 10
RECOVERY_TIMEOUT_S = 5.0
"""Every breaker's open period in the bench (``CONCIERGE_CIRCUITS``): the next probe comes at most this late."""
OPEN_FOR = {"recovery_timeout": RECOVERY_TIMEOUT_S, "initial_recovery_timeout": RECOVERY_TIMEOUT_S}
"""The first open period as long as the rest (the defaults start at 1-2 s and double): every streak of open seconds
is long enough to show what a booking meeting an open breaker holds, however late in the fault it opened."""
PATIENCE_FACTOR = 1.5
PROBE_EVERY_S = 0.25
CANCEL_EVERY_S = 1.0
SERVICES = ("search-agent", "booking-agent", "payment-agent", "hotel-api", "payment-api")
BREAKERS = (
    ("booking-agent", "search_agent"),
    ("search-agent", "hotel_api"),
    ("booking-agent", "hotel_api"),
    ("payment-agent", "payment_api"),
    ("booking-agent", "payment_api"),
)
READY_TIMEOUT_S = 120.0
SERVED = (*CORE, "recovery-worker")
"""The recovery worker too: a run that failed on its way (an open breaker at the charge) is resumed, as deployed."""
RECOVERED_WINDOW_S = 4
VERIFY_TIMEOUT_S = 300.0
PROBES = ("booking", "list", "ready", "journal", "refund")


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    service: str
    fault: dict[str, Any]
    dependency: str
    """The outbound policy the fault hits first (its breaker, its share)."""


SEARCH_FAILURES_TO_OPEN = 5


def scenarios() -> dict[str, Scenario]:
    slow_s = SLOW_FACTOR * BUDGET_S / STEPS
    return {
        s.name: s
        for s in (
            Scenario(
                "search-slow",
                f"search-agent slow ({slow_s:g} s a search)",
                "search-agent",
                {"latency_s": slow_s},
                "search_agent",
            ),
            Scenario(
                "search-hung", "search-agent hung (never answers)", "search-agent", {"hang": True}, "search_agent"
            ),
            Scenario("hotel-failing", "hotel-api failing 50%", "hotel-api", {"error_rate": 0.5}, "hotel_api"),
            Scenario(
                "payment-slow",
                f"payment-api slow ({slow_s:g} s a call)",
                "payment-api",
                {"latency_s": slow_s},
                "payment_api",
            ),
        )
    }


@dataclass
class Second:
    """What happened in one second of a phase (``t`` from the phase's start)."""

    started: int = 0
    refused: int = 0
    confirmed: int = 0
    failed: int = 0
    abandoned: int = 0
    time_to_final: list[float] = field(default_factory=list)
    failed_codes: Counter[str] = field(default_factory=Counter)
    failed_s: list[tuple[str, float]] = field(default_factory=list)
    """(error code, time to final) of each booking that failed."""
    probes: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    vitals: dict[str, dict[str, Any]] = field(default_factory=dict)
    breakers: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "refused": self.refused,
            "confirmed": self.confirmed,
            "failed": self.failed,
            "abandoned": self.abandoned,
            "time_to_final_p50_s": statistics.median(self.time_to_final) if self.time_to_final else None,
            "time_to_final_max_s": max(self.time_to_final, default=None),
            "failed_codes": dict(self.failed_codes),
            "failed_s": self.failed_s,
            "probes_ms": {k: [round(v * 1000, 2) for v in vs] for k, vs in self.probes.items()},
            "vitals": self.vitals,
            "breakers": self.breakers,
        }


class Timeline:
    def __init__(self, length_s: int) -> None:
        self.t0 = time.monotonic()
        self.seconds = [Second() for _ in range(length_s + 1)]

    def now(self) -> Second:
        return self.seconds[min(len(self.seconds) - 1, int(time.monotonic() - self.t0))]


@dataclass
class Pool:
    """Confirmed bookings the probes read and cancel (filled by the clients; the calm phases refill it)."""

    confirmed: list[str] = field(default_factory=list)
    cancellable: list[str] = field(default_factory=list)


async def booking_client(
    http: httpx.AsyncClient,
    timeline: Timeline,
    stop: asyncio.Event,
    factory: BookingFactory,
    pool: Pool,
    patience_s: float,
) -> None:
    while not stop.is_set():
        started = time.monotonic()
        try:
            response = await http.post("/bookings", json=factory())
        except httpx.HTTPError:
            await asyncio.sleep(0.1)
            continue
        if response.status_code != 202:
            timeline.now().refused += 1
            await asyncio.sleep(min(1.0, float(response.headers.get("Retry-After", "0.2") or 0.2)))
            continue
        timeline.now().started += 1
        booking_id = response.json()["booking_id"]
        while True:
            left = started + patience_s - time.monotonic()
            if left <= 0:
                timeline.now().abandoned += 1
                break
            try:
                got = await http.get(f"/bookings/{booking_id}", params={"wait": min(left, 5.0)})
                booking = got.json()
            except (httpx.HTTPError, ValueError):
                await asyncio.sleep(0.1)
                continue
            if booking.get("status") in ("confirmed", "failed"):
                second = timeline.now()
                took = time.monotonic() - started
                second.time_to_final.append(took)
                if booking["status"] == "confirmed":
                    second.confirmed += 1
                    pool.confirmed.append(booking_id)
                    pool.cancellable.append(booking_id)
                else:
                    code = str((booking.get("error") or {}).get("code"))
                    second.failed += 1
                    second.failed_codes[code] += 1
                    second.failed_s.append((code, took))
                break


async def timed(second_of: Callable[[], Second], kind: str, call: Callable[[], Any]) -> None:
    started = time.monotonic()
    try:
        await call()
    except Exception:
        second_of().probes[f"{kind}_error"].append(time.monotonic() - started)
        return
    second_of().probes[kind].append(time.monotonic() - started)


async def prober(http: httpx.AsyncClient, timeline: Timeline, stop: asyncio.Event, pool: Pool) -> None:
    """The unaffected work, a few times a second, each kind concurrently so one slow kind delays no other."""
    last_cancel = 0.0

    async def get_booking() -> None:
        (await http.get(f"/bookings/{pool.confirmed[-1]}")).raise_for_status()

    async def list_bookings() -> None:
        (await http.get("/bookings", params={"limit": 20})).raise_for_status()

    async def ready() -> None:
        (await http.get("/health/ready")).raise_for_status()

    async def journal() -> None:
        target = pool.confirmed[len(pool.confirmed) // 2]
        async with http.stream(
            "GET", f"/bookings/{target}/events", headers={"Accept": "text/event-stream"}
        ) as response:
            response.raise_for_status()
            async for _ in response.aiter_bytes():
                pass

    async def refund(booking_id: str) -> None:
        (await http.post(f"/bookings/{booking_id}/cancel")).raise_for_status()
        while True:
            got = (await http.get(f"/bookings/{booking_id}", params={"wait": 5})).json()
            if got["status"] in ("cancelled", "confirmed", "failed") and got.get("cancel_requested_at"):
                if got["status"] == "cancelled":
                    return
                raise RuntimeError(f"cancel ended {got['status']}")

    tasks: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        if pool.confirmed:
            for kind, call in (
                ("booking", get_booking),
                ("list", list_bookings),
                ("ready", ready),
                ("journal", journal),
            ):
                task = asyncio.create_task(timed(timeline.now, kind, call))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if pool.cancellable and time.monotonic() - last_cancel >= CANCEL_EVERY_S:
                last_cancel = time.monotonic()
                target = pool.cancellable.pop()
                task = asyncio.create_task(timed(timeline.now, "refund", functools.partial(refund, target)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        await asyncio.sleep(PROBE_EVERY_S)
    if tasks:
        await asyncio.wait(tasks, timeout=15)


async def sampler(stack: Stack, http: httpx.AsyncClient, timeline: Timeline, stop: asyncio.Event) -> None:
    while not stop.is_set():
        second = timeline.now()

        async def one(service: str, second: Second = second) -> None:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                body = (await http.get(f"{stack.url(service)}/health", timeout=2)).json()
                second.vitals[service] = body["vitals"]

        async def circuits(service: str) -> dict[str, Any]:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                return dict((await http.get(f"{stack.url(service)}/health/circuits", timeout=2)).json())
            return {}

        got = await asyncio.gather(
            *(one(s) for s in SERVICES), *(circuits(s) for s in ("booking-agent", "search-agent", "payment-agent"))
        )
        by_service = dict(zip(("booking-agent", "search-agent", "payment-agent"), got[len(SERVICES) :], strict=True))
        for service, name in BREAKERS:
            state = (by_service.get(service) or {}).get(name, {}).get("state")
            if state:
                second.breakers[f"{service}/{name}"] = str(state)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - timeline.t0) % 1.0))


def set_fault(stack: Stack, service: str, fault: dict[str, Any] | None) -> None:
    put = stack.admin("PUT", service, "faults", json=fault) if fault else None
    (put or stack.admin("DELETE", service, "faults")).raise_for_status()


async def wait_drained(stack: Stack, http: httpx.AsyncClient, within_s: float) -> float:
    """Until no run is in flight in booking-agent (the last arm's leftovers): the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            vitals = (await http.get(f"{stack.url('booking-agent')}/health")).json()["vitals"]
            if vitals["runs_in_flight"] == 0:
                break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def load_phase(
    stack: Stack,
    clients: int,
    seconds: float,
    factory: BookingFactory,
    pool: Pool,
    during: Callable[[float], Any] | None = None,
    probes: bool = True,
) -> Timeline:
    """``clients`` closed-loop clients for ``seconds``; ``during(t)`` is called every 0.2 s (fault on / off)."""
    timeline = Timeline(math.ceil(seconds + PATIENCE_FACTOR * BUDGET_S) + 16)
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=clients + 40, max_keepalive_connections=clients + 40)
    async with (
        httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=30, limits=limits) as http,
        httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=30) as probe_http,
        httpx.AsyncClient(timeout=5) as health_http,
    ):
        tasks = [
            asyncio.create_task(booking_client(http, timeline, stop, factory, pool, PATIENCE_FACTOR * BUDGET_S))
            for _ in range(clients)
        ]
        helpers = [asyncio.create_task(sampler(stack, health_http, timeline, stop))]
        if probes:
            helpers.append(asyncio.create_task(prober(probe_http, timeline, stop, pool)))
        while (t := time.monotonic() - timeline.t0) < seconds:
            if during is not None:
                await asyncio.to_thread(during, t)
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait(tasks + helpers, timeout=PATIENCE_FACTOR * BUDGET_S + 15)
        for task in tasks + helpers:
            task.cancel()
    return timeline


async def measure_capacity(
    stack: Stack, factory: BookingFactory, pool: Pool, steps: Sequence[int], seconds: float
) -> dict[str, Any]:
    rows = []
    for clients in steps:
        timeline = await load_phase(stack, clients, seconds, factory, pool, probes=False)
        body = timeline.seconds[1 : int(seconds)]  # the first second is a ramp
        goodput = sum(s.confirmed for s in body) / max(1, len(body))
        rows.append({"clients": clients, "goodput_per_s": goodput})
        print(f"[cascade] capacity: {clients} clients → {goodput:.1f} confirmed/s", file=sys.stderr, flush=True)
    best = max(r["goodput_per_s"] for r in rows)
    chosen = next(r for r in rows if r["goodput_per_s"] >= 0.9 * best)
    return {"steps": rows, "capacity_per_s": best, "clients": chosen["clients"]}


def p99(values: Sequence[float]) -> float | None:
    return percentiles(values)["p99"] if values else None


def summarize(timeline: Timeline, calm_s: int, fault_s: int, after_s: int, dependency: str) -> dict[str, Any]:
    """The arm's figures: calm vs fault windows, recovery, containment (the clients' wind-down left out)."""
    secs = timeline.seconds
    calm = secs[2:calm_s]
    fault = secs[calm_s : calm_s + fault_s]
    after = secs[calm_s + fault_s : calm_s + fault_s + after_s]
    calm_goodput = sum(s.confirmed for s in calm) / max(1, len(calm))
    fault_goodput = sum(s.confirmed for s in fault) / max(1, len(fault))
    recovered_at = None
    for i in range(len(after) - RECOVERED_WINDOW_S + 1):
        window = after[i : i + RECOVERED_WINDOW_S]
        if sum(s.confirmed for s in window) / RECOVERED_WINDOW_S >= 0.9 * calm_goodput:
            recovered_at = i
            break

    def probe_p99(window: Sequence[Second], kind: str) -> float | None:
        value = p99([v for s in window for v in s.probes.get(kind, [])])
        return None if value is None else value * 1000

    def vital_max(window: Sequence[Second], service: str, pick: Callable[[dict[str, Any]], float]) -> float:
        return max((pick(s.vitals[service]) for s in window if service in s.vitals), default=0.0)

    probes = {}
    for kind in PROBES:
        c, f = probe_p99(calm, kind), probe_p99(fault, kind)
        probes[kind] = {
            "calm_p99_ms": c,
            "fault_p99_ms": f,
            "ratio": (f / c) if c and f else None,
            "errors_during_fault": sum(len(s.probes.get(f"{kind}_error", [])) for s in fault),
        }
    vitals = {}
    for service in SERVICES:

        def rss(v: dict[str, Any]) -> float:
            return float(v["rss_kib"])

        def conns(v: dict[str, Any]) -> float:
            return float(v["redis_connections"]["open"])

        def held(v: dict[str, Any]) -> float:
            return float(sum(v["bulkheads_held"].values()))

        def lag(v: dict[str, Any]) -> float:
            return float(v["loop_lag_max_ms"])

        def calls(v: dict[str, Any]) -> float:
            return float(sum(v["calls_in_flight"].values()))

        def runs(v: dict[str, Any]) -> float:
            return float(v["runs_in_flight"] or 0)

        calm_rss, fault_rss = vital_max(calm, service, rss), vital_max(fault, service, rss)
        calm_conns, fault_conns = vital_max(calm, service, conns), vital_max(fault, service, conns)
        vitals[service] = {
            "rss_growth": fault_rss / calm_rss - 1 if calm_rss else None,
            "redis_connections_calm": calm_conns,
            "redis_connections_fault": fault_conns,
            "redis_connections_growth": fault_conns / calm_conns - 1 if calm_conns else None,
            "slots_held_max_calm": vital_max(calm, service, held),
            "slots_held_max_fault": vital_max(fault, service, held),
            "calls_in_flight_max_fault": vital_max(fault, service, calls),
            "runs_in_flight_max_fault": vital_max(fault, service, runs),
            "loop_lag_max_ms_calm": vital_max(calm, service, lag),
            "loop_lag_max_ms_fault": vital_max(fault, service, lag),
        }
    # what a booking meeting an open breaker holds: booking-agent's calls and outbound slots in the open seconds
    open_secs = [s for s in fault if "open" in s.breakers.values()]
    # calls admitted before the breaker opened may run on for one share; after that, whatever is in flight was
    # taken by a booking that met the open breaker (its half-open probes aside)
    settle = math.ceil((DEPENDENCIES[dependency].share or 1.0) * BUDGET_S) + 1

    settled: list[Second] = []
    open_since: int | None = None
    for i, second in enumerate(fault):
        if not second.breakers:
            continue  # not sampled that second (a busy machine): the streak goes on
        if "open" in second.breakers.values() and "half_open" not in second.breakers.values():
            open_since = i if open_since is None else open_since
            if i - open_since >= settle:
                settled.append(second)
        else:
            open_since = None
    held_while_open = max(
        (sum(s.vitals["booking-agent"]["calls_in_flight"].values()) for s in settled if "booking-agent" in s.vitals),
        default=None,
    )
    # a booking that met the open breaker: failed while one was open (CircuitOpenError answers provider_unavailable)
    fast = [took for s in fault + after if "open" in s.breakers.values() for _, took in s.failed_s]
    all_final = [v for s in fault for v in s.time_to_final]
    return {
        "calm_goodput_per_s": calm_goodput,
        "fault_goodput_per_s": fault_goodput,
        "recovery_s": recovered_at,
        "started_fault": sum(s.started for s in fault),
        "refused_fault": sum(s.refused for s in fault),
        "failed_fault": sum(s.failed for s in fault),
        "abandoned_fault": sum(s.abandoned for s in fault + after),
        "failed_codes_fault": dict(sum((s.failed_codes for s in fault), Counter())),
        "time_to_final_p99_fault_s": p99(all_final),
        "sat_a_whole_budget": sum(1 for v in all_final if v >= BUDGET_S * 0.95),
        "fast_fail_count": len(fast),
        "fast_fail_p99_ms": None if not fast else percentiles(fast, scale=1000)["p99"],
        "open_seconds": len(open_secs),
        "open_settled_seconds": len(settled),
        "calls_held_while_open_max": held_while_open,
        "probes": probes,
        "vitals": vitals,
    }


def verify(stack: Stack) -> dict[str, Any]:
    """``concierge verify --json`` against the bench's stack: every booking against both ledgers."""
    env = {**os.environ, **stack.env}
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "stack.cli",
                "verify",
                "--json",
                "--hotel-api",
                stack.url("hotel-api"),
                "--payment-api",
                stack.url("payment-api"),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=VERIFY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:  # a busy machine: say so, the run's figures stand
        return {"exit": None, "error": f"verify did not finish within {VERIFY_TIMEOUT_S:g} s"}
    try:
        body = json.loads(run.stdout)
    except ValueError:
        return {"exit": run.returncode, "error": (run.stderr or run.stdout)[-500:]}
    return {"exit": run.returncode, **(body if isinstance(body, dict) else {"body": body})}


async def run_arm(
    stack: Stack,
    scenario: Scenario,
    layers: bool,
    clients: int,
    phases: tuple[int, int, int],
    factory: BookingFactory,
    pool: Pool,
) -> dict[str, Any]:
    calm_s, fault_s, after_s = phases
    total = calm_s + fault_s + after_s
    fault_state = {"on": False}

    def during(t: float) -> None:
        want = calm_s <= t < calm_s + fault_s
        if want != fault_state["on"]:
            set_fault(stack, scenario.service, scenario.fault if want else None)
            fault_state["on"] = want

    with contextlib.closing(create_sync_redis(stack.env["REDIS_URL"])) as redis:
        switch = None if layers else layers_switched_off(redis, ttl_s=total + 120, prefix=stack.prefix)
        try:
            if switch is not None:
                await asyncio.sleep(1.0)  # every service reads the switch twice a second
            timeline = await load_phase(stack, clients, total, factory, pool, during=during)
        finally:
            set_fault(stack, scenario.service, None)
            if switch is not None:
                switch.restore()
    drained = await wait_drained_async(stack)
    figures = summarize(timeline, calm_s, fault_s, after_s, scenario.dependency)
    figures["drain_s"] = drained
    return {
        "layers": "on" if layers else "off",
        "figures": figures,
        "seconds": [s.summary() for s in timeline.seconds[:total]],
    }


async def wait_drained_async(stack: Stack) -> float:
    async with httpx.AsyncClient(timeout=5) as http:
        return await wait_drained(stack, http, within_s=180)


def plot(scenario: Scenario, arms: Sequence[dict[str, Any]], phases: tuple[int, int, int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calm_s, fault_s, _ = phases
    rows = 4
    fig, axes = plt.subplots(rows, len(arms), figsize=(6 * len(arms), 9), sharex=True, squeeze=False)
    colors = {"closed": "#d8f0d8", "half_open": "#fff0b3", "open": "#f7c6c6"}
    for col, arm in enumerate(arms):
        secs = arm["seconds"]
        t = list(range(len(secs)))
        ax = axes[0][col]
        ax.set_title(f"layers {arm['layers']}: {scenario.title}", fontsize=10)
        ax.plot(t, [s["confirmed"] for s in secs], label="confirmed/s", color="tab:green")
        ax.plot(t, [s["failed"] for s in secs], label="failed/s", color="tab:red")
        ax.plot(t, [s["abandoned"] + s["refused"] for s in secs], label="given up + refused/s", color="tab:gray")
        ax.set_ylabel("bookings / s")
        ax.legend(fontsize=7, loc="upper right")
        ax = axes[1][col]
        for kind in PROBES:
            ax.plot(t, [max(s["probes_ms"].get(kind, []), default=float("nan")) for s in secs], label=kind)
        ax.set_yscale("log")
        ax.set_ylabel("unaffected work, max ms")
        ax.legend(fontsize=7, loc="upper right", ncol=2)
        ax = axes[2][col]
        for service in ("booking-agent", "search-agent", "payment-agent"):
            ax.plot(
                t,
                [sum(s["vitals"].get(service, {}).get("bulkheads_held", {}).values()) for s in secs],
                label=f"{service} slots held",
            )
        ax.plot(
            t,
            [s["vitals"].get("booking-agent", {}).get("runs_in_flight") or 0 for s in secs],
            label="booking runs in flight",
            linestyle="--",
        )
        ax.plot(
            t,
            [s["vitals"].get("booking-agent", {}).get("redis_connections", {}).get("open", 0) for s in secs],
            label="booking-agent Redis conns",
            linestyle=":",
        )
        ax.set_ylabel("held")
        ax.legend(fontsize=7, loc="upper right")
        ax = axes[3][col]
        names = sorted({k for s in secs for k in s["breakers"]})
        for row, name in enumerate(names):
            for i, s in enumerate(secs):
                state = s["breakers"].get(name)
                if state:
                    ax.barh(row, 1, left=i, color=colors.get(state, "white"), edgecolor="none")
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("seconds (fault shaded; green closed · yellow half-open · red open)")
        for r in range(rows):
            axes[r][col].axvspan(calm_s, calm_s + fault_s, color="tab:orange", alpha=0.12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def fmt(value: Any, spec: str = ".1f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def report(result: dict[str, Any]) -> None:
    load = result["load"]
    print(
        f"\n# cascade: {load['clients']} closed-loop clients (capacity {load['capacity_per_s']:.1f} confirmed/s), "
        f"phases {result['phases']} s, budget {BUDGET_S:g} s, breakers open {RECOVERY_TIMEOUT_S:g} s, "
        f"loadavg {result['machine']['loadavg']}\n"
    )
    print(
        "| scenario | layers | goodput calm → fault /s | back after clear | unaffected p99 fault/calm (worst) | "
        "RSS / Redis conns growth (worst) | slots held max calm → fault | fast fails p99 | sat whole budget | "
        "given up | verify |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, entry in result["scenarios"].items():
        for arm in entry["arms"]:
            f = arm["figures"]
            ratios = [(k, p["ratio"]) for k, p in f["probes"].items() if p["ratio"] is not None]
            worst = max(ratios, key=lambda kv: kv[1], default=(None, None))
            rss = max((v["rss_growth"] or 0 for v in f["vitals"].values()), default=0)
            conns = max((v["redis_connections_growth"] or 0 for v in f["vitals"].values()), default=0)
            held_calm = max(v["slots_held_max_calm"] for v in f["vitals"].values())
            held_fault = max(v["slots_held_max_fault"] for v in f["vitals"].values())
            print(
                f"| {name} | {arm['layers']} | {f['calm_goodput_per_s']:.1f} → {f['fault_goodput_per_s']:.1f} | "
                f"{fmt(f['recovery_s'], 'd', ' s') if f['recovery_s'] is not None else 'not within the run'} | "
                f"{fmt(worst[1], '.2f', '×')} ({worst[0] or '–'}) | {rss:+.0%} / {conns:+.0%} | "
                f"{held_calm:.0f} → {held_fault:.0f} | "
                f"{f['vitals']['booking-agent']['calls_in_flight_max_fault']:.0f} | "
                f"{fmt(f['fast_fail_p99_ms'], '.0f', ' ms')} "
                f"({f['fast_fail_count']}) | {f['sat_a_whole_budget']} | {f['abandoned_fault']} | "
                f"{entry.get('verify', {}).get('exit', '–')} |"
            )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.cascade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default=",".join(scenarios()), help="comma-separated (default: all four)")
    parser.add_argument("--short", action="store_true", help="short phases and capacity steps (a smoke run)")
    parser.add_argument("--calm-s", type=int, default=20)
    parser.add_argument("--fault-s", type=int, default=40)
    parser.add_argument("--after-s", type=int, default=30)
    parser.add_argument("--clients", type=int, default=None, help="skip the capacity search: this many clients")
    parser.add_argument("--arms", default="on,off", help="which arms: on,off (default both; the test runs on)")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--plots", type=Path, default=DOCS, help="where the PNGs go (default: docs/)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = sorted(set(args.scenarios) - set(scenarios()))
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: unknown {unknown}; choose from {sorted(scenarios())}")
    args.arms = [a for a in args.arms.split(",") if a]
    if not args.arms or set(args.arms) - {"on", "off"}:
        parser.error("--arms: on, off or on,off")
    if args.short:
        args.calm_s, args.fault_s, args.after_s = min(args.calm_s, 10), min(args.fault_s, 15), min(args.after_s, 14)
    if min(args.calm_s, args.fault_s, args.after_s) < 4:
        parser.error("--calm-s, --fault-s and --after-s must be at least 4")
    return args


STACK_ENV = {
    "BOOKING_BUDGET_S": f"{BUDGET_S:g}",
    # a fixed door at the default cap: the adaptive one probes its floor and, on a CPU-bound machine, settles low
    # enough after a fault that its refusals, not the layers, would set the goodput (bench/overload.py measures it)
    "BOOKING_MAX_IN_FLIGHT": "40",
    # the story: search-agent's breaker opens after 5 failures (its default is 10, for a 60 s budget)
    "CONCIERGE_CIRCUITS": json.dumps(
        {
            "search_agent": {**OPEN_FOR, "failure_threshold": SEARCH_FAILURES_TO_OPEN},
            "hotel_api": OPEN_FOR,
            "payment_api": OPEN_FOR,
        }
    ),
    "CONCIERGE_LOG_LEVEL": "WARNING",
}


async def run(args: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    factory = BookingFactory(args.seed)
    pool = Pool()
    steps = (2, 4, 8) if args.short else (2, 4, 8, 12, 16)
    if args.clients is None:
        load = await measure_capacity(stack, factory, pool, steps, 5.0 if args.short else 8.0)
    else:
        load = {"steps": [], "capacity_per_s": float("nan"), "clients": args.clients}
        await load_phase(stack, args.clients, 5.0, factory, pool, probes=False)  # warm-up, fills the pool
    phases = (args.calm_s, args.fault_s, args.after_s)
    result: dict[str, Any] = {
        "machine": machine(),
        "load": load,
        "phases": phases,
        "budget_s": BUDGET_S,
        "recovery_timeout_s": RECOVERY_TIMEOUT_S,
        "scenarios": {},
    }
    for name in args.scenarios:
        scenario = scenarios()[name]
        arms = []
        for layers in (arm == "on" for arm in args.arms):
            print(f"[cascade] {name}, layers {'on' if layers else 'off'}", file=sys.stderr, flush=True)
            arms.append(await run_arm(stack, scenario, layers, load["clients"], phases, factory, pool))
        entry = {"title": scenario.title, "fault": scenario.fault, "arms": arms, "verify": verify(stack)}
        result["scenarios"][name] = entry
        plot(scenario, arms, phases, args.plots / f"cascade-{name}.png")
        write_results(args.output, result)  # after each scenario: a run cut short keeps what it measured
    result["machine"]["loadavg_end"] = os.getloadavg()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loop = new_event_loop()
    try:
        with service_stack(redis_url=args.redis_url, env=STACK_ENV, services=()) as stack:
            for service in SERVED:  # started together, each given room for a busy machine's imports
                stack.serve(service, wait=False)
            for service in SERVED:
                stack.services[service].wait_ready(timeout=READY_TIMEOUT_S)
            result = loop.run_until_complete(run(args, stack))
    finally:
        loop.close()
    report(result)
    write_results(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
