"""GET /runs/{id} (runs/api.py) over a real run store: the operator and the run's person see the record, another
person gets the 404 an unknown id gets, and neither the input nor the state is shown."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI, Request
from redis.asyncio import Redis

from identity.people import Caller
from infra.service import people as service_people
from runs.api import RUN_VIEW_STATE, RunView, runs_router
from runs.leases import RunStore


def app_for(store: RunStore, caller: Caller) -> FastAPI:
    app = FastAPI()
    app.include_router(runs_router())
    setattr(app.state, RUN_VIEW_STATE, RunView(store, {}))

    async def who(request: Request) -> Caller:
        return caller

    app.dependency_overrides[service_people._who] = who
    return app


async def get(app: FastAPI, run_id: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://runs") as client:
        return await client.get(f"/runs/{run_id}")


async def test_the_run_is_its_persons_and_the_operators_and_nobody_elses(redis: Redis) -> None:
    store = RunStore(redis)
    lease = await store.create("run-1", "restaurant", {"owner": "ana", "card": "tok_hidden"}, "agent-1", version="v1")
    assert lease is not None
    seen: dict[str, Any] = (await get(app_for(store, Caller("ana")), "run-1")).json()
    assert (seen["run_id"], seen["graph"], seen["status"], seen["held_by"], seen["version"]) == (
        "run-1",
        "restaurant",
        "running",
        "agent-1",
        "v1",
    )
    assert seen["checkpoint"] is None and "input" not in seen and "tok_hidden" not in str(seen)
    assert (await get(app_for(store, Caller("operator", operator=True)), "run-1")).status_code == 200
    other, unknown = await get(app_for(store, Caller("bob")), "run-1"), await get(app_for(store, Caller("bob")), "nope")
    assert other.status_code == unknown.status_code == 404
    assert other.json()["detail"].replace("run-1", "?") == unknown.json()["detail"].replace("nope", "?")
