"""A city as people and small models write it is matched as a hotel site would (``domain.cities``)."""

from __future__ import annotations

import pytest

from domain.cities import CITY_ALIASES, canonical_city, city_key
from providers.inventory import CITIES, hotels_in


@pytest.mark.parametrize(
    ("written", "city"),
    [
        ("Lisbon", "Lisbon"),
        ("Lisboa", "Lisbon"),
        ("LISBON", "Lisbon"),
        ("lisbon ", "Lisbon"),
        ("  lisboa\t", "Lisbon"),
        ("Roma", "Rome"),
        ("Oporto", "Porto"),
        ("Porto", "Porto"),
        ("Firenze", "Florence"),
        ("München", "Munich"),
        ("Munchen", "Munich"),
        ("MUENCHEN", "Munich"),
        ("Wien", "Vienna"),
        ("Praha", "Prague"),
        ("Köln", "Cologne"),
        ("Londres", "London"),
        ("Barcelone", "Barcelona"),
        ("Ámsterdam", "Amsterdam"),
        ("Berlín", "Berlin"),
    ],
)
def test_a_city_is_known_by_its_local_and_other_language_names(written: str, city: str) -> None:
    assert canonical_city(written) == city


def test_an_unknown_city_keeps_its_spelling_without_the_extra_spaces() -> None:
    assert canonical_city("Atlantis") == "Atlantis"
    assert canonical_city("  New   York ") == "New York"


def test_the_key_ignores_case_accents_and_spaces() -> None:
    assert city_key(" São  Paulo ") == "sao paulo"
    assert city_key("KÖLN") == city_key("koln")
    assert city_key("Straße") == "strasse"


def test_no_alias_names_two_cities() -> None:
    seen: dict[str, str] = {}
    for canonical, aliases in CITY_ALIASES.items():
        for alias in (canonical, *aliases):
            assert seen.setdefault(city_key(alias), canonical) == canonical, alias


def test_every_city_hotel_api_has_is_canonical_and_found_by_its_aliases() -> None:
    for city in CITIES:
        assert canonical_city(city) == city
        for alias in CITY_ALIASES[city]:
            assert hotels_in(alias) == hotels_in(city) != ()
    assert hotels_in("Atlantis") == ()
