"""Every booking's journal, as real processes write and serve it: clean run, kill -9, SIGTERM, SSE resume, the list.

One stack for the module (short leases as in ``test_chaos``); each test books its own dates.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.booking_keys import booking_key, journal_key
from infra.redis import create_sync_redis
from tests.e2e.test_chaos import CHAOS_ENV, RECOVERY_TIMEOUT_S, assert_confirmed_exactly_once, wait_for_status
from tests.procs import concierge_command
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

FINAL = {"confirmed", "failed", "cancelled"}
READY_TIMEOUT_S = 120.0
CHARGE_IN_FLIGHT_S = 1.5
"""After ``paying`` shows, how long until the charge surely waits at payment-api (3 s latency): killed then, the
owner leaves a charge that happened, which the resumed run must not make again."""
SIDE_EFFECTS = {("hotel-api", "POST /reservations"), ("payment-api", "POST /charges")}


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def journal_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("journal")
    with Stack(tmp, redis_url, database_url=database, env=CHAOS_ENV) as stack:
        for service in (*CORE, "recovery-worker"):
            stack.serve(service, wait=False)
        for service in (*CORE, "recovery-worker"):
            stack.services[service].wait_ready(timeout=READY_TIMEOUT_S)
        yield stack


@pytest.fixture
def stack(journal_stack: Stack) -> Iterator[Stack]:
    for service in (*CORE, "recovery-worker"):
        if not journal_stack.services[service].alive:
            serve(journal_stack, service)
    yield journal_stack
    for provider in ("hotel-api", "payment-api"):
        journal_stack.fault(provider)


def serve(stack: Stack, service: str) -> None:
    """Start (again) and wait, with room for a machine under load (imports alone can take many seconds)."""
    stack.serve(service, wait=False).wait_ready(timeout=READY_TIMEOUT_S)


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


# ------------------------------------------------------------------------------------------ kill -9, SIGTERM


def test_journal_after_kill_9_of_the_owner_shows_the_loss_the_resume_and_no_second_charge(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3.0)
    booking_id = book(stack, 210)
    wait_for_status(stack, booking_id, {"paying"})
    time.sleep(CHARGE_IN_FLIGHT_S)
    owner = [e for e in events(stack, booking_id) if e["kind"] == "step_started"][-1]["instance"]
    stack.services["booking-agent"].kill()
    stack.fault("payment-api")
    serve(stack, "booking-agent")
    assert_confirmed_exactly_once(stack, booking_id)

    entries = events(stack, booking_id)
    assert_well_formed(entries)
    assert entries[-1]["kind"] == "confirmed"
    lost = [e for e in entries if e["kind"] == "owner_lost"]
    assert lost and lost[0]["owner"] == owner and lost[0]["noticed_by"] != owner, lost
    assert lost[0]["reason"] == "presence gone", lost
    assert [e["kind"] for e in entries].count("queued_for_recovery") >= 1
    resumed = [e for e in entries if e["kind"] == "resumed"]
    assert resumed and resumed[0]["at_step"] == "charge" and resumed[0]["fence"] >= 2, resumed
    assert resumed[0]["checkpoint_id"], resumed
    assert kinds(entries).index("owner_lost") < kinds(entries).index("resumed")
    charge_starts = [e for e in entries if e["kind"] == "step_started" and e["step"] == "charge"]
    assert [e["fence"] for e in charge_starts][:1] == [1] and charge_starts[-1]["fence"] >= 2
    # every side effect acted exactly once; what the resumed run asked again was answered from a stored result
    for dependency, operation in SIDE_EFFECTS:
        assert len(acted(entries, dependency, operation)) == 1, (dependency, operation, entries)
    assert [e for e in entries if e["kind"] == "call" and e.get("replayed")], "the resumed charge was not replayed"


def test_journal_after_sigterm_shows_the_handoff(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, 211)
    wait_for_status(stack, booking_id, {"paying"})
    assert stack.services["booking-agent"].terminate() in (0, -15)
    stack.fault("payment-api")
    serve(stack, "booking-agent")
    assert_confirmed_exactly_once(stack, booking_id)

    entries = events(stack, booking_id)
    assert_well_formed(entries)
    handed = [e for e in entries if e["kind"] == "handed_off"]
    assert len(handed) == 1 and handed[0]["reason"] == "shutdown", kinds(entries)
    assert "owner_lost" not in kinds(entries), "a handoff is not a loss"
    resumed = [e for e in entries if e["kind"] == "resumed"]
    assert resumed and kinds(entries).index("handed_off") < kinds(entries).index("resumed")
    for dependency, operation in SIDE_EFFECTS:
        assert len(acted(entries, dependency, operation)) == 1, (dependency, operation, entries)


# ---------------------------------------------------------------------------------------------------- SSE


def read_sse(response: httpx.Response, stop_after: str | None = None) -> list[dict[str, Any]]:
    """The events of an open SSE response, until the stream ends (or an event of kind ``stop_after``)."""
    received: list[dict[str, Any]] = []
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            continue  # keep-alive comment
        if not line:
            if "data" in event:
                entry = json.loads(event["data"])
                assert entry["id"] == event["id"], "id: is the entry id"
                received.append(entry)
                if entry["kind"] == stop_after:
                    return received
            event = {}
            continue
        name, _, value = line.partition(":")
        event[name] = value.lstrip(" ")
    return received


def test_sse_follows_live_and_resumes_with_last_event_id_across_a_booking_agent_restart(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, 220)
    url = f"{stack.url('booking-agent')}/bookings/{booking_id}/events"
    with httpx.Client(timeout=httpx.Timeout(30, read=60)) as client:
        with client.stream("GET", url, headers={"Accept": "text/event-stream"}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            first = read_sse(response, stop_after="step_started")
        wait_for_status(stack, booking_id, {"paying"})
        stack.services["booking-agent"].kill()
        stack.fault("payment-api")
        serve(stack, "booking-agent")
        headers = {"Accept": "text/event-stream", "Last-Event-ID": first[-1]["id"]}
        with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200
            rest = read_sse(response)  # returns only because the stream ends after the final entry
    assert rest and rest[-1]["kind"] == "confirmed"
    assert first + rest == events(stack, booking_id), "no gap, no repeat"
    assert "resumed" in kinds(rest)


def test_a_client_that_never_reads_does_not_grow_the_server_memory(stack: Stack) -> None:
    """Back pressure: a stream is pulled one send at a time, so an unread socket stalls its reader (bounded by the
    socket buffers and one page of entries) instead of queueing the journal in the server."""
    booking_id = uuid.uuid4().hex
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:  # a booking still running, whose journal holds 8 MB
        client.hset(
            booking_key(booking_id, prefix=stack.prefix), mapping={"booking_id": booking_id, "status": "paying"}
        )
        padding = "x" * 8000
        with client.pipeline(transaction=False) as pipe:
            for n in range(1000):
                entry = {"kind": "call", "at": "2027-01-01T00:00:00.000Z", "instance": "test", "n": n, "pad": padding}
                pipe.xadd(journal_key(booking_id, prefix=stack.prefix), {"e": json.dumps(entry)})
            pipe.execute()
    finally:
        client.close()
    pid = stack.services["booking-agent"].pid
    before = rss_kib(pid)
    stalled = []
    try:
        for _ in range(10):
            sock = socket.create_connection(("127.0.0.1", stack.ports["booking-agent"]))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET /bookings/{booking_id}/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            stalled.append(sock)  # never read
        time.sleep(3)  # time to push everything, if nothing held it back
        grown = rss_kib(pid) - before
        # unbounded, each stream would buffer its 8 MB: 80 MB; bounded, one page (0.8 MB) and the socket buffers each
        assert grown < 40 * 1024, f"RSS grew {grown} KiB with 10 unread streams of an 8 MB journal"
        assert stack.http.get(f"{stack.url('booking-agent')}/health/ready").status_code == 200
    finally:
        for sock in stalled:
            sock.close()


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---------------------------------------------------------------------------------------------- the list


def test_list_is_newest_first_paginated_without_repeats_and_refuses_bad_input(stack: Stack) -> None:
    mine = [book(stack, 230 + n) for n in range(3)]
    for booking_id in mine:
        stack.wait(booking_id)
    url = f"{stack.url('booking-agent')}/bookings"
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = stack.http.get(url, params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["bookings"]) <= 2
        seen.extend(page["bookings"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    ids = [item["booking_id"] for item in seen]
    assert len(ids) == len(set(ids)), "a page repeated a booking"
    assert [i for i in ids if i in mine] == mine[::-1], "newest first"
    created = [item["created_at"] for item in seen]
    assert created == sorted(created, reverse=True)
    assert {"booking_id", "status", "created_at", "updated_at"} <= seen[0].keys()

    confirmed = stack.http.get(url, params={"status": "confirmed", "limit": 200}).json()["bookings"]
    assert confirmed and all(item["status"] == "confirmed" for item in confirmed)
    assert set(mine) <= {item["booking_id"] for item in confirmed}

    for params, field in (
        ({"status": "bogus"}, "status"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ({"cursor": "!!"}, "cursor"),
        ({"limit": 0}, "limit"),
    ):
        response = stack.http.get(url, params=params)
        assert response.status_code == 422, (params, response.text)
        assert response.json()["detail"][0]["loc"] == ["query", field], response.text


# -------------------------------------------------------------------------------------------- the terminal


def concierge(stack: Stack, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_concierge_book_tells_the_recovery_story_and_show_and_bookings_print_it(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3.0)
    checkin, _ = stay(days_ahead=240)
    args = ["book", "--city", "Lisbon", "--checkin", checkin, "--nights", "2", "--timeout", "90"]
    booking = subprocess.Popen(
        [*concierge_command(), *args], env={**os.environ, **stack.env}, stdout=subprocess.PIPE, text=True
    )
    assert booking.stdout is not None
    lines: list[str] = []
    for line in booking.stdout:
        lines.append(line)
        if line.strip().endswith("paying"):
            break
    time.sleep(CHARGE_IN_FLIGHT_S)
    stack.services["booking-agent"].kill()
    stack.fault("payment-api")
    serve(stack, "booking-agent")
    rest, _ = booking.communicate(timeout=90)
    output = "".join(lines) + rest
    assert booking.returncode == 0, output
    booking_id = output.split()[1].rstrip(":")
    assert output.strip().splitlines()[-1].startswith("confirmed:"), output
    assert "free cancellation until" in output.strip().splitlines()[-1], output
    for status in ("pending", "searching", "reserving", "paying", "confirming", "confirmed"):
        assert f"s  {status}\n" in output, (status, output)
    # presence (on by default) notices the closed connection before the lease could expire
    assert "lost (presence gone)" in output and "resumed at charge (fence 2)" in output, output
    assert "replayed" in output or "answered from its stored result" in output, output

    shown = concierge(stack, "show", booking_id)
    assert shown.returncode == 0, shown.stderr
    assert "owner_lost" in shown.stdout and "resumed" in shown.stdout
    assert shown.stdout.strip().splitlines()[-1].split()[2] == "confirmed", shown.stdout
    assert re.search(r"^  free cancellation until \d{4}-\d\d-\d\d 00:00 UTC, then a fee of", shown.stdout, re.M), (
        shown.stdout
    )

    listed = concierge(stack, "bookings", "--status", "confirmed", "--limit", "200")
    assert listed.returncode == 0 and booking_id in listed.stdout, listed.stdout + listed.stderr

    for bad in (
        ("show", "nosuchbooking"),
        ("show", "bad id!"),
        ("bookings", "--status", "bogus"),
        ("bookings", "--limit", "0"),
    ):
        result = concierge(stack, *bad)
        assert result.returncode != 0, bad
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------------- A2A


def test_a2a_book_hotel_streams_the_journal_as_status_updates(stack: Stack) -> None:
    card = stack.http.get(f"{stack.url('booking-agent')}/.well-known/agent-card.json").json()
    assert card["capabilities"]["streaming"] is True
    checkin, checkout = stay(days_ahead=250)
    data = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    body = {
        "jsonrpc": "2.0",
        "id": uuid.uuid4().hex,
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_USER",
                "parts": [{"data": {"skill": "book_hotel", "input": data}}],
            }
        },
    }
    token = stack.service_token("recovery-worker", "booking-agent")
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    results: list[dict[str, Any]] = []
    url = f"{stack.url('booking-agent')}/a2a"
    with (
        httpx.Client(timeout=httpx.Timeout(30, read=60)) as client,
        client.stream("POST", url, json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                results.append(json.loads(line[5:])["result"])
    updates = [r["statusUpdate"] for r in results if "statusUpdate" in r]
    journal = [
        u["status"]["message"]["parts"][0]["data"]["journal"]
        for u in updates
        if u["status"]["state"] == "TASK_STATE_WORKING" and "message" in u["status"]
    ]
    assert journal[0]["kind"] == "accepted" and journal[-1]["kind"] == "confirmed", [e["kind"] for e in journal]
    booking_id = updates[0]["status"]["message"]["parts"][0]["data"]["booking_id"]
    assert journal == events(stack, booking_id), "every entry, in order, once"
    assert updates[-1]["status"]["state"] == "TASK_STATE_COMPLETED"
    artifacts = [r["artifactUpdate"] for r in results if "artifactUpdate" in r]
    assert artifacts[0]["artifact"]["parts"][0]["data"]["status"] == "confirmed"
