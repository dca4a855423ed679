"""Chaos: booking-agent and recovery-worker killed (``kill -9``) or stopped (SIGTERM) mid-booking, as real processes.

Every booking must still end ``confirmed`` exactly once: one confirmed reservation, one captured charge, no room
left on hold. Leases are short (``RUN_LEASE_TTL=1``, ``ORPHAN_SCAN_INTERVAL=0.2``, ``IDEMPOTENCY_LEASE_S=1``) so
recovery takes about a second; provider latency (the fault API) holds a booking in the step we want to kill it in.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agents.booking.graph import booking_input
from infra.bookings import booking_key
from infra.payment_tokens import PaymentTokens
from infra.redis import create_redis, create_sync_redis, key
from infra.settings import get_settings
from runs.leases import RECOVERY_TAG, RunStore, run_key
from tests.procs import concierge_command
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

LEASE_TTL_S = 1.0
CHAOS_ENV = {
    "RUN_LEASE_TTL": str(LEASE_TTL_S),
    "ORPHAN_SCAN_INTERVAL": "0.2",
    # a dead owner's claim on a side-effect node lapses this fast, so the resumed run does not wait for it
    "IDEMPOTENCY_LEASE_S": "1",
    "BOOKING_BUDGET_S": "20",
    "CONCIERGE_CIRCUITS": '{"hotel_api": {"recovery_timeout": 2.0}, "payment_api": {"recovery_timeout": 2.0}}',
}
RECOVERY_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("chaos")
    with Stack(tmp, redis_url, database_url=database, env=CHAOS_ENV) as stack:
        stack.start((*CORE, "recovery-worker"))
        yield stack


@pytest.fixture
def stack(chaos_stack: Stack) -> Iterator[Stack]:
    """The shared stack with every service up and no faults, before and after each test."""
    for service in (*CORE, "recovery-worker"):
        if not chaos_stack.services[service].alive:
            chaos_stack.serve(service)
    yield chaos_stack
    for provider in ("hotel-api", "payment-api"):
        chaos_stack.fault(provider)


# --------------------------------------------------------------------------------------------------- helpers


def book(stack: Stack, *, days_ahead: int) -> str:
    """A Lisbon booking; each test books its own dates so no test runs out of rooms for another."""
    checkin, checkout = stay(days_ahead=days_ahead)
    return str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])


def status_now(stack: Stack, booking_id: str) -> str:
    return str(stack.booking(booking_id)["status"])


def wait_for_status(stack: Stack, booking_id: str, wanted: set[str], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = status_now(stack, booking_id)
        if status in wanted:
            return status
        assert status not in {"confirmed", "failed"}, f"booking ended {status} before reaching {wanted}"
        time.sleep(0.02)
    raise AssertionError(f"booking {booking_id} never reached {wanted} (last: {status_now(stack, booking_id)})")


def run_record(stack: Stack, booking_id: str) -> dict[str, str]:
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return dict(client.hgetall(run_key(booking_id, prefix=stack.prefix)))  # type: ignore[arg-type]
    finally:
        client.close()


def booking_status_in_redis(stack: Stack, booking_id: str) -> str:
    """The booking's status without asking booking-agent (which may be dead)."""
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return str(client.hget(booking_key(booking_id, prefix=stack.prefix), "status"))
    finally:
        client.close()


def waiting_in_queue(stack: Stack) -> set[str]:
    """Ids any consumer may take now: the waiting list, plus ids given back by a consumer that was stopping."""
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        waiting = client.lrange(key(RECOVERY_TAG, "queue", prefix=stack.prefix), 0, -1)
        given_back = client.zrange(key(RECOVERY_TAG, "queue", "delayed", prefix=stack.prefix), 0, -1)
        return {*waiting, *given_back}  # type: ignore[misc]
    finally:
        client.close()


def queue_health(stack: Stack) -> dict[str, Any]:
    response = stack.http.get(f"{stack.url('recovery-worker')}/health/queue")
    assert response.status_code == 200, response.text
    return dict(response.json())


def assert_confirmed_exactly_once(stack: Stack, booking_id: str) -> None:
    booking = stack.wait(booking_id, timeout=RECOVERY_TIMEOUT_S)
    assert booking["status"] == "confirmed", booking
    reservations = [r for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == booking_id]
    statuses = Counter(r["status"] for r in reservations)
    assert statuses["confirmed"] == 1, reservations
    assert statuses["held"] == 0, f"a room is left on hold: {reservations}"
    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking_id]
    assert [c["status"] for c in charges].count("captured") == 1, charges
    assert booking["reservation_id"] in {r["reservation_id"] for r in reservations if r["status"] == "confirmed"}


def concierge(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def checkpoints_of(database: str, thread_id: str) -> int:
    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)).fetchone()
    return int(row[0]) if row else 0


# --------------------------------------------------------------------------------------------------- kill -9

