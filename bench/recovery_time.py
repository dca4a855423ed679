"""How long a booking takes to be taken over and finished after its booking-agent dies, presence on against
TTL-only in the same run, plus the cost of liveness and of one orphan-scan pass.

Run: ``python -m bench.recovery_time`` (needs Redis at ``REDIS_URL``, Postgres at ``TEST_DATABASE_URL`` and
``redis-server`` on PATH for the in-process cases). Prints a markdown table and writes
``bench/results/recovery_time.json``; exits 1 if a target is missed.

Stack cases (``bench._stack.service_stack``: the six services as real processes, Postgres checkpoints, providers
slowed down so a booking takes about a second). Each round starts a few bookings, waits a random moment, then
``kill -9``s (or SIGTERMs) booking-agent and restarts it; the recovery worker runs all along. Per booking not final at
the signal: seconds to *taken over* (its run's fence went up: a peer holds it) and to ``confirmed`` (Redis read every
20 ms, so the restarting agent is not in the way).

- **SIGKILL, presence on** (the defaults) and **SIGKILL, TTL-only** (booking-agent and recovery-worker restarted with
  ``PRESENCE_ENABLED=false``: a dead owner is noticed when its ``RUN_LEASE_TTL`` lease runs out, at the
  ``ORPHAN_SCAN_INTERVAL`` scan), one after the other on the same stack.
- **SIGTERM** (presence on): the step in progress is cancelled and the run handed over at once.
- **50 runs killed**: 50 bookings accepted at once by booking-agent, which is killed as soon as the last 202 is in;
  providers fault-free; seconds until every run not final at the kill is taken over, and until all are confirmed.

At the end the providers' ledgers: exactly one confirmed reservation and one captured charge per booking, no room on
hold.

In-process cases, on a private ``redis-server`` (nothing else talks to it, so its counters are ours):

- **liveness commands/s**: one process holding 10 and then 1,000 runs for a few seconds, with presence (one instance
  lease renewal every ``PRESENCE_INTERVAL``) and TTL-only (a renewal per run every ``RUN_LEASE_TTL``/3);
- **one scan pass** with 10,000 runs held across 100 processes (100 named connections): the Redis time of the pass
  (``INFO commandstats``: ``CLIENT LIST``, ``INFO``, the sweep script and the expired-lease query), with nobody
  dead and with one process dead (its 100 runs released and queued).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench._stack import machine, percentiles, service_stack, write_results
from infra.booking_keys import booking_key
from infra.redis import create_sync_redis
from infra.settings import Settings, get_settings
from runs.leases import run_key
from tests.conftest import start_redis_server
from tests.stack import CORE, Stack, stay

RESULTS = Path(__file__).resolve().parent / "results" / "recovery_time.json"
KILL_TAKEOVER_P99_TARGET_S = 1.0
KILL_RATIO_TARGET = 1 / 5
TERM_TAKEOVER_P99_TARGET_S = 0.2
MASS_RESUMED_TARGET_S = 1.5
MASS_CONFIRMED_TARGET_S = 3.0
SCAN_PASS_TARGET_MS = 5.0
FINAL = {"confirmed", "failed"}
ROUND_TIMEOUT_S = 90.0
POLL_S = 0.02
START_S = 120.0
TTL_ONLY = {"PRESENCE_ENABLED": "false"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="SIGKILL rounds per path (default 6)")
    parser.add_argument("--sigterm-rounds", type=int, default=5, help="SIGTERM rounds (default 5)")
    parser.add_argument("--concurrency", type=int, default=3, help="bookings per round (default 3)")
    parser.add_argument("--mass", type=int, default=50, help="runs on the replica killed in the mass case (50)")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="RUN_LEASE_TTL (default 5)")
    parser.add_argument("--scan-interval", type=float, default=1.0, help="ORPHAN_SCAN_INTERVAL (default 1)")
    parser.add_argument("--hotel-latency", type=float, default=0.2, help="hotel-api latency per call (s)")
    parser.add_argument("--payment-latency", type=float, default=0.3, help="payment-api latency per call (s)")
    parser.add_argument("--scan-runs", type=int, default=10_000, help="runs in flight for the scan pass (10,000)")
    parser.add_argument("--scan-processes", type=int, default=100, help="processes holding them (100)")
    parser.add_argument("--liveness-window", type=float, default=3.0, help="seconds each liveness count lasts")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


class Bench:
    def __init__(self, stack: Stack, args: argparse.Namespace) -> None:
        self.stack = stack
        self.args = args
        self.redis = create_sync_redis(stack.env["REDIS_URL"])
        self.rng = random.Random(args.seed)
        self.next_day = 200
        self.booked: list[str] = []
        self.mode_env: dict[str, str] = {}
        self.lock = threading.Lock()

    def status(self, booking_id: str) -> str:
        return str(self.redis.hget(booking_key(booking_id, prefix=self.stack.prefix), "status") or "missing")

    def fence(self, booking_id: str) -> int:
        return int(self.redis.hget(run_key(booking_id, prefix=self.stack.prefix), "fence") or 0)

    def serve(self, service: str) -> None:
        """(Re)start ``service`` with the path under test; a busy machine may take a while to start one."""
        proc = self.stack.procs.serve(service, port=self.stack.ports[service], env=self.mode_env, timeout=START_S)
        self.stack.services[service] = proc

    def use(self, env: dict[str, str]) -> None:
        """Restart booking-agent and the recovery worker with ``env`` (the path under test)."""
        self.mode_env = env
        for service in ("recovery-worker", "booking-agent"):
            self.stack.services[service].kill()
            self.serve(service)

    def book(self, count: int) -> list[str]:
        ids = []
        for _ in range(count):
            with self.lock:
                day = self.next_day
                self.next_day += 1
            checkin, checkout = stay(days_ahead=day)
            ids.append(str(self.stack.book(checkin=checkin, checkout=checkout)["booking_id"]))
        self.booked += ids
        return ids

    def round(self, stop: Callable[[], None], *, in_background: bool) -> list[dict[str, Any]]:
        """Book, wait a random moment, stop booking-agent with ``stop``, time every unfinished booking.

        ``in_background``: ``stop`` blocks while the agent drains (SIGTERM), so it runs in a thread meanwhile.
        """
        ids = self.book(self.args.concurrency)
        time.sleep(self.rng.uniform(0.05, 1.0))
        return self.watch(ids, stop, in_background=in_background)

    def watch(
        self,
        ids: list[str],
        stop: Callable[[], None],
        *,
        in_background: bool,
        at_stop: Callable[[], None] = lambda: None,
    ) -> list[dict[str, Any]]:
        signalled = time.monotonic()
        stopper = threading.Thread(target=stop)
        if in_background:
            stopper.start()
        else:
            stop()  # kill -9 returns once the process is gone: the statuses read next are frozen
        at_stop()
        at_signal = {booking_id: self.status(booking_id) for booking_id in ids}
        pending = {booking_id for booking_id, status in at_signal.items() if status not in FINAL}
        fence_at_signal = {booking_id: self.fence(booking_id) for booking_id in pending}
        finished: dict[str, float] = {}
        taken_over: dict[str, float] = {}
        outcome: dict[str, str] = {}
        deadline = signalled + ROUND_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            pipe = self.redis.pipeline(transaction=False)
            watched = sorted(pending)
            for booking_id in watched:
                pipe.hget(run_key(booking_id, prefix=self.stack.prefix), "fence")
                pipe.hget(booking_key(booking_id, prefix=self.stack.prefix), "status")
            replies = pipe.execute()
            now = time.monotonic() - signalled
            for n, booking_id in enumerate(watched):
                fence, status = int(replies[2 * n] or 0), str(replies[2 * n + 1])
                if booking_id not in taken_over and fence > fence_at_signal[booking_id]:
                    taken_over[booking_id] = now
                if status in FINAL:
                    finished[booking_id] = now
                    outcome[booking_id] = status
                    pending.discard(booking_id)
            time.sleep(POLL_S)
        if in_background:
            stopper.join()
        self.serve("booking-agent")
        return [
            {
                "booking_id": booking_id,
                "status_at_signal": at_signal[booking_id],
                "outcome": outcome.get(booking_id, "timeout"),
                "seconds": finished.get(booking_id),
                "takeover_seconds": taken_over.get(booking_id),
                "fence": self.fence(booking_id),
            }
            for booking_id in ids
            if at_signal[booking_id] not in FINAL
        ]

    def mass_round(self) -> dict[str, Any]:
        """``--mass`` bookings accepted at once by one booking-agent, killed as soon as they are all accepted.

        Providers fault-free throughout: nothing the dead agent started downstream stays in flight for long (a slow
        provider would keep the peers' bulkhead slots busy with the dead agent's calls, which is not recovery).
        """
        self.stack.fault("payment-api")
        self.stack.fault("hotel-api")
        with ThreadPoolExecutor(max_workers=10) as pool:
            batches = list(pool.map(lambda _: self.book(1), range(self.args.mass)))
        ids = [booking_id for batch in batches for booking_id in batch]
        samples = self.watch(ids, self.kill, in_background=False)
        self.stack.fault("hotel-api", latency_s=self.args.hotel_latency)
        self.stack.fault("payment-api", latency_s=self.args.payment_latency)
        takeovers = [s["takeover_seconds"] for s in samples]
        confirmed = [s["seconds"] for s in samples if s["outcome"] == "confirmed"]
        return {
            "runs": len(samples),
            "accepted": len(ids),
            "all_taken_over_s": round(max(takeovers), 3) if takeovers and None not in takeovers else None,
            "all_confirmed_s": round(max(confirmed), 3) if len(confirmed) == len(samples) and samples else None,
            "not_confirmed": len(samples) - len(confirmed),
            "by_status_at_signal": dict(Counter(s["status_at_signal"] for s in samples)),
        }

    def kill(self) -> None:
        self.stack.services["booking-agent"].kill()

    def terminate(self) -> None:
        self.stack.services["booking-agent"].terminate()

    def ledgers(self) -> dict[str, int]:
        ids = set(self.booked)
        reservations = [r for r in self.stack.ledger("hotel-api")["reservations"] if r["reference"] in ids]
        charges = [c for c in self.stack.ledger("payment-api")["charges"] if c["reference"] in ids]
        confirmed = Counter(r["reference"] for r in reservations if r["status"] == "confirmed")
        captured = Counter(c["reference"] for c in charges if c["status"] == "captured")
        statuses = Counter(self.status(booking_id) for booking_id in ids)
        return {
            "bookings": len(ids),
            "confirmed_bookings": statuses["confirmed"],
            "bookings_with_duplicate_reservations": sum(1 for n in confirmed.values() if n > 1),
            "bookings_with_duplicate_charges": sum(1 for n in captured.values() if n > 1),
            "bookings_missing_a_reservation_or_charge": sum(
                1 for booking_id in ids if confirmed[booking_id] != 1 or captured[booking_id] != 1
            ),
            "rooms_left_on_hold": sum(1 for r in reservations if r["status"] == "held"),
        }

    def close(self) -> None:
        self.redis.close()


def _p99(values: list[float]) -> float:
    return percentiles(values)["p99"]


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sorted(s["seconds"] for s in samples if s["seconds"] is not None)
    takeovers = sorted(s["takeover_seconds"] for s in samples if s["takeover_seconds"] is not None)
    if not seconds:
        return {"samples": 0}
    return {
        "samples": len(seconds),
        "timeouts": sum(1 for s in samples if s["seconds"] is None),
        "not_confirmed": sum(1 for s in samples if s["outcome"] != "confirmed"),
        "p50_s": round(statistics.median(seconds), 3),
        "p99_s": round(_p99(seconds), 3),
        "max_s": round(seconds[-1], 3),
        "takeover_p50_s": round(statistics.median(takeovers), 3) if takeovers else None,
        "takeover_p99_s": round(_p99(takeovers), 3) if takeovers else None,
        "by_status_at_signal": dict(Counter(s["status_at_signal"] for s in samples)),
    }


# --------------------------------------------------------------------------------------------------- in process


def _private_settings(url: str, prefix: str) -> None:
    os.environ["REDIS_URL"] = url
    os.environ["CONCIERGE_KEY_PREFIX"] = prefix
    get_settings.cache_clear()


async def _commands_per_s(url: str, runs: int, *, presence: bool, window: float) -> float:
    """Redis commands/s spent keeping ``runs`` runs of one process alive (the private server's counter)."""
    from infra.redis import create_redis
    from runs.leases import RunStore
    from runs.presence import Presence

    _private_settings(url, f"live-{presence}-{runs}")
    client = create_redis(url)
    owner = Presence("bench-owner", url=url) if presence else None
    try:
        if owner is not None:
            await owner.start()
        store = RunStore(client, presence=presence)
        leases = [await store.create(f"run-{n}", "booking", {}, "bench-owner") for n in range(runs)]
        async with contextlib.AsyncExitStack() as stack:
            for lease in leases:
                assert lease is not None and lease.held == presence
                await stack.enter_async_context(lease.keep_alive())
            await asyncio.sleep(1.0)  # past the first renewals
            before = int((await client.info("stats"))["total_commands_processed"])
            await asyncio.sleep(window)
            after = int((await client.info("stats"))["total_commands_processed"])
        return (after - before - 1) / window  # the second INFO counts itself
    finally:
        if owner is not None:
            await owner.stop()
        await client.flushdb()
        await client.aclose()


async def _scan_pass(url: str, runs: int, processes: int) -> dict[str, Any]:
    """Redis time of one scan pass over ``runs`` held runs of ``processes`` processes: all alive, then one dead."""
    from infra.redis import create_redis
    from recovery import DeadLetterQueue, OrphanScanner, QueueConfig, QueueGuard
    from runs.leases import RunStore
    from runs.presence import Presence, PresenceMonitor

    _private_settings(url, "scan")
    client = create_redis(url)
    owners = [Presence(f"proc-{n:03d}", url=url, interval=1.0, ttl=60.0) for n in range(processes)]
    try:
        for owner in owners:
            await owner.start()
        store = RunStore(client)
        per = runs // processes
        # kept: each owner works on its runs, so its presence audit (runs.audit) leaves them held
        leases: list[Any] = []
        for n, owner in enumerate(owners):
            leases += await asyncio.gather(
                *(store.create(f"run-{n}-{m}", "booking", {}, owner.instance) for m in range(per))
            )
        guard = QueueGuard(client, DeadLetterQueue(client, config=QueueConfig(max_size=max(1000, per))))
        scanner = OrphanScanner(client, store, guard, presence=PresenceMonitor(client, grace=0.0, restart_grace=0.0))
        await scanner.scan_once()

        async def one_pass() -> tuple[float, float, int]:
            await client.config_resetstat()
            started = time.perf_counter()
            queued = await scanner.scan_once()
            wall = time.perf_counter() - started
            stats = await client.info("commandstats")
            redis_us = sum(v["usec"] for k, v in stats.items() if k != "cmdstat_config")
            return redis_us / 1000, wall * 1000, len(queued)

        alive = [await one_pass() for _ in range(5)]
        victim = owners.pop()
        if victim._task is not None:
            victim._task.cancel()
        await victim.client.aclose()  # as a kill -9 leaves it: connection gone, nobody deregistered
        await scanner.scan_once()  # sees it missing
        await asyncio.sleep(0.05)
        dead_ms, dead_wall_ms, queued = await one_pass()
        return {
            "runs": per * processes,
            "processes": processes,
            "redis_ms_all_alive_median": round(statistics.median(a[0] for a in alive), 3),
            "wall_ms_all_alive_median": round(statistics.median(a[1] for a in alive), 3),
            "redis_ms_one_dead": round(dead_ms, 3),
            "wall_ms_one_dead": round(dead_wall_ms, 3),
            "queued_when_one_dead": queued,
        }
    finally:
        for owner in owners:
            with contextlib.suppress(Exception):
                await owner.stop()
        await client.flushdb()
        await client.aclose()


def in_process_cases(args: argparse.Namespace) -> dict[str, Any]:
    saved = {name: os.environ.get(name) for name in ("REDIS_URL", "CONCIERGE_KEY_PREFIX")}
    logging.getLogger().setLevel(logging.ERROR)  # the sweep's and the queue's warnings are the point here
    server, url = start_redis_server(workdir=tempfile.mkdtemp(prefix="concierge-bench-redis-"))
    try:
        liveness = {
            f"{mode}_{runs}_runs": round(
                asyncio.run(_commands_per_s(url, runs, presence=mode == "presence", window=args.liveness_window)), 1
            )
            for mode in ("presence", "ttl_only")
            for runs in (10, 1000)
        }
        scan = asyncio.run(_scan_pass(url, args.scan_runs, args.scan_processes))
    finally:
        server.kill()
        server.wait(timeout=10)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()
    return {"liveness_commands_per_s": liveness, "scan_pass": scan}


# --------------------------------------------------------------------------------------------------- main


def main() -> int:
    args = parse_args()
    defaults = Settings()
    env = {
        "RUN_LEASE_TTL": str(args.lease_ttl),
        "ORPHAN_SCAN_INTERVAL": str(args.scan_interval),
        "BOOKING_BUDGET_S": "60",
        "BOOKING_MAX_IN_FLIGHT": str(max(80, args.mass + 10)),
        "CONCIERGE_LOG_LEVEL": "WARNING",
    }
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    started = time.monotonic()
    print("in-process cases (private redis-server)...", file=sys.stderr)
    in_process = in_process_cases(args)
    with service_stack(redis_url=redis_url, env=env, services=()) as stack:
        bench = Bench(stack, args)
        try:
            for service in (*CORE, "recovery-worker"):
                bench.serve(service)
            stack.fault("hotel-api", latency_s=args.hotel_latency)
            stack.fault("payment-api", latency_s=args.payment_latency)
            kills: dict[str, list[dict[str, Any]]] = {"presence": [], "ttl_only": []}
            for mode, mode_env in (("ttl_only", TTL_ONLY), ("presence", {})):
                bench.use(mode_env)
                for n in range(args.rounds):
                    kills[mode] += bench.round(bench.kill, in_background=False)
                    print(f"SIGKILL round {n + 1}/{args.rounds} ({mode})", file=sys.stderr)
            sigterm: list[dict[str, Any]] = []
            for n in range(args.sigterm_rounds):
                sigterm += bench.round(bench.terminate, in_background=True)
                print(f"SIGTERM round {n + 1}/{args.sigterm_rounds}", file=sys.stderr)
            print(f"mass: {args.mass} runs on one killed replica", file=sys.stderr)
            mass = bench.mass_round()
            ledgers = bench.ledgers()
        finally:
            bench.close()

    presence, ttl_only, term = summarise(kills["presence"]), summarise(kills["ttl_only"]), summarise(sigterm)
    inf = float("inf")
    kill_p99 = presence.get("takeover_p99_s") or inf
    ttl_p99 = ttl_only.get("takeover_p99_s") or inf
    liveness = in_process["liveness_commands_per_s"]
    scan = in_process["scan_pass"]
    checks = {
        f"SIGKILL taken over p99 <= {KILL_TAKEOVER_P99_TARGET_S:g} s": kill_p99 <= KILL_TAKEOVER_P99_TARGET_S,
        "SIGKILL taken over p99 <= 1/5 of the TTL-only path": kill_p99 <= ttl_p99 * KILL_RATIO_TARGET,
        f"SIGTERM taken over p99 <= {TERM_TAKEOVER_P99_TARGET_S:g} s": (term.get("takeover_p99_s") or inf)
        <= TERM_TAKEOVER_P99_TARGET_S,
        f"{args.mass} runs killed: all taken over <= {MASS_RESUMED_TARGET_S:g} s": (mass["all_taken_over_s"] or inf)
        <= MASS_RESUMED_TARGET_S,
        f"{args.mass} runs killed: all confirmed <= {MASS_CONFIRMED_TARGET_S:g} s": (mass["all_confirmed_s"] or inf)
        <= MASS_CONFIRMED_TARGET_S,
        "liveness flat: 1,000 runs cost < 2x 10 runs (presence)": liveness["presence_1000_runs"]
        < 2 * max(liveness["presence_10_runs"], 1.0),
        f"one scan pass ({scan['runs']} runs, {scan['processes']} processes) <= {SCAN_PASS_TARGET_MS:g} ms on Redis": (
            scan["redis_ms_all_alive_median"] <= SCAN_PASS_TARGET_MS
        ),
        "every booking confirmed": ledgers["confirmed_bookings"] == ledgers["bookings"],
        "no duplicate reservation or charge": ledgers["bookings_with_duplicate_reservations"] == 0
        and ledgers["bookings_with_duplicate_charges"] == 0,
        "one reservation and one charge per booking": ledgers["bookings_missing_a_reservation_or_charge"] == 0,
        "no room left on hold": ledgers["rooms_left_on_hold"] == 0,
    }
    summary = {
        "config": {
            "RUN_LEASE_TTL": args.lease_ttl,
            "ORPHAN_SCAN_INTERVAL": args.scan_interval,
            "PRESENCE_INTERVAL": defaults.presence_interval_s,
            "PRESENCE_GRACE": defaults.presence_grace_s,
            "PRESENCE_SCAN_INTERVAL": defaults.presence_scan_interval_s,
            "PRESENCE_LEASE_TTL": defaults.presence_lease_ttl_s,
            "RECOVERY_CONCURRENCY": defaults.recovery_concurrency,
            "IDEMPOTENCY_LEASE_S": defaults.idempotency_lease_s,
            "bookings_per_round": args.concurrency,
            "sigkill_rounds_per_path": args.rounds,
            "sigterm_rounds": args.sigterm_rounds,
            "hotel_api_latency_s": args.hotel_latency,
            "payment_api_latency_s": args.payment_latency,
            "seed": args.seed,
        },
        "sigkill_presence": presence,
        "sigkill_ttl_only": ttl_only,
        "sigterm": term,
        "mass": mass,
        **in_process,
        "ledgers": ledgers,
        "checks": checks,
        "runtime_s": round(time.monotonic() - started, 1),
        "machine": machine(),
        "samples": {"sigkill_presence": kills["presence"], "sigkill_ttl_only": kills["ttl_only"], "sigterm": sigterm},
    }

    print("\n| case | samples | taken over p50 / p99 (s) | confirmed p50 / p99 (s) |")
    print("|---|---:|---:|---:|")
    for name, result in (
        ("SIGKILL, presence on", presence),
        ("SIGKILL, TTL-only", ttl_only),
        ("SIGTERM, presence on", term),
    ):
        print(
            f"| {name} | {result.get('samples', 0)} | {result.get('takeover_p50_s', '-')} / "
            f"{result.get('takeover_p99_s', '-')} | {result.get('p50_s', '-')} / {result.get('p99_s', '-')} |"
        )
    print(
        f"| {args.mass} runs on a killed replica | {mass['runs']} | all: {mass['all_taken_over_s']} | all: "
        f"{mass['all_confirmed_s']} |"
    )
    print(
        "\nliveness commands/s (one process): presence 10 runs {presence_10_runs} · 1,000 runs {presence_1000_runs}"
        " | TTL-only 10 runs {ttl_only_10_runs} · 1,000 runs {ttl_only_1000_runs}".format(**liveness)
    )
    print(
        f"one scan pass, {scan['runs']} runs across {scan['processes']} processes: Redis "
        f"{scan['redis_ms_all_alive_median']} ms (wall {scan['wall_ms_all_alive_median']} ms); with one dead: Redis "
        f"{scan['redis_ms_one_dead']} ms, {scan['queued_when_one_dead']} runs queued"
    )
    print(
        f"bookings: {ledgers['bookings']} · confirmed: {ledgers['confirmed_bookings']} · duplicate reservations: "
        f"{ledgers['bookings_with_duplicate_reservations']} · duplicate charges: "
        f"{ledgers['bookings_with_duplicate_charges']} · rooms left on hold: {ledgers['rooms_left_on_hold']}"
    )
    for check, ok in checks.items():
        print(f"- [{'x' if ok else ' '}] {check}")
    write_results(RESULTS, summary)
    print(f"({summary['runtime_s']} s)")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
