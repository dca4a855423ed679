"""``concierge chaos`` as an operator runs it: a real ``concierge up`` (its own redis-server, which chaos kills; a
fresh Postgres database, whose connections chaos drops), the command in a subprocess, its verdict and exit code.

A short run at the defaults but its length, with one conversation (``--chats 1``: approvals granted and refused under
the same faults, llm-api's among them) and 30% of the confirmed stays cancelled afterwards (``--cancel-confirmed``:
each refunded total − fee exactly once, or kept confirmed when the hotel refused), must print every fault
time-stamped, heal, and keep the promise (exit 0);
a broken promise planted in the stack's Redis (a booking nobody will ever finish, a confirmed booking no ledger
knows) must turn the same command into exit 1 naming it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stack.state import StackPaths, pid_alive, read_state
from tests.procs import concierge_command, concierge_env, free_port, stack_port_base
from tests.stack import fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTINGS = {"RUN_LEASE_TTL": "2", "ORPHAN_SCAN_INTERVAL": "0.5", "BOOKING_BUDGET_S": "30"}
FAULT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \+\s*\d+\.\ds  ", re.MULTILINE)


def concierge(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    data = tmp_path_factory.mktemp("chaos-command") / "data"
    # a Redis URL nobody answers on: `up` starts its own redis-server there, with its append-only file
    with fresh_database(name_prefix="concierge_chaos") as database_url:
        env = concierge_env(data, f"redis://127.0.0.1:{free_port()}/0", prefix="chaos", **SETTINGS)
        env["DATABASE_URL"] = database_url
        ports = ["--port-base", str(stack_port_base())]
        # a loaded machine (seven engineers on two cores) starts nine services in minutes, not seconds
        up = concierge(env, "up", "--detach", "--timeout", "240", *ports, timeout=330)
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(StackPaths.at(data))
        assert state is not None and state.redis.own, "the stack runs its own Redis, for chaos to kill"
        try:
            yield env
        finally:
            concierge(env, "down", timeout=120)
            after = read_state(StackPaths.at(data))
            assert after is not None and not any(pid_alive(pid) for pid in after.pids())


def plant(env: dict[str, str], how: str) -> str:
    """A booking in the stack's Redis, written with the stack's settings (its password found as every command finds
    it, ``stack.target.adopt_stack_redis``): in flight forever, or confirmed falsely."""
    booking_id = f"planted{uuid.uuid4().hex[:12]}"
    script = (
        "import asyncio, sys\n"
        "from domain.booking import BookingStatus\n"
        "from infra.bookings import BookingStore\n"
        "from infra.redis import create_redis\n"
        "from stack.target import adopt_stack_redis\n"
        "async def main(booking_id, how):\n"
        "    adopt_stack_redis()\n"
        "    redis = create_redis()\n"
        "    store = BookingStore(redis)\n"
        "    request = {'city': 'Lisbon', 'checkin': '2030-01-10', 'checkout': '2030-01-11', 'guests': 1}\n"
        "    assert await store.create(booking_id, request)\n"
        "    if how == 'confirmed':\n"
        "        await store.finalize(booking_id, BookingStatus.CONFIRMED)\n"
        "    await redis.aclose()\n"
        "asyncio.run(main(sys.argv[1], sys.argv[2]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, booking_id, how], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return booking_id


def unplant(env: dict[str, str], booking_id: str) -> None:
    """The planted booking made final for real (cancelled, nothing held): the next run's Redis is clean again."""
    script = (
        "import asyncio, sys\n"
        "from domain.booking import BookingStatus\n"
        "from infra.bookings import BookingStore\n"
        "from infra.booking_keys import booking_key\n"
        "from infra.redis import create_redis\n"
        "from stack.target import adopt_stack_redis\n"
        "async def main(booking_id):\n"
        "    adopt_stack_redis()\n"
        "    redis = create_redis()\n"
        "    await BookingStore(redis).finalize(booking_id, BookingStatus.CANCELLED)\n"
        "    await redis.delete(booking_key(booking_id))\n"
        "    await redis.aclose()\n"
        "asyncio.run(main(sys.argv[1]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, booking_id], env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_short_chaos_run_prints_each_fault_heals_and_keeps_the_promise(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    verdict_file = tmp_path / "verdict.json"
    run = concierge(
        stack_env,
        "chaos",
        *("--duration", "40", "--every", "2-4", "--seed", "11", "--clients", "6", "--chats", "1"),
        *("--cancel-confirmed", "0.3", "--json", str(verdict_file)),
        timeout=300,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "Traceback" not in out + run.stderr
    assert "chaos seed 11: 40s" in out and "30% of the confirmed cancelled after" in out
    faults = [line for line in FAULT_LINE.findall(out)]
    assert len(faults) >= 8, out  # the start line, the faults as they happen, the heal, verify
    verdict = json.loads(verdict_file.read_text())
    assert sum(verdict["faults"].values()) >= 6, verdict["faults"]
    assert verdict["accepted"] > 20 and verdict["unfinished"] == 0 and verdict["stuck_in_redis"] == 0
    assert verdict["disagreements"] == [] and verdict["http_5xx"] == {} and verdict["broken_promises"] == []
    assert verdict["confirmed"] + sum(verdict["failed"].values()) + verdict["cancelled"] == verdict["accepted"]
    assert verdict["time_to_final_s"]["max"] is not None
    chats = verdict["chats"]
    assert chats["chats"] == 1 and chats["turns"] >= 1 and chats["approvals"] >= 1, chats
    assert chats["bookings_made"] == chats["granted"] and chats["left_running"] == [] and chats["over_charged"] == []
    refunds = verdict["refunds"]
    assert refunds["asked_after"] >= 3 and refunds["accepted"] >= 3, refunds
    assert refunds["refunded_once"] + sum(refunds["kept"].values()) == refunds["accepted"], refunds
    assert refunds["refunded_once"] >= 1 and refunds["refunded"] > 0, refunds
    for broken in ("double_refunds", "unrefunded", "wrong_refund", "not_final"):
        assert refunds[broken] == [], refunds
    for line in (
        f"  accepted {verdict['accepted']} · confirmed {verdict['confirmed']}",
        f"  confirmed stays cancelled: {refunds['asked']} ({refunds['asked_after']} drawn by --cancel-confirmed",
        f"  refunds: cancelled {refunds['cancelled']} · exactly one refund of total − fee {refunds['refunded_once']}",
        "  double refunds: 0 · cancelled without the refund owed: 0 · refunded other than total − fee: 0 · "
        "cancels not final after the heal: 0",
        "time to final: p50 ",
        "confirmed of the uncancelled, by fault kind met: ",
        "verify: 0 disagreement(s) · in flight in Redis: 0 · DLQ: ",
        "ERROR lines in the logs: ",
        f"approvals granted → bookings made: {chats['granted']} → {chats['bookings_made']}",
        "charges above an approved total: 0 · chats left running after the heal: 0",
        "promise: kept",
    ):
        assert line in out, out
    # healed: every service up again, no provider fault left behind
    status = json.loads(concierge(stack_env, "status", "--json").stdout)
    assert {i["status"] for i in status["instances"]} == {"up"}, status
    for provider in ("hotel-api", "payment-api"):
        assert concierge(stack_env, "fault", provider).stdout.strip() == f"{provider} faults: none"
    models = concierge(stack_env, "fault", "llm-api").stdout.strip().removeprefix("llm-api faults:").split(";")
    assert all(m.strip().endswith(": none") for m in models if m.strip()), models  # "sim-large: none; ..."


@pytest.mark.parametrize(
    ("how", "told"),
    [
        ("in_flight", "1 booking(s) still in flight in Redis after the heal"),
        ("confirmed", "verify: 2 disagreement(s) with the ledgers"),
    ],
)
def test_a_planted_broken_promise_gives_exit_1(stack_env: dict[str, str], how: str, told: str) -> None:
    booking_id = plant(stack_env, how)
    try:
        run = concierge(
            stack_env,
            "chaos",
            *("--duration", "4", "--every", "1-2", "--seed", "3", "--clients", "2", "--faults", "slow,kill"),
            *("--settle", "5"),
            timeout=180,
        )
    finally:
        unplant(stack_env, booking_id)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "promise: BROKEN: " in run.stdout and told in run.stdout, run.stdout
    if how == "confirmed":
        assert f"disagreement: {booking_id} confirmed: 0 confirmed reservations, not 1" in run.stdout


def test_the_console_button_runs_a_short_chaos_and_shows_its_verdict(stack_env: dict[str, str]) -> None:
    status = json.loads(concierge(stack_env, "status", "--json").stdout)
    console = next(i for i in status["instances"] if i["name"] == "console")
    base, page = console["url"], {"X-Concierge-Console": "1"}
    # logged in as the operator by the link `concierge console-url` prints (its session cookie)
    link = concierge(stack_env, "console-url").stdout.strip()
    http = httpx.Client(timeout=10)
    assert http.get(link).status_code == 303
    # the page's own requests only: its header, its origin, one of its host names
    assert http.post(f"{base}/api/chaos", json={}, timeout=10).status_code == 403
    foreign = http.post(f"{base}/api/chaos", json={}, headers={**page, "Origin": "http://evil.example"}, timeout=10)
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden"
    rebound = http.post(f"{base}/api/chaos", json={}, headers={**page, "Host": "evil.example"}, timeout=10)
    assert rebound.status_code == 421
    too_long = http.post(f"{base}/api/chaos", json={"duration_s": 1000}, headers=page, timeout=10)
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["body", "duration_s"]
    assert http.get(f"{base}/api/chaos", timeout=10).json()["running"] is False

    started = http.post(f"{base}/api/chaos", json={"duration_s": 8, "seed": 5, "clients": 2}, headers=page, timeout=10)
    assert started.status_code == 202, started.text
    assert started.json()["running"] is True and "--seed 5" in started.json()["command"]
    again = http.post(f"{base}/api/chaos", json={}, headers=page, timeout=10)
    assert again.status_code == 422 and "already running" in again.json()["error"]["message"]
    deadline = time.monotonic() + 200
    while (run := http.get(f"{base}/api/chaos", timeout=10).json())["running"]:
        assert time.monotonic() < deadline, run["lines"][-5:]
        time.sleep(1)
    output = "\n".join(run["lines"])
    assert run["exit_code"] == 0, output
    assert "chaos seed 5: 8s" in output and "promise: kept" in output and "verdict (seed 5, 8s" in output
    after = json.loads(concierge(stack_env, "status", "--json").stdout)
    assert next(i for i in after["instances"] if i["name"] == "console")["pid"] == console["pid"], "never faulted"
