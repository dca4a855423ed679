"""Every booking's journal, as real processes write and serve it: clean run, kill -9, SIGTERM, SSE resume, the list.

One stack for the module (short leases as in ``test_chaos``); each test books its own dates.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_chaos import CHAOS_ENV, RECOVERY_TIMEOUT_S
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

FINAL = {"confirmed", "failed", "cancelled"}
SIDE_EFFECTS = {("hotel-api", "POST /reservations"), ("payment-api", "POST /charges")}


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def journal_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("journal")
    with Stack(tmp, redis_url, database_url=database, env=CHAOS_ENV) as stack:
        stack.start((*CORE, "recovery-worker"))
        yield stack


@pytest.fixture
def stack(journal_stack: Stack) -> Iterator[Stack]:
    for service in (*CORE, "recovery-worker"):
        if not journal_stack.services[service].alive:
            journal_stack.serve(service)
    yield journal_stack
    for provider in ("hotel-api", "payment-api"):
        journal_stack.fault(provider)


def book(stack: Stack, days_ahead: int, **fields: Any) -> str:
    checkin, checkout = stay(days_ahead=days_ahead)
    return str(stack.book(checkin=checkin, checkout=checkout, **fields)["booking_id"])


def events(stack: Stack, booking_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["booking_id"] == booking_id
    return list(body["events"])


def final_events(stack: Stack, booking_id: str) -> list[dict[str, Any]]:
    """The journal once the booking is final (its final entry is written with the status)."""
    stack.wait(booking_id, timeout=RECOVERY_TIMEOUT_S)
    return events(stack, booking_id)


def kinds(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["kind"] for entry in entries]


def acted(entries: list[dict[str, Any]], dependency: str, operation: str) -> list[dict[str, Any]]:
    return [
        e
        for e in entries
        if e["kind"] == "call"
        and e["dependency"] == dependency
        and e["operation"] == operation
        and not e["replayed"]
        and e["outcome"].startswith("2")
    ]


def assert_well_formed(entries: list[dict[str, Any]]) -> None:
    assert entries[0]["kind"] == "accepted"
    assert entries[-1]["kind"] in FINAL
    assert sum(e["kind"] in FINAL for e in entries) == 1, kinds(entries)
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-")))) and len(set(ids)) == len(ids)
    for entry in entries:
        assert {"kind", "at", "instance"} <= entry.keys(), entry
        assert entry["at"].endswith("Z") and "T" in entry["at"]


# ------------------------------------------------------------------------------------------------ clean run


def test_journal_of_a_clean_run_tells_every_step_and_holds_no_secret(stack: Stack) -> None:
    booking_id = book(stack, 200, payment_token="tok_ok_journal_secret")
    entries = final_events(stack, booking_id)
    assert_well_formed(entries)
    assert entries[-1]["kind"] == "confirmed"
    steps = [e["step"] for e in entries if e["kind"] == "step_started"]
    assert steps == ["search", "reserve", "charge", "confirm", "finish"], kinds(entries)
    finished = [e for e in entries if e["kind"] == "step_finished"]
    assert {e["step"] for e in finished} == {"search", "reserve", "charge", "confirm"}  # nothing after the final
    assert all(e["fence"] == 1 and e["attempt"] == 1 and e["outcome"] == "ok" for e in finished)
    assert all(e["instance"] == entries[0]["instance"] for e in finished)
    for dependency, operation in SIDE_EFFECTS:
        assert len(acted(entries, dependency, operation)) == 1, (dependency, kinds(entries))
    assert not [e for e in entries if e.get("replayed")]
    # no secret anywhere: not the card token, not a service token, not the admin token
    text = json.dumps(entries)
    for secret in ("tok_ok_journal_secret", "tok_", stack.secret, stack.admin_token, "Bearer", "eyJ"):
        assert secret not in text, secret


def test_unknown_booking_is_404_and_bad_last_event_id_422(stack: Stack) -> None:
    url = f"{stack.url('booking-agent')}/bookings/nosuchbooking/events"
    for accept in ("application/json", "text/event-stream"):
        response = stack.http.get(url, headers={"Accept": accept})
        assert response.status_code == 404, response.text
        assert "nosuchbooking" in response.json()["detail"]
    booking_id = book(stack, 201)
    response = stack.http.get(
        f"{stack.url('booking-agent')}/bookings/{booking_id}/events",
        headers={"Accept": "text/event-stream", "Last-Event-ID": "not-an-id"},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]
    stack.wait(booking_id)
