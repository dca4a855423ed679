"""A stay (check-in, check-out, guests) as hotel-api validates and prices it.

Rules: dates are ISO ``YYYY-MM-DD`` (nothing else: no timestamps, no datetimes); checkout after checkin; at most
30 nights; 1 to 8 guests. Rooms are for two: a party of ``guests`` takes ``ceil(guests / 2)`` rooms every night.
Dates in the past are accepted: this is a simulation, and fixed test dates must keep working.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

__all__ = [
    "GUESTS_PER_ROOM",
    "MAX_GUESTS",
    "MAX_NIGHTS",
    "IsoDate",
    "Stay",
    "nights_between",
    "parse_iso_date",
    "rooms_for",
]

MAX_NIGHTS = 30
MAX_GUESTS = 8
GUESTS_PER_ROOM = 2
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_iso_date(value: object) -> date:
    """Strict ``YYYY-MM-DD`` (pydantic's own ``date`` would also take Unix timestamps)."""
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or not _ISO_DATE.match(value):
        raise ValueError("must be an ISO date YYYY-MM-DD")
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ValueError("must be a real calendar date YYYY-MM-DD") from None


IsoDate = Annotated[date, BeforeValidator(parse_iso_date)]


def rooms_for(guests: int) -> int:
    return -(-guests // GUESTS_PER_ROOM)


def nights_between(checkin: date, checkout: date) -> list[date]:
    """Every night of the stay: checkin up to, not including, checkout."""
    return [checkin + timedelta(days=i) for i in range((checkout - checkin).days)]


class Stay(BaseModel):
    """Validated stay; errors name the field (``checkout`` for the ordering and length rules)."""

    model_config = ConfigDict(frozen=True)

    checkin: IsoDate
    checkout: IsoDate
    guests: int = Field(ge=1, le=MAX_GUESTS)

    @field_validator("checkout")
    @classmethod
    def _after_checkin(cls, checkout: date, info: ValidationInfo) -> date:
        checkin = info.data.get("checkin")
        if isinstance(checkin, date):
            if checkout <= checkin:
                raise ValueError("must be after checkin")
            if (checkout - checkin).days > MAX_NIGHTS:
                raise ValueError(f"a stay is at most {MAX_NIGHTS} nights")
        return checkout

    @property
    def nights(self) -> list[date]:
        return nights_between(self.checkin, self.checkout)

    @property
    def rooms(self) -> int:
        return rooms_for(self.guests)
