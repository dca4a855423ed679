"""kill -9 of concierge-agent at every point of a turn, with real processes: during the model call, while the
approval waits, right after the approval's 202, during the booking's charge. Each ends with exactly one booking
for the approval, shown once in the chat, and ``concierge verify`` clean. An approval past ``APPROVAL_TTL_S`` is
decided ``expired`` by the sweeper with nobody reading the chat, a late decision is refused (409
``approval_expired``) and nothing is booked; reading a chat past the TTL calls no model and decides nothing. Killed
during a 429's ``retry-after`` wait, the resumed turn asks the model once more, after the wait.

The recovery worker resumes a killed owner's turn as soon as its presence connection is gone; no wall-clock
assertions beyond the waits' bounds (the figures are printed).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.llm import PRIMARY_MODEL
from tests.e2e.test_concierge import (
    START_S,
    approve,
    awaiting,
    book_request,
    chat,
    events,
    new_chat,
    say,
    start,
    url,
    verify,
)
from tests.stack import CORE, Stack, fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = (*CORE, "llm-api", "recovery-worker", "concierge-agent")
ENV = {"ORPHAN_SCAN_INTERVAL": "0.2", "IDEMPOTENCY_LEASE_S": "2", "APPROVAL_TTL_S": "600"}


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url_:
        yield url_


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("concierge-kills")
    with Stack(tmp, redis_url, database_url=database, env=ENV) as stack:
        start(stack, SERVICES)
        yield stack


@pytest.fixture(autouse=True)
def no_faults(stack: Stack) -> Iterator[None]:
    yield
    stack.fault("llm-api")
    stack.fault("payment-api")


def kill_and_restart(stack: Stack, env: dict[str, str] | None = None) -> float:
    """kill -9 concierge-agent, then start it again (the recovery worker resumes meanwhile); when it was killed."""
    stack.services["concierge-agent"].kill()
    killed = time.time()
    restart(stack, env)
    return killed


def restart(stack: Stack, env: dict[str, str] | None = None) -> None:
    proc = stack.procs.serve("concierge-agent", port=stack.ports["concierge-agent"], env=env, timeout=START_S)
    stack.services["concierge-agent"] = proc


def resumed_after(stack: Stack, chat_id: str, killed: float) -> float | None:
    for entry in events(stack, chat_id):
        if entry["kind"] == "resumed":
            at = datetime.fromisoformat(entry["at"].replace("Z", "+00:00")).replace(tzinfo=UTC).timestamp()
            if at >= killed - 0.01:
                return at - killed
    return None


def one_booking(stack: Stack, chat_id: str, pending: dict[str, Any]) -> str:
    """The chat ends idle with one confirmed booking of the approved hotel, relayed once; returns its id."""
    view = chat(stack, chat_id, wait=60)
    assert view["status"] == "idle", view
    assert len(view["bookings"]) == 1, view
    booking = stack.booking(view["bookings"][0], wait=30)
    assert booking["status"] == "confirmed", booking
    assert booking["hotel_id"] == pending["hotel_id"]
    assert booking["total_price"] <= pending["total_price"] + 1e-9
    relayed = [e for e in events(stack, chat_id) if e["kind"] == "booking"]
    assert [e["entry"]["kind"] for e in relayed].count("confirmed") == 1
    assert len({e["entry"]["id"] for e in relayed}) == len(relayed)  # each entry once
    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking["booking_id"]]
    assert len([c for c in charges if c.get("status") == "captured"]) == 1, charges
    return str(booking["booking_id"])


def test_kill_during_the_model_call_asks_the_model_again_and_books_once(stack: Stack) -> None:
    stack.fault("llm-api", model=None, first_token_latency_s=4.0)
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    time.sleep(1.5)  # the first model call is waiting for its first token
    killed = kill_and_restart(stack)
    stack.fault("llm-api")
    pending = awaiting(stack, chat_id)
    print(f"model call: turn resumed {resumed_after(stack, chat_id, killed)} s after the kill")
    assert resumed_after(stack, chat_id, killed) is not None
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    one_booking(stack, chat_id, pending)


def llm_requests(stack: Stack) -> list[dict[str, Any]]:
    response = stack.admin("GET", "llm-api", "requests")
    assert response.status_code == 200, response.text
    return list(response.json()["requests"])


def test_kill_during_a_retry_after_wait_asks_the_model_once_more_not_twice(stack: Stack) -> None:
    """The 429's ``retry-after`` outlives the process that heard it (the shared limiter holds the model): the turn
    resumed elsewhere waits out the rest of it and asks once, instead of asking at once and being refused again."""
    assert stack.admin("DELETE", "llm-api", "requests").status_code == 200
    retry_after = 6.0
    stack.fault("llm-api", model=PRIMARY_MODEL, error_status=429, error_count=1, retry_after_s=retry_after)
    chat_id = new_chat(stack)
    say(stack, chat_id, "hello")
    deadline = time.monotonic() + 30
    while not llm_requests(stack) and time.monotonic() < deadline:
        time.sleep(0.05)
    [refused] = llm_requests(stack)  # the turn is in its retry-after wait now
    assert refused["status"] == 429, refused
    killed = kill_and_restart(stack)
    view = chat(stack, chat_id, wait=60)
    assert view["status"] == "idle" and view["last_turn"]["outcome"] == "answered", view
    print(f"retry-after wait: turn resumed {resumed_after(stack, chat_id, killed)} s after the kill")
    assert resumed_after(stack, chat_id, killed) is not None
    first, *asked = llm_requests(stack)
    assert first == refused and [e["status"] for e in asked] == [200], asked
    waited = (at(asked[0]["at"]) - at(refused["at"])).total_seconds()
    assert waited >= retry_after - 0.1, f"asked {waited:.2f}s after the 429, before its retry-after had passed"


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_kill_while_the_approval_waits_loses_nothing(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    kill_and_restart(stack)
    assert awaiting(stack, chat_id) == pending  # parked: nobody's, not recovered as crashed
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    one_booking(stack, chat_id, pending)


def test_kill_right_after_the_approvals_202_books_once(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    killed = kill_and_restart(stack)
    booking_id = one_booking(stack, chat_id, pending)
    print(f"after 202: turn resumed {resumed_after(stack, chat_id, killed)} s after the kill; booking {booking_id}")
    # a repeat of the approval after all that is the same answer, and books nothing more
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    assert chat(stack, chat_id)["bookings"] == [booking_id]


def test_kill_during_the_bookings_charge_books_and_charges_once(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    stack.fault("payment-api", latency_s=4.0)
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # booking-agent is charging: the booking's journal is being relayed
        relayed = [e["entry"]["kind"] for e in events(stack, chat_id) if e["kind"] == "booking"]
        if "step_started" in relayed and any(
            e["kind"] == "booking" and e["entry"].get("step") == "charge" for e in events(stack, chat_id)
        ):
            break
        time.sleep(0.1)
    killed = kill_and_restart(stack)
    stack.fault("payment-api")
    booking_id = one_booking(stack, chat_id, pending)
    print(f"charge: turn resumed {resumed_after(stack, chat_id, killed)} s after the kill; booking {booking_id}")


def test_booking_agent_down_when_the_approval_comes_is_waited_out_and_books_once(stack: Stack) -> None:
    """An approved booking is a promise: booking-agent killed before the yes, the turn pauses for it (journaled
    ``paused``) instead of telling the model "unavailable", and books once when it is back."""
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    call_id = journal_entry(stack, chat_id, "approval_requested")["tool_call_id"]

    def book_results() -> list[dict[str, Any]]:
        return [e for e in events(stack, chat_id) if e["kind"] == "tool_result" and e["tool_call_id"] == call_id]

    stack.services["booking-agent"].kill()
    try:
        assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
        paused = journal_entry(stack, chat_id, "paused")
        assert paused["dependency"] == "booking_agent", paused
        assert book_results() == []  # the model was told nothing: the call waits
    finally:
        stack.serve("booking-agent")
    booking_id = one_booking(stack, chat_id, pending)
    results = book_results()
    assert len(results) == 1 and results[0]["status"] != "error", results
    print(f"booking-agent down: {sum(e['kind'] == 'paused' for e in events(stack, chat_id))} pauses; {booking_id}")


def journal_entry(stack: Stack, chat_id: str, kind: str, within: float = 60.0) -> dict[str, Any]:
    """The chat's first journal entry of ``kind``, waited for (reading the journal, never the chat or the list)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = [e for e in events(stack, chat_id) if e["kind"] == kind]
        if found:
            return found[0]
        time.sleep(0.1)
    pytest.fail(f"no {kind} in chat {chat_id} within {within}s: {[e['kind'] for e in events(stack, chat_id)]}")


