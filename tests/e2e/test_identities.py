"""People, not just services: two people and an outsider against real processes with identities on.

The issuer is a local one (``identity.people.LocalIssuer``) whose JWKS the services fetch over HTTP from a server this
module runs, so a key can be rotated to a new ``kid`` while they run. Each test uses people of its own (a fresh
``sub``), so their quotas and lists do not meet.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from identity.auth import mint_service_token
from identity.people import LOCAL_ISSUER, LocalIssuer
from tests.e2e.test_concierge import START_S, a2a_concierge, a2a_result, start
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

SERVICES = (*CORE, "llm-api", "recovery-worker", "concierge-agent")
MAX_CHATS = 4
REQUESTS_PER_MIN = 150
TOKENS_PER_DAY = 15_000
"""About a dozen of the simulator's answers: another test's person never gets near it."""
MAX_STREAMS = 2
ROTATION_WAIT_S = 90.0
"""Longer than the JWKS refetch interval (30 s) with room for a loaded machine."""


class Jwks:
    """The issuer's ``jwks_uri``: serves whatever keys the test publishes."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        jwks = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"keys": jwks.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def jwks() -> Iterator[Jwks]:
    served = Jwks()
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory, jwks: Jwks) -> LocalIssuer:
    made = LocalIssuer(tmp_path_factory.mktemp("issuer"), LOCAL_ISSUER)
    jwks.keys = [made.public_jwk]
    return made


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, issuer: LocalIssuer, jwks: Jwks) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("people")
    env = {
        "CONCIERGE_AUTH": "on",
        "CONCIERGE_AUTH_ISSUER": LOCAL_ISSUER,
        "CONCIERGE_AUTH_JWKS_URL": jwks.url,
        "PERSON_REQUESTS_PER_MIN": str(REQUESTS_PER_MIN),
        "PERSON_MAX_STREAMS": str(MAX_STREAMS),
        "PERSON_TOKENS_PER_DAY": str(TOKENS_PER_DAY),
        "PERSON_MAX_CHATS": str(MAX_CHATS),
        "ORPHAN_SCAN_INTERVAL": "0.2",
        "IDEMPOTENCY_LEASE_S": "2",
    }
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=env) as stack:
        start(stack, SERVICES)
        yield stack


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    """A client that sends only what a test gives it (the stack's own ``stack.http`` is the operator's)."""
    stack.http.headers["Authorization"] = f"Bearer {stack.admin_token}"
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def no_script(stack: Stack) -> Iterator[None]:
    stack.script_model(None)
    yield
    stack.script_model(None)


def person(issuer: LocalIssuer, name: str = "") -> dict[str, str]:
    """The headers of a new person (a fresh ``sub``)."""
    sub = f"{name or 'p'}-{uuid.uuid4().hex[:8]}"
    return {"Authorization": f"Bearer {issuer.mint(sub)}"}


def sub_of(headers: dict[str, str]) -> str:
    token = headers["Authorization"].removeprefix("Bearer ")
    return str(jwt.decode(token, options={"verify_signature": False})["sub"])


def signed(issuer: LocalIssuer, claims: dict[str, Any], kid: str | None = None) -> str:
    """``claims`` as they are, signed with ``issuer``'s key (under ``kid``, default its own)."""
    return jwt.encode(claims, issuer._private, algorithm="ES256", headers={"kid": kid or issuer.kid})


def hs256(claims: dict[str, Any], key: bytes, kid: str) -> str:
    """An HS256 token keyed with ``key``, made by hand (PyJWT itself refuses a public key as an HMAC secret)."""
    import base64
    import hashlib
    import hmac

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT', 'kid': kid})}.{part(claims)}"
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).decode().rstrip('=')}"


def operator(stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.admin_token}"}


def booking_body(**change: Any) -> dict[str, Any]:
    checkin, checkout = stay()
    body = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    return body | change


def book(http: httpx.Client, stack: Stack, headers: dict[str, str], **change: Any) -> str:
    response = http.post(f"{stack.url('booking-agent')}/bookings", json=booking_body(**change), headers=headers)
    assert response.status_code == 202, response.text
    return str(response.json()["booking_id"])


def listed(http: httpx.Client, stack: Stack, headers: dict[str, str], service: str = "booking-agent") -> set[str]:
    path, field, ident = ("/bookings", "bookings", "booking_id")
    if service == "concierge-agent":
        path, field, ident = ("/chats", "chats", "chat_id")
    response = http.get(f"{stack.url(service)}{path}", params={"limit": 200}, headers=headers)
    assert response.status_code == 200, response.text
    return {item[ident] for item in response.json()[field]}


