"""Where a booking's payment token waits for its charge: one Redis key per booking, never in a run record, a
booking record or a checkpoint.

Run records and checkpoints are kept for days and read by recovery and operators; a card token has no business
there. booking-agent puts the token here before the booking is durable, the saga's ``charge`` step reads it, and
the steps after the charge (or its compensation) drop it. The TTL bounds it for a booking that never gets that far.
"""

from __future__ import annotations

from typing import Final

from redis.asyncio import Redis

from infra.booking_keys import BOOKINGS_TAG
from infra.redis import key, text

__all__ = ["TOKEN_TTL_S", "PaymentTokens"]

TOKEN_TTL_S: Final = 7 * 24 * 3600
"""As long as a run is kept: a booking recovered days later can still be charged."""


class PaymentTokens:
    def __init__(self, redis: Redis, *, ttl_s: int = TOKEN_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    @staticmethod
    def _key(booking_id: str) -> str:
        return key(BOOKINGS_TAG, "payment-token", booking_id)  # with the booking: see BOOKINGS_TAG

    async def put(self, booking_id: str, token: str) -> None:
        await self._redis.set(self._key(booking_id), token, ex=self._ttl_s)

    async def get(self, booking_id: str) -> str | None:
        value = await self._redis.get(self._key(booking_id))
        return None if value is None else text(value)

    async def drop(self, booking_id: str) -> None:
        await self._redis.delete(self._key(booking_id))
