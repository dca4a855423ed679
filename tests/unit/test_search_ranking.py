"""Which offers a booking may take, in which order; and which stays are valid at all."""

import pytest

from agents.search.graph import rank_offers
from domain.booking import InvalidStayError, validate_stay


def offer(hotel_id: str, price: float, stars: int = 3, rooms: int = 5) -> dict[str, object]:
    return {"hotel_id": hotel_id, "price_per_night": price, "stars": stars, "available_rooms": rooms}


def test_cheapest_first_and_the_better_hotel_wins_a_tie() -> None:
    ranked = rank_offers([offer("a", 120), offer("b", 80, stars=3), offer("c", 80, stars=5), offer("d", 100)])
    assert [o["hotel_id"] for o in ranked] == ["c", "b", "d", "a"]


def test_full_hotels_requested_hotel_and_price_ceiling_filter() -> None:
    offers = [offer("a", 90, rooms=0), offer("b", 110), offer("c", 95), offer("d", 70)]
    assert [o["hotel_id"] for o in rank_offers(offers)] == ["d", "c", "b"]
    assert [o["hotel_id"] for o in rank_offers(offers, max_price_per_night=100)] == ["d", "c"]
    assert [o["hotel_id"] for o in rank_offers(offers, hotel_id="b")] == ["b"]
    assert rank_offers(offers, hotel_id="a") == []


@pytest.mark.parametrize(
    ("checkin", "checkout", "guests", "field"),
    [
        ("2027-01-10", "2027-01-10", 2, "checkout"),
        ("2027-01-10", "2027-03-10", 2, "checkout"),
        ("10/01/2027", "2027-01-12", 2, "checkin"),
        ("2027-01-10", "soon", 2, "checkout"),
        ("\u0662\u0660\u0662\u0667-01-10", "2027-01-12", 2, "checkin"),  # Arabic-Indic digits: \d, not [0-9]
        ("2027-01-10", "2027-01-12", 9, "guests"),
    ],
)
def test_invalid_stays_name_the_field(checkin: str, checkout: str, guests: int, field: str) -> None:
    with pytest.raises(InvalidStayError, match=f"^{field}:"):
        validate_stay(checkin, checkout, guests)


def test_a_valid_stay_counts_its_nights() -> None:
    assert validate_stay("2027-01-10", "2027-01-13", 2) == 3
