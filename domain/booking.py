"""A booking's vocabulary, in one place: the stay rules, its money, the booking statuses and the journal kinds.

Every floor speaks it: the booking API and the CLI validate with it, the search and booking graphs check stays
with it, the simulated hotel-api prices stays with it, and the journal records its kinds. Standard library only, so
anything may import it.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from typing import Final

__all__ = [
    "CURRENCY_PATTERN",
    "FINAL_BOOKING_STATUSES",
    "FINAL_JOURNAL_KINDS",
    "GUESTS_PER_ROOM",
    "ISO_DATE_PATTERN",
    "MAX_DAYS_AHEAD",
    "MAX_GUESTS",
    "MAX_NIGHTS",
    "MAX_TOTAL_PRICE",
    "MIN_GUESTS",
    "PROGRESS",
    "BookingFinalError",
    "BookingStatus",
    "InvalidStayError",
    "JournalKind",
    "PriceChangedError",
    "check_checkin",
    "check_guests",
    "check_hold_price",
    "check_nights",
    "nights_between",
    "parse_iso_date",
    "rooms_for",
    "to_cents",
    "validate_stay",
]

# ------------------------------------------------------------------------------------------------- stay rules

MAX_NIGHTS: Final = 30
MIN_GUESTS: Final = 1
MAX_GUESTS: Final = 8
GUESTS_PER_ROOM: Final = 2
"""Rooms are for two: a party of ``guests`` takes ``ceil(guests / 2)`` rooms every night."""
MAX_DAYS_AHEAD: Final = 730
"""A booking's check-in is at most two years ahead (and not in the past, a day of slack for time zones)."""
ISO_DATE_PATTERN: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
"""Dates are written ``YYYY-MM-DD`` and nothing else: no timestamps, no datetimes. ASCII digits only: a regex's
``\\d`` is any Unicode digit in Python, and llama.cpp's schema-to-grammar cannot hold a model to it."""
_ISO_DATE = re.compile(ISO_DATE_PATTERN)


