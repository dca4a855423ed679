"""search-agent made slow or hung on purpose, at run time: what the cascade bench and demo put booking-agent through.

``PUT /admin/faults {"latency_s", "hang"}`` · ``GET /admin/faults`` · ``DELETE /admin/faults``, behind the admin
token like the providers' (``Authorization: Bearer $CONCIERGE_ADMIN_TOKEN``, 401 without it, 404 with none
configured). One Redis key, so every replica obeys and a restart keeps it. Applied to every search (the A2A skill
and ``GET /hotels``), inside the search-agent's own bulkhead slot, as a slow search would be:

1. ``latency_s``: the search waits that long first;
2. ``hang``: it never answers; it is cancelled when its caller's budget ends (the A2A server's bound), or when the
   client leaves.

``concierge_search_hanging`` counts the searches held by ``hang`` right now. The providers' injector
(``providers/faults.py``) is theirs: agents never import simulators.
"""

from __future__ import annotations

import asyncio
import logging
from functools import lru_cache

from fastapi import APIRouter, Depends, HTTPException, Request
from prometheus_client import Gauge
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from identity.auth import admin_token, admin_token_ok
from infra.redis import key
from infra.settings import get_settings

__all__ = ["NO_SEARCH_FAULTS", "SearchFaults", "apply_search_faults", "search_faults_key", "search_faults_router"]

logger = logging.getLogger(__name__)

MAX_LATENCY_S = 300.0


class SearchFaults(BaseModel):
    """Fields left out of a PUT are reset to "no fault"; strict types, as the providers' ``Faults``."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    latency_s: float = Field(0.0, ge=0, le=MAX_LATENCY_S, allow_inf_nan=False)
    hang: bool = False

    @property
    def active(self) -> bool:
        return self.latency_s > 0 or self.hang


NO_SEARCH_FAULTS = SearchFaults()


def search_faults_key() -> str:
    return key("{search-agent}", "faults")


async def load_search_faults(redis: Redis) -> SearchFaults:
    raw = await redis.get(search_faults_key())
    return NO_SEARCH_FAULTS if raw is None else SearchFaults.model_validate_json(raw)


@lru_cache(maxsize=1)
def _hanging() -> Gauge:
    return Gauge("concierge_search_hanging", "Searches search-agent is holding (hang fault).")


async def apply_search_faults(redis: Redis) -> None:
    """The faults, before a search runs (one Redis GET; nothing when none is set)."""
    faults = await load_search_faults(redis)
    if faults.latency_s > 0:
        await asyncio.sleep(faults.latency_s)
    if faults.hang:
        gauge = _hanging()
        gauge.inc()
        try:
            await asyncio.Event().wait()  # until cancelled: the caller's budget or its disconnect
        finally:
            gauge.dec()


async def _admin_only(request: Request) -> None:
    expected = admin_token(get_settings())
    if expected is None:
        raise HTTPException(404, "Not Found")
    if not admin_token_ok(request.headers.get("authorization"), expected):
        raise HTTPException(
            401, "admin routes need Authorization: Bearer $CONCIERGE_ADMIN_TOKEN", {"WWW-Authenticate": "Bearer"}
        )


def search_faults_router() -> APIRouter:
    router = APIRouter(prefix="/admin/faults", tags=["admin"], dependencies=[Depends(_admin_only)])

    @router.get("")
    async def get_faults(request: Request) -> SearchFaults:
        return await load_search_faults(request.app.state.redis)

    @router.put("")
    async def put_faults(faults: SearchFaults, request: Request) -> SearchFaults:
        await request.app.state.redis.set(search_faults_key(), faults.model_dump_json())
        logger.warning("search-agent: faults set to %s", faults.model_dump())
        return faults

    @router.delete("")
    async def delete_faults(request: Request) -> SearchFaults:
        await request.app.state.redis.delete(search_faults_key())
        logger.info("search-agent: faults cleared")
        return NO_SEARCH_FAULTS

    return router
