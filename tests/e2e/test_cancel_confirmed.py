"""Cancelling a confirmed booking, with real processes: the stay given back at hotel-api and ``total − fee`` refunded
at payment-api under the booking's policy, exactly once (four cancels at once, a kill -9 mid-refund), a ``max_fee``
that the fee passed refusing it with nothing moved, a stranger answered 404; ``concierge verify`` after each.
docs/cancel.md.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.booking import to_cents
from identity.people import LocalIssuer
from tests.stack import CORE, Stack, fresh_database, new_person, people_env, stay

pytestmark = pytest.mark.e2e

ISSUER = "https://issuer.cancel.test"
SERVICES = (*CORE, "recovery-worker")
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer"), ISSUER)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, issuer: LocalIssuer) -> Iterator[Stack]:
    env = {
        **people_env(issuer, ISSUER),
        "RUN_LEASE_TTL": "2",
        "ORPHAN_SCAN_INTERVAL": "0.2",
        "IDEMPOTENCY_LEASE_S": "1",
    }
    tmp: Path = tmp_path_factory.mktemp("cancel-confirmed")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=env) as stack:
        for proc in [stack.serve(service, wait=False) for service in SERVICES]:
            proc.wait_ready(120)
        stack.http.headers["Authorization"] = f"Bearer {stack.admin_token}"  # the operator sees every booking
        yield stack


@pytest.fixture(autouse=True)
def no_fault(stack: Stack) -> Iterator[None]:
    yield
    stack.fault("payment-api")
    stack.fault("hotel-api")


def person(issuer: LocalIssuer) -> dict[str, str]:
    return new_person(issuer)


def confirmed(stack: Stack, who: dict[str, str], *, days_ahead: int, nights: int = 2, **fields: Any) -> dict[str, Any]:
    checkin, checkout = stay(days_ahead=days_ahead, nights=nights)
    made = stack.book(headers=who, checkin=checkin, checkout=checkout, **fields)
    booking = stack.wait(str(made["booking_id"]))
    assert booking["status"] == "confirmed", booking
    return booking


def cancel(stack: Stack, who: dict[str, str], booking_id: str, **body: Any) -> httpx.Response:
    url = f"{stack.url('booking-agent')}/bookings/{booking_id}/cancel"
    return httpx.post(url, json=body or None, headers=who, timeout=30)


def wait_status(stack: Stack, booking_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while (booking := stack.booking(booking_id))["status"] != status:
        assert time.monotonic() < deadline, f"never {status}: {booking}"
        time.sleep(0.1)
    return booking


def money(stack: Stack, booking_id: str) -> tuple[list[str], list[float], list[str]]:
    """The booking's charge statuses, its refunds' amounts, and its reservations' statuses."""
    payments = stack.ledger("payment-api")
    charges = [c["status"] for c in payments["charges"] if c["reference"] == booking_id]
    refunds = [float(r["amount"]) for r in payments["refunds"] if r["reference"] == booking_id]
    rooms = [r["status"] for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == booking_id]
    return charges, refunds, rooms


def events(stack: Stack, booking_id: str) -> list[str]:
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events")
    assert response.status_code == 200, response.text
    return [e["kind"] for e in response.json()["events"]]


def verify(stack: Stack) -> None:
    checked = stack.verify()
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_an_early_cancel_gives_the_room_back_and_refunds_the_whole_stay_once(stack: Stack, issuer: LocalIssuer) -> None:
    who = person(issuer)
    booking = confirmed(stack, who, days_ahead=45)
    booking_id, total = str(booking["booking_id"]), float(booking["total_price"])
    answer = cancel(stack, who, booking_id)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "cancelling"
    assert answer.json()["refund"] == {"amount": total, "fee": 0.0, "currency": booking["currency"]}
    ended = wait_status(stack, booking_id, "cancelled")
    assert ended["refund"]["amount"] == total
    charges, refunds, rooms = money(stack, booking_id)
    assert charges == ["refunded"] and refunds == [total] and rooms == ["cancelled"], (charges, refunds, rooms)
    kinds = events(stack, booking_id)
    assert kinds.index("confirmed") < kinds.index("cancel_accepted") < kinds.index("stay_cancelled")
    assert kinds.index("stay_cancelled") < kinds.index("refunded") < kinds.index("cancelled") == len(kinds) - 1
    again = cancel(stack, who, booking_id)
    assert again.status_code == 200 and again.json()["status"] == "cancelled", again.text
    verify(stack)


