"""What waiting for a replica (``WAIT``, docs/redis-ha.md) costs a booking: the same master and replica, two stacks.

Run: ``python -m bench.redis_wait [--bookings 300] [--block 10] [--clients 4]``. Starts a Redis master with one
replica (its own processes, free ports) and two stacks on it: ``REDIS_WAIT_REPLICAS=0`` (baseline: no write waits)
and the default (``1``: the accept, the run record, the final status and the providers' side effects wait for the
replica). ``--clients`` clients book on both in turn, a block of bookings at a time (baseline, waiting, waiting,
baseline, ...), so a slower minute slows both. Per side: the ``POST /bookings`` latency (the 202 the accept
``WAIT``\\ s for) and the booking's latency (POST to the final status read), p50/p95, and the ``WAIT`` calls the
master counted (0 for the baseline proves it did not wait). Prints a markdown table; writes
``bench/results/redis_wait.json``. Everything started is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._stack import core_stack, machine, percentiles, write_results
from bench.booking_throughput import BookingFactory
from tests.redis_topologies import SentinelTopology
from tests.stack import TEST_DATABASE_URL, Stack

RESULTS = Path(__file__).resolve().parent / "results" / "redis_wait.json"
SIDES = {"no wait": {"REDIS_WAIT_REPLICAS": "0"}, "WAIT 1": {"REDIS_WAIT_REPLICAS": "1"}}


async def _booking(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, float, str]:
    """(POST → 202 seconds, POST → final seconds, final status)."""
    started = time.perf_counter()
    response = await http.post("/bookings", json=body)
    accepted = time.perf_counter() - started
    if response.status_code != 202:
        raise RuntimeError(f"POST /bookings answered {response.status_code}: {response.text[:200]}")
    booking_id = response.json()["booking_id"]
    while True:
        booking = (await http.get(f"/bookings/{booking_id}", params={"wait": 20})).json()
        if booking["status"] in ("confirmed", "failed"):
            return accepted, time.perf_counter() - started, str(booking["status"])


async def _block(stack: Stack, clients: int, count: int, factory: BookingFactory) -> list[tuple[float, float, str]]:
    async with httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=60) as http:
        queue = [factory() for _ in range(count)]
        results: list[tuple[float, float, str]] = []

        async def client() -> None:
            while queue:
                results.append(await _booking(http, queue.pop()))

        await asyncio.gather(*(client() for _ in range(clients)))
        return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_wait", description=__doc__.splitlines()[0])
    parser.add_argument("--bookings", type=int, default=300, help="bookings per side (default 300)")
    parser.add_argument("--block", type=int, default=10, help="bookings per block (default 10)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients in a block (default 4)")
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if options.bookings < options.block or options.block < 1 or options.clients < 1:
        parser.error("--bookings must be at least --block, both and --clients at least 1")

    samples: dict[str, list[tuple[float, float, str]]] = {side: [] for side in SIDES}
    with contextlib.ExitStack() as cleanup:
        redis = cleanup.enter_context(SentinelTopology(replicas=1))  # its sentinels idle: no failover here
        url = f"redis://127.0.0.1:{redis.master.port}/0"
        stacks = {side: core_stack(cleanup, url, options.admin_database_url, env) for side, env in SIDES.items()}
        print(f"master :{redis.master.port}, replica :{redis.replicas[0].port}; two stacks up", flush=True)
        factory = BookingFactory(7)
        for stack in stacks.values():  # warm-up, not counted
            asyncio.run(_block(stack, options.clients, options.block, factory))
        waits: dict[str, int] = {}
        order = list(SIDES)
        for i in range(options.bookings // options.block):
            for side in order if i % 2 == 0 else order[::-1]:
                before = _wait_calls(redis)
                samples[side] += asyncio.run(_block(stacks[side], options.clients, options.block, factory))
                waits[side] = waits.get(side, 0) + _wait_calls(redis) - before

    rows: dict[str, dict[str, Any]] = {
        side: {
            "bookings": len(got),
            "confirmed": sum(1 for *_, status in got if status == "confirmed"),
            "accept_ms": percentiles([a for a, _, _ in got], scale=1000),
            "booking_ms": percentiles([b for _, b, _ in got], scale=1000),
            "wait_calls": waits.get(side, 0),
        }
        for side, got in samples.items()
    }
    base, waiting = (rows[side] for side in SIDES)
    print(
        f"\n# WAIT for a replica: {options.bookings} bookings per side, {options.clients} clients, blocks of {options.block}\n"
    )
    print("| | no wait (baseline) | WAIT 1 | difference |")
    print("|---|---:|---:|---:|")
    for label, part in (("POST /bookings", "accept_ms"), ("booking (POST → final)", "booking_ms")):
        for q in ("p50", "p95"):
            a, b = base[part][q], waiting[part][q]
            print(f"| {label} {q}, ms | {a:.1f} | {b:.1f} | {b - a:+.1f} ({b / a - 1:+.0%}) |")
    print(f"| WAIT calls counted by the master | {base['wait_calls']} | {waiting['wait_calls']} | |")
    print(f"| confirmed | {base['confirmed']} | {waiting['confirmed']} | |")
    write_results(
        options.output, {"machine": machine(), "options": vars(options) | {"output": str(options.output)}, "rows": rows}
    )
    return 0


def _wait_calls(redis: SentinelTopology) -> int:
    stats = redis.master.client.info("commandstats").get("cmdstat_wait", {})
    return int(stats.get("calls", 0))


if __name__ == "__main__":
    sys.exit(main())