# (kill point, provider slowed down to hold the booking there, statuses that mean "we are there")
KILL_POINTS = [
    ("before_first_checkpoint", "hotel-api", {"pending", "searching"}),
    ("during_search", "hotel-api", {"searching"}),
    ("during_reserve", "hotel-api", {"reserving"}),
    ("during_charge", "payment-api", {"paying"}),
    ("during_confirm", "hotel-api", {"confirming"}),
]


@pytest.mark.parametrize(
    ("index", "point", "slow_provider", "statuses"),
    [(n, *p) for n, p in enumerate(KILL_POINTS)],
    ids=[p[0] for p in KILL_POINTS],
)
def test_booking_agent_killed_mid_booking_is_recovered_exactly_once(
    stack: Stack, index: int, point: str, slow_provider: str, statuses: set[str]
) -> None:
    stack.fault(slow_provider, latency_s=2.0)
    booking_id = book(stack, days_ahead=90 + index)
    if point != "before_first_checkpoint":  # that one is killed right after its 202
        wait_for_status(stack, booking_id, statuses)
    stack.services["booking-agent"].kill()
    assert booking_status_in_redis(stack, booking_id) in statuses, "killed where we meant to"
    stack.fault(slow_provider)
    stack.serve("booking-agent")

    assert_confirmed_exactly_once(stack, booking_id)
    record = run_record(stack, booking_id)
    assert record["status"] == "done"
    assert int(record["fence"]) >= 2, "the recovery worker took the run over"


