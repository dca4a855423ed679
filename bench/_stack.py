"""What a bench needs beyond the test harness (``tests.procs``, ``tests.stack``): a stack that leaves nothing behind
in a shared Redis, a bare FastAPI→FastAPI pair as a baseline, and CPU/memory readings from ``/proc``.

    with service_stack(redis_url=..., admin_database_url=...) as stack:   # a started tests.stack.Stack
        stack.url("booking-agent"); stack.env["DATABASE_URL"]; stack.services["hotel-api"].pid
    with hop_pair() as hop:                                               # GET {hop.front}/hop makes one hop
        ...                                                               # and answers how long it took

Leaving either block kills every process it started (SIGKILL to the process group), and ``service_stack`` also
drops the database, deletes the Redis keys under the prefix and removes the log directory.

The two ``hop_*_app`` factories are what ``hop_pair`` serves (``uvicorn --factory bench._stack:hop_front_app``,
started by ``tests.procs.Processes.uvicorn`` from the repository root); they are as small as a FastAPI app gets, so a
request to the front costs the framework and the loopback, nothing else. The ``a2a_*_app`` factories are
``bench.a2a_overhead``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from infra.redis import create_sync_redis
from tests.procs import HOST, Processes, ServiceProcess, free_port
from tests.stack import CORE, TEST_DATABASE_URL, Stack, fresh_database

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "HopPair",
    "a2a_inline_app",
    "a2a_sdk_app",
    "bench_app",
    "cpu_seconds",
    "hop_backend_app",
    "hop_front_app",
    "hop_pair",
    "machine",
    "machine_cpu_seconds",
    "percentiles",
    "rss_kib",
    "service_stack",
    "write_results",
]

HOP_TARGET_ENV = "BENCH_HOP_TARGET"


def percentiles(values: Sequence[float], *, scale: float = 1.0) -> dict[str, float]:
    """p50/p95/p99/mean/max of ``values`` times ``scale`` (``scale=1000``: seconds in, milliseconds out; empty → NaN)."""
    if not values:
        return {k: float("nan") for k in ("p50", "p95", "p99", "mean", "max")}
    if len(values) == 1:
        return dict.fromkeys(("p50", "p95", "p99", "mean", "max"), values[0] * scale)
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50": cuts[49] * scale,
        "p95": cuts[94] * scale,
        "p99": cuts[98] * scale,
        "mean": statistics.fmean(values) * scale,
        "max": max(values) * scale,
    }


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise ProcessLookupError(f"process {pid} has no VmRSS (a zombie?)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (``/proc/<pid>/stat``, children not included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        # the command name (field 2) may hold spaces; the fields after its closing parenthesis do not
        fields = stat.read().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all CPUs (``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def machine() -> dict[str, Any]:
    """What a result file says about where it was measured."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg": os.getloadavg(),
    }


def write_results(path: Path, result: Mapping[str, Any]) -> None:
    """``result`` as indented JSON at ``path`` (folders created), and a line saying where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}")


def _delete_prefixed_keys(redis_url: str, prefix: str) -> None:
    """Best effort: the bench's Redis may be shared, but a failure here must not hide the run's own error."""
    with contextlib.suppress(Exception), contextlib.closing(create_sync_redis(redis_url)) as client:
        batch: list[str] = []
        for name in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)


@contextlib.contextmanager
def service_stack(
    *,
    redis_url: str,
    admin_database_url: str = TEST_DATABASE_URL,
    env: Mapping[str, str] | None = None,
    services: Sequence[str] = CORE,
) -> Iterator[Stack]:
    """``services`` (the five by default) started on a fresh ``concierge_bench_*`` database and a ``bench-*`` key
    prefix.

    No span files: their synchronous export would be part of every number measured. ``env`` is added to the
    services' environment.
    """
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    # unwound in reverse: processes killed, then the database dropped, the keys deleted, the logs removed
    with contextlib.ExitStack() as cleanup:
        workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="concierge-bench-")))
        cleanup.callback(_delete_prefixed_keys, redis_url, prefix)
        database = cleanup.enter_context(fresh_database(admin_database_url, name_prefix="concierge_bench"))
        stack = cleanup.enter_context(
            Stack(workdir, redis_url, database_url=database, key_prefix=prefix, span_files=False, env=env)
        )
        # dependencies first: an agent's readiness does not probe its peers, but its first request will
        yield stack.start(tuple(services))


# --------------------------------------------------------------------------------------------- bare hop baseline


def hop_backend_app() -> FastAPI:
    """Answers ``GET /pong`` with a small JSON body."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/pong")
    async def pong() -> dict[str, bool]:
        return {"pong": True}

    return app


