"""A stay's cancellation policy: free until 48 hours before 00:00 UTC of the check-in date, then the first night's
price, nothing once the stay has started; a non-refundable rate refunds nothing ever.

hotel-api owns the policy (it writes it on every offer and hold); everyone else reads it from there and applies it
with ``cancellation_fee`` at the moment of the cancel, because the fee rises as the clock passes ``free_until``.
docs/cancel.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Final

from domain.booking import to_cents

__all__ = [
    "FREE_CANCELLATION_HOURS",
    "CancelInProgressError",
    "CancellationPolicy",
    "CancellationRefusedError",
    "FeeExceedsLimitError",
    "RefundQuote",
    "cancellation_fee",
    "describe_cancellation",
    "quote_refund",
]

FREE_CANCELLATION_HOURS: Final = 48
"""How long before 00:00 UTC of the check-in date a stay can be cancelled for free."""


class CancellationRefusedError(Exception):
    """The stay cannot be cancelled at all: ``code`` is ``stay_started`` or ``not_refundable`` (an ``ErrorCode``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FeeExceedsLimitError(Exception):
    """The fee of cancelling now is above the ``max_fee`` the caller allowed: nothing is cancelled."""

    def __init__(self, fee: float, max_fee: float, currency: str) -> None:
        self.fee = fee
        self.max_fee = max_fee
        self.currency = currency
        self.message = (
            f"cancelling now costs a fee of {fee:.2f} {currency}, above the {max_fee:.2f} {currency} allowed: "
            "nothing was cancelled"
        )
        super().__init__(self.message)


class CancelInProgressError(Exception):
    """Another cancel of the booking won on terms this one did not allow (its fee is above this ``max_fee``)."""

    def __init__(self, booking_id: str, fee: float, currency: str) -> None:
        self.booking_id = booking_id
        self.fee = fee
        self.currency = currency
        self.message = f"booking {booking_id} is being cancelled already, with a fee of {fee:.2f} {currency}"
        super().__init__(self.message)


@dataclass(frozen=True)
class RefundQuote:
    """What cancelling a confirmed booking gives back, fixed when the cancel is accepted: ``amount = total − fee``."""

    amount: float
    fee: float
    currency: str

    def to_wire(self) -> dict[str, Any]:
        return {"amount": self.amount, "fee": self.fee, "currency": self.currency}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RefundQuote:
        return cls(amount=float(wire["amount"]), fee=float(wire["fee"]), currency=str(wire["currency"]))


@dataclass(frozen=True)
class CancellationPolicy:
    """What cancelling a stay costs: nothing until ``free_until``, ``fee`` after, refused once it has started."""

    free_until: datetime
    fee: float
    currency: str
    checkin: date
    refundable: bool = True

    @classmethod
    def for_stay(
        cls, checkin: date, first_night: float, currency: str, *, refundable: bool = True
    ) -> CancellationPolicy:
        """The policy of a stay whose first night (every room of it) costs ``first_night``."""
        starts = datetime.combine(checkin, time(0), tzinfo=UTC)
        return cls(
            free_until=starts - timedelta(hours=FREE_CANCELLATION_HOURS),
            fee=to_cents(first_night) / 100,
            currency=currency,
            checkin=checkin,
            refundable=refundable,
        )

    def to_wire(self) -> dict[str, Any]:
        """``{"free_until", "fee", "currency", "refundable"}``, as offers, holds and bookings carry it."""
        return {
            "free_until": self.free_until.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "fee": self.fee,
            "currency": self.currency,
            "refundable": self.refundable,
        }

    def describe(self) -> str:
        """The policy in words, as the CLI, the approval card and the concierge say it."""
        if not self.refundable:
            return "non-refundable: it cannot be cancelled"
        until = self.free_until.strftime("%Y-%m-%d %H:%M UTC")
        return f"free cancellation until {until}, then a fee of {self.fee:.2f} {self.currency} until check-in"

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any], checkin: date) -> CancellationPolicy:
        """The policy as carried (``to_wire``) for a stay from ``checkin``; ``ValueError`` names what is wrong."""
        try:
            free_until = datetime.strptime(str(wire["free_until"]), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            return cls(
                free_until=free_until,
                fee=float(wire["fee"]),
                currency=str(wire["currency"]),
                checkin=checkin,
                refundable=bool(wire.get("refundable", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"cancellation: not a policy ({exc})") from exc


def describe_cancellation(wire: object) -> str:
    """``to_wire``'s form in words; a booking held before policies were kept has none to tell."""
    if not isinstance(wire, Mapping):
        return "no cancellation policy recorded"
    try:
        return CancellationPolicy.from_wire(wire, date.min).describe()
    except ValueError:
        return "no cancellation policy recorded"


def cancellation_fee(policy: CancellationPolicy, total: float, now: datetime) -> float:
    """The fee of cancelling at ``now`` (never more than ``total``), or ``CancellationRefusedError``."""
    if not policy.refundable:
        raise CancellationRefusedError("not_refundable", "this rate is non-refundable: it cannot be cancelled")
    if now >= datetime.combine(policy.checkin, time(0), tzinfo=UTC):
        raise CancellationRefusedError("stay_started", f"the stay started on {policy.checkin}: it cannot be cancelled")
    if now < policy.free_until:
        return 0.0
    return min(to_cents(policy.fee), to_cents(total)) / 100


def quote_refund(
    policy: CancellationPolicy, total: float, now: datetime, *, max_fee: float | None = None
) -> RefundQuote:
    """The refund of cancelling at ``now``; ``CancellationRefusedError``, or ``FeeExceedsLimitError`` above ``max_fee``
    (compared in cents)."""
    fee = cancellation_fee(policy, total, now)
    if max_fee is not None and to_cents(fee) > to_cents(max_fee):
        raise FeeExceedsLimitError(fee, max_fee, policy.currency)
    return RefundQuote(amount=(to_cents(total) - to_cents(fee)) / 100, fee=fee, currency=policy.currency)
