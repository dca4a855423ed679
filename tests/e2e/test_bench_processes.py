"""The benches start their processes with the test harness: nothing runs the benches in CI, so these check that
what they start still starts (``python -m bench.<name>`` from the repository root)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench import overload
from bench._stack import hop_pair
from tests.procs import serve_in_thread

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def test_hop_pair_serves_the_bench_apps_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the uvicorn processes import ``bench._stack`` from the repository root (``--app-dir``), not from the cwd
    monkeypatch.chdir(tmp_path)
    with hop_pair() as pair:
        assert httpx.get(f"{pair.backend}/pong").json() == {"pong": True}
        hop = httpx.get(f"{pair.front}/hop").json()
        assert hop["pong"] is True
        assert hop["hop_s"] > 0


def test_serve_in_thread_answers_synchronous_callers_and_stops() -> None:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    with serve_in_thread(Starlette(routes=[Route("/echo", echo)])) as url:
        assert httpx.get(f"{url}/echo").json() == {"path": "/echo"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/echo")


@pytest.mark.slow
def test_the_concierge_bench_runs_every_measure_and_counts_no_duplicate(tmp_path: Path) -> None:
    """``python -m bench.concierge`` at its smallest: every section measured on its stack, the table printed, no
    duplicate booking or charge at any kill point (the timing targets are the bench's verdict, not this test's)."""
    out = tmp_path / "concierge.json"
    argv = ["--turns", "2", "--clients", "4", "--kills", "1", "--rounds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.concierge", *argv], capture_output=True, text=True, timeout=900, cwd=REPO
    )
    assert done.returncode in (0, 1), f"{done.stdout}\n{done.stderr}"  # 1: a timing target missed on a busy machine
    result = json.loads(out.read_text())
    assert result["first_token"]["turns"] == 2
    assert result["fanout"]["clients_4"]["complete_clients"] == 4
    assert result["kill"]["kills"] == 1 and result["kill"]["resumed_s"]["max"] > 0
    assert len(result["duplicates"]) == 4
    assert all(p["duplicate_bookings"] == 0 and p["duplicate_charges"] == 0 for p in result["duplicates"].values())
    assert "| kill -9 mid-turn" in done.stdout


@pytest.mark.slow
def test_the_cascade_bench_contains_a_hung_search_with_the_layers_on(tmp_path: Path) -> None:
    """The issue's containment figures, from a brief hung-search run with the layers on (counts and ratios only)."""
    import json
    import subprocess
    import sys

    output = tmp_path / "cascade.json"
    argv = [sys.executable, "-m", "bench.cascade", "--scenarios", "search-hung", "--arms", "on", "--clients", "3"]
    argv += ["--calm-s", "8", "--fault-s", "12", "--after-s", "20", "--output", str(output), "--plots", str(tmp_path)]
    run = subprocess.run(argv, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(output.read_text())
    entry = result["scenarios"]["search-hung"]
    (arm,) = entry["arms"]
    figures = arm["figures"]
    assert arm["layers"] == "on"
    assert figures["open_seconds"] > 0  # the breaker opened on the hung search
    assert figures["open_settled_seconds"] > 0
    assert figures["calls_held_while_open_max"] == 0  # and while open, no booking held a call to it
    assert figures["sat_a_whole_budget"] == 0  # each attempt cut at its share of the budget
    assert entry["verify"]["exit"] == 0 and not entry["verify"]["disagreements"]  # no accepted booking lost
    for service, vitals in figures["vitals"].items():
        assert vitals["rss_growth"] is not None and vitals["rss_growth"] <= 0.10, (service, vitals)
    # goodput came back once the search did: a 4 s window after the fault at half the calm rate or more (the
    # bench's own ``recovery_s`` asks for 90%, which a CI machine busier after the fault than before can miss)
    seconds = " ".join(
        f"{s['confirmed']}{(s['breakers'].get('booking-agent/search_agent') or '?')[0]}" for s in arm["seconds"]
    )
    after = [s["confirmed"] for s in arm["seconds"][8 + 12 :]]
    best = max(sum(after[i : i + 4]) / 4 for i in range(len(after) - 3))
    assert best >= 0.5 * figures["calm_goodput_per_s"], f"calm {figures['calm_goodput_per_s']:.1f}/s: {seconds}"
    assert (tmp_path / "cascade-search-hung.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_overload_bench_measures_both_doors_and_draws_them(tmp_path: Path, redis_url: str) -> None:
    # a few seconds per phase: whether it runs and what it records, not its targets (too short to judge)
    output, plot = tmp_path / "overload.json", tmp_path / "overload.png"
    args = ["--loads", "1,4", "--limits", "4", "--phase-s", "2", "--capacity-bookings", "12", "--unloaded", "5"]
    args += ["--warmup", "5", "--redis-url", redis_url, "--output", str(output), "--plot", str(plot)]
    assert overload.main(args) in (0, 1)
    result = json.loads(output.read_text())
    assert result["capacity_per_s"] > 0 and result["unloaded_ms"]["p99"] > 0
    doors = [(p["door"], p["load"]) for p in result["phases"]]
    assert doors == [(door, load) for door in ("adaptive", "4") for load in (1.0, 4.0)]
    assert all(p["confirmed"] for p in result["phases"] if p["load"] == 4.0), result["phases"]
    for phase in result["phases"]:
        assert not phase["server_errors"] and not phase["lost"], phase
        assert phase["refused_429_retry_after"] == phase["refused"], phase
    assert {t["name"] for t in result["targets"]} >= {"4 4x p99 <= 2x unloaded", "adaptive 4x goodput >= 90% of 1x"}
    assert plot.stat().st_size > 10_000


def test_the_startup_bench_times_both_floors_a_service_and_up(tmp_path: Path, redis_url: str) -> None:
    """``python -m bench.startup --up`` at its smallest: the bare app, the bare app running a LangGraph graph (which
    must answer, or the floor measures a crash), one service, and ``concierge up`` in the foreground and detached,
    each started and found ready; a table row per start."""
    output = tmp_path / "startup.json"
    argv = ["--rounds", "1", "--services", "hotel-api", "--up", "--redis-url", redis_url, "--output", str(output)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.startup", *argv], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(output.read_text())["rows"]
    floors = ["bare FastAPI", "bare FastAPI + a one-node LangGraph graph"]
    ups = ["concierge up (all, foreground)", "concierge up --detach (all)"]
    assert list(rows) == [*floors, "hotel-api", *ups]
    assert all(rows[name]["median_s"] > 0 and rows[name]["cpu_median_s"] > 0 for name in [*floors, "hotel-api"]), rows
    assert all(rows[name]["median_s"] > 0 for name in ups), rows
    assert "| bare FastAPI + a one-node LangGraph graph |" in done.stdout
