"""What one A2A call costs next to a plain JSON POST doing the same work, and what the inline send saves.

Run: ``python -m bench.a2a_overhead [--samples N] [--rounds R]``. Starts two uvicorn processes serving the same echo
skill (``bench/_stack.py``): one mounted as the agents mount it (``mount_a2a``: a blocking ``SendMessage`` runs the
skill inline), one with every request through the SDK's generic ``DefaultRequestHandler``. Both also serve
``POST /echo``, the same work as plain JSON behind the same token check: the baseline. Calls go one at a time from
this process, the three kinds interleaved round by round so machine noise hits them alike. Prints a markdown table
(p50/p95 of the round trip, the server's CPU per call) and writes ``bench/results/a2a_overhead.json``.

Claim checked: the inline send costs less than the SDK's generic path, in latency and in server CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench._stack import bench_app, cpu_seconds, machine, percentiles, write_results
from tests.procs import Processes

RESULTS = Path(__file__).resolve().parent / "results" / "a2a_overhead.json"
# What a charge request looks like on the wire: a handful of fields.
PAYLOAD = {"amount": 240.0, "currency": "EUR", "payment_token": "tok_visa", "reference": "b" * 32}


async def measure(samples: int, rounds: int, urls: dict[str, str], pids: dict[str, int]) -> dict[str, Any]:
    from identity.auth import service_tokens
    from infra.a2a.client import A2AClient
    from infra.settings import get_settings

    # one token for the whole run, as a service reuses its token for a minute
    token = service_tokens("bench", get_settings()).token("bench-echo")
    async with (
        httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=10) as plain_http,
        A2AClient(urls["inline"], audience="bench-echo", issuer="bench") as inline,
        A2AClient(urls["sdk"], audience="bench-echo", issuer="bench") as sdk,
    ):

        async def plain() -> Any:
            response = await plain_http.post(f"{urls['inline']}/echo", json=PAYLOAD)
            response.raise_for_status()
            return response.json()

        cases: dict[str, tuple[Callable[[], Awaitable[Any]], int]] = {
            "plain JSON POST (baseline)": (plain, pids["inline"]),
            "A2A, SDK generic handler": (lambda: sdk.call("echo", PAYLOAD), pids["sdk"]),
            "A2A, inline send (what the agents run)": (lambda: inline.call("echo", PAYLOAD), pids["inline"]),
        }
        for call, _pid in cases.values():  # connections open, code paths warm
            for _ in range(50):
                assert (await call())["echo"] == PAYLOAD
        times: dict[str, list[float]] = {name: [] for name in cases}
        server_cpu: dict[str, float] = dict.fromkeys(cases, 0.0)
        per_round = max(1, samples // rounds)
        for _ in range(rounds):
            for name, (call, pid) in cases.items():
                cpu_before = cpu_seconds(pid)
                for _ in range(per_round):
                    start = time.perf_counter()
                    await call()
                    times[name].append(time.perf_counter() - start)
                server_cpu[name] += cpu_seconds(pid) - cpu_before
    return {
        name: {**percentiles(times[name], scale=1000), "server_cpu_ms": server_cpu[name] * 1000 / len(times[name])}
        for name in cases
    }


def report(result: dict[str, Any]) -> bool:
    cases = result["cases"]
    baseline, sdk, inline = (cases[name] for name in cases)
    print(f"# A2A call overhead: {result['samples']} calls per case, one at a time, {result['rounds']} rounds\n")
    print("| case | p50 ms | p95 ms | server CPU ms/call | p50 over baseline ms |")
    print("|---|---:|---:|---:|---:|")
    for name, row in cases.items():
        print(
            f"| {name} | {row['p50']:.2f} | {row['p95']:.2f} | {row['server_cpu_ms']:.2f} "
            f"| {row['p50'] - baseline['p50']:+.2f} |"
        )
    ok = inline["p50"] < sdk["p50"] and inline["server_cpu_ms"] < sdk["server_cpu_ms"]
    saved = sdk["p50"] - inline["p50"]
    cpu_saved = sdk["server_cpu_ms"] - inline["server_cpu_ms"]
    print(
        f"\ninline send against the SDK's generic handler: {saved:.2f} ms less p50, {cpu_saved:.2f} ms less server CPU"
    )
    print(f"- [{'x' if ok else ' '}] inline send cheaper than the SDK path (latency and server CPU)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.a2a_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000, help="calls per case (default 1000)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args()
    if options.samples < options.rounds or options.rounds < 1:
        parser.error("--samples must be at least --rounds, and --rounds at least 1")
    secret = secrets.token_hex(32)
    os.environ["CONCIERGE_SERVICE_SECRET"] = secret
    factories = {"inline": "a2a_inline_app", "sdk": "a2a_sdk_app"}
    with (
        tempfile.TemporaryDirectory(prefix="concierge-bench-a2a-") as workdir,
        Processes(Path(workdir), env={"CONCIERGE_SERVICE_SECRET": secret}) as procs,
    ):
        started = {name: bench_app(procs, factory) for name, factory in factories.items()}
        urls = {name: proc.url for name, proc in started.items()}
        pids = {name: proc.pid for name, proc in started.items()}
        cases = asyncio.run(measure(options.samples, options.rounds, urls, pids))
    result = {
        "machine": machine(),
        "samples": options.samples - options.samples % options.rounds,
        "rounds": options.rounds,
        "payload": PAYLOAD,
        "cases": cases,
    }
    ok = report(result)
    write_results(options.output, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
