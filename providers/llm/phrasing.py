"""How llm-api says things: the offers found, a booking booked, failed or refused, a booking's status, a failure
explained, the pieces a search still needs (docs/llm-api.md quotes them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

__all__ = [
    "HELP",
    "ask_for_search",
    "booked_text",
    "bookings_text",
    "cancel_text",
    "explain",
    "failure_text",
    "offers_text",
    "refused_text",
    "status_text",
]

HELP = (
    "I can find and book hotels. Tell me the city, the dates and how many guests, for example: "
    '"two nights in Lisbon from 10 March for two, under 150 a night". I can also tell you the status of a booking '
    "or cancel it."
)
_MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_EXPLANATIONS = {
    "no_availability": "there are no rooms left for that stay",
    "payment_declined": "the card was declined",
    "provider_unavailable": "the service behind it is not answering right now; please try again in a moment",
    "timeout": "it took too long; please try again",
    "already_final": "the booking is already final and can no longer be cancelled",
    "stay_started": "the stay has started, so it can no longer be cancelled",
    "not_refundable": "it is a non-refundable rate, so it cannot be cancelled",
    "fee_exceeds_limit": "the cancellation fee went up since you approved it, so nothing was cancelled",
    "unknown_booking": "I can't find that booking among yours",
    "approval_expired": "the approval expired before it was given",
}


def _day(value: date) -> str:
    return f"{value.day} {_MONTH_NAMES[value.month - 1]} {value.year}"


def _span(checkin: date, checkout: date) -> str:
    if checkin.year == checkout.year:
        return f"{checkin.day} {_MONTH_NAMES[checkin.month - 1]} to {_day(checkout)}"
    return f"{_day(checkin)} to {_day(checkout)}"


def _money(amount: object, currency: object) -> str:
    if not isinstance(amount, int | float):
        return "?"
    shown = f"{amount:.0f}" if float(amount).is_integer() else f"{amount:.2f}"
    return f"{shown} {currency or 'EUR'}"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def ask_for_search(missing: Sequence[str], lead: str = "") -> str:
    if len(missing) > 1:
        needs = ", ".join(missing[:-1]) + " and " + missing[-1]
    else:
        needs = missing[0] if missing else "the city, the dates and the guests"
    return f"{lead} To search for a hotel I still need {needs}.".strip()


def offers_text(offers: Sequence[Mapping[str, Any]], searched: Mapping[str, Any], total: int) -> str:
    """The offers shown, for the search made (``total``: how many were found, when the tool showed fewer)."""
    city = searched.get("city") or "that city"
    guests = searched.get("guests")
    when = ""
    try:
        checkin = date.fromisoformat(str(searched.get("checkin")))
        checkout = date.fromisoformat(str(searched.get("checkout")))
        nights = (checkout - checkin).days
        when = f" from {_span(checkin, checkout)} ({_plural(nights, 'night')}"
        when += f", {_plural(int(guests), 'guest')})" if isinstance(guests, int) else ")"
    except ValueError:
        pass
    limit = searched.get("max_price_per_night")
    under = f" under {_money(limit, offers[0].get('currency') if offers else 'EUR')} a night" if limit else ""
    if not offers:
        return (
            f"I found no hotel in {city} with rooms{when}{under}. Shall I try other dates, another city or a "
            "higher price limit?"
        )
    shown = "cheapest first" if total == len(offers) else f"the {len(offers)} cheapest"
    lines = [f"I found {_plural(total, 'hotel')} in {city}{when}{under}, {shown}:"]
    for number, offer in enumerate(offers, 1):
        stars = f", {offer['stars']} stars" if isinstance(offer.get("stars"), int) else ""
        price = _money(offer.get("price_per_night"), offer.get("currency"))
        lines.append(f"{number}. {offer.get('name')}{stars}: {price} a night")
    lines.append('Which one should I book? Say "book the first", "book the cheapest" or its name.')
    return "\n".join(lines)


def booked_text(name: str, booking: Mapping[str, Any]) -> str:
    """After ``book_hotel``: booked (whatever its status), or failed and why."""
    booking_id = booking.get("booking_id", "?")
    status = str(booking.get("status") or "unknown")
    name = str(booking.get("hotel_name") or name)
    if status == "failed":
        found = booking.get("error")
        error: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        return (
            f"The booking of {name} failed (booking {booking_id}): {explain(error.get('code'), error.get('message'))}."
        )
    total = booking.get("total_price")
    cost = f" Total {_money(total, booking.get('currency'))}." if isinstance(total, int | float) else ""
    return f"Booked: {name}, booking {booking_id}, {status}.{cost}"


def refused_text(name: str) -> str:
    return f"All right, I did not book {name}. Anything else?"


def status_text(booking: Mapping[str, Any]) -> str:
    """After ``get_booking``."""
    parts = [f"Booking {booking.get('booking_id', '?')}: {booking.get('status', 'unknown')}"]
    if booking.get("hotel_name"):
        parts.append(str(booking["hotel_name"]))
    if booking.get("checkin") and booking.get("checkout"):
        parts.append(f"{booking['checkin']} to {booking['checkout']}")
    if isinstance(booking.get("guests"), int):
        parts.append(_plural(booking["guests"], "guest"))
    if isinstance(booking.get("total_price"), int | float):
        parts.append(f"total {_money(booking['total_price'], booking.get('currency'))}")
    return ", ".join(parts) + "."


def cancel_text(booking: Mapping[str, Any]) -> str:
    """After ``cancel_booking``: cancelled, or asked to be (it stops at its next step), with the refund of a
    confirmed stay."""
    booking_id = booking.get("booking_id", "?")
    status = booking.get("status", "unknown")
    refund = booking.get("refund")
    back = ""
    if isinstance(refund, Mapping):
        back = f" You get {_money(refund.get('amount'), refund.get('currency'))} back"
        back += f" (a fee of {_money(refund.get('fee'), refund.get('currency'))})." if refund.get("fee") else "."
    if status == "cancelled":
        return f"Booking {booking_id} is cancelled.{back}"
    if status == "cancelling":
        return f"Booking {booking_id} is being cancelled.{back}"
    return f"Cancel requested for booking {booking_id}; it is {status} now and stops at its next step."


def bookings_text(bookings: Sequence[Mapping[str, Any]]) -> str:
    """After ``list_bookings``: each booking in a line, newest first."""
    if not bookings:
        return "You have no bookings yet. Shall I search for a hotel?"
    lines = [status_text(booking) for booking in bookings]
    return f"You have {_plural(len(bookings), 'booking')}: " + " ".join(lines)


def failure_text(what: str, error: Mapping[str, Any]) -> str:
    """``what`` ("search for hotels", "book X") could not be done, and why."""
    return f"I could not {what}: {explain(error.get('code'), error.get('message'))}."


def explain(code: object, message: object) -> str:
    """An error's code in words (when it is one of ours), with its message."""
    known = _EXPLANATIONS.get(str(code)) if code else None
    detail = str(message).strip().rstrip(".") if message else ""
    if known and detail:
        return f"{known} ({detail})"
    if known:
        return known
    if detail and code:
        return f"{detail} ({code})"
    return detail or str(code or "an unknown error")
