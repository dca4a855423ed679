"""Replicas everywhere: ``concierge up --scale`` runs every agent twice and two recovery workers, a booking load
goes through the fronts (as through Kubernetes Services), and one replica of each is killed -9 in turn
(search-agent, payment-agent, booking-agent, recovery-worker). Every booking that got a 202 must end final, none
lost, none doubled: one confirmed reservation and one captured charge per confirmed booking, no room left on hold,
nothing in the ledgers for a booking nobody accepted (and ``concierge verify`` agrees).

Real processes, real HTTP, Redis, a fresh Postgres database for the checkpoints; short leases
(``RUN_LEASE_TTL=1``) so the orphans of a killed booking-agent are resumed within seconds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import os
import re
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.booking import FINAL_BOOKING_STATUSES
from stack.control import call
from stack.state import StackPaths, pid_alive, read_secrets, read_state
from tests.procs import concierge_command, stack_port_base

# about two minutes on a shared two-core machine: ten service processes start, then the load runs through four kills
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCALE = {"search-agent": 2, "payment-agent": 2, "booking-agent": 2, "recovery-worker": 2}
# In turn, the worker last, while it resumes the runs the booking-agent's death orphaned. The replica killed is one
# with work in hand at that moment (its bulkhead of that work in use): a search, a charge, booking runs, resumed runs.
WORK_BULKHEADS = {
    "search-agent": "search_agent",
    "payment-agent": "payment_agent",
    "booking-agent": "booking_runs",
    "recovery-worker": "recovery_worker",
}
# provider latency during the kills, so that every call a replica makes is in flight long enough to be cut
PROVIDER_LATENCY_S = 0.3
CLIENTS = 8
# bookings accepted between two kills (and before the first): the load is still moving when the next blow lands
ACCEPTED_BETWEEN_KILLS = 4
ENV = {
    "RUN_LEASE_TTL": "1",
    "ORPHAN_SCAN_INTERVAL": "0.2",
    "IDEMPOTENCY_LEASE_S": "1",
    "BOOKING_BUDGET_S": "30",
    "PYTHONUNBUFFERED": "1",
}
FINAL_WAIT_S = 120.0


def concierge(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass
class Load:
    """``CLIENTS`` users booking through booking-agent's front until stopped, each waiting for its booking to end
    before the next, each booking its own night (no hotel sells out). A request whose answer was lost (its replica
    died) is sent again, the POST with the same Idempotency-Key, as a careful client does; only a 202 counts as
    accepted."""

    url: str
    accepted: list[str] = field(default_factory=list)
    final: dict[str, str] = field(default_factory=dict)
    refused: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    unexpected: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _days: Iterator[int] = field(default_factory=lambda: itertools.count(30))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        return threads

    def _client(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self.stop.is_set():
                with self._lock:
                    checkin = dt.date.today() + dt.timedelta(days=next(self._days))
                body = {
                    "city": "Lisbon",
                    "checkin": checkin.isoformat(),
                    "checkout": (checkin + dt.timedelta(days=1)).isoformat(),
                    "guests": 2,
                    "payment_token": "tok_visa",
                }
                booking_id = self._book(http, body, uuid.uuid4().hex)
                if booking_id is not None:
                    self._until_final(http, booking_id)

    def _send(self, http: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response | None:
        """One answer that is not a refusal (429/503 are waited out), or None after 60 s."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                response = http.request(method, f"{self.url}{path}", **kwargs)
            except httpx.TransportError:
                with self._lock:
                    self.transport_errors += 1
                time.sleep(0.2)
                continue
            if response.status_code not in (429, 503):
                return response
            with self._lock:
                self.refused[response.status_code] += 1
            time.sleep(min(2.0, float(response.headers.get("Retry-After", "0.5"))))
        with self._lock:
            self.unexpected.append(f"{method} {path}: no answer in 60 s")
        return None

    def _book(self, http: httpx.Client, body: dict[str, Any], idempotency_key: str) -> str | None:
        response = self._send(http, "POST", "/bookings", json=body, headers={"Idempotency-Key": idempotency_key})
        if response is None:
            return None
        if response.status_code != 202:
            with self._lock:
                self.unexpected.append(f"POST /bookings: {response.status_code} {response.text[:300]}")
            return None
        booking_id = str(response.json()["booking_id"])
        with self._lock:
            self.accepted.append(booking_id)
        return booking_id

    def _until_final(self, http: httpx.Client, booking_id: str) -> None:
        deadline = time.monotonic() + FINAL_WAIT_S
        while time.monotonic() < deadline:
            response = self._send(http, "GET", f"/bookings/{booking_id}", params={"wait": 10})
            if response is None or response.status_code != 200:
                with self._lock:
                    self.unexpected.append(f"GET {booking_id}: {response and response.status_code}")
                return
            status = str(response.json()["status"])
            if status in FINAL_BOOKING_STATUSES:
                with self._lock:
                    self.final[booking_id] = status
                return
        with self._lock:
            self.unexpected.append(f"{booking_id} not final after {FINAL_WAIT_S:g} s")

    def wait_accepted(self, count: int, within_s: float, why: str) -> None:
        deadline = time.monotonic() + within_s
        while len(self.accepted) < count:
            assert time.monotonic() < deadline, f"{why}: {len(self.accepted)} accepted, {count} expected"
            assert not self.unexpected, self.unexpected
            time.sleep(0.1)