def test_an_expired_approval_is_decided_by_the_sweeper_without_a_read_and_books_nothing(stack: Stack) -> None:
    """Nobody reads the chat or the list: the sweeper decides the approval ``expired`` (journaled), the turn ends
    telling the model, a late decision answers 409 ``approval_expired``, and nothing is booked."""
    stack.services["concierge-agent"].kill()
    restart(stack, {"APPROVAL_TTL_S": "1"})
    try:
        chat_id = new_chat(stack)
        say(stack, chat_id, book_request(), payment_token="tok_visa")
        requested = journal_entry(stack, chat_id, "approval_requested")
        approval_id = requested["approval"]["approval_id"]
        decided = journal_entry(stack, chat_id, "approval_decided")
        assert (decided["approval_id"], decided["approve"], decided["expired"]) == (approval_id, False, True), decided
        late_s = at(decided["at"]).replace(tzinfo=UTC) - at(requested["approval"]["expires_at"]).replace(tzinfo=UTC)
        print(f"sweeper: approval_decided {late_s.total_seconds():.2f} s after expires_at")
        journal_entry(stack, chat_id, "turn_finished")
        late = approve(stack, chat_id, approval_id, {"approve": True})
        assert late.status_code == 409 and late.json()["error"]["code"] == "approval_expired", late.text
        view = chat(stack, chat_id, wait=60)
        assert view["status"] == "idle" and view["bookings"] == [] and view["pending_approval"] is None, view
        listed = stack.http.get(url(stack, "/chats")).json()["chats"]
        (row,) = [c for c in listed if c["chat_id"] == chat_id]
        assert row["status"] == "idle", row
        assert [e["kind"] for e in events(stack, chat_id)].count("approval_decided") == 1
        assert stack.http.post(url(stack, f"/chats/{chat_id}/messages"), json={"text": "thanks"}).status_code == 202
    finally:
        kill_and_restart(stack)


