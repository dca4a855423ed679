"""How long a service takes from exec to ``GET /health/ready`` answering 200, against a bare FastAPI app under
uvicorn started the same way in the same run (the floor: Python, FastAPI and uvicorn, nothing of ours).

Run: ``python -m bench.startup [--rounds 5] [--services NAME ...] [--up]`` (needs Redis at ``REDIS_URL``; services
that checkpoint use SQLite in a temporary data directory, as ``concierge up`` does by default). Each round starts
the bare app (a tiny ``FastAPI()`` with one ``/health/ready`` route, written by the bench into a temporary
directory), the same app running a one-node LangGraph graph (the floor of any service built on LangGraph), then
every service with ``concierge serve <name>`` on a free port, one process at a time, polling readiness every 20 ms;
the process is killed once it answers. The rounds interleave, so a busier minute slows every row. Prints the median
per row and its ratio to the bare app's median (the issue's target: at most 2x), and writes
``bench/results/startup.json``. Next to the wall-clock seconds, the CPU seconds (user + system, from
``/proc/<pid>/stat``) the process had used when it first answered 200: on a machine shared with other work the
wall-clock medians swing with the load, the CPU seconds far less.

``--up`` adds ``concierge up`` in the foreground (until it prints that every service is ready; then SIGTERM, as
Ctrl-C) and ``concierge up --detach`` (which returns once every service is ready, then ``concierge down``), per
round.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from bench._stack import _delete_prefixed_keys, machine, write_results
from identity.people import LOCAL_ISSUER, LocalIssuer
from stack.services import SERVICES
from stack.up import READY_PHRASE
from tests.procs import HOST, concierge_command, free_port, stack_port_base

RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"
BARE = "bare FastAPI"
GRAPH = "bare FastAPI + a one-node LangGraph graph"
UP = "concierge up --detach (all)"
UP_FOREGROUND = "concierge up (all, foreground)"
POLL_S = 0.02
READY_TIMEOUT_S = 120.0
TARGET_RATIO = 2.0

_BARE_APP = """\
from fastapi import FastAPI

app = FastAPI()


@app.get("/health/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready"}
"""

_GRAPH_APP = """\
from typing import TypedDict

from fastapi import FastAPI
from langgraph.graph import START, StateGraph


class State(TypedDict):
    n: int


builder = StateGraph(State)
builder.add_node("step", lambda state: {"n": state["n"] + 1})
builder.add_edge(START, "step")
graph = builder.compile()
app = FastAPI()


@app.get("/health/ready")
async def ready() -> dict[str, str]:
    return {"status": "ready", "n": str((await graph.ainvoke({"n": 0}))["n"])}
