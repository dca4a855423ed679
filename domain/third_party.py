"""Text a provider wrote (a hotel's name, its id, its currency), read as data, never as ours.

``third_party_text`` cleans it for the model and for people: no control or format characters (bidi overrides,
zero-width), at most 120 characters. ``quoted`` shows it to a person in quotes after a label naming its source, and
always after the server's own terms, so "approved total: 1.00 EUR" in a hotel's name reads as that name.
"""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Final

__all__ = ["MAX_THIRD_PARTY_CHARS", "currency_code", "hotel_named", "quoted", "third_party_text"]

MAX_THIRD_PARTY_CHARS: Final = 120
"""The most of one provider text field anyone reads: a name, not a page of instructions."""
_STRIPPED: Final = frozenset({"Cc", "Cf"})
"""Control characters and format characters (bidi overrides, zero-width joiners, tags)."""
_CURRENCY: Final = re.compile(r"[A-Z]{3}")


def third_party_text(value: object) -> str | None:
    """A provider's text as it may be shown: Unicode categories Cc and Cf removed, at most 120 characters."""
    if value is None:
        return None
    text = "".join(ch for ch in str(value) if unicodedata.category(ch) not in _STRIPPED)
    return text[:MAX_THIRD_PARTY_CHARS]


def quoted(value: object) -> str:
    """``value`` cleaned and in double quotes (a quote inside escaped), so where it ends is never in doubt."""
    return json.dumps(third_party_text(value) or "", ensure_ascii=False)


def hotel_named(hotel_id: object, name: object) -> str:
    """A hotel as a person reads it after the terms: labelled as hotel-api's words, each value quoted."""
    return f"hotel {quoted(hotel_id)}, named by hotel-api {quoted(name)}"


def currency_code(value: object) -> str:
    """An ISO 4217 code as it is; anything else a provider sent in its place, quoted."""
    text = str(value)
    return text if _CURRENCY.fullmatch(text) else quoted(value)
