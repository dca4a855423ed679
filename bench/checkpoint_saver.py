"""What a ``durability="sync"`` graph run costs with LangGraph's ``AsyncPostgresSaver`` and with ours.

Run: ``python -m bench.checkpoint_saver [--runs N] [--rounds R]``. Creates a fresh database, compiles the same
five-node graph (the booking saga's shape: ``search → reserve → charge → confirm → finish``, each node returning a
few fields, one of them a list of offers) once per saver, both on one connection pool configured as the services
configure theirs, and runs it one thread at a time, the savers alternating round by round. Prints a markdown table
(p50 wall time and CPU per run) and writes ``bench/results/checkpoint_saver.json``; the database is dropped at the
end.

Claim checked: ``PooledPostgresSaver`` (``infra/pooled_saver.py``) makes a run cheaper than the base class, in
wall time and in CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph

from bench._stack import machine, percentiles, write_results
from infra.checkpointer import open_checkpointer
from infra.pooled_saver import PooledPostgresSaver
from tests.stack import TEST_DATABASE_URL, fresh_database

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_saver.json"
NODES = ("search", "reserve", "charge", "confirm", "finish")


class State(TypedDict, total=False):
    booking_id: str
    city: str
    offers: list[dict[str, Any]]
    step: str
    count: int


def build(saver: BaseCheckpointSaver[str]) -> Any:
    builder = StateGraph(State)
    for name in NODES:

        async def node(state: State, name: str = name) -> dict[str, Any]:
            offers = [{"hotel_id": f"h{i}", "price": 100.0 + i, "name": f"Hotel {i}"} for i in range(3)]
            return {"step": name, "count": state.get("count", 0) + 1, "offers": offers}

        builder.add_node(name, node)
    builder.add_edge(START, NODES[0])
    for current, following in itertools.pairwise(NODES):
        builder.add_edge(current, following)
    builder.add_edge(NODES[-1], END)
    return builder.compile(checkpointer=saver)


async def run_once(graph: Any) -> tuple[float, float]:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    wall, cpu = time.perf_counter(), time.process_time()
    async for _ in graph.astream({"booking_id": "b", "city": "Lisbon"}, config, durability="sync"):
        pass
    return time.perf_counter() - wall, time.process_time() - cpu


async def measure(database_url: str, runs: int, rounds: int) -> dict[str, Any]:
    async with open_checkpointer(database_url) as pooled:
        assert isinstance(pooled, PooledPostgresSaver)
        graphs = {
            "AsyncPostgresSaver (LangGraph)": build(AsyncPostgresSaver(pooled.conn)),
            "PooledPostgresSaver (ours)": build(pooled),
        }
        for graph in graphs.values():  # connections open, statements prepared
            for _ in range(10):
                await run_once(graph)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in graphs}
        for _ in range(rounds):
            for name, graph in graphs.items():
                samples[name] += [await run_once(graph) for _ in range(max(1, runs // rounds))]
    summary = {}
    for name, values in samples.items():
        wall = percentiles([w for w, _ in values], scale=1000)
        cpu = percentiles([c for _, c in values], scale=1000)
        summary[name] = {
            "runs": len(values),
            "wall_p50_ms": wall["p50"],
            "wall_p95_ms": wall["p95"],
            "cpu_mean_ms": cpu["mean"],
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_saver", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400, help="graph runs per saver (default 400)")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds (default 8)")
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args()
    if options.rounds < 1 or options.runs < options.rounds:
        parser.error("--rounds must be at least 1 and --runs at least --rounds")
    with fresh_database(options.admin_database_url, name_prefix="concierge_bench") as url:
        cases = asyncio.run(measure(url, options.runs, options.rounds))
    base, ours = cases.values()
    print(f'# checkpoint saver: five-node graph, durability="sync", {ours["runs"]} runs per saver\n')
    print("| saver | wall p50 ms | wall p95 ms | CPU ms per run |")
    print("|---|---:|---:|---:|")
    for name, row in cases.items():
        print(f"| {name} | {row['wall_p50_ms']:.2f} | {row['wall_p95_ms']:.2f} | {row['cpu_mean_ms']:.2f} |")
    ok = ours["wall_p50_ms"] < base["wall_p50_ms"] and ours["cpu_mean_ms"] < base["cpu_mean_ms"]
    print(
        f"\nours / LangGraph's: wall {ours['wall_p50_ms'] / base['wall_p50_ms']:.2f}×, "
        f"CPU {ours['cpu_mean_ms'] / base['cpu_mean_ms']:.2f}×\n- [{'x' if ok else ' '}] cheaper in wall time and CPU"
    )
    result = {
        "machine": machine(),
        "nodes": list(NODES),
        "cases": cases,
    }
    write_results(options.output, result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