def work_in_hand(url: str, bulkhead: str) -> int:
    try:
        stats = httpx.get(f"{url}/health/bulkheads", timeout=5).json()
    except httpx.TransportError:
        return 0  # restarting
    return int(stats.get(bulkhead, {}).get("in_use", 0))


def busy_replica(urls: dict[str, str], service: str, within_s: float) -> str:
    """The first replica of ``service`` seen with work in hand."""
    replicas = [name for name in urls if name.startswith(f"{service}:")]
    deadline = time.monotonic() + within_s
    while True:
        for name in replicas:
            if work_in_hand(urls[name], WORK_BULKHEADS[service]) > 0:
                return name
        assert time.monotonic() < deadline, f"no replica of {service} had work in hand within {within_s:g} s"
        time.sleep(0.05)


def set_latency(urls: dict[str, str], admin_token: str, latency_s: float) -> None:
    for provider in ("hotel-api", "payment-api"):
        headers = {"Authorization": f"Bearer {admin_token}"}
        if latency_s:
            answer = httpx.put(
                f"{urls[provider]}/admin/faults", headers=headers, json={"latency_s": latency_s}, timeout=10
            )
        else:
            answer = httpx.delete(f"{urls[provider]}/admin/faults", headers=headers, timeout=10)
        assert answer.status_code in (200, 204), answer.text


