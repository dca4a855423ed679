"""How long a booking takes to finish after its booking-agent dies, against a real stack this script starts.

Run: ``python -m bench.recovery_time`` (needs Redis at ``REDIS_URL`` and Postgres at ``TEST_DATABASE_URL``, like the
e2e tests). Prints a markdown table and writes ``bench/results/recovery_time.json``; exits 1 if a target is missed.

What it does: the six services as real processes (``bench._stack.service_stack``: a ``tests.stack.Stack`` on a fresh
database, Postgres checkpoints, its Redis keys deleted at the end), providers slowed down a little so a booking takes
about a second. Each round starts a few bookings at once, waits a random moment, then ``kill -9``s booking-agent (or
SIGTERMs it, for the SIGTERM rounds) and restarts it; the recovery worker was running all along. For every booking that
was not final at the kill it measures the seconds from the signal to ``confirmed`` (read from Redis every 20 ms, so the
restarting agent is not in the way). At the end it checks the providers' ledgers: exactly one confirmed reservation and
one captured charge per booking, no room left on hold.

Claims checked:

- after SIGKILL, p99 < 8 s with ``RUN_LEASE_TTL=5`` and ``ORPHAN_SCAN_INTERVAL=1`` (detection floor: lease TTL +
  scan interval = 6 s, plus the rest of the booking);
- after SIGTERM, p99 < 2 s (the agent hands its runs over at the next step boundary: no lease to wait for);
- no duplicates: reservations and charges per booking never exceed one; every booking ends confirmed.

Three bookings per round by default: the recovery worker resumes three runs at a time (its ``recovery_worker``
bulkhead), so a fourth orphan waits for a slot and its time grows by one booking's remaining work (measured with
``--concurrency 4``: SIGTERM p99 about 2.1 s, SIGKILL p99 about 7.9 s). More replicas of the worker take more at once.

``IDEMPOTENCY_LEASE_S`` (default 3 s) is how long a dead owner's claim on a side-effect node blocks the node that
resumes it. Above the run lease it would become the real floor for kills mid-reserve/charge/confirm, which is why
its default is below ``RUN_LEASE_TTL``; the bench runs with the project defaults (``--idempotency-lease`` to change
it) and reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._stack import percentiles, service_stack
from infra.bookings import booking_key
from infra.redis import create_sync_redis
from infra.settings import Settings
from runs.leases import run_key
from tests.stack import CORE, Stack, stay

RESULTS = Path(__file__).resolve().parent / "results" / "recovery_time.json"
SIGKILL_P99_TARGET_S = 8.0
SIGTERM_P99_TARGET_S = 2.0
FINAL = {"confirmed", "failed"}
ROUND_TIMEOUT_S = 90.0
POLL_S = 0.02


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="SIGKILL rounds (default 8)")
    parser.add_argument("--sigterm-rounds", type=int, default=5, help="SIGTERM rounds (default 5)")
    parser.add_argument(
        "--concurrency", type=int, default=3, help="bookings per round (default 3, the worker's bulkhead slots)"
    )
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="RUN_LEASE_TTL (default 5)")
    parser.add_argument("--scan-interval", type=float, default=1.0, help="ORPHAN_SCAN_INTERVAL (default 1)")
    parser.add_argument(
        "--idempotency-lease", type=float, default=None, help="IDEMPOTENCY_LEASE_S (default: the project's)"
    )
    parser.add_argument("--hotel-latency", type=float, default=0.2, help="hotel-api latency per call (s)")
    parser.add_argument("--payment-latency", type=float, default=0.3, help="payment-api latency per call (s)")
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

    def status(self, booking_id: str) -> str:
        return str(self.redis.hget(booking_key(booking_id, prefix=self.stack.prefix), "status") or "missing")

    def fence(self, booking_id: str) -> int:
        return int(self.redis.hget(run_key(booking_id, prefix=self.stack.prefix), "fence") or 0)

    def book_round(self) -> list[str]:
        ids = []
        for _ in range(self.args.concurrency):
            checkin, checkout = stay(days_ahead=self.next_day)
            self.next_day += 1
            ids.append(str(self.stack.book(checkin=checkin, checkout=checkout)["booking_id"]))
        self.booked += ids
        return ids

    def round(self, stop: Callable[[], None], *, in_background: bool) -> list[dict[str, Any]]:
        """Book, wait a random moment, stop booking-agent with ``stop``, time every unfinished booking.

        ``in_background``: ``stop`` blocks while the agent drains (SIGTERM), so it runs in a thread meanwhile.
        """
        ids = self.book_round()
        time.sleep(self.rng.uniform(0.05, 1.0))
        signalled = time.monotonic()
        stopper = threading.Thread(target=stop)
        if in_background:
            stopper.start()
        else:
            stop()  # kill -9 returns once the process is gone: the statuses read next are frozen
        at_signal = {booking_id: self.status(booking_id) for booking_id in ids}
        pending = {booking_id for booking_id, status in at_signal.items() if status not in FINAL}
        fence_at_signal = {booking_id: self.fence(booking_id) for booking_id in pending}
        finished: dict[str, float] = {}
        taken_over: dict[str, float] = {}
        outcome: dict[str, str] = {}
        deadline = signalled + ROUND_TIMEOUT_S
        while pending and time.monotonic() < deadline:
            for booking_id in list(pending):
                if booking_id not in taken_over and self.fence(booking_id) > fence_at_signal[booking_id]:
                    taken_over[booking_id] = time.monotonic() - signalled
                status = self.status(booking_id)
                if status in FINAL:
                    finished[booking_id] = time.monotonic() - signalled
                    outcome[booking_id] = status
                    pending.discard(booking_id)
            time.sleep(POLL_S)
        if in_background:
            stopper.join()
        self.stack.serve("booking-agent")
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


def main() -> int:
    args = parse_args()
    idempotency_lease = args.idempotency_lease if args.idempotency_lease is not None else Settings().idempotency_lease_s
    env = {
        "RUN_LEASE_TTL": str(args.lease_ttl),
        "ORPHAN_SCAN_INTERVAL": str(args.scan_interval),
        "IDEMPOTENCY_LEASE_S": str(idempotency_lease),
        "BOOKING_BUDGET_S": "60",
        "CONCIERGE_LOG_LEVEL": "WARNING",
    }
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    started = time.monotonic()
    with service_stack(redis_url=redis_url, env=env, services=(*CORE, "recovery-worker")) as stack:
        stack.fault("hotel-api", latency_s=args.hotel_latency)
        stack.fault("payment-api", latency_s=args.payment_latency)
        bench = Bench(stack, args)
        try:
            sigkill: list[dict[str, Any]] = []
            for n in range(args.rounds):
                sigkill += bench.round(bench.kill, in_background=False)
                print(f"SIGKILL round {n + 1}/{args.rounds}: {len(sigkill)} samples", file=sys.stderr)
            sigterm: list[dict[str, Any]] = []
            for n in range(args.sigterm_rounds):
                sigterm += bench.round(bench.terminate, in_background=True)
                print(f"SIGTERM round {n + 1}/{args.sigterm_rounds}: {len(sigterm)} samples", file=sys.stderr)
            ledgers = bench.ledgers()
        finally:
            bench.close()

    kill_summary, term_summary = summarise(sigkill), summarise(sigterm)
    floor = args.lease_ttl + args.scan_interval
    checks = {
        f"SIGKILL p99 < {SIGKILL_P99_TARGET_S:g} s": kill_summary.get("p99_s", float("inf")) < SIGKILL_P99_TARGET_S,
        f"SIGTERM p99 < {SIGTERM_P99_TARGET_S:g} s": term_summary.get("p99_s", float("inf")) < SIGTERM_P99_TARGET_S,
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
            "IDEMPOTENCY_LEASE_S": idempotency_lease,
            "bookings_per_round": args.concurrency,
            "sigkill_rounds": args.rounds,
            "sigterm_rounds": args.sigterm_rounds,
            "hotel_api_latency_s": args.hotel_latency,
            "payment_api_latency_s": args.payment_latency,
            "seed": args.seed,
        },
        "detection_floor_s": floor,
        "sigkill": kill_summary,
        "sigterm": term_summary,
        "ledgers": ledgers,
        "checks": checks,
        "runtime_s": round(time.monotonic() - started, 1),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "samples": {"sigkill": sigkill, "sigterm": sigterm},
    }

    print("\n| signal | samples | p50 (s) | p99 (s) | max (s) | target p99 | taken over p50 / p99 (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, result, target in (
        ("SIGKILL", kill_summary, SIGKILL_P99_TARGET_S),
        ("SIGTERM", term_summary, SIGTERM_P99_TARGET_S),
    ):
        print(
            f"| {name} | {result.get('samples', 0)} | {result.get('p50_s', '-')} | {result.get('p99_s', '-')} "
            f"| {result.get('max_s', '-')} | < {target:g} "
            f"| {result.get('takeover_p50_s', '-')} / {result.get('takeover_p99_s', '-')} |"
        )
    print('(seconds from the signal to `confirmed`; "taken over": to the recovery worker holding the run\'s lease)')
    print(
        f"\nfloor after SIGKILL (RUN_LEASE_TTL + ORPHAN_SCAN_INTERVAL): {floor:g} s · IDEMPOTENCY_LEASE_S: "
        f"{idempotency_lease:g} s"
    )
    print(
        f"bookings: {ledgers['bookings']} · confirmed: {ledgers['confirmed_bookings']} · duplicate reservations: "
        f"{ledgers['bookings_with_duplicate_reservations']} · duplicate charges: "
        f"{ledgers['bookings_with_duplicate_charges']} · rooms left on hold: {ledgers['rooms_left_on_hold']}"
    )
    for check, ok in checks.items():
        print(f"- [{'x' if ok else ' '}] {check}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {RESULTS} ({summary['runtime_s']} s)")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
