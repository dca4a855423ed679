"""The booking vocabulary every floor speaks (``domain.booking``): stay rules, statuses, error codes."""

from domain.booking import (
    FINAL_BOOKING_STATUSES,
    GUESTS_PER_ROOM,
    ISO_DATE_PATTERN,
    MAX_GUESTS,
    MAX_NIGHTS,
    MIN_GUESTS,
    PROGRESS,
    BookingStatus,
    ErrorCode,
    InvalidStayError,
    check_guests,
    check_nights,
    nights_between,
    parse_iso_date,
    rooms_for,
    validate_stay,
)

__all__ = [
    "FINAL_BOOKING_STATUSES",
    "GUESTS_PER_ROOM",
    "ISO_DATE_PATTERN",
    "MAX_GUESTS",
    "MAX_NIGHTS",
    "MIN_GUESTS",
    "PROGRESS",
    "BookingStatus",
    "ErrorCode",
    "InvalidStayError",
    "check_guests",
    "check_nights",
    "nights_between",
    "parse_iso_date",
    "rooms_for",
    "validate_stay",
]
