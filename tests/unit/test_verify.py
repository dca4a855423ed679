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
