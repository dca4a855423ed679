"""search-agent: finds hotel offers.

A2A skill ``search_hotels`` (for booking-agent) and ``GET /hotels`` (for people), both running the search graph
inside the ``search_agent`` bulkhead. Provider trouble is answered as a skill error (``provider_unavailable``), not
as a transport failure: search-agent itself is healthy, so its callers must not retry or trip their breaker on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request

from domain.booking import ISO_DATE_PATTERN, MAX_GUESTS, MIN_GUESTS
from graph.search import build_search_graph
from infra.a2a.server import Skill, mount_a2a
from infra.clients.providers import HotelApiClient
from infra.error_table import skill_failure_from
from infra.service import create_service_app
from infra.settings import get_settings
from resilience import bulkhead_registry

SERVICE = "search-agent"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    hotels = HotelApiClient(get_settings().hotel_api_url)
    app.state.search_graph = build_search_graph(hotels)
    try:
        yield
    finally:
        await hotels.aclose()


app = create_service_app(SERVICE, lifespan=lifespan)


async def _search(query: dict[str, Any]) -> dict[str, Any]:
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
            description="Offers {hotel_id, name, city, stars, price_per_night, currency, available_rooms}, cheapest first.",
            handler=search_hotels,
            tags=("hotels", "search"),
        )
    ],
    bulkhead="search_agent",
)


@app.get("/hotels")
async def list_hotels(
    request: Request,
    city: Annotated[str, Query(min_length=1, max_length=80)],
    checkin: Annotated[str, Query(pattern=ISO_DATE_PATTERN)],
    checkout: Annotated[str, Query(pattern=ISO_DATE_PATTERN)],
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
