"""Presence with real processes: a dead owner is noticed by its Redis connection, a live one is never robbed.

The stack runs with leases of ten minutes (``RUN_LEASE_TTL`` and ``PRESENCE_LEASE_TTL``): a run taken over within
the tests' timeouts can only have been taken because its owner's named connection went away. No wall-clock
assertions: timeouts only bound the waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from agents.payment.graph import payment_thread_id
from infra.booking_keys import booking_key
from infra.redis import create_sync_redis, key
from runs.leases import run_key
from tests.conftest import start_redis_server
from tests.procs import ServiceProcess, free_port
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

LONG_S = 600.0
PRESENCE_ENV = {
    "RUN_LEASE_TTL": str(LONG_S),
    "PRESENCE_LEASE_TTL": str(LONG_S),
    "PRESENCE_GRACE": "1.0",
    "ORPHAN_SCAN_INTERVAL": "0.2",
    "IDEMPOTENCY_LEASE_S": "1",
    "BOOKING_BUDGET_S": "60",
    "BOOKING_MAX_IN_FLIGHT": "80",
    "CONCIERGE_LOG_LEVEL": "INFO",
}
TIMEOUT_S = 60.0
START_S = 120.0
"""Bounds a service's start: on a busy machine importing LangGraph alone can take half a minute."""


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def presence_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("presence")
    with Stack(tmp, redis_url, database_url=database, env=PRESENCE_ENV) as stack:
        for service in (*CORE, "recovery-worker"):
            serve(stack, service)
        yield stack


@pytest.fixture
def stack(presence_stack: Stack) -> Iterator[Stack]:
    for service in (*CORE, "recovery-worker"):
        if not presence_stack.services[service].alive:
            serve(presence_stack, service)
    yield presence_stack
    for provider in ("hotel-api", "payment-api"):
        presence_stack.fault(provider)


# --------------------------------------------------------------------------------------------------- helpers


def serve(stack: Stack, service: str, env: dict[str, str] | None = None) -> ServiceProcess:
    """``stack.serve`` with a longer bound on the start (``START_S``)."""
    proc = stack.procs.serve(service, port=stack.ports[service], env=env, timeout=START_S)
    stack.services[service] = proc
    return proc


def sync_redis(stack: Stack) -> Any:
    return create_sync_redis(stack.env["REDIS_URL"])


def book(stack: Stack, days_ahead: int) -> str:
    checkin, checkout = stay(days_ahead=days_ahead)
    return str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])


def redis_status(stack: Stack, booking_id: str) -> str:
    with sync_redis(stack) as client:
        return str(client.hget(booking_key(booking_id, prefix=stack.prefix), "status"))


def fence(stack: Stack, booking_id: str) -> int:
    with sync_redis(stack) as client:
        return int(client.hget(run_key(booking_id, prefix=stack.prefix), "fence") or 0)


def wait_until(condition: object, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_for_status(stack: Stack, booking_id: str, wanted: set[str]) -> None:
    wait_until(lambda: redis_status(stack, booking_id) in wanted, f"{booking_id} to reach {wanted}")


def charge_claimed(stack: Stack, booking_id: str) -> bool:
    """payment-agent holds the idempotency claim of the booking's charge (taken before it calls payment-api)."""
    claims = key("idem", f"charge:{payment_thread_id(booking_id, 'charge')}:*", prefix=stack.prefix)
    with sync_redis(stack) as client:
        return any(True for _ in client.scan_iter(match=claims, count=1000))


def presence_connections(stack: Stack, service: str) -> dict[str, int]:
    """name → client id of the named (presence) connections of ``service``'s processes."""
    with sync_redis(stack) as client:
        return {
            c["name"]: int(c["id"])
            for c in client.client_list(_type="normal")
            if c.get("name", "").startswith(f"{service}-")
        }


def assert_each_confirmed_exactly_once(stack: Stack, booking_ids: list[str]) -> None:
    for booking_id in booking_ids:
        wait_until(lambda b=booking_id: redis_status(stack, b) in {"confirmed", "failed"}, f"{booking_id} to end")
        assert redis_status(stack, booking_id) == "confirmed", booking_id
    ids = set(booking_ids)
    reservations = [r for r in stack.ledger("hotel-api")["reservations"] if r["reference"] in ids]
    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] in ids]
    confirmed = Counter(r["reference"] for r in reservations if r["status"] == "confirmed")
    captured = Counter(c["reference"] for c in charges if c["status"] == "captured")
    assert all(confirmed[b] == 1 for b in ids), confirmed
    assert all(captured[b] == 1 for b in ids), captured
    assert not [r for r in reservations if r["status"] == "held"], "a room is left on hold"


# --------------------------------------------------------------------------------------------------- tests