def test_booking_agent_dead_between_run_record_and_booking_record(
    stack: Stack, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowest crash: the run record (with its input and lease) exists, nothing else does."""
    booking_id = uuid.uuid4().hex
    checkin, checkout = stay(days_ahead=101)
    request = {"city": "Porto", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    monkeypatch.setenv("REDIS_URL", stack.env["REDIS_URL"])
    monkeypatch.setenv("CONCIERGE_KEY_PREFIX", stack.prefix)
    monkeypatch.setenv("RUN_LEASE_TTL", str(LEASE_TTL_S))
    get_settings.cache_clear()

    async def accept_then_die() -> None:
        client = create_redis()
        try:
            await PaymentTokens(client).put(booking_id, request["payment_token"])  # accept's first write
            lease = await RunStore(client).create(
                booking_id, "booking", dict(booking_input(booking_id, request)), "booking-agent-crashed"
            )
            assert lease is not None
        finally:
            await client.aclose()

    try:
        asyncio.run(accept_then_die())
    finally:
        get_settings.cache_clear()
    assert checkpoints_of(database, booking_id) == 0
    url = f"{stack.url('booking-agent')}/bookings/{booking_id}"
    assert stack.http.get(url).status_code == 404

    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while stack.http.get(url).status_code == 404:  # until the worker recreates it (lease TTL + scan interval)
        assert time.monotonic() < deadline, "the booking record was never recreated"
        time.sleep(0.05)
    assert_confirmed_exactly_once(stack, booking_id)
    booking = stack.booking(booking_id)
    assert (booking["city"], booking["checkin"], booking["guests"]) == ("Porto", checkin, 2)


# --------------------------------------------------------------------------------------------------- live owners


def test_a_node_three_times_longer_than_the_lease_is_never_recovered(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3 * LEASE_TTL_S)
    recovered_before = queue_health(stack)["recovered_total"]

    booking_id = book(stack, days_ahead=102)
    wait_for_status(stack, booking_id, {"paying"})
    started = time.monotonic()
    assert_confirmed_exactly_once(stack, booking_id)

    assert time.monotonic() - started >= 2.5, "the charge really was slow"
    assert int(run_record(stack, booking_id)["fence"]) == 1, "nobody else ever took the lease"
    assert queue_health(stack)["recovered_total"] == recovered_before


# --------------------------------------------------------------------------------------------------- the worker


def test_recovery_worker_killed_while_resuming_a_run(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3.0)
    booking_id = book(stack, days_ahead=103)
    wait_for_status(stack, booking_id, {"paying"})
    stack.services["booking-agent"].kill()

    deadline = time.monotonic() + 15
    while not run_record(stack, booking_id).get("owner", "").startswith("recovery-worker"):
        assert time.monotonic() < deadline, run_record(stack, booking_id)
        time.sleep(0.01)
    time.sleep(0.3)  # inside the slow charge now
    assert booking_status_in_redis(stack, booking_id) == "paying"
    stack.services["recovery-worker"].kill()
    stack.fault("payment-api")
    stack.serve("recovery-worker")
    stack.serve("booking-agent")

    assert_confirmed_exactly_once(stack, booking_id)
    assert int(run_record(stack, booking_id)["fence"]) >= 3, "taken over again after the worker died"


def test_run_failing_every_resume_is_dead_lettered_then_requeued_by_an_operator(stack: Stack, database: str) -> None:
    stack.fault("hotel-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=104)
    wait_for_status(stack, booking_id, {"reserving"})
    # The checkpoint store breaks (a botched migration) while the room is being held: the hold is made, its step
    # checkpoint is not, the owner's run fails, and so does every resume, which reads the checkpoint first. The
    # saga cannot turn that into a compensation: the run must raise, be retried, and end in the DLQ.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE checkpoints RENAME TO checkpoints_broken")
    try:
        deadline = time.monotonic() + 30
        while True:
            listing = concierge(stack, "dlq", "list", "--json")
            assert listing.returncode == 0, listing.stderr
            entries = {entry["thread_id"]: entry for entry in json.loads(listing.stdout)}
            if booking_id in entries:
                break
            assert time.monotonic() < deadline, "never dead-lettered"
            time.sleep(0.2)
        entry = entries[booking_id]
        assert (entry["reason"], entry["attempts"]) == ("max_attempts", 3)
        assert "checkpoints" in entry["error"], entry
        assert run_record(stack, booking_id)["status"] == "dead_lettered"
        assert status_now(stack, booking_id) == "reserving", "no compensation could run: the booking stays as it is"
        table = concierge(stack, "dlq", "list")
        assert booking_id in table.stdout and "max_attempts" in table.stdout
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("ALTER TABLE checkpoints_broken RENAME TO checkpoints")
    stack.fault("hotel-api")
    time.sleep(1.0)
    assert status_now(stack, booking_id) == "reserving", "a dead-lettered run waits for the operator"

    requeue = concierge(stack, "dlq", "requeue", booking_id)
    assert (requeue.returncode, requeue.stdout.strip()) == (0, f"requeued {booking_id}"), requeue.stderr
    assert_confirmed_exactly_once(stack, booking_id)
    assert booking_id not in concierge(stack, "dlq", "list").stdout


# --------------------------------------------------------------------------------------------------- SIGTERM


def test_sigterm_hands_the_run_over_without_waiting_for_the_lease(stack: Stack) -> None:
    # a lease far longer than the test may take: only the handoff (never an expiry) can get the run confirmed
    long_ttl = 600.0
    stack.services["booking-agent"].kill()
    stack.serve("booking-agent", env={"RUN_LEASE_TTL": str(long_ttl)})
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=105)
    wait_for_status(stack, booking_id, {"paying"})

    assert stack.services["booking-agent"].terminate() in (0, -15)
    record = run_record(stack, booking_id)
    # released (owner "") and queued; the recovery worker may already have taken it
    assert not record["owner"].startswith("booking-agent"), f"lease released on SIGTERM, not left to expire: {record}"
    stack.fault("payment-api")
    stack.serve("booking-agent")
    assert_confirmed_exactly_once(stack, booking_id)  # within RECOVERY_TIMEOUT_S, far below the lease
    assert int(run_record(stack, booking_id)["fence"]) == 2, "handed over once, to the recovery worker"


def test_sigterm_on_the_worker_hands_its_runs_back_at_once(stack: Stack) -> None:
    # with a lease this long, only a handoff (not an expiry) can get the run to the next worker within the test
    long_ttl = 600.0
    stack.services["recovery-worker"].kill()
    stack.serve("recovery-worker", env={"RUN_LEASE_TTL": str(long_ttl)})
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=106)
    wait_for_status(stack, booking_id, {"paying"})
    stack.services["booking-agent"].kill()
    deadline = time.monotonic() + 15
    while not run_record(stack, booking_id).get("owner", "").startswith("recovery-worker"):
        assert time.monotonic() < deadline, run_record(stack, booking_id)
        time.sleep(0.01)

    worker = stack.services["recovery-worker"]
    assert worker.terminate() in (0, -15), "the worker stops within its drain period"
    record = run_record(stack, booking_id)
    assert (record["status"], record["owner"]) == ("pending", ""), "lease released, not left to expire"
    assert booking_id in waiting_in_queue(stack), "re-enqueued at once for the next worker"
    assert "handed off for recovery" in worker.log_text()

    stack.fault("payment-api")
    stack.serve("recovery-worker")
    stack.serve("booking-agent")
    assert_confirmed_exactly_once(stack, booking_id)  # within RECOVERY_TIMEOUT_S, far below the lease
    assert int(run_record(stack, booking_id)["fence"]) == 3, "booking-agent, the stopped worker, the new worker"


def test_several_runs_orphaned_at_once_are_all_recovered_exactly_once(stack: Stack) -> None:
    recovered_before = queue_health(stack)["recovered_total"]
    stack.fault("payment-api", latency_s=2.0)
    booking_ids = [book(stack, days_ahead=110 + n) for n in range(4)]
    for booking_id in booking_ids:
        wait_for_status(stack, booking_id, {"paying"})
    stack.services["booking-agent"].kill()
    stack.fault("payment-api")
    stack.serve("booking-agent")

    for booking_id in booking_ids:
        assert_confirmed_exactly_once(stack, booking_id)
    assert queue_health(stack)["recovered_total"] == recovered_before + 4