def test_reading_a_chat_past_its_approvals_ttl_calls_no_model_and_decides_nothing(stack: Stack) -> None:
    """With the sweeper idle (``APPROVAL_SWEEP_INTERVAL_S`` an hour), reading the chat, long-polling it and listing
    chats after ``expires_at`` shows the approval as it stands, asks the model nothing and journals no decision;
    the POST of a decision is what decides it (409 ``approval_expired``), and only then is the model asked."""
    stack.services["concierge-agent"].kill()
    restart(stack, {"APPROVAL_TTL_S": "3", "APPROVAL_SWEEP_INTERVAL_S": "3600"})
    try:
        chat_id = new_chat(stack)
        say(stack, chat_id, book_request(), payment_token="tok_visa")
        pending = awaiting(stack, chat_id)  # a read before the approval expires
        assert stack.admin("DELETE", "llm-api", "requests").status_code == 200
        expires = datetime.fromisoformat(pending["expires_at"].replace("Z", "+00:00")).timestamp()
        time.sleep(max(0.0, expires - time.time()) + 1.0)  # past expires_at (a lower bound, by the clock it names)
        for _ in range(3):
            view = chat(stack, chat_id, wait=0)
            assert view["status"] == "awaiting_approval" and view["pending_approval"] == pending, view
            assert chat(stack, chat_id, wait=2)["status"] == "awaiting_approval"  # not running: answered at once
            listed = stack.http.get(url(stack, "/chats")).json()["chats"]
            (row,) = [c for c in listed if c["chat_id"] == chat_id]
            assert row["status"] == "awaiting_approval", row
        assert llm_requests(stack) == []
        assert "approval_decided" not in [e["kind"] for e in events(stack, chat_id)]

        late = approve(stack, chat_id, pending["approval_id"], {"approve": True})
        assert late.status_code == 409 and late.json()["error"]["code"] == "approval_expired", late.text
        decided = journal_entry(stack, chat_id, "approval_decided")
        assert (decided["approve"], decided["expired"]) == (False, True), decided
        view = chat(stack, chat_id, wait=60)
        assert view["status"] == "idle" and view["bookings"] == [], view
        assert llm_requests(stack), "the decided turn told the model: the log counts what reaches it"
    finally:
        kill_and_restart(stack)


