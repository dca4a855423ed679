"""``GET /runs/{id}``: where a run is (its record and its last checkpoint's step and next nodes), for the service
that hosts it.

A service mounts ``runs_router()`` and sets ``app.state.run_view`` (``RunView``: the run store, the graphs it
runs, whose a run is) in its lifespan. Only the operator and the run's person see it; anyone else's answers 404 like
an unknown id (docs/people.md). Neither the run's input nor its state is shown.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request
from langchain_core.runnables import RunnableConfig
from pydantic import BaseModel

from infra.service.openapi import answers, detail
from infra.service.people import PEOPLE_ANSWERS, Who
from runs.leases import RunRecord, RunStatus, RunStore

__all__ = ["RUN_VIEW_STATE", "Checkpoint", "RunAnswer", "RunView", "input_owner", "runs_router"]

RUN_VIEW_STATE = "run_view"
"""The ``app.state`` attribute ``runs_router`` reads its ``RunView`` from."""
_CHECKPOINT_METADATA = ("step", "source", "graph_version")
"""The checkpoint metadata shown: LangGraph's step and source, and the graph version the run records."""


async def input_owner(record: RunRecord) -> str | None:
    """The person a run is for, as its input names them (``owner``: a booking's, a restaurant table's)."""
    owner = record.input.get("owner")
    return owner if isinstance(owner, str) else None


@dataclass(frozen=True)
class RunView:
    """What ``GET /runs/{id}`` reads: the runs, the compiled graphs by name (their checkpoints), whose a run is."""

    store: RunStore
    graphs: Mapping[str, Any]
    owner: Callable[[RunRecord], Awaitable[str | None]] = field(default=input_owner)


class Checkpoint(BaseModel):
    checkpoint_id: str | None
    created_at: str | None
    step: int | None
    source: str | None
    graph_version: str | None
    next: list[str]
    """The nodes the run takes next from here; empty once it reached its end."""


class RunAnswer(BaseModel):
    run_id: str
    graph: str
    status: RunStatus
    attempts: int
    fence: int
    held_by: str | None
    """The process holding its lease (as in the journal), ``None`` once released or final."""
    created_at: float
    updated_at: float
    lease_expires_at: float | None
    last_error: str | None
    version: str | None
    checkpoint: Checkpoint | None
    """The last checkpoint, ``None`` before the first one (or when this service does not run the graph)."""


async def _last_checkpoint(graph: Any, run_id: str) -> Checkpoint | None:
    if graph is None:
        return None
    config: RunnableConfig = {"configurable": {"thread_id": run_id}}
    snapshot = await graph.aget_state(config)
    if not snapshot.metadata:
        return None
    metadata = {name: snapshot.metadata.get(name) for name in _CHECKPOINT_METADATA}
    checkpoint_id = (snapshot.config.get("configurable") or {}).get("checkpoint_id")
    return Checkpoint(checkpoint_id=checkpoint_id, created_at=snapshot.created_at, next=list(snapshot.next), **metadata)


_NO_RUN = detail(404, description="No run with this id, or another person's.")


def runs_router() -> APIRouter:
    """``GET /runs/{run_id}`` over ``app.state.run_view``."""
    router = APIRouter(tags=["runs"])

    @router.get("/runs/{run_id}", response_model=RunAnswer, responses=answers(_NO_RUN, *PEOPLE_ANSWERS))
    async def get_run(
        run_id: Annotated[str, Path(min_length=1, max_length=256)], request: Request, who: Who
    ) -> RunAnswer:
        """The run's record and last checkpoint; 404 for an unknown run and another person's alike."""
        view: RunView = getattr(request.app.state, RUN_VIEW_STATE)
        record = await view.store.get(run_id)
        if record is None or not who.may_see(await view.owner(record)):
            raise HTTPException(status_code=404, detail=f"no run {run_id}")
        return RunAnswer(
            run_id=record.thread_id,
            graph=record.graph,
            status=record.status,
            attempts=record.attempts,
            fence=record.fence,
            held_by=record.owner,
            created_at=record.created_at,
            updated_at=record.updated_at,
            lease_expires_at=record.lease_expires_at,
            last_error=record.last_error,
            version=record.version,
            checkpoint=await _last_checkpoint(view.graphs.get(record.graph), run_id),
        )

    return router
