"""hotel-api's built-in inventory: 60 hotels in 10 cities, the same in every process.

Generated from a fixed seed at import (Python's ``random.Random`` is reproducible across versions for the calls
used here), so every replica and every restart agrees on ids, prices and room counts without any storage. Only
what changes (rooms taken per night) lives in Redis.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import date
from types import MappingProxyType
from typing import Any

from domain import CancellationPolicy
from domain.cities import canonical_city, city_key

__all__ = ["CITIES", "CURRENCY", "HOTELS", "Hotel", "find_hotel", "hotels_in"]

CURRENCY = "EUR"
_SEED = 20_240_917
_HOTELS_PER_CITY = 6
# city → typical price of a 3-star room per night, in euros
_CITY_PRICES: Mapping[str, int] = {
    "Lisbon": 95,
    "Porto": 80,
    "Madrid": 105,
    "Barcelona": 125,
    "Paris": 170,
    "London": 185,
    "Berlin": 110,
    "Rome": 140,
    "Amsterdam": 160,
    "Vienna": 115,
}
_NAME_FIRST = ("Grand", "Royal", "Casa", "Little", "Old Town", "Riverside", "Garden", "Harbour", "Central", "Park")
_NAME_SECOND = ("Palace", "Inn", "Suites", "House", "Lodge", "Residence", "Hotel", "Rooms", "Retreat", "Hall")
_STAR_FACTOR: Mapping[int, float] = {2: 0.6, 3: 1.0, 4: 1.45, 5: 2.2}

CITIES: tuple[str, ...] = tuple(_CITY_PRICES)


@dataclass(frozen=True)
class Hotel:
    hotel_id: str
    name: str
    city: str
    stars: int
    price_per_night: float
    """Per room and night."""
    rooms: int
    """Rooms the hotel has every night."""
    currency: str = CURRENCY
    refundable: bool = True
    """False: a non-refundable rate, never cancelled (``not_refundable``)."""

    def policy(self, checkin: date, first_night: float) -> CancellationPolicy:
        """The cancellation policy of a stay here from ``checkin`` whose first night costs ``first_night``."""
        return CancellationPolicy.for_stay(checkin, first_night, self.currency, refundable=self.refundable)

    def offer(self, available_rooms: int, checkin: date | None = None, rooms: int = 1) -> dict[str, Any]:
        """This hotel as a search lists it (``infra.clients.wire.Offer``), with the policy of a stay from
        ``checkin`` in ``rooms`` rooms (its fee: their first night)."""
        offer: dict[str, Any] = {
            "hotel_id": self.hotel_id,
            "name": self.name,
            "city": self.city,
            "stars": self.stars,
            "price_per_night": self.price_per_night,
            "currency": self.currency,
            "available_rooms": available_rooms,
            "refundable": self.refundable,
        }
        if checkin is not None:
            offer["cancellation"] = self.policy(checkin, self.price_per_night * rooms).to_wire()
        return offer

    def describe(self) -> dict[str, object]:
        return {
            "hotel_id": self.hotel_id,
            "name": self.name,
            "city": self.city,
            "stars": self.stars,
            "price_per_night": self.price_per_night,
            "currency": self.currency,
            "rooms": self.rooms,
            "refundable": self.refundable,
        }


def _generate() -> dict[str, Hotel]:
    rng = random.Random(_SEED)
    hotels: dict[str, Hotel] = {}
    for city, base in _CITY_PRICES.items():
        names: set[str] = set()
        for number in range(1, _HOTELS_PER_CITY + 1):
            name = f"{rng.choice(_NAME_FIRST)} {rng.choice(_NAME_SECOND)} {city}"
            while name in names:
                name = f"{rng.choice(_NAME_FIRST)} {rng.choice(_NAME_SECOND)} {city}"
            names.add(name)
            stars = rng.randint(2, 5)
            price = round(base * _STAR_FACTOR[stars] * rng.uniform(0.85, 1.15))
            hotel_id = f"{city.lower()}-{number:02d}"
            hotels[hotel_id] = Hotel(hotel_id, name, city, stars, float(price), rng.randint(5, 20))
    # each city's dearest hotel sells a non-refundable rate only: never its cheapest, so the walkthroughs (the
    # cheapest stay) can always be cancelled
    for city in _CITY_PRICES:
        dearest = max((h for h in hotels.values() if h.city == city), key=lambda h: (h.price_per_night, h.hotel_id))
        hotels[dearest.hotel_id] = replace(dearest, refundable=False)
    return hotels


HOTELS: Mapping[str, Hotel] = MappingProxyType(_generate())
_BY_CITY: Mapping[str, tuple[Hotel, ...]] = MappingProxyType(
    {city_key(city): tuple(h for h in HOTELS.values() if h.city == city) for city in CITIES}
)


def find_hotel(hotel_id: str) -> Hotel | None:
    return HOTELS.get(hotel_id)


def hotels_in(city: str) -> tuple[Hotel, ...]:
    """The city's hotels, matched as a hotel site would (``domain.cities``: case, accents, spaces and local names
    ignored: "Lisboa" is Lisbon); none for a city we do not know."""
    return _BY_CITY.get(city_key(canonical_city(city)), ())