def assert_unauthenticated(response: httpx.Response, *, invalid: bool = False) -> None:
    assert response.status_code == 401, response.text
    code = "invalid_token" if invalid else "unauthenticated"
    assert response.json()["error"]["code"] == code, response.text
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    assert response.headers["WWW-Authenticate"] == challenge


# ------------------------------------------------------------------------------------------------- bookings


def test_a_booking_is_its_owners_alone_another_person_gets_what_an_unknown_id_gets(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    alice, bob = person(issuer, "alice"), person(issuer, "bob")
    agent = stack.url("booking-agent")
    booking_id = book(http, stack, alice)
    assert stack.wait(booking_id)["status"] == "confirmed"  # the operator's view (stack.http is auth-less: see below)

    mine = http.get(f"{agent}/bookings/{booking_id}", headers=alice)
    assert mine.status_code == 200 and mine.json()["owner"] == sub_of(alice), mine.text
    for method, path in (
        ("GET", f"/bookings/{booking_id}"),
        ("GET", f"/bookings/{booking_id}?wait=5"),
        ("GET", f"/bookings/{booking_id}/events"),
        ("POST", f"/bookings/{booking_id}/cancel"),
    ):
        theirs = http.request(method, agent + path, headers=bob)
        unknown = http.request(method, agent + path.replace(booking_id, "no-such-booking"), headers=bob)
        assert theirs.status_code == unknown.status_code == 404, (path, theirs.text)
        assert theirs.json()["detail"].replace(booking_id, "ID") == unknown.json()["detail"].replace(
            "no-such-booking", "ID"
        )
        outsider = http.request(method, agent + path)
        assert_unauthenticated(outsider)
    assert_unauthenticated(http.post(f"{agent}/bookings", json=booking_body()))
    assert_unauthenticated(http.get(f"{agent}/bookings"))

    assert booking_id in listed(http, stack, alice)
    assert booking_id not in listed(http, stack, bob)
    assert booking_id in listed(http, stack, operator(stack))  # the operator sees everyone's
    assert http.get(f"{agent}/bookings/{booking_id}", headers=operator(stack)).status_code == 200
    assert stack.booking(booking_id)["status"] == "confirmed"  # bob's cancel changed nothing


def test_idempotency_keys_are_per_person(http: httpx.Client, stack: Stack, issuer: LocalIssuer) -> None:
    alice, bob = person(issuer, "alice"), person(issuer, "bob")
    key = f"trip-{uuid.uuid4().hex[:8]}"
    first = book(http, stack, {**alice, "Idempotency-Key": key})
    again = book(http, stack, {**alice, "Idempotency-Key": key})
    other = book(http, stack, {**bob, "Idempotency-Key": key})
    assert first == again and other != first  # the same key from two people: two bookings
    reused = http.post(
        f"{stack.url('booking-agent')}/bookings",
        json=booking_body(guests=3),
        headers={**alice, "Idempotency-Key": key},
    )
    assert reused.status_code == 422, reused.text
    assert reused.json()["error"]["code"] == "idempotency_key_reused"
    assert "Idempotency-Key" in reused.json()["error"]["message"]
    for booking_id in (first, other):
        assert stack.wait(booking_id)["status"] == "confirmed"


def test_a_chats_message_key_reused_with_another_text_is_422(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    gina = person(issuer, "gina")
    concierge = stack.url("concierge-agent")
    chat_id = http.post(f"{concierge}/chats", headers=gina).json()["chat_id"]
    key = {**gina, "Idempotency-Key": f"msg-{uuid.uuid4().hex[:8]}"}
    first = http.post(f"{concierge}/chats/{chat_id}/messages", json={"text": "Hi!"}, headers=key)
    assert first.status_code == 202, first.text
    again = http.post(f"{concierge}/chats/{chat_id}/messages", json={"text": "Hi!"}, headers=key)
    assert again.status_code == 202 and again.json()["turn_id"] == first.json()["turn_id"], again.text
    other = http.post(f"{concierge}/chats/{chat_id}/messages", json={"text": "Cancel it all"}, headers=key)
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=gina, timeout=80).json()
    assert [m["content"] for m in view["messages"] if m["role"] == "user"] == ["Hi!"], view


def test_every_kind_of_bad_token_is_refused(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer, tmp_path: Path
) -> None:
    agent = stack.url("booking-agent")
    stranger = LocalIssuer(tmp_path / "stranger", LOCAL_ISSUER)  # same name, keys nobody trusts
    now = int(time.time())
    claims = {"iss": LOCAL_ISSUER, "sub": "mallory", "aud": "concierge", "iat": now, "exp": now + 600}
    # the key confusion attack: HS256 "signed" with the issuer's public key, which anyone can read from its JWKS
    public_pem = issuer._private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)

    unsigned = jwt.encode(claims, "", algorithm="none", headers={"kid": issuer.kid})
    bad = {
        "garbage": "not-a-jwt",
        "alg none": unsigned,
        "HS256 with the public key": hs256(claims, public_pem, issuer.kid),
        "expired": issuer.mint("mallory", now=now - 7200, ttl_s=60),
        "another issuer": signed(issuer, claims | {"iss": "https://evil.example"}),
        "another audience": issuer.mint("mallory", audience="someone-else"),
        "an unknown kid": stranger.mint("mallory"),
        "a forged signature": signed(stranger, claims, kid=issuer.kid),
        "no sub": signed(issuer, {k: v for k, v in claims.items() if k != "sub"}),
        # good for a century, or issued two days ago: not a day's token (CONCIERGE_AUTH_MAX_TOKEN_AGE_S)
        "a 100-year exp": issuer.mint("mallory", ttl_s=100 * 365 * 86_400),
        "issued two days ago": signed(issuer, claims | {"iat": now - 2 * 86_400}),
        "no iat": signed(issuer, {k: v for k, v in claims.items() if k != "iat"}),
    }
    for what, token in bad.items():
        for url in (f"{agent}/bookings", f"{stack.url('concierge-agent')}/chats"):
            response = http.get(url, headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 401, (what, url, response.text)
            assert_unauthenticated(response, invalid=True)
            assert token not in response.text
    assert_unauthenticated(http.get(f"{agent}/bookings", headers={"Authorization": "Basic YTpi"}), invalid=True)
    assert http.get(f"{agent}/bookings", headers=person(issuer)).status_code == 200


# ------------------------------------------------------------------------------------------------- chats


def test_a_person_keeps_at_most_person_max_chats_and_others_are_not_held_by_it(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    concierge = stack.url("concierge-agent")
    hoarder, other = person(issuer, "hoarder"), person(issuer, "other")
    for _ in range(MAX_CHATS):
        assert http.post(f"{concierge}/chats", headers=hoarder).status_code == 201
    refused = http.post(f"{concierge}/chats", headers=hoarder)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "quota_exceeded" and "PERSON_MAX_CHATS" in refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    listed = http.get(f"{concierge}/chats", headers=hoarder).json()
    assert len(listed["chats"]) == MAX_CHATS, listed  # nothing was created by the refusal
    assert http.post(f"{concierge}/chats", headers=other).status_code == 201
    operator = {"Authorization": f"Bearer {stack.admin_token}"}
    assert http.post(f"{concierge}/chats", headers=operator).status_code == 201  # the operator's are not capped


def test_a_chat_is_its_owners_and_the_concierge_books_for_them(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    alice, bob = person(issuer, "alice"), person(issuer, "bob")
    concierge = stack.url("concierge-agent")
    created = http.post(f"{concierge}/chats", headers=alice)
    assert created.status_code == 201, created.text
    chat_id = created.json()["chat_id"]
    checkin, checkout = stay()
    args: dict[str, Any] = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2}
    offers = http.get(f"{stack.url('hotel-api')}/hotels", params=args, auth=stack.provider_auth("hotel-api"))
    offers = offers.json()["offers"]
    stack.script_model(
        [
            {"tool_calls": [{"name": "book_hotel", "arguments": {"hotel_id": offers[0]["hotel_id"], **args}}]},
            {"text": "Booked."},
        ]
    )
    said = http.post(
        f"{concierge}/chats/{chat_id}/messages", json={"text": "book it", "payment_token": "tok_visa"}, headers=alice
    )
    assert said.status_code == 202, said.text
    view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=alice, timeout=80).json()
    assert view["status"] == "awaiting_approval", view
    approval_id = view["pending_approval"]["approval_id"]

    # bob: the chat, its journal, its approval and its list are not his (404 as for an unknown chat)
    unknown = "0" * 32
    for method, path, body in (
        ("GET", f"/chats/{chat_id}", None),
        ("GET", f"/chats/{chat_id}/events", None),
        ("POST", f"/chats/{chat_id}/messages", {"text": "cancel everything"}),
        ("POST", f"/chats/{chat_id}/approvals/{approval_id}", {"approve": True}),
    ):
        theirs = http.request(method, concierge + path, json=body, headers=bob)
        other = http.request(method, concierge + path.replace(chat_id, unknown), json=body, headers=bob)
        assert theirs.status_code == other.status_code == 404, (path, theirs.text)
        assert_unauthenticated(http.request(method, concierge + path, json=body))
    assert chat_id in listed(http, stack, alice, "concierge-agent")
    assert chat_id not in listed(http, stack, bob, "concierge-agent")
    assert chat_id in listed(http, stack, operator(stack), "concierge-agent")

    decided = http.post(f"{concierge}/chats/{chat_id}/approvals/{approval_id}", json={"approve": True}, headers=alice)
    assert decided.status_code == 202, decided.text
    view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=alice, timeout=80).json()
    assert view["status"] == "idle" and len(view["bookings"]) == 1, view
    booking_id = view["bookings"][0]
    booking = stack.wait(booking_id)
    assert booking["status"] == "confirmed" and booking["owner"] == sub_of(alice), booking
    assert booking_id in listed(http, stack, alice) and booking_id not in listed(http, stack, bob)