def test_kill_9_a_peer_takes_the_run_over_long_before_any_lease_could_expire(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, 300)
    wait_for_status(stack, booking_id, {"paying"})
    stack.services["booking-agent"].kill()
    # ten-minute leases: only the dead process's closed connection can explain a takeover within the timeout
    wait_until(lambda: fence(stack, booking_id) >= 2, "a peer to take the run over")
    stack.fault("payment-api")
    assert_each_confirmed_exactly_once(stack, [booking_id])
    assert fence(stack, booking_id) == 2
    serve(stack, "booking-agent")


def test_sigterm_cancels_the_step_and_hands_the_run_over(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3.0)
    booking_id = book(stack, 302)
    wait_for_status(stack, booking_id, {"paying"})
    agent = stack.services["booking-agent"]
    os.kill(agent.pid, signal.SIGTERM)
    # handed over while the 3 s charge call would still be running: the step was cancelled, not waited for
    wait_until(lambda: fence(stack, booking_id) >= 2, "the handoff", timeout=TIMEOUT_S)
    assert agent.terminate() in (0, -15)
    assert "handed off for recovery" in agent.log_text()
    stack.fault("payment-api")
    assert_each_confirmed_exactly_once(stack, [booking_id])
    serve(stack, "booking-agent")


def test_client_kill_of_the_presence_connection_is_a_blip_the_owner_keeps_its_run(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, 304)
    wait_for_status(stack, booking_id, {"paying"})
    (name, client_id), *_ = presence_connections(stack, "booking-agent").items()
    with sync_redis(stack) as client:
        assert client.execute_command("CLIENT", "KILL", "ID", client_id) == 1
    wait_until(lambda: name in presence_connections(stack, "booking-agent"), "the presence to reconnect")
    stack.fault("payment-api")
    assert_each_confirmed_exactly_once(stack, [booking_id])
    assert fence(stack, booking_id) == 1, "reconnected within the grace: nobody took the run"
    assert stack.services["booking-agent"].alive


@pytest.mark.slow
def test_a_cpu_hog_beside_a_live_owner_takes_nothing_from_it(stack: Stack) -> None:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        stack.fault("payment-api", latency_s=1.0)
        booking_ids = [book(stack, 306 + 2 * n) for n in range(3)]
        stack.fault("payment-api")
        assert_each_confirmed_exactly_once(stack, booking_ids)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert [fence(stack, b) for b in booking_ids] == [1, 1, 1], "a slow owner is not a dead one"


def test_sigstop_frozen_owner_is_taken_over_after_its_instance_lease_and_is_fenced_after_sigcont(
    stack: Stack,
) -> None:
    stack.services["booking-agent"].kill()
    agent = serve(stack, "booking-agent", env={"PRESENCE_LEASE_TTL": "2"})
    stack.fault("payment-api", latency_s=1.5)
    booking_id = book(stack, 320)
    wait_for_status(stack, booking_id, {"paying"})
    (name, _), *_ = presence_connections(stack, "booking-agent").items()
    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: fence(stack, booking_id) >= 2, "the frozen owner's instance lease to expire")
        assert name in presence_connections(stack, "booking-agent"), "frozen, its socket stayed open"
        wait_until(lambda: redis_status(stack, booking_id) == "confirmed", "the peer to finish it")
    finally:
        os.killpg(agent.pid, signal.SIGCONT)
    # woken up mid-charge: its next side effect is refused by the fence
    wait_until(lambda: "lease lost" in agent.log_text(), "the old owner to notice the takeover")
    stack.fault("payment-api")
    assert_each_confirmed_exactly_once(stack, [booking_id])
    agent.kill()
    serve(stack, "booking-agent")


@pytest.mark.slow
def test_fifty_runs_on_a_killed_replica_are_resumed_by_two_workers_each_exactly_once(stack: Stack) -> None:
    second = stack.procs.serve("recovery-worker", port=free_port(), timeout=START_S)
    try:
        stack.fault("payment-api", latency_s=1.5)
        booking_ids = [book(stack, 400 + n) for n in range(50)]
        wait_until(
            lambda: sum(redis_status(stack, b) == "paying" for b in booking_ids) >= 10, "bookings to reach payment"
        )
        stack.services["booking-agent"].kill()
        stack.fault("payment-api")
        assert_each_confirmed_exactly_once(stack, booking_ids)
        fences = Counter(fence(stack, b) for b in booking_ids)
        assert set(fences) <= {1, 2}, f"each run taken over at most once: {fences}"
        assert fences[2] > 0
    finally:
        _stop(second)
    serve(stack, "booking-agent")


def _stop(proc: ServiceProcess) -> None:
    if proc.alive:
        proc.kill()


# --------------------------------------------------------------------------------------------------- Redis restart


PROVIDERS = ("hotel-api", "payment-api")


