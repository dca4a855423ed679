"""``concierge demo cascade [--layers off]``: watch a slow search-agent not take the others down (or, layers off, do).

With the stack up: closed-loop clients book all along; after a calm phase search-agent turns slow (every search
takes 10× its share of a booking's budget, ``infra.dependencies``); after ``--fault-s`` the fault is cleared and
the demo waits for the breaker to close and goodput to come back. Meanwhile it narrates what each layer does, read
live from booking-agent's ``/health`` (vitals), ``/health/circuits`` and ``/metrics``: each timed-out attempt the
breaker counts, the breaker opening, the searches in flight freed, the retries stopped, the probe in half-open, closed
again, with a line of figures every two seconds. ``--layers off`` switches the layers off in every service for the
demo (``infra.service.vitals.layers_switched_off``: a Redis key with a TTL) and shows that world instead; the
layers are back on when it ends, Ctrl-C included, and the fault cleared. See docs/cascade.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import httpx

from infra.dependencies import DEPENDENCIES
from infra.redis import create_sync_redis
from infra.service.vitals import layers_switched_off
from infra.settings import get_settings
from resilience import default_budget
from stack.book import booking_agent_urls
from stack.console import EXIT_OK, Subparsers, one_line_errors
from stack.errors import StackError, UsageError
from stack.target import admin_token, adopt_stack_redis, provider_url

__all__ = ["register_demo"]

SLOW_FACTOR = 10
CITIES = ("Lisbon", "Porto", "Madrid", "Barcelona", "Paris", "London", "Berlin", "Rome", "Amsterdam", "Vienna")
WATCH_EVERY_S = 0.25
FIGURES_EVERY_S = 2.0
SWITCH_READ_S = 1.0
"""Every service reads the layer switch twice a second: after this long, all of them have read a change."""
BREAKER = "search_agent"


def register_demo(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("demo", help="watch a scenario happen on the running stack (cascade)")
    parser.add_argument("scenario", choices=["cascade"], help="cascade: search-agent slow under load")
    parser.add_argument("--layers", choices=["on", "off"], default="on", help="off: the world without them")
    parser.add_argument("--clients", default="8", metavar="N", help="closed-loop booking clients (default 8)")
    parser.add_argument("--calm-s", default="6", metavar="S", help="seconds of calm first (default 6)")
    parser.add_argument("--fault-s", default="45", metavar="S", help="seconds search-agent stays slow (default 45)")
    parser.add_argument("--recover-s", default="40", metavar="S", help="at most this long after (default 40)")
    parser.add_argument(
        "--back-at", default="0.9", metavar="F", help="goodput is back at this fraction of the calm's (default 0.9)"
    )
    parser.add_argument("--url", default=None, help="booking-agent URL (default: the running stack's)")
    parser.add_argument("--search-url", default=None, help="search-agent URL (default: the running stack's)")
    parser.set_defaults(handler=_demo)


def _number(value: str, option: str, low: float, high: float) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{option} must be a number, got {value!r}") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise UsageError(f"{option} must be between {low:g} and {high:g}, got {value}")
    return number


@dataclass
class Figures:
    """What the clients saw, kept for the last few seconds."""

    confirmed: deque[float] = field(default_factory=deque)
    failed: deque[tuple[float, float]] = field(default_factory=deque)
    """(when, time to final)"""
    reads: deque[tuple[float, float]] = field(default_factory=deque)
    """(when, GET /bookings/{id} latency): the unaffected work."""
    confirmed_ids: list[str] = field(default_factory=list)
    refused: deque[float] = field(default_factory=deque)
    """When the door answered 429: a client then waits half a second before it asks again."""

    def refused_rate(self, window: float = FIGURES_EVERY_S) -> float:
        now = time.monotonic()
        while self.refused and self.refused[0] < now - 10:
            self.refused.popleft()
        return sum(1 for t in self.refused if t >= now - window) / window

    def rate(self, window: float = FIGURES_EVERY_S) -> tuple[float, float]:
        now = time.monotonic()
        for queue in (self.confirmed, self.failed, self.reads):
            while queue and (queue[0] if isinstance(queue[0], float) else queue[0][0]) < now - 10:
                queue.popleft()
        ok = sum(1 for t in self.confirmed if t >= now - window) / window
        bad = sum(1 for t, _ in self.failed if t >= now - window) / window
        return ok, bad

    def recent_failures_ms(self, window: float = FIGURES_EVERY_S) -> float | None:
        now = time.monotonic()
        took = [d for t, d in self.failed if t >= now - window]
        return statistics.median(took) * 1000 if took else None

    def read_p99_ms(self, window: float = FIGURES_EVERY_S * 2) -> float | None:
        now = time.monotonic()
        took = sorted(d for t, d in self.reads if t >= now - window)
        return took[min(len(took) - 1, int(len(took) * 0.99))] * 1000 if took else None


async def _client(http: httpx.AsyncClient, stop: asyncio.Event, figures: Figures, n: int, patience: float) -> None:
    day = 0
    while not stop.is_set():
        day += 1
        checkin = date.today() + timedelta(days=30 + (n * 37 + day) % 300)
        body = {
            "city": CITIES[(n + day) % len(CITIES)],
            "checkin": checkin.isoformat(),
            "checkout": (checkin + timedelta(days=1)).isoformat(),
            "guests": 2,
            "payment_token": "tok_visa",
        }
        started = time.monotonic()
        try:
            response = await http.post("/bookings", json=body)
            if response.status_code != 202:
                if response.status_code == 429:
                    figures.refused.append(time.monotonic())
                await asyncio.sleep(0.5)
                continue
            booking_id = response.json()["booking_id"]
            while not stop.is_set() and time.monotonic() - started < patience:
                got = (await http.get(f"/bookings/{booking_id}", params={"wait": 2})).json()
                if got.get("status") == "confirmed":
                    figures.confirmed.append(time.monotonic())
                    figures.confirmed_ids.append(booking_id)
                    break
                if got.get("status") == "failed":
                    figures.failed.append((time.monotonic(), time.monotonic() - started))
                    break
        except (httpx.HTTPError, ValueError, KeyError):
            await asyncio.sleep(0.5)


async def _reader(http: httpx.AsyncClient, stop: asyncio.Event, figures: Figures) -> None:
    """The unaffected work: reading a confirmed booking, four times a second."""
    while not stop.is_set():
        if figures.confirmed_ids:
            started = time.monotonic()
            with contextlib.suppress(httpx.HTTPError):
                await http.get(f"/bookings/{figures.confirmed_ids[-1]}")
                figures.reads.append((time.monotonic(), time.monotonic() - started))
        await asyncio.sleep(0.25)


def _retries(metrics: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith("concierge_retries_total{") and f'service="{BREAKER}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Narrator:
    """Turns what booking-agent reports into sentences, once per change; a figures line every two seconds."""

    def __init__(self, started: float, layers_on: bool, share_s: float) -> None:
        self.started = started
        self.layers_on = layers_on
        self.share_s = share_s
        self.state: str | None = None
        self.failures: int | None = None
        self.short_circuits = 0
        self.in_flight_peak = 0
        self.retries_at_open: float | None = None
        self.retries = 0.0
        self.freed_told = False
        self.retries_told = False
        self.last_figures = 0.0
        self.opened_at: float | None = None
        self.first_opened_at: float | None = None
        self.closed_again_at: float | None = None
        self.door: dict[str, Any] = {}
        """booking-agent's ``/health/door``: how many bookings it takes at once now."""

    def say(self, text: str) -> None:
        print(f"  +{time.monotonic() - self.started:5.1f} s  {text}", flush=True)

    def watch(self, circuit: dict[str, Any], vitals: dict[str, Any], retries: float, figures: Figures) -> None:
        state = str(circuit.get("state", "?"))
        failures = int(circuit.get("failures", 0))
        in_flight = int(vitals.get("calls_in_flight", {}).get(BREAKER, 0))
        self.in_flight_peak = max(self.in_flight_peak, in_flight)
        self.retries = retries
        if self.failures is not None and failures > self.failures and state == "closed" and self.layers_on:
            self.say(
                f"breaker counted {failures - self.failures} more failure(s) ({circuit.get('consecutive_failures')} "
                f"in a row): searches cut at their {self.share_s:.1f} s share, not the booking's whole budget"
            )
        if self.state is not None and state != self.state:
            self._transition(self.state, state, failures, figures)
        self.state, self.failures = state, failures
        if state == "open" and not self.freed_told and in_flight == 0 and self.in_flight_peak:
            self.freed_told = True
            self.say(f"slots freed: 0 searches in flight (peak {self.in_flight_peak}); nothing waits on search-agent")
        if (
            state == "open"
            and not self.retries_told
            and self.retries_at_open is not None
            and time.monotonic() - (self.opened_at or 0) > 2
        ):
            self.retries_told = True
            self.say(
                f"retries stopped: {retries - self.retries_at_open:.0f} retries of search since it opened; "
                f"{int(circuit.get('short_circuits', 0))} calls refused without being made"
            )
        if time.monotonic() - self.last_figures >= FIGURES_EVERY_S:
            self.last_figures = time.monotonic()
            self.figures(figures, vitals, state, circuit)

    def _transition(self, before: str, after: str, failures: int, figures: Figures) -> None:
        if after == "open" and before == "closed":
            self.opened_at = time.monotonic()
            self.first_opened_at = self.first_opened_at or self.opened_at
            self.retries_at_open = self.retries
            fast = figures.recent_failures_ms(1.0)
            self.say(
                f"breaker OPEN after {failures} failures: bookings now fail at once"
                + (f" (~{fast:.0f} ms)" if fast is not None else "")
                + ", holding no slot, no connection, no call"
            )
        elif after == "half_open":
            self.say("breaker HALF-OPEN: one probe search let through to see whether search-agent is back")
        elif after == "open" and before == "half_open":
            self.say("probe failed: breaker open again, search-agent still left alone")
            self.opened_at = time.monotonic()
            self.retries_at_open = self.retries
            self.retries_told = True
        elif after == "closed":
            self.closed_again_at = time.monotonic()
            self.say("breaker CLOSED again: the probe succeeded, searches flow")

    def figures(self, figures: Figures, vitals: dict[str, Any], state: str, circuit: dict[str, Any]) -> None:
        ok, bad = figures.rate()
        read = figures.read_p99_ms()
        conns = vitals.get("redis_connections", {}).get("open", "?")
        self.say(
            f"· confirmed {ok:4.1f}/s · failed {bad:4.1f}/s · searches in flight "
            f"{vitals.get('calls_in_flight', {}).get(BREAKER, 0):>3} · runs in flight "
            f"{vitals.get('runs_in_flight', '?'):>3} · door {self.door.get('limit', '?'):>2} (refused "
            f"{figures.refused_rate():4.1f}/s) · Redis conns {conns} · GET /bookings/{{id}} p99 "
            + (f"{read:.0f} ms" if read is not None else "–")
            + (f" · breaker {state} ({circuit.get('consecutive_failures', 0)} in a row)" if self.layers_on else "")
        )


