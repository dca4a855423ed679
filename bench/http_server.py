"""What the services' bounded server costs a request, against uvicorn's httptools, in the same run.

Run: ``python -m bench.http_server [--requests 1000]``. Starts one small FastAPI app twice, as real processes: once
the way every service is served (``python -m infra.service.server``: h11 with the header cap and deadlines), once
with uvicorn's defaults (httptools, no bounds). Requests alternate one by one between the two, over one pooled
client each, in the shapes of the booking path: a small ``GET`` (health, status reads), a ``POST`` of a 2 KB JSON
body with a 3 KB answer (the A2A calls, ``POST /bookings``) and a short event stream (A2A streaming, journals).
Prints the p50 of each shape on each server, the paired difference, and that difference times the requests of one
booking. Writes ``bench/results/http_server.json``. No target: the booking path's p50 is the issue's (issue 42).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from bench._stack import machine, write_results
from tests.procs import HOST, REPO_ROOT, Processes, free_port

RESULTS = Path(__file__).resolve().parent / "results" / "http_server.json"
REQUESTS_PER_BOOKING = 10
"""HTTP requests one booking makes across the services: the client's POST and long-poll, booking-agent's A2A calls
to search-agent and payment-agent, their calls to hotel-api and payment-api, reserve and confirm at hotel-api."""


def app() -> FastAPI:
    """The app both servers serve: the three request shapes, no framework work beyond FastAPI's own."""
    served = FastAPI()

    @served.get("/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @served.get("/small")
    async def small() -> dict[str, str]:
        return {"status": "confirmed"}

    @served.post("/json")
    async def post_json(request: Request) -> dict[str, Any]:
        body = await request.json()
        return {"n": len(body["text"]), "answer": "a" * 3000}

    @served.get("/stream")
    async def stream() -> StreamingResponse:
        async def events() -> Any:
            for i in range(5):
                yield f"data: {json.dumps({'i': i, 'pad': 'p' * 200})}\n\n"
                await asyncio.sleep(0)

        return StreamingResponse(events(), media_type="text/event-stream")

    return served


def _once(client: httpx.Client, shape: str) -> None:
    if shape == "small":
        client.get("/small").raise_for_status()
    elif shape == "json":
        client.post("/json", json={"text": "t" * 2000}).raise_for_status()
    else:
        with client.stream("GET", "/stream") as response:
            for _ in response.iter_lines():
                pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="requests per shape and server (default 1000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Processes(Path(tmp)) as procs:
        bounded = procs.uvicorn("bench.http_server:app", factory=True, access_log=False, name="bounded")
        port = free_port()
        stock = procs.start(
            "httptools",
            [
                *(sys.executable, "-m", "uvicorn", "bench.http_server:app", "--factory", "--app-dir", str(REPO_ROOT)),
                *("--host", HOST, "--port", str(port), "--no-access-log", "--http", "httptools"),
            ],
            port=port,
        )
        servers = {"bounded h11": bounded.url, "httptools": stock.url}
        rows: dict[str, dict[str, Any]] = {}
        with httpx.Client(base_url=servers["bounded h11"]) as a, httpx.Client(base_url=servers["httptools"]) as b:
            for shape in ("small", "json", "stream"):
                times: dict[str, list[float]] = {"bounded h11": [], "httptools": []}
                diffs: list[float] = []
                for i in range(args.requests + 50):
                    pair = []
                    order = (("bounded h11", a), ("httptools", b)) if i % 2 else (("httptools", b), ("bounded h11", a))
                    for name, client in order:
                        started = time.perf_counter()
                        _once(client, shape)
                        elapsed = (time.perf_counter() - started) * 1000
                        if i >= 50:  # warm-up: pools, caches
                            times[name].append(elapsed)
                            pair.append((name, elapsed))
                    if i >= 50:
                        by = dict(pair)
                        diffs.append(by["bounded h11"] - by["httptools"])
                rows[shape] = {
                    "bounded_p50_ms": statistics.median(times["bounded h11"]),
                    "httptools_p50_ms": statistics.median(times["httptools"]),
                    "paired_diff_p50_ms": statistics.median(diffs),
                }
    print("| request | bounded h11 p50 ms | httptools p50 ms | paired Δ ms |")
    print("|---|---:|---:|---:|")
    for shape, row in rows.items():
        print(
            f"| {shape} | {row['bounded_p50_ms']:.3f} | {row['httptools_p50_ms']:.3f} | "
            f"{row['paired_diff_p50_ms']:+.3f} |"
        )
    worst = max(row["paired_diff_p50_ms"] for row in rows.values())
    print(
        f"\nat most {worst:+.3f} ms a request: {worst * REQUESTS_PER_BOOKING:+.2f} ms on a booking's "
        f"{REQUESTS_PER_BOOKING} requests"
    )
    write_results(RESULTS, {"machine": machine(), "requests": args.requests, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