class InvalidStayError(ValueError):
    """A stay that breaks a rule; ``field`` names the request field to blame (``checkin``, ``checkout``...)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_iso_date(value: object) -> date:
    """Strict ``YYYY-MM-DD`` (``ValueError`` otherwise; pydantic's ``date`` would also take Unix timestamps)."""
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be a date written YYYY-MM-DD")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError("not a calendar date (YYYY-MM-DD)") from None


def rooms_for(guests: int) -> int:
    return -(-guests // GUESTS_PER_ROOM)


def nights_between(checkin: date, checkout: date) -> list[date]:
    """Every night of the stay: checkin up to, not including, checkout."""
    return [checkin + timedelta(days=i) for i in range((checkout - checkin).days)]


def check_checkin(checkin: date, today: date) -> date:
    """``checkin``, or ``ValueError`` when it is in the past or beyond the booking horizon (``MAX_DAYS_AHEAD``)."""
    if checkin < today - timedelta(days=1):
        raise ValueError("must not be in the past")
    if checkin > today + timedelta(days=MAX_DAYS_AHEAD):
        raise ValueError(f"must be within {MAX_DAYS_AHEAD} days from today")
    return checkin


def check_nights(checkin: date, checkout: date) -> int:
    """The number of nights, or ``ValueError`` (for the ``checkout`` field) when the stay is empty or too long."""
    nights = (checkout - checkin).days
    if nights < 1:
        raise ValueError("must be after checkin")
    if nights > MAX_NIGHTS:
        raise ValueError(f"a stay is at most {MAX_NIGHTS} nights")
    return nights


def check_guests(guests: object) -> int:
    """``guests`` as an int, or ``ValueError`` when it is not a whole number in range (booleans are not numbers)."""
    if not isinstance(guests, int) or isinstance(guests, bool) or not MIN_GUESTS <= guests <= MAX_GUESTS:
        raise ValueError(f"must be an integer from {MIN_GUESTS} to {MAX_GUESTS}, got {guests!r}")
    return guests


def validate_stay(checkin: object, checkout: object, guests: object) -> int:
    """The nights of a stay; ``InvalidStayError`` naming the first field that breaks a rule."""
    try:
        start = parse_iso_date(checkin)
    except ValueError as exc:
        raise InvalidStayError("checkin", f"{exc}: {checkin!r}") from None
    try:
        end = parse_iso_date(checkout)
    except ValueError as exc:
        raise InvalidStayError("checkout", f"{exc}: {checkout!r}") from None
    try:
        nights = check_nights(start, end)
    except ValueError as exc:
        raise InvalidStayError("checkout", str(exc)) from None
    try:
        check_guests(guests)
    except ValueError as exc:
        raise InvalidStayError("guests", str(exc)) from None
    return nights


# ------------------------------------------------------------------------------------------------------- money

MAX_TOTAL_PRICE: Final = 10_000_000
"""The largest ``max_total_price`` a booking takes: far above any stay, and exact in cents."""
CURRENCY_PATTERN: Final = r"^[A-Z]{3}$"
"""A currency is an ISO 4217 code: three capital letters (``EUR``)."""


def to_cents(amount: float) -> int:
    """``amount`` in whole cents, to the nearest (half up): what two amounts are compared in, never as floats."""
    return int((Decimal(str(amount)) * 100).quantize(Decimal(1), rounding=ROUND_HALF_UP))


class PriceChangedError(Exception):
    """A hold that costs more than the booking allows, or in another currency: nothing may be charged for it."""

    def __init__(
        self, held_total: float, currency: str, allowed_total: float | None, allowed_currency: str | None
    ) -> None:
        self.held_total = held_total
        self.currency = currency
        self.allowed_total = allowed_total
        self.allowed_currency = allowed_currency
        why = []
        if allowed_total is not None and to_cents(held_total) > to_cents(allowed_total):
            why.append(f"above the {allowed_total:.2f} {allowed_currency or currency} allowed")
        if allowed_currency is not None and currency != allowed_currency:
            why.append(f"not in {allowed_currency}")
        self.message = (
            f"the hotel held the stay at {held_total:.2f} {currency}, {' and '.join(why) or 'not as allowed'}: "
            "hold released, nothing charged"
        )
        super().__init__(self.message)


def check_hold_price(
    held_total: float, currency: str, allowed_total: float | None, allowed_currency: str | None
) -> None:
    """``PriceChangedError`` when a hold costs more than ``allowed_total`` (in cents) or is not in
    ``allowed_currency``: the approved total is a ceiling where the money moves (``None``: no limit of that kind)."""
    over = allowed_total is not None and to_cents(held_total) > to_cents(allowed_total)
    if over or (allowed_currency is not None and currency != allowed_currency):
        raise PriceChangedError(held_total, currency, allowed_total, allowed_currency)


# ---------------------------------------------------------------------------------------------------- statuses


class BookingStatus(StrEnum):
    """Where a booking is, as ``GET /bookings/{id}`` shows it. Not the run's status (``runs.RunStatus``)."""

    PENDING = "pending"
    SEARCHING = "searching"
    RESERVING = "reserving"
    PAYING = "paying"
    CONFIRMING = "confirming"
    COMPENSATING = "compensating"
    """Failed on the way; the hold is being released and any charge refunded (retried until done)."""
    CONFIRMED = "confirmed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    """Final: cancelled on request (``POST /bookings/{id}/cancel``), after the compensation released the hold and
    refunded anything captured; or, after it was confirmed, once the hotel cancelled the stay and ``refund`` is back."""
    CANCELLING = "cancelling"
    """A confirmed booking being cancelled (its own run, ``agents.booking.cancellation``): the stay cancelled at the hotel,
    then ``total − fee`` refunded; it ends ``cancelled``, or ``confirmed`` again (saying why) when the hotel refused."""

    @property
    def is_final(self) -> bool:
        return self in FINAL_BOOKING_STATUSES


FINAL_BOOKING_STATUSES: Final = frozenset({BookingStatus.CONFIRMED, BookingStatus.FAILED, BookingStatus.CANCELLED})
PROGRESS: Final = (
    BookingStatus.PENDING,
    BookingStatus.SEARCHING,
    BookingStatus.RESERVING,
    BookingStatus.PAYING,
    BookingStatus.CONFIRMING,
    BookingStatus.CONFIRMED,
)
"""The happy path, in order: a booking only moves forward along it (or, via ``compensating``, to ``failed`` or
``cancelled``)."""


class BookingFinalError(Exception):
    """A cancel that comes too late: the booking is final, or past its point of no return (the confirm was sent)."""

    def __init__(self, booking_id: str, status: str, message: str) -> None:
        super().__init__(message)
        self.booking_id = booking_id
        self.status = status
        self.message = message


# ----------------------------------------------------------------------------------------------------- journal


class JournalKind(StrEnum):
    """What a booking's journal entry tells (``infra.journal``; the README has the table of fields).

    Every entry also has ``at`` (ISO 8601 UTC) and ``instance`` (the process that wrote it). The final three are
    the booking's final statuses: nothing is written to a journal after one of them.
    """

    ACCEPTED = "accepted"
    STEP_STARTED = "step_started"
    STEP_FINISHED = "step_finished"
    CALL = "call"
    """A call to a dependency; ``replayed: true`` when it answered from its stored result instead of acting again."""
    RETRY_SCHEDULED = "retry_scheduled"
    CIRCUIT_REJECTED = "circuit_rejected"
    PAUSED = "paused"
    """The run waits out an outage: ``dependency``, ``wait_s``, ``attempt`` (its pauses so far), then runs the step
    again."""
    OWNER_LOST = "owner_lost"
    QUEUED_FOR_RECOVERY = "queued_for_recovery"
    RESUMED = "resumed"
    HANDED_OFF = "handed_off"
    WAITING_FOR_VERSION = "waiting_for_version"
    """Its graph version is one the process that took it does not run: it waits (``version``: the label,
    ``fingerprint``), never resumed on another graph, until a process that runs it takes it up (``resumed``)."""
    MIGRATED = "migrated"
    """Its checkpoint was migrated from the version it started on (``from``) to one this process runs (``to``), as
    the graph declares (``graph.migrations``); it resumes on that one."""
    COMPENSATION = "compensation"
    CANCEL_REQUESTED = "cancel_requested"
    CANCEL_ACCEPTED = "cancel_accepted"
    """A confirmed booking's cancel accepted: ``refund``, ``fee``, ``currency`` (what its policy gives back now)."""
    STAY_CANCELLED = "stay_cancelled"
    """hotel-api cancelled the confirmed reservation (its rooms given back): the refund follows, whatever happens."""
    REFUNDED = "refunded"
    """payment-api refunded ``amount`` on the original charge (``payment_id``); none when the fee took it all."""
    CANCEL_FAILED = "cancel_failed"
    """The hotel refused to cancel (or could not be reached in time): the booking stays ``confirmed`` (``code``)."""
    CONFIRMED = "confirmed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL_JOURNAL_KINDS: Final = frozenset({JournalKind.CONFIRMED, JournalKind.FAILED, JournalKind.CANCELLED})
