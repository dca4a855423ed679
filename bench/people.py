"""What knowing who is calling costs a booking: the same bookings with identities on and with ``CONCIERGE_AUTH=off``.

Run: ``python -m bench.people [--bookings 300] [--block 10] [--clients 4]`` (Redis at ``REDIS_URL``, Postgres as the
tests use it). Two stacks side by side: ``CONCIERGE_AUTH=off`` (the baseline: every request is ``anonymous``, no token
checked, no quota counted) and identities on (a local issuer's JWKS file, each client a person with an ES256 token,
every request's JWT verified and counted against ``PERSON_REQUESTS_PER_MIN``). ``--clients`` clients book on both in
turn, a block at a time (baseline, on, on, baseline, ...), so a slower minute slows both. Per side: ``POST /bookings``
(to its 202), the booking (POST to the final status read, a long-poll) and a read (``GET /bookings/{id}``), p50/p95.
The issue's target: the booking's p50 at most 2% slower. Prints a markdown table; writes
``bench/results/people.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._stack import core_stack, machine, percentiles, write_results
from bench.booking_throughput import BookingFactory
from identity.people import LOCAL_ISSUER, LocalIssuer
from tests.stack import TEST_DATABASE_URL, Stack

RESULTS = Path(__file__).resolve().parent / "results" / "people.json"
OFF, ON = "CONCIERGE_AUTH=off", "identities on"
TARGET = 0.02
"""The booking's p50 with identities on at most 2% above the baseline's."""

Sample = tuple[float, float, float, str]
"""(POST → 202, POST → final, a read of the final booking) seconds, and the final status."""


async def _booking(http: httpx.AsyncClient, body: dict[str, Any]) -> Sample:
    started = time.perf_counter()
    response = await http.post("/bookings", json=body)
    accepted = time.perf_counter() - started
    if response.status_code != 202:
        raise RuntimeError(f"POST /bookings answered {response.status_code}: {response.text[:200]}")
    booking_id = response.json()["booking_id"]
    while True:
        answer = await http.get(f"/bookings/{booking_id}", params={"wait": 20})
        if answer.status_code != 200:
            raise RuntimeError(f"GET /bookings/{booking_id} answered {answer.status_code}: {answer.text[:200]}")
        if answer.json()["status"] in ("confirmed", "failed"):
            break
    done = time.perf_counter() - started
    read_started = time.perf_counter()
    assert (await http.get(f"/bookings/{booking_id}")).status_code == 200
    return accepted, done, time.perf_counter() - read_started, str(answer.json()["status"])


async def _block(stack: Stack, tokens: list[str | None], count: int, factory: BookingFactory) -> list[Sample]:
    queue = [factory() for _ in range(count)]
    results: list[Sample] = []

    async def client(token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=60, headers=headers) as http:
            while queue:
                results.append(await _booking(http, queue.pop()))

    await asyncio.gather(*(client(token) for token in tokens))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.people", description=__doc__.splitlines()[0])
    parser.add_argument("--bookings", type=int, default=300, help="bookings per side (default 300)")
    parser.add_argument("--block", type=int, default=10, help="bookings per block (default 10)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients, each a person (default 4)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if options.bookings < options.block or options.block < 1 or options.clients < 1:
        parser.error("--bookings must be at least --block, both and --clients at least 1")

    samples: dict[str, list[Sample]] = {OFF: [], ON: []}
    with contextlib.ExitStack() as cleanup:
        workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="concierge-bench-people-")))
        issuer = LocalIssuer(workdir / "issuer", LOCAL_ISSUER)
        door = {"BOOKING_MAX_IN_FLIGHT": "200"}  # a fixed door: the adaptive one's 429s would time its learning
        sides = {
            OFF: {**door, "CONCIERGE_AUTH": "off"},
            ON: {
                **door,
                "CONCIERGE_AUTH": "on",
                "CONCIERGE_AUTH_ISSUER": issuer.issuer,
                "CONCIERGE_AUTH_JWKS_FILE": str(issuer.jwks_path),
            },
        }
        stacks = {
            side: core_stack(cleanup, options.redis_url, options.admin_database_url, env) for side, env in sides.items()
        }
        tokens: dict[str, list[str | None]] = {
            OFF: [None] * options.clients,
            ON: [issuer.mint(f"bench-{uuid.uuid4().hex[:8]}") for _ in range(options.clients)],
        }
        print("two stacks up", flush=True)
        factory = BookingFactory(11)
        for side, stack in stacks.items():  # warm-up, not counted
            asyncio.run(_block(stack, tokens[side], options.block, factory))
        order = list(sides)
        for i in range(options.bookings // options.block):
            for side in order if i % 2 == 0 else order[::-1]:
                samples[side] += asyncio.run(_block(stacks[side], tokens[side], options.block, factory))

    rows: dict[str, dict[str, Any]] = {
        side: {
            "bookings": len(got),
            "confirmed": sum(1 for *_, status in got if status == "confirmed"),
            "accept_ms": percentiles([s[0] for s in got], scale=1000),
            "booking_ms": percentiles([s[1] for s in got], scale=1000),
            "read_ms": percentiles([s[2] for s in got], scale=1000),
        }
        for side, got in samples.items()
    }
    base, on = rows[OFF], rows[ON]
    print(
        f"\n# Identities: {options.bookings} bookings per side, {options.clients} clients, blocks of {options.block}\n"
    )
    print(f"| | {OFF} (baseline) | {ON} | difference |")
    print("|---|---:|---:|---:|")
    for label, part in (
        ("POST /bookings", "accept_ms"),
        ("booking (POST → final)", "booking_ms"),
        ("GET /bookings/{id}", "read_ms"),
    ):
        for q in ("p50", "p95"):
            a, b = base[part][q], on[part][q]
            print(f"| {label} {q}, ms | {a:.2f} | {b:.2f} | {b - a:+.2f} ({b / a - 1:+.1%}) |")
    print(f"| confirmed | {base['confirmed']} | {on['confirmed']} | |")
    cost = on["booking_ms"]["p50"] / base["booking_ms"]["p50"] - 1
    verdict = "met" if cost <= TARGET else "not met"
    print(f"\nthe booking's p50 with identities on: {cost:+.1%} (target at most {TARGET:+.0%}: {verdict})")
    write_results(
        options.output,
        {"machine": machine(), "options": vars(options) | {"output": str(options.output)}, "rows": rows, "cost": cost},
    )
    return 0 if cost <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