async def _get(http: httpx.AsyncClient, url: str) -> Any:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        response = await http.get(url, timeout=2)
        return response.json() if "json" in response.headers.get("content-type", "") else response.text
    return None


async def _run(args: argparse.Namespace, booking_url: str, search_url: str, token: str | None) -> None:
    settings = get_settings()
    layers_on = args.layers == "on"
    budget = settings.booking_budget_s
    share = (DEPENDENCIES[BREAKER].share or 1.0) * budget
    latency = SLOW_FACTOR * share
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    narrator = Narrator(started, layers_on, share)
    stop = asyncio.Event()
    figures = Figures()
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with (
        # the operator's demo: its bookings are the operator's (no person's quota)
        httpx.AsyncClient(base_url=booking_url, timeout=30, limits=limits, headers=headers) as http,
        httpx.AsyncClient(timeout=5, headers=headers) as admin,
    ):
        circuits = await _get(admin, f"{booking_url}/health/circuits")
        if not isinstance(circuits, dict):
            raise StackError(f"booking-agent at {booking_url} does not answer: stack not running? (`concierge up`)")
        fault_url = f"{search_url}/admin/faults"
        probe = await admin.get(fault_url)
        if probe.status_code != 200:
            raise StackError(f"search-agent at {search_url} refused its /admin/faults: HTTP {probe.status_code}")
        world = "on" if layers_on else "OFF (no breaker, no slot, no budget share; naive retries, 30 s timeouts)"
        print(
            f"demo cascade · layers {world} · {args.clients} clients booking on {booking_url}\n"
            f"  search-agent will take {latency:g} s a search: 10× its {share:g} s share of a booking's {budget:g} s "
            f"budget (without the layers a call waits up to {default_budget():g} s)",
            flush=True,
        )
        patience = budget * 1.5
        tasks = [asyncio.create_task(_client(http, stop, figures, n, patience)) for n in range(args.clients)]
        tasks.append(asyncio.create_task(_reader(http, stop, figures)))
        phase_end = started + args.calm_s
        calm_rate = 0.0
        fault_on = False
        cleared_at: float | None = None
        back_at: float | None = None
        try:
            while True:
                now = time.monotonic()
                if not fault_on and cleared_at is None and now >= phase_end:
                    calm_rate = figures.rate(min(args.calm_s, 4))[0]
                    (await admin.put(fault_url, json={"latency_s": latency})).raise_for_status()
                    fault_on = True
                    phase_end = now + args.fault_s
                    narrator.say(f"search-agent is slow now ({latency:g} s a search); calm was {calm_rate:.1f}/s")
                elif fault_on and now >= phase_end:
                    (await admin.delete(fault_url)).raise_for_status()
                    fault_on = False
                    cleared_at = now
                    phase_end = now + args.recover_s
                    narrator.say("fault cleared: search-agent answers in milliseconds again")
                elif cleared_at is not None:
                    ok, _ = figures.rate()
                    if (
                        back_at is None
                        and ok >= args.back_at * calm_rate
                        and (narrator.state == "closed" or not layers_on)
                    ):
                        back_at = now
                        narrator.say(f"goodput back: {ok:.1f}/s, {now - cleared_at:.1f} s after the fault cleared")
                    if (back_at is not None and now - back_at > 3) or now >= phase_end:
                        break
                circuit, vitals, metrics, door = await asyncio.gather(
                    _get(admin, f"{booking_url}/health/circuits"),
                    _get(admin, f"{booking_url}/health"),
                    _get(admin, f"{booking_url}/metrics"),
                    _get(admin, f"{booking_url}/health/door"),
                )
                narrator.door = door if isinstance(door, dict) else {}
                narrator.watch(
                    (circuit or {}).get(BREAKER, {}) if isinstance(circuit, dict) else {},
                    (vitals or {}).get("vitals", {}) if isinstance(vitals, dict) else {},
                    _retries(metrics) if isinstance(metrics, str) else narrator.retries,
                    figures,
                )
                await asyncio.sleep(WATCH_EVERY_S)
        finally:
            stop.set()
            with contextlib.suppress(httpx.HTTPError):
                await admin.delete(fault_url)
            await asyncio.wait(tasks, timeout=3)
            for task in tasks:
                task.cancel()
    if cleared_at is None:
        return
    if back_at is None:
        print(
            f"  goodput not back to {args.back_at * calm_rate:.1f}/s within {args.recover_s:g} s of the fault clearing"
        )
        if figures.refused_rate(FIGURES_EVERY_S * 5) > 0:
            print(
                f"  booking-agent's door refused some bookings (its limit {narrator.door.get('limit', '?')} now): an "
                "adaptive door shrinks when runs slow down with more of them in flight (docs/overload.md)"
            )
    print(
        f"  searches in flight peaked at {narrator.in_flight_peak}"
        + (
            f"; breaker first opened {narrator.first_opened_at - started:.1f} s in"
            if narrator.first_opened_at is not None and layers_on
            else ""
        ),
        flush=True,
    )


