"""Search graph: find hotel offers for a stay.

::

    START → validate → query_hotels → END

``validate`` refuses a malformed stay before any I/O (``domain.booking.validate_stay``: ``InvalidStayError``). ``query_hotels`` is the only I/O: hotel-api ``GET /hotels``
for the canonical city (``domain.cities.canonical_city``: "Lisboa" asks for Lisbon)
through ``policy_for("hotel_api")`` (breaker → retry, each attempt bounded by the caller's budget), then ranks the
offers in the same step (``rank_offers``, pure): every super-step costs LangGraph bookkeeping on the request path,
and ranking needs nothing a separate step would add. No side effects, so no checkpointer and no idempotency.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from domain.booking import InvalidStayError, validate_stay
from domain.cities import canonical_city
from graph.tracing import traced_node
from infra.clients.providers import HotelApiClient
from resilience import policy_for


class SearchState(TypedDict, total=False):
    city: str
    checkin: str
    checkout: str
    guests: int
    max_price_per_night: float | None
    hotel_id: str | None
    offers: list[dict[str, Any]]


def rank_offers(
    offers: list[dict[str, Any]], *, hotel_id: str | None = None, max_price_per_night: float | None = None
) -> list[dict[str, Any]]:
    """Bookable offers (rooms left, matching ``hotel_id`` and the price ceiling), cheapest first."""
    ranked = [o for o in offers if o["available_rooms"] > 0]
    if hotel_id:
        ranked = [o for o in ranked if o["hotel_id"] == hotel_id]
    if max_price_per_night is not None:
        ranked = [o for o in ranked if o["price_per_night"] <= max_price_per_night]
    # cheapest first; among equal prices the better hotel
    ranked.sort(key=lambda o: (o["price_per_night"], -o["stars"], o["hotel_id"]))
    return ranked


def build_search_graph(hotels: HotelApiClient) -> CompiledStateGraph[SearchState, None, SearchState, SearchState]:
    policy = policy_for("hotel_api")

    @traced_node("validate")
    async def validate(state: SearchState, config: RunnableConfig) -> dict[str, Any]:
        if not str(state.get("city") or "").strip():
            raise InvalidStayError("city", "must not be empty")
        validate_stay(state["checkin"], state["checkout"], state["guests"])
        return {}

    @traced_node("query_hotels")
    async def query_hotels(state: SearchState, config: RunnableConfig) -> dict[str, Any]:
        offers = await policy.call(
            hotels.search,
            city=canonical_city(state["city"]),  # "Lisboa", "LISBON", "lisbon " → "Lisbon"
            checkin=state["checkin"],
            checkout=state["checkout"],
            guests=state["guests"],
        )
        ranked = rank_offers(
            offers, hotel_id=state.get("hotel_id"), max_price_per_night=state.get("max_price_per_night")
        )
        return {"offers": ranked}

    builder = StateGraph(SearchState)
    builder.add_node("validate", validate)
    builder.add_node("query_hotels", query_hotels)
    builder.add_edge(START, "validate")
    builder.add_edge("validate", "query_hotels")
    builder.add_edge("query_hotels", END)
    return builder.compile(name="search")
