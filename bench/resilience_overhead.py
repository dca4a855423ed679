"""What the resilience layers cost per call, next to a bare await and to the usual libraries.

Run: ``python -m bench.resilience_overhead`` (``make bench``). Prints a markdown table (median ns/call of several
repetitions) and writes ``bench/results/resilience_overhead.json``.

Claims checked (this project's targets, on a small 2-core machine):

- ``ResiliencePolicy.call`` success path (breaker + bulkhead + bounded execution + retry, inside a budget) costs at
  most 10 µs per call, and at most a quarter of tenacity's ``AsyncRetrying(stop=stop_after_attempt(3))`` alone;
- a call refused by an OPEN breaker costs at most 2 µs;
- refusing 100k calls leaves memory flat (tracemalloc before/after).

The wrapped coroutine is trivial on purpose: what is measured is the layers' overhead, not I/O.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiobreaker
import anyio
import tenacity
from prometheus_client import CollectorRegistry
from tenacity import AsyncRetrying, stop_after_attempt

from infra.metrics import install_resilience_metrics, uninstall_resilience_metrics
from resilience import (
    Bulkhead,
    BulkheadConfig,
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitOpenError,
    ResiliencePolicy,
    RetryConfig,
    budget_scope,
    with_retry,
)

CALLS = 20_000
REPS = 7
REJECTIONS_FOR_MEMORY = 100_000
RESULTS = Path(__file__).resolve().parent / "results" / "resilience_overhead.json"

POLICY_TARGET_NS = 10_000
POLICY_VS_TENACITY = 0.25
REJECTION_TARGET_NS = 2_000


async def trivial() -> int:
    return 1


async def measure(call: Callable[[], Awaitable[Any]], *, calls: int = CALLS, reps: int = REPS) -> float:
    """Median ns per ``await call()`` over ``reps`` runs of ``calls`` calls (after a warm-up)."""
    for _ in range(1_000):
        await call()
    samples = []
    for _ in range(reps):
        # let the loop run once: it drops cancelled timer handles, as it would between real requests
        await asyncio.sleep(0)
        gc.collect()
        start = time.perf_counter_ns()
        for _ in range(calls):
            await call()
        samples.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(samples)


def open_breaker(name: str) -> CircuitBreaker:
    breaker = CircuitBreaker(name, CircuitBreakerConfig(failure_threshold=1, recovery_timeout=3600.0))
    breaker.record_exception(RuntimeError("down"), breaker.admit())
    return breaker


async def refused(policy: ResiliencePolicy) -> None:
    try:
        await policy.call(trivial)
    except CircuitOpenError:
        return
    raise AssertionError("the breaker should have refused the call")


async def rejection_memory() -> dict[str, float]:
    policy = ResiliencePolicy("bench-memory", circuit=open_breaker("bench-memory"))
    for _ in range(1_000):
        await refused(policy)
    gc.collect()
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    for _ in range(REJECTIONS_FOR_MEMORY):
        await refused(policy)
    gc.collect()
    after, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"rejections": REJECTIONS_FOR_MEMORY, "before_bytes": before, "after_bytes": after, "peak_bytes": peak}


async def run() -> dict[str, Any]:
    rows: dict[str, float] = {}
    budget = 3600.0

    rows["bare await (baseline)"] = await measure(trivial)

    policy = ResiliencePolicy(
        "bench",
        circuit=CircuitBreaker("bench"),
        bulkhead=Bulkhead("bench", BulkheadConfig(max_concurrent=100, timeout=budget * 2)),
        retry=RetryConfig(max_attempts=3),
    )
    with budget_scope(budget):
        rows["ResiliencePolicy.call, success (breaker+bulkhead+retry, in a budget)"] = await measure(
            lambda: policy.call(trivial)
        )
    tight = ResiliencePolicy(
        "bench-tight",
        circuit=CircuitBreaker("bench-tight"),
        bulkhead=Bulkhead("bench-tight", BulkheadConfig(max_concurrent=100, timeout=budget / 2)),
        retry=RetryConfig(max_attempts=3),
    )
    with budget_scope(budget):
        rows["ResiliencePolicy.call, success, bulkhead bound tighter than budget"] = await measure(
            lambda: tight.call(trivial)
        )

    rejecting = ResiliencePolicy("bench-open", circuit=open_breaker("bench-open"))
    rows["ResiliencePolicy.call, refused by OPEN breaker"] = await measure(lambda: refused(rejecting))
    registry = CollectorRegistry()
    install_resilience_metrics(registry)
    try:
        rows["ResiliencePolicy.call, refused by OPEN breaker, metrics hook installed"] = await measure(
            lambda: refused(rejecting)
        )
    finally:
        uninstall_resilience_metrics(registry)

    breaker = CircuitBreaker("bench-alone")
    rows["CircuitBreaker.call alone, closed"] = await measure(lambda: breaker.call(trivial))
    bulkhead = Bulkhead("bench-alone", BulkheadConfig(max_concurrent=100, timeout=budget * 2))
    with budget_scope(budget):
        rows["Bulkhead.run alone"] = await measure(lambda: bulkhead.run(trivial))
    retry_config = RetryConfig(max_attempts=3)
    rows["with_retry alone (3 attempts)"] = await measure(lambda: with_retry(trivial, config=retry_config))

    async def tenacity_loop() -> int:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(3)):
            with attempt:
                return await trivial()
        raise AssertionError("unreachable")

    retrying = AsyncRetrying(stop=stop_after_attempt(3))
    rows["tenacity AsyncRetrying(stop_after_attempt(3)), `async for`"] = await measure(tenacity_loop)
    rows["tenacity AsyncRetrying(stop_after_attempt(3)), `retrying(fn)`"] = await measure(lambda: retrying(trivial))

    peer_breaker = aiobreaker.CircuitBreaker()
    rows["aiobreaker CircuitBreaker.call_async, closed"] = await measure(lambda: peer_breaker.call_async(trivial))

    stacked_breaker = aiobreaker.CircuitBreaker()

    async def tenacity_and_aiobreaker() -> int:
        async for attempt in AsyncRetrying(stop=stop_after_attempt(3)):
            with attempt:
                return await stacked_breaker.call_async(trivial)
        raise AssertionError("unreachable")

    rows["tenacity + aiobreaker stacked"] = await measure(tenacity_and_aiobreaker)

    limiter = anyio.CapacityLimiter(100)

    async def limited() -> int:
        async with limiter:
            return await trivial()

    rows["anyio.CapacityLimiter alone (`async with`)"] = await measure(limited)

    async def with_timeout() -> int:
        async with asyncio.timeout(budget):
            return await trivial()

    rows["asyncio.timeout block alone"] = await measure(with_timeout)

    memory = await rejection_memory()
    return {"rows": rows, "memory": memory}


def report(result: dict[str, Any]) -> dict[str, Any]:
    rows: dict[str, float] = result["rows"]
    memory: dict[str, float] = result["memory"]
    baseline = rows["bare await (baseline)"]
    policy = rows["ResiliencePolicy.call, success (breaker+bulkhead+retry, in a budget)"]
    rejection = rows["ResiliencePolicy.call, refused by OPEN breaker"]
    tenacity_fastest = min(v for k, v in rows.items() if k.startswith("tenacity AsyncRetrying"))

    print(f"# resilience overhead: {CALLS} calls x {REPS} reps, median ns/call\n")
    print("| case | ns/call | overhead over bare await (ns) |")
    print("|---|---:|---:|")
    for name, ns in rows.items():
        print(f"| {name} | {ns:,.0f} | {ns - baseline:,.0f} |")
    growth = memory["after_bytes"] - memory["before_bytes"]
    print(
        f"\nmemory over {memory['rejections']:,} rejections: {memory['before_bytes']:,} B before, "
        f"{memory['after_bytes']:,} B after ({growth:+,} B), peak {memory['peak_bytes']:,} B"
    )
    checks = {
        "policy <= 10 us": policy <= POLICY_TARGET_NS,
        "policy <= 1/4 of tenacity alone (fastest form)": policy <= POLICY_VS_TENACITY * tenacity_fastest,
        "rejection <= 2 us": rejection <= REJECTION_TARGET_NS,
        "memory flat over 100k rejections (< 64 KiB growth)": growth < 64 * 1024,
    }
    print(f"\npolicy / tenacity (fastest form) = {policy / tenacity_fastest:.2f}")
    for claim, ok in checks.items():
        print(f"- [{'x' if ok else ' '}] {claim}")
    return {
        "calls": CALLS,
        "reps": REPS,
        "unit": "ns/call (median)",
        "rows": rows,
        "memory": memory,
        "policy_vs_tenacity": policy / tenacity_fastest,
        "checks": checks,
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "tenacity": tenacity.__version__ if hasattr(tenacity, "__version__") else "unknown",
            "anyio": anyio.__version__ if hasattr(anyio, "__version__") else "unknown",
        },
    }


def main() -> int:
    summary = report(asyncio.run(run()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {RESULTS}")
    return 0 if all(summary["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
