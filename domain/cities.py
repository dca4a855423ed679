"""A city as a person (or a small model) writes it, matched as a hotel site would: one canonical name per city.

"Lisboa", "LISBON", "lisbon " and "Lisbonne" are the same city; so are "München" and "Munchen". Both sides use
this: search-agent canonicalizes before it asks hotel-api, and hotel-api accepts the aliases too. A city not
listed here keeps its own spelling (surrounding spaces dropped): unknown, it answers as before.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["CITY_ALIASES", "canonical_city", "city_key"]

CITY_ALIASES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # canonical (English) name → local and other-language names; accents and case do not matter here
        "Lisbon": ("Lisboa", "Lissabon", "Lisbonne", "Lisbona"),
        "Porto": ("Oporto",),
        "Madrid": ("Madri", "Madryt"),
        "Barcelona": ("Barcelone", "Barcellona"),
        "Paris": ("Parigi", "Parijs", "Paryz"),
        "London": ("Londres", "Londra", "Londen", "Londyn"),
        "Berlin": ("Berlino", "Berlim", "Berlijn"),
        "Rome": ("Roma", "Rom"),
        "Amsterdam": ("Amesterdao", "Amsterda"),
        "Vienna": ("Wien", "Vienne", "Viena", "Wenen"),
        "Munich": ("Muenchen", "Munchen", "Monaco di Baviera", "Munique"),
        "Florence": ("Firenze", "Florenz", "Florencia"),
        "Prague": ("Praha", "Prag", "Praga"),
        "Cologne": ("Koeln", "Koln", "Colonia"),
        "Venice": ("Venezia", "Venedig", "Venise", "Venecia", "Veneza"),
        "Milan": ("Milano", "Mailand", "Milao"),
        "Naples": ("Napoli", "Neapel", "Napoles"),
        "Seville": ("Sevilla", "Sevilha"),
        "Brussels": ("Bruxelles", "Brussel", "Bruselas", "Bruxelas"),
        "Copenhagen": ("Kobenhavn", "Kopenhagen", "Copenhague"),
        "Warsaw": ("Warszawa", "Warschau", "Varsovie", "Varsovia"),
        "Athens": ("Athina", "Athen", "Atenas", "Atene"),
    }
)


def city_key(name: str) -> str:
    """``name`` folded for comparison: NFKD with combining marks dropped, case folded, inner spaces collapsed
    (``" São  Paulo "`` → ``"sao paulo"``); "ß" folds to "ss"."""
    decomposed = unicodedata.normalize("NFKD", name)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(bare.casefold().split())


def _index() -> Mapping[str, str]:
    index: dict[str, str] = {}
    for canonical, aliases in CITY_ALIASES.items():
        for alias in (canonical, *aliases):
            index[city_key(alias)] = canonical
    return MappingProxyType(index)


_CANONICAL: Mapping[str, str] = _index()


def canonical_city(name: str) -> str:
    """The city's canonical name ("Lisboa" → "Lisbon", "münchen" → "Munich"); one we do not know comes back with
    its surrounding and repeated spaces dropped, otherwise as written."""
    return _CANONICAL.get(city_key(name)) or " ".join(name.split())
