"""concierge-agent with real processes: a conversation through the simulated model (llm-api, reached by the real
``ChatOpenAI``) to a confirmed booking, approvals refused, expired and raced, bad input, the SSE journal resumed
with ``Last-Event-ID``, the A2A ``concierge`` skill (a decision applies only to the approval it names); and
``concierge verify`` clean after them.

The kill -9 tests (``test_concierge_kills.py``) are slow; these stay in the default suite.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
from typing import Any

import httpx
import pytest

from agents.concierge.graph import OUT_OF_STEPS
from tests.procs import concierge_command
from tests.stack import CORE, SharedStacks, Stack, stay

SHARED_CONCIERGE = pytest.mark.xdist_group("shared-stack-concierge")
"""The mark of the modules sharing ``SERVICES`` with ``ENV`` (``stack``): one worker runs them, on one stack."""
pytestmark = [pytest.mark.e2e, SHARED_CONCIERGE]

SERVICES = (*CORE, "llm-api", "concierge-agent")
ENV = {"APPROVAL_TTL_S": "600"}
WAIT_S = 30
START_S = 180.0


@pytest.fixture(scope="module")
def stack(shared_stack: SharedStacks) -> Stack:
    """Shared with ``test_concierge_consent.py``: each test has its own chats and bookings, and clears the faults
    and scripts it set."""
    return shared_stack(SERVICES, ENV)


def start(stack: Stack, services: tuple[str, ...]) -> None:
    """Every service at once, each given ``START_S`` to be ready (importing LangGraph on a busy machine is slow)."""
    procs = [stack.serve(service, wait=False) for service in services]
    for proc in procs:
        proc.wait_ready(START_S)


def url(stack: Stack, path: str) -> str:
    return f"{stack.url('concierge-agent')}{path}"


def new_chat(stack: Stack) -> str:
    response = stack.http.post(url(stack, "/chats"))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["status"] == "idle"
    return str(body["chat_id"])


def say(stack: Stack, chat_id: str, text: str, **extra: Any) -> dict[str, Any]:
    headers = extra.pop("headers", {})
    response = stack.http.post(url(stack, f"/chats/{chat_id}/messages"), json={"text": text, **extra}, headers=headers)
    assert response.status_code == 202, response.text
    return dict(response.json())


def chat(stack: Stack, chat_id: str, wait: float = WAIT_S) -> dict[str, Any]:
    response = stack.http.get(url(stack, f"/chats/{chat_id}"), params={"wait": wait}, timeout=wait + 10)
    assert response.status_code == 200, response.text
    return dict(response.json())


def book_request() -> str:
    checkin, checkout = stay()
    return f"Book the cheapest hotel in Lisbon checkin {checkin} checkout {checkout} for two"


def events(stack: Stack, chat_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(url(stack, f"/chats/{chat_id}/events"))
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def approve(stack: Stack, chat_id: str, approval_id: str, body: dict[str, Any]) -> httpx.Response:
    return stack.http.post(url(stack, f"/chats/{chat_id}/approvals/{approval_id}"), json=body)


def verify(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *concierge_command(),
            "verify",
            "--hotel-api",
            stack.url("hotel-api"),
            "--payment-api",
            stack.url("payment-api"),
        ],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=300,  # a cold CLI start on a machine under load (load average 10+ on 2 cores) takes long
    )


def awaiting(stack: Stack, chat_id: str) -> dict[str, Any]:
    view = chat(stack, chat_id)
    assert view["status"] == "awaiting_approval", view
    assert view["last_turn"]["outcome"] == "awaiting_approval"
    return dict(view["pending_approval"])


# --------------------------------------------------------------------------------------------------- tests


def test_a_conversation_ends_in_one_confirmed_booking_after_the_approval(stack: Stack) -> None:
    chat_id = new_chat(stack)
    accepted = say(stack, chat_id, book_request(), payment_token="tok_visa")
    assert accepted["status"] == "running" and accepted["chat_id"] == chat_id
    pending = awaiting(stack, chat_id)
    assert set(pending) >= {
        "approval_id",
        "hotel_id",
        "hotel_name",
        "checkin",
        "checkout",
        "guests",
        "total_price",
        "currency",
        "cancellation",
        "expires_at",
    }
    assert pending["cancellation"]["refundable"] and pending["cancellation"]["free_until"].endswith("T00:00:00Z")
    # a message while the approval waits is refused, naming why
    refused = stack.http.post(url(stack, f"/chats/{chat_id}/messages"), json={"text": "hello"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "approval_pending"

    answer = approve(stack, chat_id, pending["approval_id"], {"approve": True})
    assert answer.status_code == 202, answer.text
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202  # a repeat
    view = chat(stack, chat_id)
    assert view["status"] == "idle", view
    assert view["last_turn"]["outcome"] == "answered" and view["last_turn"]["error"] is None
    assert view["last_turn"]["usage"]["calls"] >= 2
    assert len(view["bookings"]) == 1
    booking = stack.booking(view["bookings"][0])
    assert booking["status"] == "confirmed"
    assert booking["hotel_id"] == pending["hotel_id"]
    assert booking["total_price"] == pytest.approx(pending["total_price"])
    assert booking["cancellation"] == pending["cancellation"], "the policy approved is the one held"
    assert view["messages"][0] == {"role": "user", "content": book_request(), "turn_id": accepted["turn_id"]}
    assert view["messages"][-1]["role"] == "assistant" and "Booked" in view["messages"][-1]["content"]

    kinds = [entry["kind"] for entry in events(stack, chat_id)]
    for kind in (
        "user_message",
        "token",
        "tool_call",
        "tool_result",
        "approval_requested",
        "approval_decided",
        "booking",
        "assistant_message",
        "turn_finished",
    ):
        assert kind in kinds, kinds
    assert kinds.count("approval_decided") == 1 and kinds.count("turn_finished") == 1
    relayed = [e["entry"]["kind"] for e in events(stack, chat_id) if e["kind"] == "booking"]
    assert relayed.count("confirmed") == 1 and relayed[0] == "accepted"
    # the card token never reaches the journal, the chat or the model's messages
    raw = json.dumps(events(stack, chat_id)) + json.dumps(view)
    assert "tok_visa" not in raw
    listed = stack.http.get(url(stack, "/chats")).json()["chats"]
    assert listed[0]["chat_id"] == chat_id


def test_a_refused_approval_books_nothing_and_the_model_says_so(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    assert approve(stack, chat_id, pending["approval_id"], {"approve": False}).status_code == 202
    # the first decision stands: a later "yes" gets the "no" back
    late = approve(stack, chat_id, pending["approval_id"], {"approve": True})
    assert late.status_code == 202 and late.json()["approve"] is False
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and view["bookings"] == []
    assert "did not book" in view["messages"][-1]["content"]


def test_racing_approvals_book_once(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, book_request(), payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: httpx.post(
                    url(stack, f"/chats/{chat_id}/approvals/{pending['approval_id']}"),
                    json={"approve": True},
                    timeout=30,
                ),
                range(8),
            )
        )
    assert [a.status_code for a in answers] == [202] * 8
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and len(view["bookings"]) == 1
    assert [e["kind"] for e in events(stack, chat_id)].count("approval_decided") == 1


def test_bad_input_is_refused_naming_the_field(stack: Stack) -> None:
    chat_id = new_chat(stack)
    for body, field in (
        ({"text": ""}, "text"),
        ({"text": "   "}, "text"),
        ({"text": "x" * (8 * 1024 + 1)}, "text"),
        ({"text": "hi", "payment_token": "visa"}, "payment_token"),
        ({}, "text"),
    ):
        response = stack.http.post(url(stack, f"/chats/{chat_id}/messages"), json=body)
        assert response.status_code == 422, (body, response.text)
        assert field in response.text
    assert stack.http.post(url(stack, "/chats/nope/messages"), json={"text": "hi"}).status_code == 404
    assert stack.http.get(url(stack, "/chats/nope")).status_code == 404
    assert approve(stack, chat_id, "ap_unknown", {"approve": True}).status_code == 404
    wrong = approve(stack, chat_id, "ap_unknown", {"approve": "yes"})
    assert wrong.status_code == 422 and "approve" in wrong.text
    assert stack.http.get(url(stack, "/chats"), params={"cursor": "!!"}).status_code == 422


def test_a_retried_message_with_its_key_is_the_same_turn(stack: Stack) -> None:
    chat_id = new_chat(stack)
    first = say(stack, chat_id, "hello there", headers={"Idempotency-Key": "k-1"})
    again = say(stack, chat_id, "hello there", headers={"Idempotency-Key": "k-1"})
    assert again["turn_id"] == first["turn_id"]
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and view["last_turn"]["turn_id"] == first["turn_id"]
    assert [m["role"] for m in view["messages"]] == ["user", "assistant"]


def test_the_sse_stream_resumes_after_the_last_event_id_without_gap_or_repeat(stack: Stack) -> None:
    chat_id = new_chat(stack)
    say(stack, chat_id, "hello there")
    chat(stack, chat_id)
    every = events(stack, chat_id)
    assert len(every) >= 3
    cut = every[1]["id"]
    seen: list[str] = []
    with httpx.stream(
        "GET",
        url(stack, f"/chats/{chat_id}/events"),
        headers={"Accept": "text/event-stream", "Last-Event-ID": cut},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("id:"):
                seen.append(line.removeprefix("id:").strip())
            if len(seen) == len(every) - 2:
                break
    assert seen == [e["id"] for e in every[2:]]


def test_the_a2a_concierge_skill_answers_plain_text(stack: Stack) -> None:
    token = stack.service_token("booking-agent", "concierge-agent")
    checkin, checkout = stay()
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": "m1",
                "parts": [{"text": f"hotels in Lisbon checkin {checkin} checkout {checkout} for two"}],
            }
        },
    }
    response = stack.http.post(
        url(stack, "/a2a"), json=body, headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}, timeout=60
    )
    assert response.status_code == 200, response.text
    task = response.json()["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    parts = task["artifacts"][0]["parts"]
    assert any("Lisbon" in part.get("text", "") for part in parts), parts


@pytest.mark.parametrize("malformed", ["invalid_json", "bad_stay"])
def test_a_malformed_tool_call_goes_back_to_the_model_as_a_tool_error(stack: Stack, malformed: str) -> None:
    stack.fault("llm-api", model=None, malformed_tool_args=malformed)
    try:
        chat_id = new_chat(stack)
        checkin, checkout = stay()
        say(stack, chat_id, f"hotels in Lisbon checkin {checkin} checkout {checkout} for two")
        view = chat(stack, chat_id)
    finally:
        stack.fault("llm-api")
    assert view["status"] == "idle", view
    results = [e for e in events(stack, chat_id) if e["kind"] == "tool_result"]
    assert results and results[0]["status"] == "error", results
    assert results[0]["content"]["error"]["code"] == "invalid_request"
    assert view["last_turn"]["outcome"] in ("answered", "failed")  # never a 500: the model read the error


def test_a_runaway_model_ends_the_turn_in_words_after_its_calls(stack: Stack) -> None:
    stack.fault("llm-api", model=None, loop_tool=True)
    try:
        chat_id = new_chat(stack)
        say(stack, chat_id, "find me something nice")
        view = chat(stack, chat_id, wait=60)
    finally:
        stack.fault("llm-api")
    assert view["status"] == "idle", view
    assert view["last_turn"]["outcome"] == "answered" and view["last_turn"]["error"] is None, view["last_turn"]
    assert view["last_turn"]["usage"]["calls"] == 8  # LLM_MAX_CALLS_PER_TURN
    assert view["messages"][-1]["content"] == OUT_OF_STEPS, view["messages"]
    # the last call's search was not run; the same search again was answered from the first one, not run either
    turn = [e for e in events(stack, chat_id) if e.get("turn_id") == view["last_turn"]["turn_id"]]
    assert len([e for e in turn if e["kind"] == "tool_call"]) == 7, turn
    answered = [e for e in turn if e["kind"] == "tool_result"]
    assert len(answered) == 7 and [e["repeated"] for e in answered] == [False] + [True] * 6, answered
    assert view["bookings"] == [] and view["pending_approval"] is None, view
    # the chat takes the next message
    say(stack, chat_id, "thanks")
    assert chat(stack, chat_id)["last_turn"]["outcome"] == "answered"


def test_the_a2a_concierge_skill_streams_the_answer_over_message_stream(stack: Stack) -> None:
    card = stack.http.get(url(stack, "/.well-known/agent-card.json")).json()
    assert card["capabilities"]["streaming"] is True
    assert "text/plain" in next(s for s in card["skills"] if s["id"] == "concierge")["inputModes"]
    checkin, checkout = stay()
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": "m2",
                "parts": [{"text": f"hotels in Porto checkin {checkin} checkout {checkout} for two"}],
            }
        },
    }
    token = stack.service_token("booking-agent", "concierge-agent")
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    results: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=httpx.Timeout(30, read=60)) as client,
        client.stream("POST", url(stack, "/a2a"), json=body, headers=headers) as response,
    ):
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data:"):
                results.append(json.loads(line[5:])["result"])
    updates = [r["statusUpdate"] for r in results if "statusUpdate" in r]
    streamed = [
        u["status"]["message"]["parts"][0]["text"]
        for u in updates
        if u["status"]["state"] == "TASK_STATE_WORKING" and "message" in u["status"]
    ]
    assert updates[-1]["status"]["state"] == "TASK_STATE_COMPLETED"
    answer = next(r["artifactUpdate"] for r in results if "artifactUpdate" in r)["artifact"]["parts"][0]["text"]
    assert "Porto" in answer and "".join(streamed).endswith(answer), (streamed, answer)


def a2a_concierge(
    stack: Stack, context_id: str, skill_input: dict[str, Any], token: str | None = None
) -> dict[str, Any]:
    """One blocking ``SendMessage`` of the ``concierge`` skill in the conversation ``context_id``: its task (sent
    with ``token``, by default booking-agent's, for no person)."""
    token = token or stack.service_token("booking-agent", "concierge-agent")
    body = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "SendMessage",
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": os.urandom(8).hex(),
                "contextId": context_id,
                "parts": [{"data": {"skill": "concierge", "input": skill_input}}],
            }
        },
    }
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    response = stack.http.post(url(stack, "/a2a"), json=body, headers=headers, timeout=90)
    assert response.status_code == 200, response.text
    return dict(response.json()["result"]["task"])


