"""search-agent: finds hotel offers.

A2A skill ``search_hotels`` (for booking-agent) and ``GET /hotels`` (for people), both running the search graph
inside the ``search_agent`` bulkhead (slowed or hung at run time by ``/admin/faults``: ``agents.search.faults``). Provider trouble is answered as a skill error (``provider_unavailable``), not
as a transport failure: search-agent itself is healthy, so its callers must not retry or trip their breaker on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from pydantic import BaseModel

from agents.search.faults import apply_search_faults, search_faults_router
from agents.search.graph import build_search_graph
from domain.booking import ISO_DATE_PATTERN, MAX_GUESTS, MIN_GUESTS
from domain.errors import ErrorCode
from infra.a2a.server import Skill, mount_a2a
from infra.a2a.wire import A2A_PATH
from infra.clients.providers import HotelApiClient
from infra.clients.wire import Offer
from infra.error_table import skill_failure_from
from infra.service import create_service_app
from infra.service.openapi import answers, document_service_token, error, retry_after
from infra.settings import get_settings
from resilience import bulkhead_registry

SERVICE = "search-agent"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    hotels = HotelApiClient(get_settings().hotel_api_url, client=SERVICE)
    app.state.search_graph = build_search_graph(hotels)
    try:
        yield
    finally:
        await hotels.aclose()


app = create_service_app(SERVICE, lifespan=lifespan)
app.include_router(search_faults_router())


async def _search(query: dict[str, Any]) -> dict[str, Any]:
    await apply_search_faults(app.state.redis)
    graph = app.state.search_graph
    try:
        state = await graph.ainvoke(query)
    except Exception as exc:
        raise skill_failure_from(exc) from exc
    return {"offers": state.get("offers", [])}


async def search_hotels(data: dict[str, Any]) -> dict[str, Any]:
    query = {k: data.get(k) for k in ("city", "checkin", "checkout", "guests", "hotel_id", "max_price_per_night")}
    return await _search(query)


mount_a2a(
    app,
    name=SERVICE,
    description="Finds hotel offers for a city and a stay.",
    url=get_settings().search_agent_url,
    skills=[
        Skill(
            id="search_hotels",
            name="Search hotels",
            description="Offers for {city, checkin, checkout, guests, max_price_per_night?, hotel_id?}: "
            "{hotel_id, name, city, stars, price_per_night, currency, available_rooms}, cheapest first.",
            handler=search_hotels,
            tags=("hotels", "search"),
            inputs=("city", "checkin", "checkout", "guests", "max_price_per_night?", "hotel_id?"),
        )
    ],
    bulkhead="search_agent",
)
document_service_token(app, A2A_PATH)


class Offers(BaseModel):
    """``GET /hotels`` (documentation only: the route answers the search graph's offers)."""

    offers: list[Offer]
    """Cheapest first; empty when no hotel of the city can host the party on every night."""


# documentation only (json_schema_extra): what the search graph's validate step refuses besides the Query rules
_NOT_BLANK = {"pattern": r"\S"}
_DATE = {"format": "date"}


@app.get(
    "/hotels",
    responses={
        200: {"model": Offers, "description": "Bookable offers, cheapest first."},
        **answers(
            error(
                422,
                ErrorCode.INVALID_REQUEST,
                ErrorCode.REJECTED,
                description="The stay breaks a rule (`checkout` after `checkin`, at most 30 nights, calendar dates, "
                "a city that is not blank), or hotel-api refused the query.",
            ),
            error(
                503,
                ErrorCode.PROVIDER_UNAVAILABLE,
                ErrorCode.BULKHEAD_FULL,
                ErrorCode.UNAVAILABLE,
                description="hotel-api failed or its circuit is open (`provider_unavailable`: search-agent is "
                "fine, no `Retry-After`), or search-agent is at capacity (`bulkhead_full`, with `Retry-After`).",
                headers={"Retry-After": retry_after(required=False)},
            ),
            error(504, ErrorCode.TIMEOUT, description="The request's budget ran out."),
        ),
    },
)
async def list_hotels(
    request: Request,
    city: Annotated[str, Query(min_length=1, max_length=80, json_schema_extra=_NOT_BLANK)],
    checkin: Annotated[str, Query(pattern=ISO_DATE_PATTERN, json_schema_extra=_DATE)],
    checkout: Annotated[str, Query(pattern=ISO_DATE_PATTERN, json_schema_extra=_DATE)],
    guests: Annotated[int, Query(ge=MIN_GUESTS, le=MAX_GUESTS)] = 1,
    max_price_per_night: Annotated[float | None, Query(gt=0)] = None,
) -> dict[str, Any]:
    query = {
        "city": city,
        "checkin": checkin,
        "checkout": checkout,
        "guests": guests,
        "max_price_per_night": max_price_per_night,
    }
    return await bulkhead_registry.get("search_agent").run(_search, query)
