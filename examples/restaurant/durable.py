"""restaurant-agent's graph, one idempotent step holding a table at a simulated provider, and what recovery needs of
it (``DURABLE_GRAPHS``, found through ``DURABLE_AGENTS``). The worked example of docs/new-agent.md."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Final, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from redis.asyncio import Redis

from graph import idempotency_key, idempotent_node, traced_node
from infra.clients.errors import ProviderRejectedError
from infra.clients.providers import HotelApiClient
from recovery.consumer import RecoverableGraph
from recovery.registry import DurableGraph

GRAPH: Final = "restaurant"


class TableState(TypedDict, total=False):
    hotel_id: str
    day: str
    guests: int
    owner: str | None
    reservation_id: str
    error: str


@dataclass(frozen=True)
class RestaurantDeps:
    redis: Redis
    tables: HotelApiClient
    """The simulated provider: hotel-api holds a table for the evening as it holds a room for a night."""


@asynccontextmanager
async def open_restaurant_deps(redis: Redis) -> AsyncIterator[RestaurantDeps]:
    tables = HotelApiClient(client="restaurant-agent")  # the recovery worker presents restaurant-agent's key too
    try:
        yield RestaurantDeps(redis, tables)
    finally:
        await tables.aclose()


def build_restaurant_graph(deps: RestaurantDeps, checkpointer: BaseCheckpointSaver[str] | None = None) -> Any:
    @traced_node("reserve")
    @idempotent_node(lambda: deps.redis, "reserve", key_fields=["hotel_id", "day", "guests"])
    async def reserve(state: TableState, config: RunnableConfig) -> dict[str, Any]:
        day = date.fromisoformat(state["day"])
        try:  # the same Idempotency-Key on every attempt: the provider holds the table once
            held = await deps.tables.reserve(
                hotel_id=state["hotel_id"],
                checkin=day,
                checkout=day + timedelta(days=1),
                guests=state["guests"],
                reference=config["configurable"]["thread_id"],
                idempotency_key=idempotency_key(),
            )
        except ProviderRejectedError as exc:  # an answer (no table, unknown place): final, never retried
            return {"error": str(exc)}
        return {"reservation_id": held["reservation_id"]}

    builder = StateGraph(TableState)
    builder.add_node("reserve", reserve)
    builder.add_edge(START, "reserve")
    builder.add_edge("reserve", END)
    return builder.compile(checkpointer=checkpointer, name=GRAPH)


def table_is_final(values: Mapping[str, Any]) -> bool:
    return bool(values.get("reservation_id") or values.get("error"))


def restaurant_recovery(graph: Any, deps: RestaurantDeps) -> RecoverableGraph:
    """Resumed from its checkpoint; given up on, it ends with the error (a table held meanwhile stays held)."""

    def give_up(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
        return {} if table_is_final(state) else {"error": f"recovery gave up: {last_error}"}

    return RecoverableGraph(graph=graph, give_up_update=give_up, is_final=table_is_final)


DURABLE_GRAPHS: Final = (DurableGraph(GRAPH, (build_restaurant_graph,), open_restaurant_deps, restaurant_recovery),)
