"""``concierge up`` as a user runs it: the real CLI in subprocesses, the real stack, real Redis, SQLite checkpoints.

The supervisor's own rules (restart after a crash, hold on ``--no-restart``, start-up failures, stop order) are
checked first against tiny stand-in services, which start in milliseconds; then the whole stack end to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stack.control import call
from stack.errors import ControlError
from stack.layout import plan_instances
from stack.redis_server import RedisPlan
from stack.services import DEFAULT_STACK, SERVICES
from stack.state import StackPaths, pid_alive, read_secrets, read_state
from stack.supervisor import RestartPolicy, Supervisor, SupervisorConfig
from tests.procs import concierge_command, concierge_env, free_port

pytestmark = pytest.mark.e2e

# ------------------------------------------------------------------------------------------- stand-in services

# Answers /health/ready like a service; exits at once when its name is in FAKE_CRASH; notes SIGTERM in its log.
FAKE_SERVICE = """
import http.server, os, signal, sys
name, port = sys.argv[2], int(sys.argv[sys.argv.index("--port") + 1])
if name in os.environ.get("FAKE_CRASH", "").split(","):
    print(f"{name}: cannot start, FAKE_CRASH says so", flush=True)
    sys.exit(3)
def stop(signum, frame):
    print(f"{name}: SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
print(f"{name}: listening on {port}", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


def fake_config(tmp_path: Path, redis_url: str, env: dict[str, str] | None = None) -> SupervisorConfig:
    script = tmp_path / "concierge_stand_in.py"
    script.write_text(FAKE_SERVICE)
    ports = {name: free_port() for name in SERVICES}
    return SupervisorConfig(
        paths=StackPaths.at(tmp_path / "data"),
        instances=plan_instances(ports=ports),
        redis=RedisPlan(url=redis_url, own=False),
        command=(sys.executable, str(script)),
        base_env={**os.environ, **(env or {})},
        grace_s=5,
        ready_timeout_s=15,
        restart=RestartPolicy(initial_s=0.2, max_s=1.0),
    )


async def wait_for(predicate: Any, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def instance(paths: StackPaths, name: str) -> dict[str, Any]:
    """The supervisor's live view of one instance (the state file may lag it by a write)."""
    state = (await call(paths, "status"))["state"]
    return dict(next(i for i in state["instances"] if i["name"] == name))


async def eventually(probe: Any, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not await probe():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_supervisor_restarts_crashes_holds_on_request_and_stops_in_reverse_order(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = fake_config(tmp_path, redis_url)
    paths = config.paths
    supervisor = Supervisor(config)
    running = asyncio.create_task(supervisor.run())
    try:
        await wait_for(lambda: (s := read_state(paths)) is not None and s.phase == "ready", 20)
        first_pid = (await instance(paths, "booking-agent"))["pid"]

        killed = await call(paths, "kill", target="booking-agent", restart=True)
        assert killed["killed"] == [{"name": "booking-agent", "pid": first_pid}]
        assert not pid_alive(first_pid)

        async def restarted_and_up() -> bool:
            agent = await instance(paths, "booking-agent")
            return agent["status"] == "up" and agent["pid"] not in (None, first_pid)

        await eventually(restarted_and_up)
        restarted = await instance(paths, "booking-agent")
        assert (restarted["restarts"], restarted["last_exit"]) == (1, -9)

        await call(paths, "kill", target="payment-api", restart=False)
        await asyncio.sleep(0.5)  # several backoffs' worth: it must stay down
        held = await instance(paths, "payment-api")
        assert (held["status"], held["pid"], held["restarts"]) == ("stopped", None, 0)

        started = await call(paths, "start", target="payment-api")
        assert started["started"][0]["ready"] is True
        assert (await instance(paths, "payment-api"))["status"] == "up"

        with pytest.raises(ControlError, match="unknown service 'nope'"):
            await call(paths, "stop", target="nope")
        status = await call(paths, "status")
        assert status["in_flight"] == 0  # nothing booked under this prefix

        await call(paths, "down")
        assert await asyncio.wait_for(running, 30) == 0
    finally:
        if not running.done():
            running.cancel()  # the supervisor kills its children on the way out
            await asyncio.gather(running, return_exceptions=True)
    state = read_state(paths)
    assert state is not None and state.phase == "stopped"
    assert all(i.pid is None for i in state.instances)
    # dependants first, each asked with SIGTERM
    out = capsys.readouterr().out
    stopped = re.findall(r"concierge: (\S+) stopped \(", out)
    assert stopped[-len(config.instances) :] == [i.name for i in reversed(config.instances)], out
    for i in config.instances:
        assert f"{i.name}: SIGTERM" in paths.log_file(i.name).read_text()


async def test_a_service_that_dies_during_start_up_fails_up_with_its_last_words(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # a ready timeout of an hour: reported only at it, the crash would trip the 120 s hang guard
    config = dataclasses.replace(
        fake_config(tmp_path, redis_url, env={"FAKE_CRASH": "payment-agent"}), ready_timeout_s=3600
    )
    code = await asyncio.wait_for(Supervisor(config).run(), 120)
    assert code == 1, "a crash at start-up is reported at once, not after the ready timeout"
    state = read_state(config.paths)
    assert state is not None and state.phase == "failed"
    assert state.error and "payment-agent exited with code 3 before it was ready" in state.error
    assert "FAKE_CRASH says so" in state.error
    assert all(not i.pid for i in state.instances)


# A supervisor in its own process, to be killed -9 (which a supervisor in the test's event loop cannot be).
SUPERVISOR = """
import asyncio, json, sys
from stack.layout import plan_instances
from stack.redis_server import RedisPlan
from stack.state import StackPaths
from stack.supervisor import Supervisor, SupervisorConfig
spec = json.loads(sys.argv[1])
config = SupervisorConfig(
    paths=StackPaths.at(spec["data"]),
    instances=plan_instances(ports=spec["ports"]),
    redis=RedisPlan(url=spec["redis"], own=False),
    command=(sys.executable, spec["script"]),
    grace_s=5,
    ready_timeout_s=15,
)
sys.exit(asyncio.run(Supervisor(config).run()))
"""


def test_down_sweeps_what_a_killed_supervisor_left_and_up_refuses_until_then(tmp_path: Path, redis_url: str) -> None:
    config = fake_config(tmp_path, redis_url)
    spec: dict[str, Any] = {
        "data": str(config.paths.root),
        "ports": {i.service: i.port for i in config.instances},
        "redis": redis_url,
        "script": config.command[1],
    }
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, json.dumps(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    env = {**os.environ, "CONCIERGE_DATA_DIR": str(config.paths.root)}
    try:
        deadline = time.monotonic() + 20
        while (state := read_state(config.paths)) is None or state.phase != "ready":
            assert supervisor.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        children = [i.pid for i in state.instances if i.pid]
        assert len(children) == len(config.instances)

        supervisor.kill()
        supervisor.wait(timeout=10)
        assert all(pid_alive(pid) for pid in children), "services outlive their supervisor"

        status = concierge(env, "status")
        assert status.returncode == 1 and "stack not running" in status.stderr
        refused = concierge(env, "up", "--detach")
        assert refused.returncode == 1, refused.stdout
        assert "still run" in refused.stderr and "concierge down" in refused.stderr

        down = concierge(env, "down")
        assert down.returncode == 0, down.stderr
        assert [pid for pid in children if pid_alive(pid)] == []
        swept = read_state(config.paths)
        assert swept is not None and swept.phase == "stopped" and not any(i.pid for i in swept.instances)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
        state = read_state(config.paths)
        for pid in state.pids() if state else []:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------------------- the real stack


def concierge(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def stack_env(tmp_path: Path, redis_url: str) -> Iterator[dict[str, str]]:
    # SQLite: what `up` defaults to; the secrets: what `up` generates
    settings = {"RUN_LEASE_TTL": "1", "ORPHAN_SCAN_INTERVAL": "0.2", "BOOKING_BUDGET_S": "30"}
    env = concierge_env(tmp_path / "data", redis_url, prefix="up", **settings)
    env.pop("CONCIERGE_AUTH", None)  # identities on, as the README's walkthrough has them: `up` makes the issuer
    yield env
    # whatever happened, nothing of this stack outlives the test
    paths = StackPaths.at(tmp_path / "data")
    state = read_state(paths)
    if state is not None and any(pid_alive(pid) for pid in state.pids()):
        concierge(env, "down", timeout=120)


def port_flags() -> list[str]:
    flags: list[str] = []
    for name in SERVICES:
        flags += ["--port", f"{name}={free_port()}"]
    return flags


def ledger(url: str, paths: StackPaths) -> dict[str, Any]:
    """A provider's ledger, with the admin token ``up`` generated and keeps in the data directory."""
    stack_secrets = read_secrets(paths)
    assert stack_secrets is not None
    headers = {"Authorization": f"Bearer {stack_secrets.admin_token}"}
    response = httpx.get(f"{url}/admin/ledger", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def seed_dlq(env: dict[str, str], thread_id: str) -> None:
    """A dead-lettered run in the stack's Redis, written by another process with the stack's settings."""
    script = (
        "import asyncio\n"
        "from infra.redis import create_redis\n"
        "from recovery import DeadLetterQueue\n"
        "async def main():\n"
        "    redis = create_redis()\n"
        f"    await DeadLetterQueue(redis).send_to_dlq({thread_id!r}, 'max_attempts', 'seeded by the test', 3)\n"
        "    await redis.aclose()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def follow_lines(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_up_book_kill_mid_booking_status_and_down(stack_env: dict[str, str], tmp_path: Path) -> None:
    env = stack_env
    up = concierge(env, "up", "--detach", *port_flags(), timeout=120)
    supervisor_log = tmp_path / "data" / "logs" / "supervisor.log"
    assert up.returncode == 0, (
        f"{up.stdout}\n{up.stderr}\n{supervisor_log.read_text() if supervisor_log.exists() else ''}"
    )
    assert "all services ready" in up.stdout

    # the secrets `up` generated: kept for the owner alone, and the admin routes are closed to anyone else
    paths = StackPaths.at(tmp_path / "data")
    assert paths.secrets_file.stat().st_mode & 0o777 == 0o600
    assert paths.state_file.stat().st_mode & 0o777 == 0o600

    again = concierge(env, "up", "--detach")
    assert again.returncode == 1 and "already running" in again.stderr and "Traceback" not in again.stderr

    status = json.loads(concierge(env, "status", "--json").stdout)
    urls = {i["name"]: i["url"] for i in status["instances"]}
    assert {i["status"] for i in status["instances"]} == {"up"}
    assert httpx.get(f"{urls['payment-api']}/admin/ledger", timeout=10).status_code == 401
    assert set(urls) == set(DEFAULT_STACK)  # the web console among them

    checkin = (dt.date.today() + dt.timedelta(days=50)).isoformat()
    book_args = ("book", "--city", "Lisbon", "--checkin", checkin, "--nights", "2", "--guests", "2")
    first = concierge(env, *book_args)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.strip().splitlines()[-1].startswith("confirmed:")
    assert re.search(r"\bpending\b", first.stdout) and re.search(r"\bconfirmed\b", first.stdout)
    # the booking is the person's who made it (`me`): docs/bookings.md's curl lines show it, nobody else's list does
    agent = urls["booking-agent"]
    made = re.search(r"^booking (\w+):", first.stdout, re.MULTILINE)
    assert made, first.stdout
    token = concierge(env, "token")
    assert token.returncode == 0 and token.stdout.count(".") == 2, token.stderr
    mine = httpx.get(f"{agent}/bookings", headers={"Authorization": f"Bearer {token.stdout.strip()}"}, timeout=10)
    assert mine.status_code == 200 and len(mine.json()["bookings"]) == 1, mine.text
    assert mine.json()["bookings"][0]["booking_id"] == made.group(1)
    assert httpx.get(f"{agent}/bookings", timeout=10).status_code == 401
    others = concierge(env, "bookings", "--user", "someone-else", "--json")
    assert others.returncode == 0 and json.loads(others.stdout) == [], others.stdout + others.stderr

    # A slow payment holds the booking in "paying" long enough to kill its owner mid-flight (the kill command itself
    # takes seconds on a busy machine: 4 s of latency was not always enough).
    assert concierge(env, "fault", "payment-api", "--latency", "10").returncode == 0
    booking = subprocess.Popen(
        [*concierge_command(), *book_args, "--timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    reader = follow_lines(booking, lines)
    old_pid = next(i["pid"] for i in status["instances"] if i["name"] == "booking-agent")
    # the README's walkthrough: the kill waits for the booking to be paying, no `sleep N` guess
    killed = concierge(env, "kill", "booking-agent", "--when", "booking:paying", timeout=180)
    assert killed.returncode == 0, killed.stderr + "".join(lines)
    assert re.search(r"^booking \w+ is paying$", killed.stdout, re.MULTILINE), killed.stdout
    assert f"pid {old_pid}" in killed.stdout
    assert not pid_alive(old_pid)
    assert booking.poll() is None, "the booking must still be in flight when its owner dies"
    assert concierge(env, "fault", "payment-api", "--clear").returncode == 0

    assert booking.wait(timeout=60) == 0, "".join(lines)
    reader.join(timeout=5)
    output = "".join(lines)
    booking_id = re.search(r"^booking (\w+):", output, re.MULTILINE)
    assert booking_id, output
    reference = booking_id.group(1)
    assert f"booking {reference} is paying" in killed.stdout  # the one in flight, killed during its payment
    assert output.strip().splitlines()[-1].startswith("confirmed:"), output
    assert "still trying" in output  # `book` waited out the restart instead of failing

    reservations = [r for r in ledger(urls["hotel-api"], paths)["reservations"] if r["reference"] == reference]
    assert [r["status"] for r in reservations] == ["confirmed"], reservations
    charges = [c for c in ledger(urls["payment-api"], paths)["charges"] if c["reference"] == reference]
    assert [c["status"] for c in charges].count("captured") == 1, charges

    status = json.loads(concierge(env, "status", "--json").stdout)
    agent = next(i for i in status["instances"] if i["name"] == "booking-agent")
    assert agent["restarts"] == 1 and agent["pid"] not in (None, old_pid) and agent["status"] == "up"
    assert status["bookings_in_flight"] == 0
    queue = status["queue"]["recovery-worker"]
    assert queue["dlq_depth"] == 0
    assert queue["recovered_total"] >= 1, queue  # the worker took the orphaned run over
    table = concierge(env, "status").stdout
    assert re.search(r"^booking-agent\s+up\s+\d+\s+1\s", table, re.MULTILINE), table

    # the operator's commands find the running stack's Redis without REDIS_URL (they used to see an empty DLQ)
    seed_dlq(env, "dead-run-1")
    bare = {k: v for k, v in env.items() if k not in ("REDIS_URL", "CONCIERGE_KEY_PREFIX")}
    listed = concierge(bare, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["thread_id"] for e in json.loads(listed.stdout)] == ["dead-run-1"]
    audit = concierge(bare, "verify")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "0 disagreement(s)" in audit.stdout
    assert concierge(bare, "dlq", "purge").returncode == 0

    pids = [i["pid"] for i in status["instances"]] + [status["supervisor_pid"]]
    down = concierge(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert [pid for pid in pids if pid_alive(pid)] == []
    after = concierge(env, "status")
    assert after.returncode == 1 and "stack not running" in after.stderr


def test_up_on_a_fresh_postgres_database_starts_and_books(
    stack_env: dict[str, str], tmp_path: Path, postgres_url: str
) -> None:
    """What docker compose runs: three services migrate the same empty checkpoint database at once."""
    env = stack_env | {"DATABASE_URL": postgres_url}
    up = concierge(env, "up", "--detach", *port_flags(), timeout=120)
    supervisor_log = tmp_path / "data" / "logs" / "supervisor.log"
    assert up.returncode == 0, (
        f"{up.stdout}\n{up.stderr}\n{supervisor_log.read_text() if supervisor_log.exists() else ''}"
    )
    try:
        checkin = (dt.date.today() + dt.timedelta(days=60)).isoformat()
        booked = concierge(env, "book", "--city", "Porto", "--checkin", checkin, "--nights", "1", "--guests", "1")
        assert booked.returncode == 0, booked.stdout + booked.stderr
        assert booked.stdout.strip().splitlines()[-1].startswith("confirmed:")
    finally:
        down = concierge(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr


def test_up_without_redis_or_redis_server_fails_fast_and_says_how_to_get_one(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {
        **os.environ,
        "PATH": str(empty_bin),  # no redis-server to fall back on
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "CONCIERGE_DATA_DIR": str(tmp_path / "data"),
    }
    for args in (("up",), ("up", "--detach")):
        # ports of its own: a stack of `make up` on the default ones must not answer first (its ports are busy)
        result = concierge(env, *args, *port_flags(), timeout=60)
        assert result.returncode == 1
        message = result.stderr.strip()
        assert len(message.splitlines()) == 1 and "Traceback" not in message, message
        assert "unreachable" in message and "redis-server is not on PATH" in message
        assert "REDIS_URL" in message
        # fails fast: refused before a supervisor or a service was started (and so before any ready timeout)
        assert read_state(StackPaths.at(tmp_path / "data")) is None


def test_up_with_the_example_runs_restaurant_agent_and_a_table_is_held(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    """docs/new-agent.md's agent is no default stack's, but ``up --with`` runs it, its graph in the worker's list."""
    env = stack_env
    up = concierge(env, "up", "--detach", "--with", "restaurant-agent", *port_flags(), timeout=180)
    supervisor_log = tmp_path / "data" / "logs" / "supervisor.log"
    assert up.returncode == 0, (
        f"{up.stdout}\n{up.stderr}\n{supervisor_log.read_text() if supervisor_log.exists() else ''}"
    )
    try:
        status = json.loads(concierge(env, "status", "--json").stdout)
        instances = {i["name"]: i for i in status["instances"]}
        assert set(instances) == set(DEFAULT_STACK) | {"restaurant-agent"}
        worker_env = Path(f"/proc/{instances['recovery-worker']['pid']}/environ").read_bytes().split(b"\0")
        assert b"DURABLE_AGENTS=agents.booking,agents.concierge,examples.restaurant" in worker_env
        secrets = read_secrets(StackPaths.at(tmp_path / "data"))
        assert secrets is not None
        operator = {"Authorization": f"Bearer {secrets.admin_token}"}
        restaurant = instances["restaurant-agent"]["url"]
        table = {"hotel_id": "porto-01", "day": (dt.date.today() + dt.timedelta(days=33)).isoformat(), "guests": 3}
        accepted = httpx.post(f"{restaurant}/tables", json=table, headers=operator, timeout=30)
        assert accepted.status_code == 202, accepted.text
        run_id = accepted.json()["run_id"]
        deadline = time.monotonic() + 60
        while (run := httpx.get(f"{restaurant}/runs/{run_id}", headers=operator, timeout=10).json())[
            "status"
        ] != "done":
            assert time.monotonic() < deadline and run["status"] == "running", run
            time.sleep(0.1)
        ledger = httpx.get(f"{instances['hotel-api']['url']}/admin/ledger", headers=operator, timeout=10).json()
        assert [r["status"] for r in ledger["reservations"] if r["reference"] == run_id] == ["held"]
    finally:
        down = concierge(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