def test_a_late_cancel_keeps_the_first_night_and_a_lower_max_fee_moves_nothing(
    stack: Stack, issuer: LocalIssuer
) -> None:
    who = person(issuer)
    booking = confirmed(stack, who, days_ahead=1, nights=3)  # inside the 48 hours: the fee applies
    booking_id, total, fee = str(booking["booking_id"]), float(booking["total_price"]), booking["cancellation"]["fee"]
    assert 0 < fee < total

    refused = cancel(stack, who, booking_id, max_fee=fee - 0.01)
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "fee_exceeds_limit" and error["fee"] == fee, error
    assert stack.booking(booking_id)["status"] == "confirmed"
    assert money(stack, booking_id) == (["captured"], [], ["confirmed"])
    assert "cancel_accepted" not in events(stack, booking_id)

    answer = cancel(stack, who, booking_id, max_fee=fee)
    assert answer.status_code == 202, answer.text
    expected = (to_cents(total) - to_cents(fee)) / 100
    assert answer.json()["refund"] == {"amount": expected, "fee": fee, "currency": booking["currency"]}
    wait_status(stack, booking_id, "cancelled")
    charges, refunds, rooms = money(stack, booking_id)
    assert charges == ["partially_refunded"] and refunds == [expected] and rooms == ["cancelled"]
    verify(stack)


def test_four_cancels_at_once_make_one_refund(stack: Stack, issuer: LocalIssuer) -> None:
    who = person(issuer)
    booking_id = str(confirmed(stack, who, days_ahead=50)["booking_id"])
    answers: list[httpx.Response] = []
    start = threading.Barrier(4)

    def one() -> None:
        start.wait()
        answers.append(cancel(stack, who, booking_id))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    statuses = Counter(a.status_code for a in answers)
    assert statuses[202] == 1 and statuses[200] == 3, [(a.status_code, a.text) for a in answers]
    assert len({str(a.json()["refund"]) for a in answers}) == 1, [a.text for a in answers]
    wait_status(stack, booking_id, "cancelled")
    _, refunds, rooms = money(stack, booking_id)
    assert len(refunds) == 1 and rooms == ["cancelled"], (refunds, rooms)
    verify(stack)


def test_kill_9_of_booking_agent_mid_refund_refunds_once(stack: Stack, issuer: LocalIssuer) -> None:
    who = person(issuer)
    booking = confirmed(stack, who, days_ahead=55)
    booking_id = str(booking["booking_id"])
    stack.fault("payment-api", latency_s=3.0)  # the refund waits there while its owner dies
    answer = cancel(stack, who, booking_id)
    assert answer.status_code == 202, answer.text
    deadline = time.monotonic() + DEADLINE_S
    while "stay_cancelled" not in events(stack, booking_id):
        assert time.monotonic() < deadline, events(stack, booking_id)
        time.sleep(0.05)
    time.sleep(1.0)  # the refund is on its way to payment-api
    stack.services["booking-agent"].kill()
    stack.fault("payment-api")
    stack.serve("booking-agent")
    wait_status(stack, booking_id, "cancelled")
    charges, refunds, rooms = money(stack, booking_id)
    assert charges == ["refunded"] and refunds == [float(booking["total_price"])] and rooms == ["cancelled"]
    assert events(stack, booking_id).count("cancelled") == 1
    verify(stack)


def test_what_cannot_be_cancelled_changes_nothing_and_a_strangers_cancel_is_unknown(
    stack: Stack, issuer: LocalIssuer
) -> None:
    who = person(issuer)
    booking = confirmed(stack, who, days_ahead=60)
    booking_id = str(booking["booking_id"])
    stranger = cancel(stack, person(issuer), booking_id)
    assert stranger.status_code == 404, stranger.text
    assert booking_id not in stranger.text or "no booking" in stranger.text

    started = confirmed(stack, who, days_ahead=0, nights=1)  # checks in today: the stay has started
    refused = cancel(stack, who, str(started["booking_id"]))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "stay_started", refused.text

    offers = httpx.get(  # not stack.http: it carries the admin token, which opens no business route
        f"{stack.url('hotel-api')}/hotels",
        params={"city": "Porto", "checkin": stay(65)[0], "checkout": stay(65)[1], "guests": 2},
        auth=stack.provider_auth("hotel-api"),
        timeout=30,
    )
    assert offers.status_code == 200, offers.text
    rigid = next(o for o in offers.json()["offers"] if not o["cancellation"]["refundable"])
    kept = confirmed(stack, who, days_ahead=65, city="Porto", hotel_id=rigid["hotel_id"])
    refused = cancel(stack, who, str(kept["booking_id"]))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_refundable", refused.text
    for unchanged in (booking_id, str(started["booking_id"]), str(kept["booking_id"])):
        assert stack.booking(unchanged)["status"] == "confirmed"
        assert money(stack, unchanged) == (["captured"], [], ["confirmed"])
    verify(stack)