"""
"""The floor of any service that runs a LangGraph graph: the bare app plus ``langgraph`` imported and one graph
compiled (LangGraph's own imports include langsmith and langgraph_sdk, which no setting skips)."""


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used (``/proc``; None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(proc: subprocess.Popen[bytes], url: str, started: float, log: Path) -> tuple[float, float | None]:
    """Seconds from ``started`` to the first 200 of ``url``, and the CPU seconds the process had used by then;
    raises with the log tail if the process dies first."""
    deadline = started + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{url} exited with {proc.returncode} before it was ready:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return time.monotonic() - started, _cpu_seconds(proc.pid)
            time.sleep(POLL_S)
    raise RuntimeError(f"{url} not ready after {READY_TIMEOUT_S:.0f} s")


def _time_start(argv: Sequence[str], env: Mapping[str, str], url: str, log: Path) -> tuple[float, float | None]:
    """Exec ``argv``, wait for ``url`` to answer 200, kill the process group: the seconds to ready, and the CPU
    seconds used by then."""
    with log.open("ab") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        return _wait_ready(proc, url, started, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def _time_up(env: Mapping[str, str], data_dir: Path, log: Path) -> float:
    """``concierge up --detach`` (returns once every service is ready), then ``concierge down``."""
    up_env = {**env, "CONCIERGE_DATA_DIR": str(data_dir)}
    argv = [*concierge_command(), "up", "--detach", "--port-base", str(stack_port_base())]
    with log.open("ab") as out:
        started = time.monotonic()
        code = subprocess.call(argv, env=up_env, stdout=out, stderr=out)
        elapsed = time.monotonic() - started
        subprocess.call([*concierge_command(), "down"], env=up_env, stdout=out, stderr=out)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"concierge up --detach exited with {code}:\n{tail}")
    return elapsed


def _time_up_foreground(env: Mapping[str, str], data_dir: Path, log: Path) -> float:
    """``concierge up`` as a person runs it, until it prints that every service is ready; then SIGTERM, which stops
    the stack as Ctrl-C does."""
    up_env = {**env, "CONCIERGE_DATA_DIR": str(data_dir)}
    argv = [*concierge_command(), "up", "--port-base", str(stack_port_base())]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=up_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0
    )
    assert proc.stdout is not None
    seen, elapsed = b"", None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while elapsed is None and time.monotonic() < started + READY_TIMEOUT_S:
                if not selector.select(timeout=POLL_S):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break  # it exited
                seen += chunk
                if READY_PHRASE.encode() in seen:
                    elapsed = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rest, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        log.write_bytes(seen + (rest or b""))
    if elapsed is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise RuntimeError(f"concierge up never said {READY_PHRASE!r}:\n{tail}")
    return elapsed


def _env(workdir: Path, redis_url: str, prefix: str) -> dict[str, str]:
    """What ``concierge serve`` needs (a secret, Redis, a data directory), nothing else of a developer's."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CONCIERGE_", "DATABASE_URL"))}
    issuer = LocalIssuer(workdir / "issuer", LOCAL_ISSUER)  # people's tokens checked as `concierge up` has them
    return keep | {
        "CONCIERGE_AUTH_ISSUER": issuer.issuer,
        "CONCIERGE_AUTH_JWKS_FILE": str(issuer.jwks_path),
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": prefix,
        "CONCIERGE_SERVICE_SECRET": secrets.token_hex(32),
        "CONCIERGE_ADMIN_TOKEN": secrets.token_urlsafe(24),
        "LLM_API_KEY": f"sk-bench-{secrets.token_urlsafe(16)}",
        "CONCIERGE_DATA_DIR": str(workdir / "data"),
        "PYTHONUNBUFFERED": "1",
    }


def _cpu_stats(values: Sequence[float], floor: float | None) -> dict[str, Any]:
    if not values or not floor:
        return {}
    median = statistics.median(values)
    return {"cpu_median_s": round(median, 3), "cpu_ratio": round(median / floor, 2), "cpu_samples_s": list(values)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts per row (default 5)")
    parser.add_argument("--services", nargs="+", default=list(SERVICES), help="services to start (default: all)")
    parser.add_argument(
        "--up", action="store_true", help="also time concierge up, foreground and --detach, until all are ready"
    )
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    unknown = [name for name in options.services if name not in SERVICES]
    if unknown or options.rounds < 1:
        parser.error(f"unknown services {unknown}" if unknown else "--rounds must be at least 1")

    rows = [BARE, GRAPH, *options.services, *([UP_FOREGROUND, UP] if options.up else [])]
    samples: dict[str, list[float]] = {row: [] for row in rows}
    cpu_samples: dict[str, list[float]] = {row: [] for row in rows}
    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="concierge-startup-") as tmp:
        workdir = Path(tmp)
        (workdir / "bare_app.py").write_text(_BARE_APP, encoding="utf-8")
        (workdir / "graph_app.py").write_text(_GRAPH_APP, encoding="utf-8")
        env = _env(workdir, options.redis_url, prefix)
        try:
            for n in range(options.rounds):
                for row in rows:
                    port = free_port()
                    log = workdir / f"{row.replace(' ', '_')}.log"
                    if row in (BARE, GRAPH):
                        module = "bare_app" if row == BARE else "graph_app"
                        app_argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--app-dir", str(workdir)]
                        cmd = [*app_argv, "--host", HOST, "--port", str(port), "--lifespan", "on"]
                        seconds, cpu = _time_start(cmd, env, f"http://{HOST}:{port}/health/ready", log)
                    elif row == UP:
                        seconds, cpu = _time_up(env, workdir / f"up-{n}", log), None  # many processes: no one CPU
                    elif row == UP_FOREGROUND:
                        seconds, cpu = _time_up_foreground(env, workdir / f"upf-{n}", log), None
                    else:
                        cmd = [*concierge_command(), "serve", row, "--host", HOST, "--port", str(port)]
                        url = f"http://{HOST}:{port}{SERVICES[row].ready_path}"
                        seconds, cpu = _time_start(cmd, env, url, log)
                    samples[row].append(seconds)
                    if cpu is not None:
                        cpu_samples[row].append(cpu)
                    said = f"{seconds:.2f} s" + (f" ({cpu:.2f} s CPU)" if cpu is not None else "")
                    print(f"round {n + 1}/{options.rounds} {row}: {said}", file=sys.stderr, flush=True)
        finally:
            _delete_prefixed_keys(options.redis_url, prefix)

    floor = statistics.median(samples[BARE])
    cpu_floor = statistics.median(cpu_samples[BARE]) if cpu_samples[BARE] else None
    result: dict[str, Any] = {
        "machine": machine(),
        "loadavg_before": load_before,
        "rounds": options.rounds,
        "runtime_s": round(time.monotonic() - started, 1),
        "rows": {
            row: {
                "median_s": round(statistics.median(values), 3),
                "min_s": round(min(values), 3),
                "max_s": round(max(values), 3),
                "ratio": round(statistics.median(values) / floor, 2),
                "samples_s": [round(v, 3) for v in values],
                **_cpu_stats(cpu_samples[row], cpu_floor),
            }
            for row, values in samples.items()
        },
    }
    print(
        f"\n| start-up (exec → /health/ready 200), {options.rounds} rounds | median (s) | min / max (s) | ×bare "
        "| CPU median (s) | CPU ×bare |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row, stats in result["rows"].items():
        cpu_cells = f"{stats['cpu_median_s']:.2f} | {stats['cpu_ratio']:.1f}" if "cpu_median_s" in stats else "– | –"
        print(
            f"| {row} | {stats['median_s']:.2f} | {stats['min_s']:.2f} / {stats['max_s']:.2f} | {stats['ratio']:.1f} "
            f"| {cpu_cells} |"
        )
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\nload average before: {', '.join(f'{v:.2f}' for v in load_before)}; after: {load}")
    print(f"target: every service at most {TARGET_RATIO:.0f}x the bare app")
    write_results(options.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
