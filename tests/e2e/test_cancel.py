"""Cancelling bookings on a real stack: every service and the recovery worker as processes, Redis, Postgres, HTTP.

``POST /bookings/{id}/cancel`` stops a run at its next step boundary wherever it runs (booking-agent, or the
recovery worker after the owner was killed), compensates and ends the booking ``cancelled``; the providers' ledgers
then hold nothing for it: no room held or confirmed, no money captured. Provider latency (the fault API) holds a
booking in the step a test cancels it in. Leases are short, as in ``test_chaos``, so recovery takes about a second.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.booking.graph import booking_input
from infra.bookings import BookingStore, booking_key
from infra.payment_tokens import PaymentTokens
from infra.redis import create_redis, create_sync_redis
from infra.settings import get_settings
from runs.leases import RunStore, active_index_key, run_key
from tests.procs import concierge_command
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

SERVICES = (*CORE, "recovery-worker")
CANCEL_ENV = {
    "RUN_LEASE_TTL": "1",
    "ORPHAN_SCAN_INTERVAL": "0.2",
    "IDEMPOTENCY_LEASE_S": "1",
    "BOOKING_BUDGET_S": "20",
    "CONCIERGE_CIRCUITS": '{"hotel_api": {"recovery_timeout": 2.0}, "payment_api": {"recovery_timeout": 2.0}}',
}
END_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def cancel_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("cancel")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=CANCEL_ENV) as stack:
        stack.start(SERVICES)
        yield stack


@pytest.fixture
def stack(cancel_stack: Stack) -> Iterator[Stack]:
    """The shared stack with every service up and no faults, before and after each test."""
    for service in SERVICES:
        if not cancel_stack.services[service].alive:
            cancel_stack.serve(service)
    yield cancel_stack
    for provider in ("hotel-api", "payment-api"):
        cancel_stack.fault(provider)


# --------------------------------------------------------------------------------------------------- helpers


def book(stack: Stack, *, days_ahead: int) -> str:
    """A Lisbon booking; each test books its own dates so no test runs out of rooms for another."""
    checkin, checkout = stay(days_ahead=days_ahead)
    return str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])


def cancel(stack: Stack, booking_id: str) -> httpx.Response:
    return stack.http.post(f"{stack.url('booking-agent')}/bookings/{booking_id}/cancel")


def in_redis(stack: Stack, booking_id: str) -> dict[str, str]:
    """The booking record without asking booking-agent (which may be dead)."""
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return dict(client.hgetall(booking_key(booking_id, prefix=stack.prefix)))
    finally:
        client.close()


def run_record(stack: Stack, booking_id: str) -> dict[str, str]:
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return dict(client.hgetall(run_key(booking_id, prefix=stack.prefix)))  # type: ignore[arg-type]
    finally:
        client.close()


def wait_for_status(stack: Stack, booking_id: str, wanted: set[str], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = in_redis(stack, booking_id).get("status", "")
        if status in wanted:
            return status
        assert status not in {"confirmed", "failed", "cancelled"}, f"booking ended {status} before reaching {wanted}"
        time.sleep(0.02)
    raise AssertionError(f"booking {booking_id} never reached {wanted} (last: {in_redis(stack, booking_id)})")


def wait_cancelled(stack: Stack, booking_id: str) -> dict[str, Any]:
    booking = stack.wait(booking_id, timeout=END_TIMEOUT_S)
    assert booking["status"] == "cancelled", booking
    return booking


def ledgers_of(stack: Stack, booking_id: str) -> tuple[Counter[str], Counter[str]]:
    """The statuses of the booking's reservations at hotel-api and of its charges at payment-api."""
    rooms = Counter(r["status"] for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == booking_id)
    money = Counter(c["status"] for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking_id)
    return rooms, money


def assert_nothing_kept(stack: Stack, booking_id: str) -> tuple[Counter[str], Counter[str]]:
    rooms, money = ledgers_of(stack, booking_id)
    assert rooms["held"] == 0 and rooms["confirmed"] == 0, f"a room is kept: {rooms}"
    assert money["captured"] == 0, f"money is kept: {money}"
    return rooms, money


