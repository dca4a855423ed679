"""The console needs a login (issue 42), against real processes with people's identities on: booking-agent,
search-agent, payment-agent, the providers, concierge-agent and the console, as compose runs them.

Without a login every /api route answers 401 and does nothing (another person's confirmed booking stays
confirmed); a one-time link opens one session, once; a person's login (a pasted token, or their bearer) shows and
moves only their bookings and chats, relayed with their own token (another's: 404; their stream cap applies;
the operator's routes: 403); the operator's actions are journaled with who did them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from identity.people import LOCAL_ISSUER, LocalIssuer
from stack.login import login_url, mint_ticket
from tests.procs import concierge_command, free_port
from tests.stack import CORE, Stack, people_env, stay

pytestmark = pytest.mark.e2e

PAGE = {"X-Concierge-Console": "1"}
MAX_STREAMS = 2
READY_S = 120.0


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer"), LOCAL_ISSUER)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, issuer: LocalIssuer) -> Iterator[Stack]:
    env = {**people_env(issuer, LOCAL_ISSUER), "PERSON_MAX_STREAMS": str(MAX_STREAMS)}
    with Stack(tmp_path_factory.mktemp("console-login"), redis_url, env=env) as stack:
        stack.ports["console"] = free_port()
        started = [stack.serve(name, wait=False) for name in (*CORE, "llm-api", "concierge-agent", "console")]
        for proc in started:
            proc.wait_ready(timeout=READY_S)
        yield stack


def person(issuer: LocalIssuer) -> tuple[str, dict[str, str]]:
    sub = f"guest-{uuid.uuid4().hex[:8]}"
    return sub, {"Authorization": f"Bearer {issuer.mint(sub)}"}


def confirmed_booking(stack: Stack, headers: dict[str, str]) -> str:
    booking_id = str(stack.book(headers=headers)["booking_id"])
    assert stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}", headers=headers).status_code == 200
    deadline = time.monotonic() + 60
    while (status := status_of(stack, booking_id)) != "confirmed" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert status == "confirmed"
    return booking_id


def status_of(stack: Stack, booking_id: str) -> str:
    operator = {"Authorization": f"Bearer {stack.admin_token}"}
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}", headers=operator)
    assert response.status_code == 200, response.text
    return str(response.json()["status"])


def logged_in(stack: Stack, token: str) -> httpx.Client:
    """A browser-like client with a session from the login page's pasted token."""
    client = httpx.Client(base_url=stack.url("console"), timeout=30, headers=PAGE)
    answer = client.post("/api/login", json={"token": token})
    assert answer.status_code == 200, answer.text
    return client


def test_without_a_login_every_api_route_answers_401_and_does_nothing(stack: Stack, issuer: LocalIssuer) -> None:
    _, alice = person(issuer)
    booking_id = confirmed_booking(stack, alice)
    chat = stack.http.post(f"{stack.url('concierge-agent')}/chats", headers=alice)
    assert chat.status_code == 201, chat.text
    chat_id = chat.json()["chat_id"]
    base = stack.url("console")
    attempts = [
        ("POST", f"/api/bookings/{booking_id}/cancel", None),  # the page's header and no Origin: still nothing
        ("GET", "/api/overview", None),
        ("GET", "/api/stream", None),
        ("GET", "/api/chats", None),
        ("GET", f"/api/chats/{chat_id}", None),
        ("GET", f"/api/chats/{chat_id}/events", None),
        ("GET", f"/api/bookings/{booking_id}/events", None),
        ("POST", "/api/bookings", {"city": "Lisbon", "checkin": stay()[0]}),
        ("PUT", "/api/faults/payment-api", {"error_rate": 1}),
        ("POST", "/api/services/booking-agent/kill", None),
        ("GET", "/api/chaos", None),
        ("POST", "/api/demo/cascade", {}),
        ("GET", "/api/operator-journal", None),
    ]
    for credentials in ({}, {"Cookie": "concierge_console=made-up"}):
        for method, path, body in attempts:
            answer = httpx.request(method, f"{base}{path}", json=body, headers={**PAGE, **credentials}, timeout=30)
            assert answer.status_code == 401, (method, path, answer.text)
            assert answer.json()["error"]["code"] == "unauthenticated", answer.text
            assert "concierge console-url" in answer.json()["error"]["message"]
    refused = httpx.get(f"{base}/api/overview", headers={"Authorization": "Bearer not-a-token"}, timeout=30)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_token"
    assert status_of(stack, booking_id) == "confirmed"
    assert (
        httpx.get(
            f"{stack.url('payment-api')}/admin/faults", headers={"Authorization": f"Bearer {stack.admin_token}"}
        ).json()["error_rate"]
        == 0
    )
    # the page itself is the login page: how to get a link, and a box for a token
    page = httpx.get(base, timeout=10)
    assert page.status_code == 200 and 'id="login-form"' in page.text and "console.js" not in page.text