@pytest.mark.slow
def test_a_redis_restart_under_load_takes_no_run_from_its_live_owner(tmp_path: Path, redis_url: str) -> None:
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server, url = start_redis_server(appendonly=True, workdir=str(workdir))
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with fresh_database() as database, Stack(tmp_path, url, database_url=database, env=PRESENCE_ENV) as stack:
            # Only our services' Redis restarts. The providers stand for services outside ours: they keep their own
            # (the test Redis, under this stack's unique key prefix). On the restarted one their 503s during the
            # outage could open payment-agent's breaker and fail a run, which is not what this test is about.
            for service in (*CORE, "recovery-worker"):
                serve(stack, service, env={"REDIS_URL": redis_url} if service in PROVIDERS else None)
            # every booking held in its charge (payment-api's latency), past every step an outage fails: a search, a
            # hold, or payment-agent's claim of the charge meeting the outage fails the booking (a true final state,
            # compensated, but not what this test is about). "paying" is reported as the charge step starts, before
            # payment-agent has claimed it: its claim is what says the charge is in payment-api's hands.
            stack.fault("payment-api", latency_s=4.0)
            booking_ids = [book(stack, 500 + n) for n in range(8)]
            wait_until(lambda: all(charge_claimed(stack, b) for b in booking_ids), "the charges to be in flight")
            holds = f"{stack.prefix}:{{hotel-api}}:*"
            with create_sync_redis(redis_url) as theirs, sync_redis(stack) as ours:
                assert any(theirs.scan_iter(match=holds)), "the providers write to their own Redis"
                assert not any(ours.scan_iter(match=holds)), "nothing of the providers' is on the Redis that restarts"
            server.kill()
            server.wait(timeout=10)
            time.sleep(0.5)
            server, _ = start_redis_server(port, appendonly=True, workdir=str(workdir))
            stack.fault("payment-api")
            assert_each_confirmed_exactly_once(stack, booking_ids)
            assert [fence(stack, b) for b in booking_ids] == [1] * 8, "every connection dropped; no owner died"
    finally:
        server.kill()
        server.wait(timeout=10)


# --------------------------------------------------------------------------------------------------- a failed release


class RedisRelay:
    """A TCP relay in front of Redis for one process: ``cut()`` drops its connections and refuses new ones until
    ``heal()``; that process alone meets a Redis outage, everyone else's Redis answers."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = urlunsplit(parts._replace(netloc=f"127.0.0.1:{self.port}"))
        self._broken = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self._broken.set()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)

    def heal(self) -> None:
        self._broken.clear()

    def close(self) -> None:
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._broken.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=2)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update({client, upstream})
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.difference_update({src, dst})
            _close(src)
            _close(dst)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def events(stack: Stack, booking_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events")
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def test_a_run_whose_release_met_an_outage_is_recovered_by_a_peer_while_its_owner_lives(stack: Stack) -> None:
    """booking-agent alone loses Redis mid-run, for longer than its run's budget: the run gives up and its release
    fails, and Redis comes back with the run still held by the live agent. Its audit hands the run to a peer.

    The recovery worker gets a presence grace longer than the outage, so the agent is never declared dead: only the
    owner's own audit can explain the takeover (ten-minute run and instance leases).
    """
    stack.services["booking-agent"].kill()
    stack.services["recovery-worker"].kill()
    serve(stack, "recovery-worker", env={"PRESENCE_GRACE": "60"})
    relay = RedisRelay(stack.env["REDIS_URL"])
    agent = serve(stack, "booking-agent", env={"REDIS_URL": relay.url, "BOOKING_BUDGET_S": "4"})
    try:
        stack.fault("payment-api", latency_s=1.0)
        booking_id = book(stack, 330)
        wait_for_status(stack, booking_id, {"paying"})
        relay.cut()
        # the charge returns (payment-agent's Redis answers), the agent's own writes fail, it waits for its stores
        # until the run's 4 s budget is spent, gives the run up and cannot release it
        wait_until(lambda: "could not release the lease" in agent.log_text(), "the release to fail")
        relay.heal()
        wait_until(lambda: fence(stack, booking_id) >= 2, "a peer to take the held run over")
        assert agent.alive
        stack.fault("payment-api")
        assert_each_confirmed_exactly_once(stack, [booking_id])
        assert "not executing here released for recovery" in agent.log_text()
        lost = [e for e in events(stack, booking_id) if e["kind"] == "owner_lost"]
        assert [e["owner"].split("-")[:2] for e in lost if e.get("reason") == "held run not executing"] == [
            ["booking", "agent"]
        ], lost
        assert agent.alive, "the owner lived through it all"
    finally:
        relay.close()
        agent.kill()
        stack.services["recovery-worker"].kill()
    serve(stack, "booking-agent")
    serve(stack, "recovery-worker")
