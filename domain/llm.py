"""The model's vocabulary, in one place: the simulated provider's model names and the concierge's tool names.

The simulator (``providers.llm_api``) serves these models and calls these tools; the settings default to them, and
the concierge offers the tools by these names (their arguments and rules: one record each in
``agents.concierge.tools``). Standard library only, so every floor may import it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BOOK_HOTEL",
    "CANCEL_BOOKING",
    "FALLBACK_MODEL",
    "GET_BOOKING",
    "LIST_BOOKINGS",
    "PRIMARY_MODEL",
    "SEARCH_HOTELS",
    "SIMULATED_MODELS",
    "TOOL_NAMES",
]

PRIMARY_MODEL: Final = "sim-large"
"""The simulator's primary model (``LLM_MODEL``'s default)."""
FALLBACK_MODEL: Final = "sim-small"
"""The simulator's second model, the one a fallback switches to."""
SIMULATED_MODELS: Final = (PRIMARY_MODEL, FALLBACK_MODEL)

SEARCH_HOTELS: Final = "search_hotels"
"""``search_hotels(city, checkin, checkout, guests, max_price_per_night?)``."""
BOOK_HOTEL: Final = "book_hotel"
"""``book_hotel(hotel_id, city, checkin, checkout, guests)``."""
GET_BOOKING: Final = "get_booking"
"""``get_booking(booking_id)``."""
CANCEL_BOOKING: Final = "cancel_booking"
"""``cancel_booking(booking_id)``."""
LIST_BOOKINGS: Final = "list_bookings"
"""``list_bookings()``: the person's bookings, from any chat."""
TOOL_NAMES: Final = (SEARCH_HOTELS, BOOK_HOTEL, LIST_BOOKINGS, GET_BOOKING, CANCEL_BOOKING)
