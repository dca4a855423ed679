"""The Redis keys of a booking, in one place and on one Cluster slot.

Every key of a booking (record, in-flight index, journal, list index, client key, payment token) carries the
``{bookings}`` hash tag: one slot, so the scripts that touch two of them run on a Redis Cluster, and one ``WAIT``
after the acceptance's last write covers them all (docs/redis-ha.md).
"""

from __future__ import annotations

from typing import Final

from infra.redis import key

__all__ = ["BOOKINGS_TAG", "booking_key", "journal_key"]

BOOKINGS_TAG: Final = "{bookings}"


def booking_key(booking_id: str, *, prefix: str | None = None) -> str:
    """A booking's record (a hash)."""
    return key(BOOKINGS_TAG, "booking", booking_id, prefix=prefix)


def journal_key(booking_id: str, *, prefix: str | None = None) -> str:
    """A booking's journal (a stream)."""
    return key(BOOKINGS_TAG, "journal", booking_id, prefix=prefix)
