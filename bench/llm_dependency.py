"""The model dependency's targets (issue 22), each measured against a baseline in the same run, on one real llm-api
process and one Redis:

1. ``overhead``: ``ChatModel.respond`` (breaker → bulkhead → budget → retry, the span and metrics; and again with
   the shared Redis limiter on) against bare ``ChatOpenAI`` streaming the same answer from the same simulator, in
   alternating blocks so a slower minute slows both; p50 difference in ms and in %.
2. ``rate_limit``: two "replicas" (two ``ChatModel``s, their own HTTP clients, one Redis) offered 3× the
   provider's requests per minute at once: requests over the provider's limit (its 429s in its log), against two
   naive clients doing the same.
3. ``fallback_ttft``: time to first token from the fallback while the primary's breaker is open, against the
   primary's when healthy (both models given the same first-token latency), alternating.
4. ``faults``: turns completed under 30% injected 503s on the primary, with the fallback and without.

Run: ``python -m bench.llm_dependency [--calls 200] [--rpm 30] [--turns 200]``; prints a markdown table and writes
``bench/results/llm_dependency.json``. Say the machine's load with the numbers (it is in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from bench._stack import _delete_prefixed_keys, machine, percentiles, write_results
from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from infra.dependencies import install as install_dependencies
from infra.llm import Budget, ChatModel, ModelError, Usage
from infra.redis import create_redis
from infra.settings import Settings
from resilience import OverloadedError, budget_scope, bulkhead_registry, circuit_registry
from tests.llm import TOOLS, chat_model
from tests.procs import Processes

KEY = "sk-bench-llm-0123456789abcdef"
ADMIN_TOKEN = "bench-admin-token-0123456789"
SECRET = "bench-service-secret-0123456789abcdef"
TOOL_SCHEMAS = [convert_to_openai_tool(t) for t in TOOLS]
HELLO: list[BaseMessage] = [HumanMessage("hello")]
RESULTS = Path(__file__).resolve().parent / "results" / "llm_dependency.json"


class Quiet:
    async def token(self, text: str, attempt: int) -> None:
        return None

    async def switched(self, reason: str, from_model: str, to_model: str, attempt: int) -> None:
        return None


class FirstToken(Quiet):
    def __init__(self) -> None:
        self.at: float | None = None

    async def token(self, text: str, attempt: int) -> None:
        if self.at is None:
            self.at = time.perf_counter()


class Sim:
    def __init__(self, url: str, redis_url: str, prefix: str) -> None:
        self.url = url
        self.redis_url = redis_url
        self.prefix = prefix
        self.admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def fault(self, **faults: Any) -> None:
        httpx.put(f"{self.url}/admin/faults", json=faults, headers=self.admin).raise_for_status()

    def reset(self) -> None:
        for path in ("faults", "requests"):
            httpx.delete(f"{self.url}/admin/{path}", headers=self.admin).raise_for_status()

    def log(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/admin/requests", headers=self.admin)
        response.raise_for_status()
        return list(response.json()["requests"])

    def settings(self, **env: Any) -> Settings:
        values: dict[str, Any] = {
            "LLM_BASE_URL": f"{self.url}/v1",
            "LLM_API_URL": self.url,  # the simulator: today's limits, not a local model's (Settings.llm_limits)
            "LLM_API_KEY": KEY,
            "REDIS_URL": self.redis_url,
            "CONCIERGE_KEY_PREFIX": f"{self.prefix}-{uuid.uuid4().hex[:6]}",
        }
        values.update(env)
        return Settings(**values)


@contextmanager
def simulator(redis_url: str) -> Iterator[Sim]:
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    env = {
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": prefix,
        "CONCIERGE_SERVICE_SECRET": SECRET,
        "CONCIERGE_ADMIN_TOKEN": ADMIN_TOKEN,
        "LLM_API_KEY": KEY,
    }
    with tempfile.TemporaryDirectory(prefix="bench-llm-") as tmp, Processes(Path(tmp), env=env) as procs:
        try:
            yield Sim(procs.serve("llm-api", timeout=120).url, redis_url, prefix)
        finally:
            _delete_prefixed_keys(redis_url, prefix)


async def respond(model: ChatModel, events: Any = None) -> Any:
    return await model.respond(
        HELLO, TOOL_SCHEMAS, budget=Budget(), events=events or Quiet(), spent_turn=Usage(), spent_chat=Usage()
    )


async def bare(chat: Any) -> None:
    full = None
    async for chunk in chat.astream(HELLO):
        full = chunk if full is None else full + chunk
    assert full is not None and full.content


# ------------------------------------------------------------------------------------------------ 1. overhead


async def overhead(sim: Sim, calls: int) -> dict[str, Any]:
    """Each call on each side in turn (A B C A B C ...), so drift hits all alike; wall time and this process's CPU
    time per call (the simulator is another process: the CPU is the client's own work, which a loaded machine
    disturbs far less than the wall clock)."""
    sim.reset()
    plain = chat_model(f"{sim.url}/v1", KEY).bind_tools(TOOL_SCHEMAS)
    redis = create_redis(sim.redis_url)
    ours = ChatModel(sim.settings())
    limited = ChatModel(sim.settings(LLM_RPM=1_000_000, LLM_TPM=100_000_000), redis)
    sides: dict[str, list[float]] = {"bare": [], "layers": [], "layers_limiter": []}
    cpu: dict[str, list[float]] = {side: [] for side in sides}

    async def timed(side: str) -> None:
        begun, begun_cpu = time.perf_counter(), time.process_time()
        if side == "bare":
            await bare(plain)
        else:
            await respond(ours if side == "layers" else limited)
        sides[side].append(time.perf_counter() - begun)
        cpu[side].append(time.process_time() - begun_cpu)

    for _ in range(5):  # warm every path
        for side in sides:
            await timed(side)
    for side in sides:
        sides[side].clear()
        cpu[side].clear()
    order = list(sides)
    for i in range(calls):
        for side in order if i % 2 == 0 else reversed(order):
            await timed(side)
    await ours.aclose()
    await limited.aclose()
    await redis.aclose()
    base = statistics.median(sides["bare"])
    base_cpu = statistics.fmean(cpu["bare"])
    result: dict[str, Any] = {side: percentiles(values, scale=1000) for side, values in sides.items()}
    for side in sides:
        result[f"{side}_cpu_ms"] = 1000 * statistics.fmean(cpu[side])
    for side in ("layers", "layers_limiter"):
        cost = statistics.median(sides[side]) - base
        result[f"{side}_cost_ms"] = cost * 1000
        result[f"{side}_cost_pct"] = 100 * cost / base
        result[f"{side}_cpu_cost_ms"] = 1000 * (statistics.fmean(cpu[side]) - base_cpu)
    result["calls_per_side"] = len(sides["bare"])
    return result


# ------------------------------------------------------------------------------------------------ 2. rate limit


async def rate_limit(sim: Sim, rpm: int, window_s: float = 60.0) -> dict[str, Any]:
    """3 × ``rpm`` turns arriving evenly over ``window_s`` (60: three times the provider's rate for a minute)."""
    offered = 3 * rpm
    gap = window_s / offered
    result: dict[str, Any] = {"rpm": rpm, "offered": offered, "window_s": window_s}
    # naive: two clients, nobody counting
    sim.reset()
    sim.fault(model=PRIMARY_MODEL, rpm=rpm)
    naive = [chat_model(f"{sim.url}/v1", KEY) for _ in range(2)]

    async def naive_turn(i: int) -> str:
        await asyncio.sleep(i * gap)
        try:
            await bare(naive[i % 2])
        except Exception:  # the provider's 429: exactly what this side does not prevent
            return "refused_by_provider"
        return "answered"

    outcomes = await asyncio.gather(*(naive_turn(i) for i in range(offered)))
    entries = sim.log()
    result["naive"] = {
        "answered": outcomes.count("answered"),
        "over_limit_requests": sum(1 for e in entries if e["status"] == 429),
        "reached_provider": len(entries),
    }
    # ours: two replicas sharing the limiter; the door's check first, as concierge-agent does
    sim.reset()
    sim.fault(model=PRIMARY_MODEL, rpm=rpm)
    prefix = f"{sim.prefix}-shared"
    clients = [create_redis(sim.redis_url) for _ in range(2)]
    replicas = [ChatModel(sim.settings(LLM_RPM=rpm, CONCIERGE_KEY_PREFIX=prefix), c) for c in clients]

    async def turn(i: int) -> str:
        model = replicas[i % 2]
        await asyncio.sleep(i * gap)
        with budget_scope(8):
            try:
                await model.check_capacity(8)
                await respond(model)
            except OverloadedError:
                return "refused_at_door"
            except ModelError:
                return "refused_in_turn"
        return "answered"

    outcomes = await asyncio.gather(*(turn(i) for i in range(offered)))
    entries = sim.log()
    result["ours"] = {
        "answered": outcomes.count("answered"),
        "refused_at_door": outcomes.count("refused_at_door"),
        "refused_in_turn": outcomes.count("refused_in_turn"),
        "over_limit_requests": sum(1 for e in entries if e["status"] == 429),
        "reached_provider": len(entries),
    }
    for model in replicas:
        await model.aclose()
    for client in clients:
        await client.aclose()
    return result


# ------------------------------------------------------------------------------------------------ 3. fallback TTFT


async def fallback_ttft(sim: Sim, calls: int, latency: float = 0.05, block: int = 10) -> dict[str, Any]:
    sim.reset()
    sim.fault(model=None, first_token_latency_s=latency)
    healthy = ChatModel(sim.settings(LLM_FALLBACK_MODEL=FALLBACK_MODEL))
    sides: dict[str, list[float]] = {"primary_healthy": [], "fallback_breaker_open": []}
    models: dict[str, str] = {}

    async def timed(side: str) -> None:
        breaker = circuit_registry.get("llm_primary")
        if side == "fallback_breaker_open":
            _open(breaker)
        else:
            breaker.reset()
        events = FirstToken()
        begun = time.perf_counter()
        reply = await respond(healthy, events)
        assert events.at is not None
        sides[side].append(events.at - begun)
        models[side] = reply.model

    for side in sides:
        await timed(side)
    for values in sides.values():
        values.clear()
    order = list(sides)
    for i in range(max(1, calls // block)):
        for side in order if i % 2 == 0 else reversed(order):
            for _ in range(block):
                await timed(side)
    circuit_registry.get("llm_primary").reset()
    await healthy.aclose()
    result: dict[str, Any] = {side: percentiles(values, scale=1000) for side, values in sides.items()}
    result["ratio_p50"] = statistics.median(sides["fallback_breaker_open"]) / statistics.median(
        sides["primary_healthy"]
    )
    result["models"] = models
    result["first_token_latency_s"] = latency
    return result


def _open(breaker: Any) -> None:
    # as five failures would: the breaker's own path to OPEN
    breaker.reset()
    while breaker.state.value != "open":
        breaker.record_exception(RuntimeError("bench"), breaker.admit())


# ------------------------------------------------------------------------------------------------ 4. faults


async def faults(sim: Sim, turns: int, concurrency: int = 10) -> dict[str, Any]:
    result: dict[str, Any] = {"turns": turns, "primary_503_rate": 0.3}
    for side, env in (("with_fallback", {"LLM_FALLBACK_MODEL": FALLBACK_MODEL}), ("without_fallback", {})):
        sim.reset()
        circuit_registry.clear()
        bulkhead_registry.clear()
        sim.fault(model=PRIMARY_MODEL, error_status=503, error_rate=0.3)
        model = ChatModel(sim.settings(**env))
        gate = asyncio.Semaphore(concurrency)

        async def turn(m: ChatModel = model, gate: asyncio.Semaphore = gate) -> str:
            async with gate:
                with budget_scope(30):
                    try:
                        reply = await respond(m)
                    except ModelError:
                        return "failed"
                return reply.model

        outcomes = await asyncio.gather(*(turn() for _ in range(turns)))
        await model.aclose()
        completed = sum(1 for o in outcomes if o != "failed")
        result[side] = {
            "completed": completed,
            "completion": completed / turns,
            "by_model": {m: outcomes.count(m) for m in (PRIMARY_MODEL, FALLBACK_MODEL)},
            "requests": len(sim.log()),
        }
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    load_before = os.getloadavg()
    result: dict[str, Any] = {"machine": machine(), "loadavg_before": load_before}
    install_dependencies()  # the model's endpoints take their layers from the dependency table
    with simulator(redis_url) as sim:
        circuit_registry.clear()
        wanted = set(args.only.split(",")) if args.only else {"overhead", "rate_limit", "fallback_ttft", "faults"}
        if "overhead" in wanted:
            result["overhead"] = await overhead(sim, args.calls)
        if "rate_limit" in wanted:
            result["rate_limit"] = await rate_limit(sim, args.rpm, args.window)
        circuit_registry.clear()
        if "fallback_ttft" in wanted:
            result["fallback_ttft"] = await fallback_ttft(sim, args.calls // 2)
        if "faults" in wanted:
            result["faults"] = await faults(sim, args.turns)
    result["loadavg_after"] = os.getloadavg()
    return result


def table(result: dict[str, Any]) -> str:
    rows = ["| measure | target | measured |", "|---|---|---|"]
    if "overhead" in result:
        o = result["overhead"]
        rows.append(
            f"| layers' cost on a model call vs. bare `ChatOpenAI`, p50 | ≤ 1 ms and ≤ 2% | "
            f"{o['layers_cost_ms']:+.2f} ms ({o['layers_cost_pct']:+.1f}%) on {o['bare']['p50']:.1f} ms, client CPU "
            f"{o['layers_cpu_cost_ms']:+.2f} ms a call; with the Redis limiter {o['layers_limiter_cost_ms']:+.2f} ms "
            f"({o['layers_limiter_cost_pct']:+.1f}%), CPU {o['layers_limiter_cpu_cost_ms']:+.2f} ms |"
        )
    if "rate_limit" in result:
        r = result["rate_limit"]
        rows.append(
            f"| 2 replicas at 3× the provider's {r['rpm']} rpm: requests over the limit | 0 (naive shown) | "
            f"{r['ours']['over_limit_requests']} (naive: {r['naive']['over_limit_requests']} of "
            f"{r['naive']['reached_provider']}); answered {r['ours']['answered']}, refused at the door "
            f"{r['ours']['refused_at_door']}, in the turn {r['ours']['refused_in_turn']} |"
        )
    if "fallback_ttft" in result:
        f = result["fallback_ttft"]
        rows.append(
            f"| breaker open → first token from the fallback vs. the healthy primary, p50 | ≤ 1.1× | "
            f"{f['ratio_p50']:.3f}× ({f['fallback_breaker_open']['p50']:.1f} vs {f['primary_healthy']['p50']:.1f} ms) |"
        )
    if "faults" in result:
        x = result["faults"]
        rows.append(
            f"| turns completed under 30% 503s on the primary, with fallback | ≥ 99% | "
            f"{100 * x['with_fallback']['completion']:.1f}% (without: {100 * x['without_fallback']['completion']:.1f}%) |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rpm", type=int, default=30)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--only", default="", help="comma-separated: overhead,rate_limit,fallback_ttft,faults")
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which 3 × rpm turns arrive")
    measured = asyncio.run(main(parser.parse_args()))
    print(table(measured))
    print(f"load average before {measured['loadavg_before']}, after {measured['loadavg_after']}")
    write_results(RESULTS, measured)
