"""The providers' Redis key space.

Every key of a provider carries the hash tag ``{<provider>}`` after the configured prefix
(``<prefix>:{hotel-api}:reservation:<id>``), so all keys one Lua script touches live in one Redis Cluster slot.
"""

from __future__ import annotations

from infra.redis import key

__all__ = ["provider_key"]


def provider_key(provider: str, *parts: str) -> str:
    return key("{" + provider + "}", *parts)
