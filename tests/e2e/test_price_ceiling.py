"""The approved total is a ceiling where the money moves, on real processes (issue 32).

hotel-api reprices holds on demand (the fault ``price_change_pct``: a hold costs that much more than the offer its
search showed). A booking that names ``max_total_price`` (and ``currency``) is charged only when its hold is within
them; otherwise booking-agent releases the hold, charges nothing and ends the booking ``failed`` / ``price_changed``,
the held and the allowed totals in its error. The ledgers of both providers are the proof; ``concierge verify``
finds every booking here consistent with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import SHARED_CORE
from tests.e2e.test_concierge import verify
from tests.stack import Stack, stay

pytestmark = [pytest.mark.e2e, SHARED_CORE]

NIGHTS = 2


@pytest.fixture
def repricing(stack: Stack) -> Iterator[Stack]:
    """The shared stack; hotel-api's faults cleared after the test."""
    yield stack
    stack.fault("hotel-api")


def cheapest_offer(stack: Stack, checkin: str, checkout: str) -> tuple[dict[str, Any], float]:
    """Lisbon's cheapest offer for two, as hotel-api's search shows it, and the stay's total at that price."""
    response = stack.http.get(
        f"{stack.url('hotel-api')}/hotels",
        params={"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2},
        auth=stack.provider_auth("hotel-api"),
    )
    assert response.status_code == 200, response.text
    offer: dict[str, Any] = response.json()["offers"][0]
    return offer, round(offer["price_per_night"] * NIGHTS, 2)  # two guests: one room, every night


def book_within(stack: Stack, days_ahead: int, **fields: Any) -> tuple[dict[str, Any], float]:
    """A booking of Lisbon's cheapest hotel with ``fields`` (``max_total_price``: ``"offer"`` is the offer's total),
    waited for; and the offer's total."""
    checkin, checkout = stay(days_ahead=days_ahead, nights=NIGHTS)
    offer, total = cheapest_offer(stack, checkin, checkout)
    if fields.get("max_total_price") == "offer":
        fields["max_total_price"] = total
    accepted = stack.book(checkin=checkin, checkout=checkout, hotel_id=offer["hotel_id"], **fields)
    return stack.wait(accepted["booking_id"]), total


def charges_of(stack: Stack, reference: str) -> list[dict[str, Any]]:
    return [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == reference]


def holds_of(stack: Stack, reference: str) -> list[dict[str, Any]]:
    return [r for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == reference]


def journal(stack: Stack, booking_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events")
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def test_a_hold_repriced_above_the_ceiling_is_released_and_nothing_is_charged(repricing: Stack) -> None:
    stack = repricing
    stack.fault("hotel-api", price_change_pct=30)
    booking, total = book_within(stack, 90, max_total_price="offer", currency="EUR")

    assert booking["status"] == "failed", booking
    raised = round(total * 1.3, 2)
    assert booking["error"] == {
        "code": "price_changed",
        "message": booking["error"]["message"],
        "held_total": raised,
        "currency": "EUR",
        "allowed_total": total,
        "allowed_currency": "EUR",
    }
    assert f"{raised:.2f} EUR" in booking["error"]["message"]
    assert booking["payment_id"] is None

    reference = booking["booking_id"]
    assert charges_of(stack, reference) == [], "nothing charged, not even attempted"
    holds = holds_of(stack, reference)
    assert [h["status"] for h in holds] == ["cancelled"], holds

    events = journal(stack, reference)
    compensation = [e for e in events if e["kind"] == "compensation"]
    assert compensation and compensation[0]["reason"] == "price_changed" and compensation[0]["release_hold"]
    assert not [e for e in events if e["kind"] == "step_started" and e.get("step") == "charge"]
    final = events[-1]
    assert (final["kind"], final["error_code"]) == ("failed", "price_changed")
    assert f"{raised:.2f} EUR" in final["error_message"]


def test_the_same_ceiling_without_a_price_change_confirms(repricing: Stack) -> None:
    booking, total = book_within(repricing, 91, max_total_price="offer", currency="EUR")

    assert booking["status"] == "confirmed", booking["error"]
    assert booking["total_price"] == total
    charges = charges_of(repricing, booking["booking_id"])
    assert [(c["amount"], c["currency"], c["status"]) for c in charges] == [(total, "EUR", "captured")]


def test_a_ceiling_above_the_raised_price_confirms_at_the_raised_price(repricing: Stack) -> None:
    stack = repricing
    stack.fault("hotel-api", price_change_pct=30)
    checkin, checkout = stay(days_ahead=92, nights=NIGHTS)
    offer, total = cheapest_offer(stack, checkin, checkout)
    raised = round(total * 1.3, 2)
    accepted = stack.book(
        checkin=checkin, checkout=checkout, hotel_id=offer["hotel_id"], max_total_price=raised, currency="EUR"
    )
    booking = stack.wait(accepted["booking_id"])

    assert booking["status"] == "confirmed", booking["error"]
    assert booking["total_price"] == raised
    charges = charges_of(stack, booking["booking_id"])
    assert [(c["amount"], c["status"]) for c in charges] == [(raised, "captured")]
    assert [h["status"] for h in holds_of(stack, booking["booking_id"])] == ["confirmed"]


def test_a_hold_in_another_currency_fails_price_changed(repricing: Stack) -> None:
    booking, _total = book_within(repricing, 93, currency="USD")

    assert booking["status"] == "failed"
    assert booking["error"]["code"] == "price_changed"
    assert (booking["error"]["currency"], booking["error"]["allowed_currency"]) == ("EUR", "USD")
    assert charges_of(repricing, booking["booking_id"]) == []
    assert [h["status"] for h in holds_of(repricing, booking["booking_id"])] == ["cancelled"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_total_price": 0}, "max_total_price"),
        ({"max_total_price": -10}, "max_total_price"),
        ({"max_total_price": "112.00"}, "max_total_price"),
        ({"currency": "euro"}, "currency"),
        ({"max_total_price": 112, "currency": "EU"}, "currency"),
    ],
)
def test_a_bad_ceiling_is_422_naming_the_field_over_http_and_a2a(
    stack: Stack, fields: dict[str, Any], field: str
) -> None:
    checkin, checkout = stay(days_ahead=94, nights=NIGHTS)
    body = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    response = stack.http.post(f"{stack.url('booking-agent')}/bookings", json=body | fields)
    assert response.status_code == 422, response.text
    assert [e["loc"][-1] for e in response.json()["detail"]] == [field]

    token = stack.service_token("concierge-agent", "booking-agent")
    answer = stack.a2a("booking-agent", "book_hotel", body | fields, authorization=f"Bearer {token}")
    assert answer.status_code == 200, answer.text
    status = answer.json()["result"]["task"]["status"]
    error = status["message"]["parts"][0]["data"]["error"]
    assert error["code"] == "invalid_request" and field in error["message"], status


def test_verify_finds_every_booking_above_consistent_with_the_ledgers(stack: Stack) -> None:
    """Last in this module: ``concierge verify`` over the failed and confirmed bookings above."""
    result = verify(stack)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 disagreement(s)" in result.stdout, result.stdout