def test_the_concierge_killed_mid_booking_resumes_for_the_same_person(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    """kill -9 of concierge-agent while booking-agent charges: the turn resumed elsewhere (the recovery worker, or the
    restarted agent) still acts for the chat's owner, read from the chat record, never as itself."""
    alice, bob = person(issuer, "alice"), person(issuer, "bob")
    concierge = stack.url("concierge-agent")
    chat_id = http.post(f"{concierge}/chats", headers=alice).json()["chat_id"]
    checkin, checkout = stay(days_ahead=55)
    args: dict[str, Any] = {"city": "Porto", "checkin": checkin, "checkout": checkout, "guests": 2}
    found = http.get(f"{stack.url('hotel-api')}/hotels", params=args, auth=stack.provider_auth("hotel-api"))
    hotel = found.json()["offers"][0]
    stack.script_model(
        [
            {"tool_calls": [{"name": "book_hotel", "arguments": {"hotel_id": hotel["hotel_id"], **args}}]},
            {"text": "Ok."},
        ]
    )
    said = http.post(
        f"{concierge}/chats/{chat_id}/messages", json={"text": "book", "payment_token": "tok_visa"}, headers=alice
    )
    assert said.status_code == 202, said.text
    view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=alice, timeout=80).json()
    approval_id = view["pending_approval"]["approval_id"]
    stack.fault("payment-api", latency_s=4.0)
    try:
        decided = http.post(
            f"{concierge}/chats/{chat_id}/approvals/{approval_id}", json={"approve": True}, headers=alice
        )
        assert decided.status_code == 202, decided.text
        deadline = time.monotonic() + 60
        while True:  # booking-agent is charging: its journal is being relayed into the chat's
            entries = http.get(f"{concierge}/chats/{chat_id}/events", headers=alice).json()["events"]
            if any(e["kind"] == "booking" and e["entry"].get("step") == "charge" for e in entries):
                break
            assert time.monotonic() < deadline, entries
            time.sleep(0.1)
        stack.services["concierge-agent"].kill()
    finally:
        stack.fault("payment-api")
    stack.services["concierge-agent"] = stack.procs.serve(
        "concierge-agent", port=stack.ports["concierge-agent"], timeout=START_S
    )
    view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=alice, timeout=80).json()
    assert view["status"] == "idle" and len(view["bookings"]) == 1, view
    booking = stack.wait(view["bookings"][0])
    assert booking["status"] == "confirmed" and booking["owner"] == sub_of(alice), booking
    assert booking["booking_id"] in listed(http, stack, alice)
    assert booking["booking_id"] not in listed(http, stack, bob)
    assert any(
        e["kind"] == "resumed" for e in http.get(f"{concierge}/chats/{chat_id}/events", headers=alice).json()["events"]
    )