def a2a_result(task: dict[str, Any]) -> dict[str, Any]:
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    return dict(next(p["data"] for p in task["artifacts"][0]["parts"] if "data" in p))


def test_an_a2a_decision_applies_only_to_the_approval_it_names(stack: Stack) -> None:
    """Over A2A a stale "yes" (the id of an earlier, refused approval) or one naming no approval, while a newer
    approval waits, is answered ``input-required`` naming the newer one and decides nothing: no model call, nothing
    booked. The decision naming the pending one books it."""
    context_id = f"consent-{os.urandom(6).hex()}"
    first = a2a_result(a2a_concierge(stack, context_id, {"text": book_request(), "payment_token": "tok_visa"}))
    assert first["status"] == "awaiting_approval", first
    earlier = first["pending_approval"]
    refused = a2a_result(a2a_concierge(stack, context_id, {"approve": False, "approval_id": earlier["approval_id"]}))
    assert refused["status"] == "idle" and refused["pending_approval"] is None, refused
    second = a2a_result(a2a_concierge(stack, context_id, {"text": book_request()}))
    newer = second["pending_approval"]
    assert second["status"] == "awaiting_approval" and newer["approval_id"] != earlier["approval_id"], second
    assert stack.admin("DELETE", "llm-api", "requests").status_code == 200

    for stale in ({"approve": True, "approval_id": earlier["approval_id"]}, {"approve": True}):
        task = a2a_concierge(stack, context_id, {**stale, "payment_token": "tok_visa"})
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
        parts = task["status"]["message"]["parts"]
        said = next(p["data"] for p in parts if "data" in p)
        assert said["status"] == "awaiting_approval" and said["pending_approval"] == newer, said
        assert newer["approval_id"] in next(p["text"] for p in parts if "text" in p)
    chat_id = second["chat_id"]
    view = chat(stack, chat_id, wait=0)
    assert view["status"] == "awaiting_approval" and view["bookings"] == [], view
    kinds = [e["kind"] for e in events(stack, chat_id)]
    assert kinds.count("approval_decided") == 1, kinds  # the refusal only
    response = stack.admin("GET", "llm-api", "requests")
    assert response.status_code == 200 and response.json()["requests"] == [], response.text

    booked = a2a_result(
        a2a_concierge(
            stack, context_id, {"approve": True, "approval_id": newer["approval_id"], "payment_token": "tok_visa"}
        )
    )
    assert booked["status"] == "idle" and booked["last_turn"]["outcome"] == "answered", booked
    view = chat(stack, chat_id, wait=0)
    assert len(view["bookings"]) == 1, view
    booking = stack.booking(view["bookings"][0], wait=30)
    assert booking["status"] == "confirmed" and booking["hotel_id"] == newer["hotel_id"], booking


def test_verify_is_clean_after_the_conversations(stack: Stack) -> None:
    audit = verify(stack)
    assert audit.returncode == 0, audit.stdout + audit.stderr
