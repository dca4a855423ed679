"""The concierge knows the person's bookings from any chat, and only theirs: real processes, people's identities on
(a local issuer), llm-api's simulated model reading what the person writes.

A new chat lists the bookings the person made elsewhere (``list_bookings``), cancels a confirmed one after an
approval that names its refund and fee (the approved fee is the cancel's ``max_fee``), and another person's chat can
neither list, read nor cancel it: ``unknown_booking``, exactly as for an id nobody made. ``concierge verify`` after.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.booking import to_cents
from identity.people import LocalIssuer
from tests.stack import CORE, Stack, fresh_database, new_person, people_env, stay

pytestmark = pytest.mark.e2e

ISSUER = "https://issuer.concierge-bookings.test"
SERVICES = (*CORE, "llm-api", "concierge-agent", "recovery-worker")
WAIT_S = 30.0


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer"), ISSUER)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, issuer: LocalIssuer) -> Iterator[Stack]:
    env = {
        **people_env(issuer, ISSUER),
        "APPROVAL_TTL_S": "600",
    }
    tmp: Path = tmp_path_factory.mktemp("concierge-bookings")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=env) as stack:
        for proc in [stack.serve(service, wait=False) for service in SERVICES]:
            proc.wait_ready(180)
        stack.http.headers["Authorization"] = f"Bearer {stack.admin_token}"  # the operator's reads
        yield stack


def person(issuer: LocalIssuer) -> dict[str, str]:
    return new_person(issuer)


def concierge_url(stack: Stack, path: str) -> str:
    return f"{stack.url('concierge-agent')}{path}"


def new_chat(stack: Stack, who: dict[str, str]) -> str:
    response = httpx.post(concierge_url(stack, "/chats"), headers=who, timeout=30)
    assert response.status_code == 201, response.text
    return str(response.json()["chat_id"])


def say(stack: Stack, who: dict[str, str], chat_id: str, text: str) -> dict[str, Any]:
    """One message, and the chat once its turn has ended (answered, or waiting for an approval)."""
    sent = httpx.post(concierge_url(stack, f"/chats/{chat_id}/messages"), json={"text": text}, headers=who, timeout=30)
    assert sent.status_code == 202, sent.text
    deadline = time.monotonic() + 120
    while True:
        response = httpx.get(
            concierge_url(stack, f"/chats/{chat_id}"), params={"wait": WAIT_S}, headers=who, timeout=WAIT_S + 10
        )
        assert response.status_code == 200, response.text
        view = dict(response.json())
        if view["status"] != "running":
            return view
        assert time.monotonic() < deadline, view


def results(stack: Stack, who: dict[str, str], chat_id: str) -> list[dict[str, Any]]:
    response = httpx.get(concierge_url(stack, f"/chats/{chat_id}/events"), headers=who, timeout=30)
    assert response.status_code == 200, response.text
    return [e for e in response.json()["events"] if e["kind"] == "tool_result"]


def booked(stack: Stack, who: dict[str, str], days_ahead: int) -> dict[str, Any]:
    """A booking the person made without the concierge (``POST /bookings``), confirmed."""
    checkin, checkout = stay(days_ahead=days_ahead)
    made = stack.book(headers=who, checkin=checkin, checkout=checkout)
    booking = stack.wait(str(made["booking_id"]))
    assert booking["status"] == "confirmed", booking
    return booking


def verify(stack: Stack) -> None:
    checked = stack.verify()
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_new_chat_lists_the_persons_bookings_and_cancels_one_after_an_approval_naming_refund_and_fee(
    stack: Stack, issuer: LocalIssuer
) -> None:
    who = person(issuer)
    early = booked(stack, who, days_ahead=80)
    late = booked(stack, who, days_ahead=1)  # inside 48 hours: the first night is the fee
    chat_id = new_chat(stack, who)

    view = say(stack, who, chat_id, "What bookings do I have?")
    assert view["status"] == "idle", view
    (listed,) = results(stack, who, chat_id)
    shown = {b["booking_id"]: b for b in listed["content"]["bookings"]}
    assert {early["booking_id"], late["booking_id"]} <= set(shown), listed
    assert shown[late["booking_id"]]["status"] == "confirmed" and "payment_id" not in shown[late["booking_id"]]

    view = say(stack, who, chat_id, f"Please cancel my Lisbon booking {late['booking_id']}")
    assert view["status"] == "awaiting_approval", view
    approval = view["pending_approval"]
    fee = late["cancellation"]["fee"]
    total = float(late["total_price"])
    assert approval["action"] == "cancel" and approval["booking_id"] == late["booking_id"], approval
    assert approval["refund"] == {
        "amount": (to_cents(total) - to_cents(fee)) / 100,
        "fee": fee,
        "currency": late["currency"],
    }, approval
    assert stack.booking(late["booking_id"])["status"] == "confirmed"  # nothing before the decision

    decided = httpx.post(
        concierge_url(stack, f"/chats/{chat_id}/approvals/{approval['approval_id']}"),
        json={"approve": True},
        headers=who,
        timeout=30,
    )
    assert decided.status_code == 202, decided.text
    deadline = time.monotonic() + 120
    while (ended := stack.booking(late["booking_id"]))["status"] != "cancelled":
        assert time.monotonic() < deadline and not ended.get("cancel_error"), ended
        time.sleep(0.1)
    assert ended["refund"] == approval["refund"], ended
    refunds = [r for r in stack.ledger("payment-api")["refunds"] if r["reference"] == late["booking_id"]]
    assert [r["amount"] for r in refunds] == [approval["refund"]["amount"]], refunds
    assert stack.booking(early["booking_id"])["status"] == "confirmed"
    verify(stack)


def test_another_persons_booking_is_invisible_to_their_concierge(stack: Stack, issuer: LocalIssuer) -> None:
    owner, stranger = person(issuer), person(issuer)
    theirs = booked(stack, owner, days_ahead=85)
    chat_id = new_chat(stack, stranger)

    say(stack, stranger, chat_id, "What bookings do I have?")
    say(stack, stranger, chat_id, f"what's the status of {theirs['booking_id']}?")
    view = say(stack, stranger, chat_id, f"cancel booking {theirs['booking_id']}")
    assert view["status"] == "idle" and view["pending_approval"] is None, view
    listed, read, cancelled = results(stack, stranger, chat_id)
    assert listed["content"]["bookings"] == [], listed
    for refused in (read, cancelled):
        assert refused["content"]["error"]["code"] == "unknown_booking", refused
    nobody = "0123456789abcdef0123456789abcdef"
    say(stack, stranger, chat_id, f"what's the status of {nobody}?")
    unknown = results(stack, stranger, chat_id)[-1]["content"]["error"]["message"]
    assert read["content"]["error"]["message"].replace(theirs["booking_id"], "ID") == unknown.replace(nobody, "ID")
    assert stack.booking(theirs["booking_id"])["status"] == "confirmed"
    verify(stack)
