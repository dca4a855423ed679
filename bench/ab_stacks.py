"""A against B under the same load at the same time: the CPU one booking costs in each service of two stacks.

Run: ``python -m bench.ab_stacks --a-env CONCIERGE_GC_GEN0_THRESHOLD=0`` (a setting against the default), or
``python -m bench.ab_stacks --a-tree /path/to/a/checkout/of/the/old/code`` (old code against this checkout). Both
stacks are started here (five ``concierge serve`` processes each, a fresh database and a key prefix each, all
removed at the end); ``--a-tree``/``--b-tree`` put that checkout first on the services' ``PYTHONPATH``.

Why two stacks at once: on these shared 2-core machines the CPU a booking costs drifts by ±10% from one minute to
the next, more than most changes worth measuring, so two runs of ``bench.booking_throughput`` one after the other
mostly measure the minute. Here both stacks are loaded by ``--clients`` closed-loop clients each, in the same
rounds; whatever slows the machine slows both, and the per-round difference is the change's. A is the baseline.

Per round and per stack: bookings finished, CPU ms per booking of each service (``/proc``, every booking finished in
the round, in flight ones included) and RSS. Prints a markdown table of the medians and writes
``bench/results/ab_stacks.json``. No target: it reports, the reader judges (the per-round rows show whether B was
lower in every round or only on average).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._stack import cpu_seconds, machine, rss_kib, service_stack, write_results
from bench.booking_throughput import BookingFactory, StopRule, new_event_loop, run_load
from tests.stack import CORE, TEST_DATABASE_URL, Stack

RESULTS = Path(__file__).resolve().parent / "results" / "ab_stacks.json"
SIDES = ("A", "B")


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, setting = value.partition("=")
        if not sep or not name:
            raise SystemExit(f"{option}: expected NAME=VALUE, got {value!r}")
        pairs[name] = setting
    return pairs


def _env(pairs: Mapping[str, str], tree: Path | None) -> dict[str, str]:
    env = dict(pairs)
    if tree is not None:
        if not (tree / "infra").is_dir():
            raise SystemExit(f"{tree}: not a checkout of this project (no infra/ there)")
        env["PYTHONPATH"] = os.pathsep.join([str(tree.resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


async def _round(stacks: Mapping[str, Stack], clients: int, seconds: float, seed: int) -> dict[str, dict[str, Any]]:
    """Both stacks loaded for ``seconds``; per stack: bookings finished, CPU ms per booking per service, RSS MB."""
    pids = {side: {name: proc.pid for name, proc in stack.services.items()} for side, stack in stacks.items()}
    before = {side: {name: cpu_seconds(pid) for name, pid in p.items()} for side, p in pids.items()}
    async with contextlib.AsyncExitStack() as exits:
        loads = []
        for i, stack in enumerate(stacks.values()):
            http = await exits.enter_async_context(httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=120))
            loads.append(
                run_load(http, clients=clients, stop=StopRule(seconds=seconds), new_booking=BookingFactory(seed + i))
            )
        results = dict(zip(stacks, await asyncio.gather(*loads), strict=True))
    rows: dict[str, dict[str, Any]] = {}
    for side, result in results.items():
        finished = len(result.completed)
        cpu = {
            name: 1000 * (cpu_seconds(pid) - before[side][name]) / max(finished, 1) for name, pid in pids[side].items()
        }
        cpu["services"] = sum(cpu.values())
        rows[side] = {
            "bookings": finished,
            "confirmed": sum(1 for c in result.completed if c.status == "confirmed"),
            "errors": dict(result.errors),
            "cpu_ms_per_booking": cpu,
            "rss_mb": {name: rss_kib(pid) / 1024 for name, pid in pids[side].items()},
        }
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_stacks", description=__doc__.splitlines()[0])
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE", help="stack A's environment")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE", help="stack B's environment")
    parser.add_argument("--a-tree", type=Path, help="checkout whose code stack A runs (default: this one)")
    parser.add_argument("--b-tree", type=Path, help="checkout whose code stack B runs (default: this one)")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients per stack (default 8)")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of a round (default 30)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first round")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if options.clients < 1 or options.rounds < 1 or options.seconds <= 0:
        parser.error("--clients and --rounds must be at least 1, --seconds positive")
    envs = {
        "A": _env(_pairs(options.a_env, "--a-env"), options.a_tree),
        "B": _env(_pairs(options.b_env, "--b-env"), options.b_tree),
    }
    if envs["A"] == envs["B"]:
        parser.error("A and B are the same: give --a-env/--b-env or --a-tree/--b-tree")

    rounds: list[dict[str, dict[str, Any]]] = []
    with contextlib.ExitStack() as stacks_cm, asyncio.Runner(loop_factory=new_event_loop) as runner:
        stacks = {
            side: stacks_cm.enter_context(
                service_stack(
                    redis_url=options.redis_url, admin_database_url=options.admin_database_url, env=envs[side]
                )
            )
            for side in SIDES
        }
        print(f"stacks up: A {envs['A'] or '(defaults)'}, B {envs['B'] or '(defaults)'}", flush=True)
        if options.warmup > 0:
            runner.run(_round(stacks, options.clients, options.warmup, seed=0))
        for i in range(options.rounds):
            rows = runner.run(_round(stacks, options.clients, options.seconds, seed=1000 * (i + 1)))
            rounds.append(rows)
            a, b = (rows[side]["cpu_ms_per_booking"]["services"] for side in SIDES)
            print(
                f"round {i + 1}: A {rows['A']['bookings']} bookings, {a:.1f} ms/booking; "
                f"B {rows['B']['bookings']} bookings, {b:.1f} ms/booking ({b / a - 1:+.1%})",
                flush=True,
            )

    names = [*CORE, "services"]
    medians = {
        side: {name: statistics.median(r[side]["cpu_ms_per_booking"][name] for r in rounds) for name in names}
        for side in SIDES
    }
    lower_every_round = all(
        r["B"]["cpu_ms_per_booking"]["services"] < r["A"]["cpu_ms_per_booking"]["services"] for r in rounds
    )
    print(f"\n# A against B: CPU ms per booking, median of {options.rounds} rounds of {options.seconds:g} s\n")
    print("| service | A (baseline) | B | B / A |")
    print("|---|---:|---:|---:|")
    for name in names:
        a, b = medians["A"][name], medians["B"][name]
        print(f"| {name} | {a:.2f} | {b:.2f} | {b / a:.3f} |")
    print(f"\nB lower than A in every round: {'yes' if lower_every_round else 'no'}")
    last = rounds[-1]
    print(
        "RSS after the last round, MB: "
        + "; ".join(
            f"{side} " + ", ".join(f"{name} {mb:.0f}" for name, mb in last[side]["rss_mb"].items()) for side in SIDES
        )
    )
    errors = {side: sum(sum(r[side]["errors"].values()) for r in rounds) for side in SIDES}
    if any(errors.values()):
        print(f"errors (bookings not finished): A {errors['A']}, B {errors['B']}")

    write_results(
        options.output,
        {
            "machine": machine(),
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
            "env": envs,
            "rounds": rounds,
            "median_cpu_ms_per_booking": medians,
            "b_lower_every_round": lower_every_round,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