def hop_front_app() -> FastAPI:
    """``GET /hop`` calls the backend (``$BENCH_HOP_TARGET``) once over a pooled httpx client.

    It answers ``{"pong": true, "hop_s": ...}``: the call timed where a service times its own calls, from sending
    the request to holding the decoded answer. That is one FastAPI→FastAPI hop; the caller's request to the front
    is another leg, a client's, which the caller prices separately (``GET {backend}/pong``).
    """
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    target = os.environ[HOP_TARGET_ENV]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=target) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/hop")
    async def hop() -> Any:
        start = time.perf_counter()
        response = await app.state.client.get("/pong")
        response.raise_for_status()
        answer = response.json()
        return {**answer, "hop_s": time.perf_counter() - start}

    return app


def _a2a_echo_app(*, inline_send: bool) -> FastAPI:
    """An agent with one skill that returns its input, and ``POST /echo`` doing the same as plain JSON.

    Both sit behind the same service token check (audience ``bench-echo``), so the difference between them is what
    A2A itself costs.
    """
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import JSONResponse

    from infra.a2a.server import Skill, mount_a2a, token_ok
    from resilience import BulkheadConfig, bulkhead_registry

    bulkhead_registry.configure("bench_echo", BulkheadConfig(max_concurrent=64, timeout=10))

    async def echo(payload: dict[str, Any]) -> dict[str, Any]:
        return {"echo": payload}

    app = FastAPI()
    mount_a2a(
        app,
        name="bench-echo",
        description="Echoes its input.",
        url="http://127.0.0.1",
        skills=[Skill("echo", "Echo", "Returns its input.", echo)],
        bulkhead="bench_echo",
        inline_send=inline_send,
    )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def plain(request: Request) -> JSONResponse:
        if not token_ok(request.headers.get("authorization"), "bench-echo"):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return JSONResponse(await echo(await request.json()))

    # a Starlette route: FastAPI cannot resolve a locally imported ``Request`` annotation under postponed evaluation
    app.router.add_route("/echo", plain, methods=["POST"])
    return app


def a2a_inline_app() -> FastAPI:
    """``_a2a_echo_app`` as the agents mount it: a blocking send runs the skill inline."""
    return _a2a_echo_app(inline_send=True)


def a2a_sdk_app() -> FastAPI:
    """``_a2a_echo_app`` with every request through the SDK's generic request handler."""
    return _a2a_echo_app(inline_send=False)


@dataclass(frozen=True)
class HopPair:
    front: str
    """``GET {front}/hop`` makes one hop to the backend and answers its duration (``hop_s``)."""
    backend: str
    """``GET {backend}/pong`` answers directly (no hop)."""
    pids: tuple[int, int]
    """(front, backend)"""


def bench_app(procs: Processes, factory: str, *, port: int | None = None) -> ServiceProcess:
    """``factory`` of this module served by its own uvicorn process, ready once ``GET /health`` answers.

    The same server stack as the services: uvicorn's defaults (uvloop and httptools when installed), no access log
    (the services run without it, see ``CONCIERGE_ACCESS_LOG``).
    """
    return procs.uvicorn(
        f"bench._stack:{factory}",
        factory=True,
        access_log=False,
        name=factory.removesuffix("_app").replace("_", "-"),
        port=port,
        ready_path="/health",
    )


@contextlib.contextmanager
def hop_pair() -> Iterator[HopPair]:
    """Two uvicorn processes, front → backend; yields their base URLs. Both killed on exit."""
    backend_port, front_port = free_port(), free_port()
    env = {HOP_TARGET_ENV: f"http://{HOST}:{backend_port}"}
    with (
        tempfile.TemporaryDirectory(prefix="concierge-bench-hop-") as workdir,
        Processes(Path(workdir), env=env) as procs,
    ):
        backend = bench_app(procs, "hop_backend_app", port=backend_port)
        front = bench_app(procs, "hop_front_app", port=front_port)
        yield HopPair(front=front.url, backend=backend.url, pids=(front.pid, backend.pid))


CORE_READY_TIMEOUT_S = 180.0
"""Longer than the harness's 30 s: on a busy shared machine starting one service has taken more."""


def core_stack(cleanup: contextlib.ExitStack, redis_url: str, admin_database_url: str, env: dict[str, str]) -> Stack:
    """The five core services on a fresh database and a temporary directory, gone with ``cleanup``; started side
    by side, each given ``CORE_READY_TIMEOUT_S`` to be ready."""
    workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="concierge-bench-")))
    database = cleanup.enter_context(fresh_database(admin_database_url, name_prefix="concierge_bench"))
    stack = cleanup.enter_context(Stack(workdir, redis_url, database_url=database, span_files=False, env=env))
    for service in CORE:
        stack.serve(service, wait=False)
    for service in CORE:
        stack.services[service].wait_ready(timeout=CORE_READY_TIMEOUT_S)
    return stack