def test_a_one_time_link_opens_one_session_and_only_once(stack: Stack, tmp_path: Path) -> None:
    # what an operator runs against a compose stack: the stack's secret and the console's address
    env = {
        **os.environ,
        "CONCIERGE_SERVICE_SECRET": stack.secret,
        "CONSOLE_URL": stack.url("console"),
        "CONCIERGE_DATA_DIR": str(tmp_path),
    }
    printed = subprocess.run(
        [*concierge_command(), "console-url"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert printed.returncode == 0, printed.stderr
    url = printed.stdout.strip()
    assert url.startswith(f"{stack.url('console')}/?login="), url
    assert stack.secret not in url

    browser = httpx.Client(timeout=30, headers=PAGE)
    opened = browser.get(url)
    assert opened.status_code == 303 and opened.headers["location"] == "/", opened.text
    cookie = opened.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    me = browser.get(f"{stack.url('console')}/api/session")
    assert me.json() == {"who": "operator", "operator": True, "via": "login-url"}
    assert "console.js" in browser.get(f"{stack.url('console')}/").text

    for link in (
        url,  # used already
        login_url(stack.url("console"), stack.secret, -5),  # expired
        login_url(stack.url("console"), "another-stack-" + "x" * 40, 600),  # not this stack's
        f"{stack.url('console')}/?login=v1.9999999999.abc.def",  # forged
    ):
        again = httpx.get(link, timeout=30)
        assert again.status_code == 401 and "set-cookie" not in again.headers, link
        assert "concierge console-url" in again.text and 'id="login-form"' in again.text
    assert "used already" in httpx.get(url, timeout=30).text
    assert "expired" in httpx.get(login_url(stack.url("console"), stack.secret, -5), timeout=30).text

    # the cookie session keeps the page's CSRF defences
    cancel = f"{stack.url('console')}/api/bookings/nosuch/cancel"
    assert browser.post(cancel, headers={"X-Concierge-Console": ""}).status_code == 403
    assert browser.post(cancel, headers={"Origin": "http://evil.example"}).status_code == 403
    # and ends with a logout
    assert browser.post(f"{stack.url('console')}/api/logout").status_code == 200
    browser.cookies.set("concierge_console", opened.cookies["concierge_console"])
    assert browser.get(f"{stack.url('console')}/api/session").status_code == 401
    assert mint_ticket(stack.secret, 60) != mint_ticket(stack.secret, 60)  # a nonce each


def test_a_persons_login_shows_and_moves_only_theirs(stack: Stack, issuer: LocalIssuer) -> None:
    alice_sub, alice = person(issuer)
    bob_sub, bob = person(issuer)
    alices, bobs = confirmed_booking(stack, alice), confirmed_booking(stack, bob)
    alice_chat = stack.http.post(f"{stack.url('concierge-agent')}/chats", headers=alice).json()["chat_id"]
    bob_chat = stack.http.post(f"{stack.url('concierge-agent')}/chats", headers=bob).json()["chat_id"]

    with contextlib.closing(logged_in(stack, bob["Authorization"].removeprefix("Bearer "))) as page:
        assert page.get("/api/session").json() == {"who": bob_sub, "operator": False, "via": "person-token"}
        overview = page.get("/api/overview").json()
        shown = {b["booking_id"] for b in overview["bookings"]}
        assert bobs in shown and alices not in shown, shown
        assert overview["faults"] == {"hotel-api": None, "payment-api": None, "llm-api": None}
        assert overview["dlq"] == [] and overview["queue"] is None
        chats = {c["chat_id"] for c in page.get("/api/chats").json()["chats"]}
        assert bob_chat in chats and alice_chat not in chats
        # another person's: what an unknown id gets, and nothing moves
        assert page.post(f"/api/bookings/{alices}/cancel").status_code == 404
        assert page.get(f"/api/chats/{alice_chat}").status_code == 404
        with page.stream("GET", f"/api/bookings/{alices}/events", timeout=30) as stream:
            assert "event: unknown" in stream.read().decode()
        assert status_of(stack, alices) == "confirmed"
        # the operator's routes are not a person's
        for method, path, body in (
            ("PUT", "/api/faults/payment-api", {"error_rate": 1}),
            ("DELETE", "/api/faults/payment-api", None),
            ("POST", "/api/services/booking-agent/kill", None),
            ("GET", "/api/chaos", None),
            ("POST", "/api/chaos", {}),
            ("POST", "/api/demo/cascade", {}),
            ("GET", "/api/demo/stream", None),
            ("GET", "/api/operator-journal", None),
        ):
            answer = page.request(method, path, json=body)
            assert answer.status_code == 403 and answer.json()["error"]["code"] == "forbidden", (path, answer.text)
        # their own: cancelled, as theirs
        mine = page.post(f"/api/bookings/{bobs}/cancel")
        assert mine.status_code == 202, mine.text
    # a person's bearer, with no session, is the same person
    direct = httpx.get(f"{stack.url('console')}/api/chats", headers=alice, timeout=30)
    assert {c["chat_id"] for c in direct.json()["chats"]} >= {alice_chat}
    assert bob_chat not in {c["chat_id"] for c in direct.json()["chats"]}
    assert alice_sub != bob_sub


def test_a_persons_stream_cap_applies_through_the_console(stack: Stack, issuer: LocalIssuer) -> None:
    _, carol = person(issuer)
    chat_id = stack.http.post(f"{stack.url('concierge-agent')}/chats", headers=carol).json()["chat_id"]
    path = f"{stack.url('console')}/api/chats/{chat_id}/events"
    with httpx.Client(timeout=httpx.Timeout(30, read=60), headers=carol) as client, contextlib.ExitStack() as held:
        for _ in range(MAX_STREAMS):
            opened = held.enter_context(client.stream("GET", path))
            assert opened.status_code == 200
        refused = client.get(path)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "quota_exceeded" and "Retry-After" in refused.headers
    # the operator has no cap
    operator = {"Authorization": f"Bearer {stack.admin_token}"}
    with httpx.Client(timeout=httpx.Timeout(30, read=60), headers=operator) as client, contextlib.ExitStack() as held:
        for _ in range(MAX_STREAMS + 1):
            assert held.enter_context(client.stream("GET", path)).status_code == 200


def test_every_operator_action_is_journaled_with_who_did_it(stack: Stack, issuer: LocalIssuer) -> None:
    _, dave = person(issuer)
    booking_id = confirmed_booking(stack, dave)
    console = stack.console  # the operator, by a one-time link
    journal = console.get(f"{stack.url('console')}/api/operator-journal").json()["entries"]
    after = journal[-1]["id"] if journal else None

    cancelled = console.post(f"{stack.url('console')}/api/bookings/{booking_id}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    admin = {**PAGE, "Authorization": f"Bearer {stack.admin_token}"}
    injected = httpx.put(
        f"{stack.url('console')}/api/faults/hotel-api", json={"latency_s": 0.01}, headers=admin, timeout=30
    )
    assert injected.status_code == 200, injected.text
    assert httpx.delete(f"{stack.url('console')}/api/faults/hotel-api", headers=admin, timeout=30).status_code == 200

    params = {"after": after} if after else {}
    entries = console.get(f"{stack.url('console')}/api/operator-journal", params=params).json()["entries"]
    actions = [(e["action"], e["by"], e["via"], e["status"]) for e in entries]
    assert actions == [
        ("cancel", "operator", "login-url", 202),
        ("inject", "operator", "admin-token", 200),
        ("clear", "operator", "admin-token", 200),
    ], actions
    assert entries[0]["booking_id"] == booking_id and entries[0]["session"]
    assert entries[1]["provider"] == "hotel-api" and "session" not in entries[1]
    assert all(e["kind"] == "operator_action" for e in entries)
    assert stack.admin_token not in console.get(f"{stack.url('console')}/api/operator-journal").text
    logged = "".join(log.read_text() for log in (stack.tmp_path / "logs").glob("console*.log"))
    assert "operator action: by=operator via=login-url" in logged and stack.admin_token not in logged
