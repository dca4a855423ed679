"""A stay (check-in, check-out, guests) as hotel-api validates and prices it, by the rules of ``domain.booking``.

Dates in the past are accepted here: this is a simulation, and fixed test dates must keep working.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from domain.booking import MAX_GUESTS, MIN_GUESTS, check_nights, nights_between, parse_iso_date, rooms_for

__all__ = ["IsoDate", "Stay"]

IsoDate = Annotated[date, BeforeValidator(parse_iso_date)]


class Stay(BaseModel):
    """Validated stay; errors name the field (``checkout`` for the ordering and length rules)."""

    model_config = ConfigDict(frozen=True)

    checkin: IsoDate
    checkout: IsoDate
    guests: int = Field(ge=MIN_GUESTS, le=MAX_GUESTS)

    @field_validator("checkout")
    @classmethod
    def _after_checkin(cls, checkout: date, info: ValidationInfo) -> date:
        checkin = info.data.get("checkin")
        if isinstance(checkin, date):
            check_nights(checkin, checkout)
        return checkout

    @property
    def nights(self) -> list[date]:
        return nights_between(self.checkin, self.checkout)

    @property
    def rooms(self) -> int:
        return rooms_for(self.guests)