def test_the_concierges_a2a_skill_talks_for_the_person_its_caller_names(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    """A service calling the concierge names the person (its token's ``sub``, ``act`` = itself): the chat is
    theirs. Without a person there is nobody to talk for: ``unauthenticated``."""
    hana = person(issuer, "hana")

    def send(token: str) -> dict[str, Any]:
        return a2a_concierge(stack, uuid.uuid4().hex, {"text": "Hi!"}, token)

    nobody = send(mint_service_token(stack.secret, issuer="booking-agent", audience="concierge-agent"))
    assert nobody["status"]["state"] == "TASK_STATE_FAILED" and "unauthenticated" in json.dumps(nobody), nobody
    token = mint_service_token(stack.secret, issuer="booking-agent", audience="concierge-agent", person=sub_of(hana))
    chat_id = a2a_result(send(token))["chat_id"]  # completed, for hana
    assert chat_id in listed(http, stack, hana, "concierge-agent")
    assert chat_id not in listed(http, stack, person(issuer, "ivan"), "concierge-agent")


# ------------------------------------------------------------------------------------------------- quotas


def test_a_person_over_their_requests_a_minute_gets_429_and_others_do_not(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    flooder, other = person(issuer, "flood"), person(issuer, "calm")
    url = f"{stack.url('booking-agent')}/bookings"
    statuses = [http.get(url, params={"limit": 1}, headers=flooder).status_code for _ in range(REQUESTS_PER_MIN + 5)]
    assert 429 in statuses, statuses
    refused = http.get(url, headers=flooder)
    if refused.status_code == 429:  # unless the minute turned just now
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert http.get(url, headers=other).status_code == 200
    assert http.get(url, headers=operator(stack)).status_code == 200  # the operator has no quota


def test_a_person_who_spent_their_model_tokens_of_the_day_gets_429_and_others_do_not(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    erin, frank = person(issuer, "erin"), person(issuer, "frank")
    concierge = stack.url("concierge-agent")

    def turn(who: dict[str, str], chat_id: str) -> httpx.Response:
        said = http.post(f"{concierge}/chats/{chat_id}/messages", json={"text": "Hi!"}, headers=who)
        if said.status_code == 202:
            view = http.get(f"{concierge}/chats/{chat_id}", params={"wait": 60}, headers=who, timeout=80).json()
            assert view["status"] == "idle", view
        return said

    chat_id = http.post(f"{concierge}/chats", headers=erin).json()["chat_id"]
    for _ in range(60):
        said = turn(erin, chat_id)
        if said.status_code != 202:
            break
    assert said.status_code == 429, said.text
    assert (
        said.json()["error"]["code"] == "quota_exceeded" and "PERSON_TOKENS_PER_DAY" in said.json()["error"]["message"]
    )
    assert 1 <= int(said.headers["Retry-After"]) <= 86400
    other = http.post(f"{concierge}/chats", headers=frank).json()["chat_id"]
    assert turn(frank, other).status_code == 202


def test_a_person_holds_at_most_their_share_of_open_streams(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer
) -> None:
    carol = person(issuer, "carol")
    concierge = stack.url("concierge-agent")
    chats = [http.post(f"{concierge}/chats", headers=carol).json()["chat_id"] for _ in range(MAX_STREAMS + 1)]
    sse = {**carol, "Accept": "text/event-stream"}
    with contextlib.ExitStack() as streams:
        for chat_id in chats[:MAX_STREAMS]:
            opened = streams.enter_context(http.stream("GET", f"{concierge}/chats/{chat_id}/events", headers=sse))
            assert opened.status_code == 200
        over = http.get(f"{concierge}/chats/{chats[-1]}/events", headers=sse)
        assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded", over.text
        assert "Retry-After" in over.headers
    # closed: the share is free again (the server sees the disconnect within its keep-alive poll)
    deadline = time.monotonic() + 60
    while True:
        with http.stream("GET", f"{concierge}/chats/{chats[-1]}/events", headers=sse) as again:
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline, "the closed streams were never released"
        time.sleep(0.5)


# ------------------------------------------------------------------------------------------------- keys


def test_keys_rotate_to_a_new_kid_without_a_restart(
    http: httpx.Client, stack: Stack, issuer: LocalIssuer, jwks: Jwks, tmp_path: Path
) -> None:
    rotated = LocalIssuer(tmp_path / "rotated", LOCAL_ISSUER)
    token = {"Authorization": f"Bearer {rotated.mint(f'dave-{uuid.uuid4().hex[:6]}')}"}
    url = f"{stack.url('booking-agent')}/bookings"
    assert http.get(url, headers=token).status_code == 401  # not published yet
    jwks.keys = [issuer.public_jwk, rotated.public_jwk]
    deadline = time.monotonic() + ROTATION_WAIT_S  # an unknown kid refetches the keys at most every 30 s
    while http.get(url, headers=token).status_code != 200:
        assert time.monotonic() < deadline, "the new key was never fetched"
        time.sleep(1.0)
    assert http.get(url, headers=person(issuer)).status_code == 200  # the old key still works
