"""restaurant-agent: ``POST /tables`` holds a table for a party, exactly once through kill -9 (docs/new-agent.md).

The run is recorded with its lease before the 202 and executed on the run host; if this process dies, the recovery
worker resumes it from its checkpoint (``durable.py``). ``GET /runs/{id}`` shows where it is.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from examples.restaurant.durable import GRAPH, build_restaurant_graph, open_restaurant_deps, table_is_final
from infra.checkpointer import open_checkpointer
from infra.service import create_service_app
from infra.service.people import Who
from infra.settings import get_settings
from recovery.queue import DeadLetterQueue, QueueGuard
from runs.api import RUN_VIEW_STATE, RunView, runs_router
from runs.host import RunHost, hosted_instance
from runs.leases import RunStore
from runs.versions import graph_fingerprint

SERVICE = "restaurant-agent"


class TableRequest(BaseModel):
    hotel_id: str = Field(min_length=1, max_length=64)
    day: date
    guests: int = Field(ge=1, le=8)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    redis = app.state.redis
    async with open_checkpointer() as saver, open_restaurant_deps(redis) as deps, hosted_instance(SERVICE) as me:
        graph = build_restaurant_graph(deps, saver)
        host = RunHost(QueueGuard(redis, DeadLetterQueue(redis)).safe_enqueue, what=SERVICE, drain_s=10)
        app.state.stopping.add(host.stopping.set)  # SIGTERM: each run is handed to recovery at its next step
        app.state.restaurant = (graph, host, RunStore(redis), me)
        setattr(app.state, RUN_VIEW_STATE, RunView(RunStore(redis), {GRAPH: graph}))
        try:
            yield
        finally:
            await host.drain()


app = create_service_app(SERVICE, lifespan=lifespan, people=True)
app.include_router(runs_router())


@app.post("/tables", status_code=202)
async def reserve_table(body: TableRequest, who: Who) -> dict[str, Any]:
    """Accepted once durable (run record and lease), then run here: ``GET /runs/{run_id}`` until ``done``."""
    graph, host, runs, me = app.state.restaurant
    run_id, run_input = uuid.uuid4().hex, {**body.model_dump(mode="json"), "owner": who.person}
    lease = await runs.create(run_id, GRAPH, run_input, me, version=graph_fingerprint(graph))
    if lease is not None:
        host.start(graph, lease, run_input, budget_s=get_settings().booking_budget_s, is_final=table_is_final)
    return {"run_id": run_id}