def _read_ids(response: httpx.Response, until: Callable[[dict[str, Any]], bool]) -> list[str]:
    seen: list[str] = []
    with contextlib.suppress(httpx.HTTPError):  # the stream breaks when its server is killed
        for line in response.iter_lines():
            if line.startswith("data:"):
                entry = json.loads(line[5:])
                seen.append(entry["id"])
                if until(entry):
                    break
    return seen


def test_the_sse_stream_resumes_across_a_restart_without_gap_or_repeat(stack: Stack) -> None:
    stack.fault("llm-api", model=None, token_delay_s=0.05)
    chat_id = new_chat(stack)
    say(stack, chat_id, "hello there, what can you do for me today?")
    headers = {"Accept": "text/event-stream"}
    with httpx.stream("GET", url(stack, f"/chats/{chat_id}/events"), headers=headers, timeout=60) as response:
        assert response.status_code == 200
        tokens = 0

        def enough(entry: dict[str, Any]) -> bool:
            nonlocal tokens
            tokens += entry["kind"] == "token"
            return tokens >= 3

        before = _read_ids(response, enough)
        kill_and_restart(stack)
    assert before, "nothing streamed before the kill"
    resume = {**headers, "Last-Event-ID": before[-1]}
    with httpx.stream("GET", url(stack, f"/chats/{chat_id}/events"), headers=resume, timeout=90) as response:
        assert response.status_code == 200
        after = _read_ids(response, lambda entry: entry["kind"] == "turn_finished")
    assert chat(stack, chat_id)["status"] == "idle"
    assert before + after == [entry["id"] for entry in events(stack, chat_id)]  # no gap, no repeat


def test_sigterm_answers_the_open_long_poll_and_ends_the_stream_with_shutting_down(stack: Stack) -> None:
    """A stopping concierge-agent answers what it holds at once (as booking-agent does): the long-poll gets the chat
    as it stands, the SSE ends with ``shutting_down``, neither waits for uvicorn's graceful timeout nor becomes a
    500; the turn it held is resumed by recovery and finishes."""
    stack.fault("llm-api", model=None, first_token_latency_s=20.0)
    chat_id = new_chat(stack)
    say(stack, chat_id, "hello there, what can you do for me today?")
    agent = stack.services["concierge-agent"]
    headers = {"Accept": "text/event-stream"}

    def stream_lines() -> list[str]:
        with httpx.stream("GET", url(stack, f"/chats/{chat_id}/events"), headers=headers, timeout=60) as response:
            assert response.status_code == 200
            return list(response.iter_lines())

    def long_poll() -> httpx.Response:
        return httpx.get(url(stack, f"/chats/{chat_id}"), params={"wait": 40}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        lines, poll = pool.submit(stream_lines), pool.submit(long_poll)
        time.sleep(2.0)  # both open and waiting, the turn's model call in flight
        assert not lines.done() and not poll.done()
        assert agent.terminate() in (0, -15)
        answered = poll.result(timeout=30)
        streamed = lines.result(timeout=30)
    assert answered.status_code == 200, answered.text
    assert answered.json()["status"] == "running"  # the chat as it stands
    assert "event: shutting_down" in streamed and "retry: 1000" in streamed, streamed[-10:]
    log = agent.log_text()
    # answered at once: had either been left open, uvicorn would have sat out its graceful timeout and said so
    assert "graceful shutdown exceeded" not in log and "Traceback" not in log, log[-3000:]
    stack.fault("llm-api")
    restart(stack)
    assert chat(stack, chat_id, wait=60)["status"] == "idle"
    assert chat(stack, chat_id)["last_turn"]["outcome"] == "answered"


def test_verify_is_clean_after_every_kill(stack: Stack) -> None:
    audit = verify(stack)
    assert audit.returncode == 0, audit.stdout + audit.stderr
