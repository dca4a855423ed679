"""Hostile input against the real services: non-finite numbers, dates past the horizon, oversized values.

Each answer is a 422 naming the field, never a 500 with a traceback, and an error body never echoes more than a
short prefix of what was sent.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest
from redis import Redis

from runs.leases import run_key
from tests.e2e.conftest import SHARED_CORE
from tests.stack import Stack, stay

pytestmark = SHARED_CORE

JSON = {"Content-Type": "application/json"}


def _raw(body: dict[str, object], **numbers: str) -> bytes:
    """``body`` as JSON with ``numbers`` spliced in as literal tokens (``1e400`` parses as infinity)."""
    fields = [json.dumps(body)[1:-1], *(f'"{name}": {token}' for name, token in numbers.items())]
    return ("{" + ", ".join(f for f in fields if f) + "}").encode()


def _fields(response_json: dict[str, object]) -> set[str]:
    detail = response_json["detail"]
    assert isinstance(detail, list)
    return {str(part) for item in detail for part in item["loc"]}


def _booking(**change: object) -> dict[str, object]:
    checkin, checkout = stay()
    body: dict[str, object] = {
        "city": "Lisbon",
        "checkin": checkin,
        "checkout": checkout,
        "guests": 2,
        "payment_token": "tok_visa",
    }
    body.update(change)
    return body


@pytest.mark.parametrize(("field", "token"), [("guests", "1e400"), ("max_price_per_night", "1e400")])
def test_non_finite_numbers_at_the_booking_door_are_422_naming_the_field(stack: Stack, field: str, token: str) -> None:
    body = _booking()
    body.pop(field, None)
    response = stack.http.post(
        f"{stack.url('booking-agent')}/bookings", content=_raw(body, **{field: token}), headers=JSON
    )
    assert response.status_code == 422, response.text
    assert field in _fields(response.json())
    assert "Traceback" not in response.text


def test_non_finite_numbers_at_the_providers_are_422_naming_the_field(stack: Stack) -> None:
    checkin, checkout = stay()
    reservation = {"hotel_id": "lisbon-01", "checkin": checkin, "checkout": checkout, "reference": "hostile"}
    held = stack.http.post(
        f"{stack.url('hotel-api')}/reservations",
        content=_raw(reservation, guests="1e400"),
        headers={**JSON, "Idempotency-Key": uuid.uuid4().hex},
        auth=stack.provider_auth("hotel-api"),
    )
    assert held.status_code == 422 and "guests" in _fields(held.json()), held.text

    charge = {"currency": "EUR", "payment_token": "tok_visa", "reference": "hostile"}
    charged = stack.http.post(
        f"{stack.url('payment-api')}/charges",
        content=_raw(charge, amount="1e400"),
        headers={**JSON, "Idempotency-Key": uuid.uuid4().hex},
        auth=stack.provider_auth("payment-api"),
    )
    assert charged.status_code == 422 and "amount" in _fields(charged.json()), charged.text
    assert not [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == "hostile"]

    faults = stack.admin("PUT", "hotel-api", "faults", content=_raw({}, latency_s="1e400"), headers=JSON)
    assert faults.status_code == 422 and "latency_s" in _fields(faults.json()), faults.text


@pytest.mark.parametrize("checkin", ["9999-12-30", "2020-01-10"])
def test_a_checkin_outside_the_booking_horizon_is_refused(stack: Stack, checkin: str) -> None:
    body = _booking(checkin=checkin, checkout=checkin[:-2] + "31")
    response = stack.http.post(f"{stack.url('booking-agent')}/bookings", json=body)
    assert response.status_code == 422, response.text
    assert "checkin" in _fields(response.json())


def test_an_oversized_value_is_not_echoed_back_whole(stack: Stack) -> None:
    key = "k" * 10_000
    response = stack.http.post(
        f"{stack.url('booking-agent')}/bookings", json=_booking(), headers={"Idempotency-Key": key}
    )
    assert response.status_code == 422
    assert "Idempotency-Key" in _fields(response.json())
    assert len(response.content) < 1_000, f"{len(response.content)} bytes answered to a 10 KB header"


def test_the_payment_token_is_kept_in_no_record_and_no_checkpoint(stack: Stack) -> None:
    token = f"tok_ok_{uuid.uuid4().hex[:12]}"  # captured by payment-api, and unique to this booking
    booking = stack.wait(stack.book(payment_token=token)["booking_id"])
    assert booking["status"] == "confirmed", booking
    charged = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking["booking_id"]]
    assert [c["status"] for c in charged] == ["captured"], "the token did reach the charge"

    redis = Redis.from_url(stack.env["REDIS_URL"])
    try:
        record = redis.hgetall(run_key(booking["booking_id"], prefix=stack.prefix))
        assert record, "the run record is there"
        assert token.encode() not in b"".join(k + v for k, v in record.items())
        leftovers = [k for k in redis.scan_iter(match=f"{stack.prefix}:*") if token.encode() in (redis.dump(k) or b"")]
        assert leftovers == [], f"the token is still kept under {leftovers}"
    finally:
        redis.close()
    with psycopg.connect(stack.env["DATABASE_URL"]) as conn:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # every service's checkpoints
            assert rows, table
            assert token not in repr(rows), f"{table} holds the payment token"