def concierge(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=90,
    )


# --------------------------------------------------------------------------------------------------- tests


def test_cancel_before_search_of_a_run_no_process_runs_ends_cancelled_when_the_worker_resumes_it(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner died right after accepting (run and booking recorded, no step run): the cancel is recorded at once,
    and the recovery worker that resumes the run stops it before its search."""
    booking_id = uuid.uuid4().hex
    checkin, checkout = stay(days_ahead=120)
    request = {"city": "Porto", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    monkeypatch.setenv("REDIS_URL", stack.env["REDIS_URL"])
    monkeypatch.setenv("CONCIERGE_KEY_PREFIX", stack.prefix)
    monkeypatch.setenv("RUN_LEASE_TTL", "30")  # the dead owner's lease still runs while the cancel comes in
    get_settings.cache_clear()

    async def accept_then_die() -> None:
        client = create_redis()
        try:
            await PaymentTokens(client).put(booking_id, request["payment_token"])
            lease = await RunStore(client).create(
                booking_id, "booking", dict(booking_input(booking_id, request)), "booking-agent-crashed"
            )
            assert lease is not None
            assert await BookingStore(client).create(booking_id, request)
        finally:
            await client.aclose()

    try:
        asyncio.run(accept_then_die())
    finally:
        get_settings.cache_clear()

    response = cancel(stack, booking_id)
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "pending" and response.json()["cancel_requested_at"]
    # the dead owner's lease runs out now rather than in 30 s: the orphan scanner hands the run to the worker
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        client.hset(run_key(booking_id, prefix=stack.prefix), "lease_until", 0)
        client.zadd(active_index_key(prefix=stack.prefix), {booking_id: 0})
    finally:
        client.close()

    wait_cancelled(stack, booking_id)
    rooms, money = assert_nothing_kept(stack, booking_id)
    assert not rooms and not money, "no search, no hold, no charge"
    record = run_record(stack, booking_id)
    assert record["status"] == "done", record
    assert int(record["fence"]) >= 2, "the recovery worker ran it"


def test_cancel_during_reserve_releases_the_hold_and_charges_nothing(stack: Stack) -> None:
    stack.fault("hotel-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=121)
    wait_for_status(stack, booking_id, {"reserving"})

    response = cancel(stack, booking_id)
    assert response.status_code == 202, response.text
    assert response.json()["booking_id"] == booking_id and response.json()["cancel_requested_at"]
    stack.fault("hotel-api")

    wait_cancelled(stack, booking_id)
    rooms, money = assert_nothing_kept(stack, booking_id)
    assert rooms["cancelled"] == 1, f"the hold the reserve made is released: {rooms}"
    assert not money, "no charge was ever attempted"


def test_cancel_during_charge_refunds_the_capture(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=122)
    wait_for_status(stack, booking_id, {"paying"})

    assert cancel(stack, booking_id).status_code == 202
    stack.fault("payment-api")

    booking = wait_cancelled(stack, booking_id)
    rooms, money = assert_nothing_kept(stack, booking_id)
    assert rooms == Counter({"cancelled": 1}) and money == Counter({"refunded": 1}), (rooms, money)
    assert booking["payment_id"], "the charge went through, and was refunded"
    assert stack.booking(booking_id)["status"] == "cancelled"


def test_cancel_twice_answers_the_same_and_200_once_cancelled(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, days_ahead=123)
    wait_for_status(stack, booking_id, {"paying"})

    first, second = cancel(stack, booking_id), cancel(stack, booking_id)
    assert (first.status_code, second.status_code) == (202, 202), (first.text, second.text)
    assert first.json()["cancel_requested_at"] == second.json()["cancel_requested_at"]
    by_cli = concierge(stack, "cancel", booking_id, "--url", stack.url("booking-agent"), "--wait")
    assert by_cli.returncode == 0, by_cli.stderr
    assert by_cli.stdout.splitlines()[-1] == f"booking {booking_id}: cancelled", by_cli.stdout
    stack.fault("payment-api")

    wait_cancelled(stack, booking_id)
    again = cancel(stack, booking_id)
    assert again.status_code == 200, again.text
    assert again.json()["status"] == "cancelled" and again.json() == stack.booking(booking_id)
    by_cli = concierge(stack, "cancel", booking_id, "--url", stack.url("booking-agent"))
    assert (by_cli.returncode, by_cli.stdout.strip()) == (0, f"booking {booking_id}: cancelled"), by_cli.stderr
    assert_nothing_kept(stack, booking_id)


def test_a_failed_booking_answers_409_already_final_and_stays_failed(stack: Stack) -> None:
    checkin, checkout = stay(days_ahead=124)
    booking_id = str(stack.book(checkin=checkin, checkout=checkout, payment_token="tok_declined")["booking_id"])
    assert stack.wait(booking_id, timeout=END_TIMEOUT_S)["status"] == "failed"

    response = cancel(stack, booking_id)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "already_final"
    assert response.json()["error"]["status"] == "failed"
    assert stack.booking(booking_id)["status"] == "failed"
    assert_nothing_kept(stack, booking_id)

    by_cli = concierge(stack, "cancel", booking_id, "--url", stack.url("booking-agent"))
    assert by_cli.returncode == 1 and by_cli.stdout == ""
    assert by_cli.stderr.count("\n") == 1 and "already_final" in by_cli.stderr, by_cli.stderr
    # a confirmed stay is cancelled under its policy instead (tests/e2e/test_cancel_confirmed.py)


def test_an_unknown_booking_answers_404(stack: Stack) -> None:
    response = cancel(stack, "no-such-booking")
    assert response.status_code == 404, response.text
    assert cancel(stack, "not%20an%20id").status_code == 422
    by_cli = concierge(stack, "cancel", "no-such-booking", "--url", stack.url("booking-agent"))
    assert (by_cli.returncode, by_cli.stdout) == (1, "")
    assert by_cli.stderr == "concierge cancel: no booking no-such-booking\n"


@pytest.mark.parametrize(
    ("index", "status", "slow_provider"),
    [(0, "reserving", "hotel-api"), (1, "paying", "payment-api")],
    ids=["during_reserve", "during_charge"],
)
def test_cancel_then_kill_the_owner_still_ends_cancelled_with_the_ledgers_clean(
    stack: Stack, index: int, status: str, slow_provider: str
) -> None:
    """The step the owner was killed in runs again in the recovery worker (replayed: the provider answers from its
    idempotency record), and the edge after it finds the flag: what the step did is undone."""
    stack.fault(slow_provider, latency_s=3.0)
    booking_id = book(stack, days_ahead=125 + index)
    wait_for_status(stack, booking_id, {status})

    assert cancel(stack, booking_id).status_code == 202
    stack.services["booking-agent"].kill()
    assert in_redis(stack, booking_id)["status"] == status, "killed in the step, the cancel not acted on yet"
    stack.fault(slow_provider)

    deadline = time.monotonic() + END_TIMEOUT_S
    while in_redis(stack, booking_id)["status"] != "cancelled":  # booking-agent is dead: the worker ends it
        assert time.monotonic() < deadline, in_redis(stack, booking_id)
        time.sleep(0.05)
    stack.serve("booking-agent")
    assert stack.booking(booking_id)["status"] == "cancelled"
    assert_nothing_kept(stack, booking_id)
    record = run_record(stack, booking_id)
    assert record["status"] == "done" and int(record["fence"]) >= 2, record


def test_verify_finds_every_cancelled_booking_consistent_with_the_ledgers(stack: Stack) -> None:
    """Last in this module: ``concierge verify`` over every booking above (cancelled and confirmed ones)."""
    result = concierge(
        stack, "verify", "--hotel-api", stack.url("hotel-api"), "--payment-api", stack.url("payment-api")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cancelled" in result.stdout and "0 disagreement(s)" in result.stdout, result.stdout
