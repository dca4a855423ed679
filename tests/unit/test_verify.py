"""``concierge verify``'s judgement: which ledger states a booking's status allows."""

from __future__ import annotations

from stack.verify import disagreements


def hold(ref: str, status: str) -> dict[str, str]:
    return {"reference": ref, "status": status}


charge = hold


def test_a_consistent_stack_has_no_disagreement() -> None:
    bookings = {"b1": "confirmed", "b2": "failed", "b3": "paying"}
    reservations = [hold("b1", "confirmed"), hold("b2", "cancelled"), hold("b3", "held")]
    charges = [charge("b1", "captured"), charge("b2", "refunded"), charge("b2", "declined")]
    assert disagreements(bookings, reservations, charges) == []


def test_each_broken_promise_is_named() -> None:
    bookings = {"confirmed-twice": "confirmed", "failed-kept": "failed", "confirmed-unpaid": "confirmed"}
    reservations = [
        hold("confirmed-twice", "confirmed"),
        hold("confirmed-twice", "confirmed"),
        hold("failed-kept", "held"),
        hold("confirmed-unpaid", "confirmed"),
    ]
    charges = [charge("confirmed-twice", "captured"), charge("failed-kept", "captured"), charge("ghost", "captured")]
    found = {(d.reference, d.problem) for d in disagreements(bookings, reservations, charges)}
    assert found == {
        ("confirmed-twice", "2 confirmed reservations, not 1"),
        ("failed-kept", "reservations {'held': 1}: a room is kept"),
        ("failed-kept", "1 captured charge(s) not refunded"),
        ("confirmed-unpaid", "0 captured charges, not 1"),
        ("ghost", "no such booking, yet reservations {}, charges {'captured': 1}"),
    }


def test_bookings_in_flight_and_harmless_leftovers_are_not_judged() -> None:
    bookings = {"b1": "reserving", "b2": "compensating"}
    reservations = [hold("b1", "held"), hold("b2", "held"), hold("old", "cancelled")]
    charges = [charge("b2", "captured"), charge("old", "declined")]
    assert disagreements(bookings, reservations, charges) == []


def test_a_cancelled_booking_is_held_to_the_promise_of_a_failed_one() -> None:
    bookings = {"released": "cancelled", "refunded": "cancelled", "untouched": "cancelled", "kept": "cancelled"}
    reservations = [hold("released", "cancelled"), hold("refunded", "cancelled"), hold("kept", "confirmed")]
    charges = [charge("refunded", "refunded"), charge("kept", "captured")]
    found = {(d.reference, d.status, d.problem) for d in disagreements(bookings, reservations, charges)}
    assert found == {
        ("kept", "cancelled", "reservations {'confirmed': 1}: a room is kept"),
        ("kept", "cancelled", "1 captured charge(s) not refunded"),
    }


def refund(ref: str, amount: float) -> dict[str, object]:
    return {"reference": ref, "amount": amount}


def test_a_confirmed_stay_cancelled_since_keeps_its_fee_and_is_refunded_the_rest_once() -> None:
    bookings = {
        "full": "cancelled",
        "late": "cancelled",
        "all-fee": "cancelled",
        "twice": "cancelled",
        "short": "cancelled",
    }
    owed = {
        "full": {"amount": 200.0, "fee": 0.0},
        "late": {"amount": 120.0, "fee": 80.0},
        "all-fee": {"amount": 0.0, "fee": 90.0},
        "twice": {"amount": 50.0, "fee": 50.0},
        "short": {"amount": 100.0, "fee": 20.0},
    }
    reservations = [hold(ref, "cancelled") for ref in bookings] + [hold("late", "confirmed")]
    charges = [
        charge("full", "refunded"),
        charge("late", "partially_refunded"),
        charge("all-fee", "captured"),  # the fee took it all: nothing to give back, the charge stays
        charge("twice", "refunded"),
        charge("short", "partially_refunded"),
    ]
    refunds = [refund("full", 200.0), refund("late", 120.0), refund("twice", 25.0), refund("twice", 25.0)]
    refunds.append(refund("short", 99.99))
    found = {(d.reference, d.problem) for d in disagreements(bookings, reservations, charges, refunds, owed)}
    assert found == {
        ("late", "reservations {'cancelled': 1, 'confirmed': 1}: a room is kept"),
        ("twice", "2 refunds: a second refund"),
        ("short", "refunded 99.99, not 100.00"),
    }