@one_line_errors("demo")
def _demo(args: argparse.Namespace) -> int:
    args.clients = int(_number(args.clients, "--clients", 1, 200))
    args.calm_s = _number(args.calm_s, "--calm-s", 2, 600)
    args.fault_s = _number(args.fault_s, "--fault-s", 2, 600)
    args.recover_s = _number(args.recover_s, "--recover-s", 2, 600)
    args.back_at = _number(args.back_at, "--back-at", 0.1, 1.0)
    adopt_stack_redis()
    booking_url = booking_agent_urls(args.url)[0]
    search_url, _ = provider_url("search-agent", args.search_url)
    token = admin_token(bool(args.search_url))
    switch = None
    if args.layers == "off":
        redis = create_sync_redis(get_settings().redis_url)
        total = args.calm_s + args.fault_s + args.recover_s + 60
        try:
            switch = layers_switched_off(redis, ttl_s=total)
        except Exception as exc:
            redis.close()
            raise StackError(
                f"cannot reach the stack's Redis to switch the layers off ({type(exc).__name__})"
            ) from None
        print(
            f"layers switched off in every service (back on when the demo ends, or by themselves after {total:g} s)",
            flush=True,
        )
        time.sleep(SWITCH_READ_S)
    try:
        asyncio.run(_run(args, booking_url, search_url, token))
    finally:
        if switch is not None:
            try:
                switch.restore()
                time.sleep(SWITCH_READ_S)  # once this prints, every service has read the switch back on
                print("layers back on", flush=True)
            finally:
                redis.close()
    return EXIT_OK