def requests_answered(url: str, route: str) -> float:
    """The replica's ``concierge_http_requests_total`` for ``route`` (any method, any status)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = re.compile(r"^concierge_http_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)
    return sum(float(value) for labels, value in pattern.findall(text) if f'route="{route}"' in labels)


@pytest.fixture
def stack_env(tmp_path: Path, redis_url: str, postgres_url: str) -> Iterator[dict[str, str]]:
    unset = ("CONCIERGE_SERVICE_SECRET", "CONCIERGE_ADMIN_TOKEN", *(k for k in os.environ if k.endswith("_URL")))
    env = {key: value for key, value in os.environ.items() if key not in unset}
    env |= ENV | {
        "REDIS_URL": redis_url,
        "DATABASE_URL": postgres_url,
        "CONCIERGE_KEY_PREFIX": f"replicas-{uuid.uuid4().hex[:10]}",
        "CONCIERGE_DATA_DIR": str(tmp_path / "data"),
    }
    yield env
    state = read_state(StackPaths.at(tmp_path / "data"))
    if state is not None and any(pid_alive(pid) for pid in state.pids()):
        concierge(env, "down", timeout=120)


def test_one_replica_of_each_killed_in_turn_under_load_loses_and_doubles_nothing(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    env = stack_env
    paths = StackPaths.at(tmp_path / "data")
    scale = [flag for name, count in SCALE.items() for flag in ("--scale", f"{name}={count}")]
    up = concierge(env, "up", "--detach", "--port-base", str(stack_port_base(SCALE)), *scale, timeout=180)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{paths.supervisor_log.read_text()}"
    state = read_state(paths)
    assert state is not None
    urls = {i.name: i.url for i in state.instances}
    assert set(state.fronts) == set(SCALE)
    assert sum(1 for i in state.instances if i.service == "recovery-worker") == 2
    for service, front in state.fronts.items():
        assert front not in {i.url for i in state.instances}, f"{service}'s front is one of its replicas"
        assert f"front        {service} {front}" in up.stdout

    load = Load(state.fronts["booking-agent"])
    threads = load.run()
    try:
        load.wait_accepted(ACCEPTED_BETWEEN_KILLS, 90, "before the first kill")
        # the fronts spread the work: both replicas of each agent answer their callers
        served = {
            replica: route
            for route, service in (("/bookings", "booking-agent"), ("/a2a", "search-agent"), ("/a2a", "payment-agent"))
            for replica in (f"{service}:1", f"{service}:2")
        }
        deadline = time.monotonic() + 60
        while idle := [replica for replica, route in served.items() if requests_answered(urls[replica], route) == 0]:
            assert time.monotonic() < deadline, f"{idle} answered nothing through their fronts"
            assert not load.unexpected, load.unexpected
            time.sleep(0.5)

        secrets = read_secrets(paths)
        assert secrets is not None
        set_latency(urls, secrets.admin_token, PROVIDER_LATENCY_S)
        killed: dict[str, int] = {}
        for service in WORK_BULKHEADS:
            target = busy_replica(urls, service, within_s=60)
            # what `concierge kill` sends (the CLI itself takes seconds to start on a machine this busy)
            answer = asyncio.run(call(paths, "kill", target=target, restart=True))
            (victim,) = answer["killed"]
            assert victim["name"] == target and victim["pid"], answer
            killed[target] = int(victim["pid"])
            assert not pid_alive(killed[target])
            if service != "booking-agent":  # after it, the worker at once: while it resumes the orphans
                load.wait_accepted(len(load.accepted) + ACCEPTED_BETWEEN_KILLS, 90, f"after killing {target}")
        set_latency(urls, secrets.admin_token, 0)
    finally:
        load.stop.set()
        for thread in threads:
            thread.join(timeout=FINAL_WAIT_S + 60)
    assert not any(thread.is_alive() for thread in threads), "a load client is stuck"
    assert not load.unexpected, load.unexpected

    # every accepted booking ended final (its client waited for it), and confirmed: rooms and money were there
    accepted = load.accepted
    assert len(set(accepted)) == len(accepted), "one booking accepted twice"
    assert set(load.final) == set(accepted), set(accepted) - set(load.final)
    assert Counter(load.final.values()) == {"confirmed": len(accepted)}, Counter(load.final.values())

    # the ledgers: one confirmed reservation and one captured charge per booking, no hold, nothing else
    headers = {"Authorization": f"Bearer {secrets.admin_token}"}
    reservations = httpx.get(f"{urls['hotel-api']}/admin/ledger", headers=headers, timeout=30).json()["reservations"]
    charges = httpx.get(f"{urls['payment-api']}/admin/ledger", headers=headers, timeout=30).json()["charges"]
    confirmed_rooms = Counter(r["reference"] for r in reservations if r["status"] == "confirmed")
    captured = Counter(c["reference"] for c in charges if c["status"] == "captured")
    assert confirmed_rooms == Counter(accepted), "a booking without exactly one confirmed reservation"
    assert captured == Counter(accepted), "a booking without exactly one captured charge"
    assert [r for r in reservations if r["status"] == "held"] == [], "a room left on hold"
    assert {r["reference"] for r in reservations} | {c["reference"] for c in charges} <= set(accepted)
    audit = concierge(env, "verify")
    assert audit.returncode == 0 and "0 disagreement(s)" in audit.stdout, audit.stdout + audit.stderr

    # the kills landed on work and were survived: each killed replica restarted, the orphans resumed by the workers
    deadline = time.monotonic() + 90
    while True:
        status = asyncio.run(call(paths, "status"))
        instances = {i["name"]: i for i in status["state"]["instances"]}
        if all(i["status"] == "up" for i in instances.values()):
            break
        assert time.monotonic() < deadline, f"not every replica is back: {instances}"
        time.sleep(0.5)
    for target, pid in killed.items():
        assert instances[target]["restarts"] == 1 and instances[target]["pid"] != pid, instances[target]
    assert status["in_flight"] == 0
    # the queue's figures are shared by the workers: any one tells them
    queue = httpx.get(f"{urls['recovery-worker:2']}/health/queue", timeout=30).json()
    assert queue["dlq_depth"] == 0, queue
    assert queue["recovered_total"] >= 1, f"killing booking-agent:1 orphaned no run: {queue}"

    down = concierge(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    print(
        f"replicas: {len(accepted)} bookings confirmed through the kills of {', '.join(killed)}; "
        f"{load.transport_errors} client connections lost and retried, refusals {dict(load.refused)}, "
        f"recovered by the workers {queue['recovered_total']}"
    )
