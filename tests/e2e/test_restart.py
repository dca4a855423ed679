"""``concierge restart``, the rolling upgrade of the local stack, as an operator runs it on a real ``concierge up``
started from a copy of this checkout: the copy is changed (the booking graph's ``charge`` step renamed) while a
booking is parked mid-charge, and the command moves every service onto it, one instance at a time, each ready before
the next stops. The parked run is not resumed on the new graph: it waits, and the command says so. Changed back and
restarted (a rollback), the booking finishes exactly once. docs/upgrades.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.state import StackPaths, pid_alive, read_secrets, read_state
from tests.e2e.test_deploy import BOOKING_LABEL, BOOKING_NOW, CHANGE, PACKAGES
from tests.procs import REPO_ROOT, concierge_command, concierge_env, stack_port_base
from tests.stack import stay

pytestmark = pytest.mark.e2e

SETTINGS = {"RUN_LEASE_TTL": "2", "ORPHAN_SCAN_INTERVAL": "0.5", "IDEMPOTENCY_LEASE_S": "1"}
DEADLINE_S = 120.0


def concierge(env: dict[str, str], code: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The command run from the copy (its working directory first on the path, as a deploy's would be)."""
    return subprocess.run(
        [*concierge_command(), *args], env=env, cwd=code, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def code(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def up(tmp_path: Path, code: Path, redis_url: str) -> Iterator[tuple[dict[str, str], StackPaths]]:
    data = tmp_path / "data"
    env = concierge_env(data, redis_url, prefix="restart", **SETTINGS) | {"PYTHONPATH": str(code)}
    env.pop("CONCIERGE_AUTH", None)  # people on, as the README has them: `up` makes the issuer
    started = concierge(
        env, code, "up", "--detach", "--timeout", "240", "--port-base", str(stack_port_base()), timeout=330
    )
    paths = StackPaths.at(data)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield env, paths
    finally:
        concierge(env, code, "down", timeout=180)
        after = read_state(paths)
        assert after is not None and not any(pid_alive(pid) for pid in after.pids())


def booking(url: str, token: str, booking_id: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/bookings/{booking_id}", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_status(url: str, token: str, booking_id: str, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while (found := booking(url, token, booking_id))["status"] not in statuses:
        assert time.monotonic() < deadline, f"never {statuses}: {found}"
        time.sleep(0.1)
    return found


def ledger(url: str, paths: StackPaths) -> dict[str, Any]:
    secrets = read_secrets(paths)
    assert secrets is not None
    response = httpx.get(f"{url}/admin/ledger", headers={"Authorization": f"Bearer {secrets.admin_token}"}, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def assert_one_at_a_time(log: str, names: list[str]) -> None:
    """In the supervisor's log, each instance is ready again before the next one is stopped (or started)."""
    position = 0
    for name in names:
        ended = re.compile(rf"concierge: {re.escape(name)} (stopped|started) ")
        found = ended.search(log, position)
        assert found, f"{name} was not restarted after position {position}:\n{log[-4000:]}"
        ready = log.find(f"concierge: {name} ready again", found.end())
        assert ready != -1, f"{name} never ready again:\n{log[-4000:]}"
        position = ready


def test_a_rolling_restart_moves_every_service_onto_the_checkout_one_at_a_time_and_old_runs_wait_for_their_graph(
    up: tuple[dict[str, str], StackPaths], code: Path
) -> None:
    env, paths = up
    state = read_state(paths)
    assert state is not None
    urls = {i.name: i.url for i in state.instances}
    agent = urls["booking-agent"]
    token_answer = concierge(env, code, "token")
    assert token_answer.returncode == 0, token_answer.stderr
    token = token_answer.stdout.strip()

    # a booking parked mid-charge, handed to the recovery queue by a graceful stop, with no worker to take it (the
    # worker stopped first, so one CLI start stands between the charge and the drain, which cuts it after 10 s and
    # hands it off: well inside the charge's 30 s, even on a loaded machine)
    stopped = concierge(env, code, "stop", "recovery-worker", timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    assert concierge(env, code, "fault", "payment-api", "--latency", "30").returncode == 0
    checkin, checkout = stay(days_ahead=47)
    body = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    made = httpx.post(f"{agent}/bookings", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert made.status_code in (200, 201, 202), made.text
    booking_id = str(made.json()["booking_id"])
    wait_status(agent, token, booking_id, {"paying"})
    stopped = concierge(env, code, "stop", "booking-agent", timeout=180)
    assert stopped.returncode == 0, stopped.stderr
    in_flight = concierge(env, code, "runs", "--json")  # from Redis: booking-agent is down
    assert in_flight.returncode == 0 and booking_id in in_flight.stdout, "handed off mid-charge, not finished"

    # the deploy: the checkout changes under the running stack, then every service moves onto it
    module = code / "agents" / "booking" / "graph.py"
    original = module.read_text()
    module.write_text(original + CHANGE.format(renamed={"charge": "capture"}, added=[], key="", keep=False, migrate=""))
    before = {i.name: i.pid for i in state.instances}
    log_start = len(paths.supervisor_log.read_text())
    rolled = concierge(env, code, "restart", timeout=900)
    out = rolled.stdout
    assert rolled.returncode == 0, out + rolled.stderr
    names = [i.name for i in state.instances]
    for name in names:
        assert f"restarting {name} (pid" in out and re.search(rf"^{re.escape(name)} ready \(pid \d+\)$", out, re.M), out
    assert f"restarted {len(names)} instance(s) on the current checkout" in out
    assert_one_at_a_time(paths.supervisor_log.read_text()[log_start:], names)
    after = read_state(paths)
    assert after is not None
    for instance in after.instances:
        assert instance.pid is not None and pid_alive(instance.pid), instance
        assert instance.pid != before[instance.name], f"{instance.name} kept its process"

    # said so, and so it is: waiting on its own version, nothing undone, nothing marked done
    assert f"waiting: 1 run(s) wait for graph version {BOOKING_LABEL}" in out and booking_id in out, out
    assert booking(agent, token, booking_id)["status"] == "paying"
    runs = concierge(env, code, "runs", "--by-version", "--json")
    assert runs.returncode == 0, runs.stderr
    rows = {row["version"]: row for row in json.loads(runs.stdout)}
    assert rows[BOOKING_LABEL]["waiting"] == [booking_id] and rows[BOOKING_LABEL]["fingerprint"] == BOOKING_NOW, rows
    status = concierge(env, code, "status")
    assert f"wait for graph version {BOOKING_LABEL}" in status.stdout, status.stdout

    # the rollback: the booking finishes on the graph it started on, once
    module.write_text(original)
    assert concierge(env, code, "fault", "payment-api", "--clear").returncode == 0
    back = concierge(env, code, "restart", "booking-agent", "recovery-worker", timeout=600)
    assert back.returncode == 0, back.stdout + back.stderr
    assert "restarted 2 instance(s)" in back.stdout, back.stdout
    wait_status(agent, token, booking_id, {"confirmed", "failed", "cancelled"})
    assert booking(agent, token, booking_id)["status"] == "confirmed"
    rooms = [r["status"] for r in ledger(urls["hotel-api"], paths)["reservations"] if r["reference"] == booking_id]
    money = [c["status"] for c in ledger(urls["payment-api"], paths)["charges"] if c["reference"] == booking_id]
    assert rooms == ["confirmed"] and money == ["captured"], (rooms, money)
    checked = concierge(env, code, "verify", timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "wait for graph version" not in checked.stdout, checked.stdout


def test_restart_refuses_what_it_cannot_do_in_one_line(tmp_path: Path) -> None:
    env = concierge_env(tmp_path / "nothing-here", "redis://127.0.0.1:1/0", prefix="restart")
    unknown = concierge(env, REPO_ROOT, "restart", "no-such-agent")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "no-such-agent" in unknown.stderr and "booking-agent" in unknown.stderr, unknown.stderr
    none = concierge(env, REPO_ROOT, "restart")
    assert none.returncode != 0 and "stack not running" in none.stderr, none.stderr
    assert "Traceback" not in none.stderr + unknown.stderr
