"""``domain.cancellation``: what cancelling a stay costs, at each moment of its life."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from domain.cancellation import CancellationPolicy, CancellationRefusedError, cancellation_fee, describe_cancellation

CHECKIN = date(2031, 3, 10)
POLICY = CancellationPolicy.for_stay(CHECKIN, 95.555, "EUR")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_free_until_48_hours_before_midnight_utc_of_the_checkin_date() -> None:
    assert POLICY.free_until == at("2031-03-08T00:00:00")
    assert POLICY.to_wire() == {
        "free_until": "2031-03-08T00:00:00Z",
        "fee": 95.56,
        "currency": "EUR",
        "refundable": True,
    }
    assert CancellationPolicy.from_wire(POLICY.to_wire(), CHECKIN) == POLICY


@pytest.mark.parametrize(
    ("now", "fee"),
    [
        ("2031-01-01T00:00:00", 0.0),
        ("2031-03-07T23:59:59", 0.0),
        ("2031-03-08T00:00:00", 95.56),  # from free_until on: the first night
        ("2031-03-09T23:59:59", 95.56),
    ],
)
def test_the_fee_rises_as_the_clock_passes_free_until(now: str, fee: float) -> None:
    assert cancellation_fee(POLICY, 300.0, at(now)) == fee


def test_the_fee_never_exceeds_what_was_paid() -> None:
    assert cancellation_fee(POLICY, 50.0, at("2031-03-09T12:00:00")) == 50.0


def test_once_the_stay_started_or_on_a_non_refundable_rate_nothing_is_cancelled() -> None:
    with pytest.raises(CancellationRefusedError) as started:
        cancellation_fee(POLICY, 300.0, at("2031-03-10T00:00:00"))
    assert started.value.code == "stay_started"
    strict = CancellationPolicy.for_stay(CHECKIN, 95.0, "EUR", refundable=False)
    with pytest.raises(CancellationRefusedError) as refused:
        cancellation_fee(strict, 300.0, at("2031-01-01T00:00:00"))
    assert refused.value.code == "not_refundable"


@pytest.mark.parametrize("wire", [{}, {"free_until": "tomorrow", "fee": 1, "currency": "EUR"}, {"free_until": None}])
def test_a_policy_that_is_not_one_is_a_value_error_naming_it(wire: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="cancellation"):
        CancellationPolicy.from_wire(wire, CHECKIN)


def test_the_policy_in_words() -> None:
    assert describe_cancellation(POLICY.to_wire()) == (
        "free cancellation until 2031-03-08 00:00 UTC, then a fee of 95.56 EUR until check-in"
    )
    strict = CancellationPolicy.for_stay(CHECKIN, 95.0, "EUR", refundable=False)
    assert describe_cancellation(strict.to_wire()) == "non-refundable: it cannot be cancelled"
    assert describe_cancellation(None) == describe_cancellation({"fee": 1}) == "no cancellation policy recorded"


def test_a_refund_quote_is_the_total_less_the_fee_in_cents_and_max_fee_is_a_ceiling() -> None:
    from domain.cancellation import FeeExceedsLimitError, quote_refund

    policy = CancellationPolicy.for_stay(date(2030, 5, 10), 70.1, "EUR")
    early = datetime(2030, 5, 1, tzinfo=UTC)
    late = datetime(2030, 5, 9, 12, tzinfo=UTC)
    assert quote_refund(policy, 210.3, early).to_wire() == {"amount": 210.3, "fee": 0.0, "currency": "EUR"}
    assert quote_refund(policy, 210.3, late, max_fee=70.1).to_wire() == {
        "amount": 140.2,
        "fee": 70.1,
        "currency": "EUR",
    }
    with pytest.raises(FeeExceedsLimitError) as refused:
        quote_refund(policy, 210.3, late, max_fee=70.09)
    assert (refused.value.fee, refused.value.max_fee) == (70.1, 70.09)
