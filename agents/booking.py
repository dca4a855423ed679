"""booking-agent: the user-facing booking API, orchestrating search, reservation and payment.

``POST /bookings`` validates, records the booking and its run (with a lease) in Redis, answers **202**, and runs
the booking graph in a background task (thread id = booking id, budget ``BOOKING_BUDGET_S``). ``GET
/bookings/{id}?wait=`` long-polls the outcome. The A2A skill ``book_hotel`` does both in one call.

Nothing is accepted that is not durable first: if this process dies after the 202, the run's lease expires and the
recovery worker resumes it from its checkpoint. On SIGTERM the service stops taking bookings, stops its runs at the
next step boundary and hands them to the recovery queue at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Path, Query, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from domain.booking import MAX_GUESTS, MIN_GUESTS, check_checkin, check_nights, parse_iso_date
from graph.booking import BookingDeps, booking_input, build_booking_graph, open_booking_deps
from infra.a2a.server import Skill, mount_a2a
from infra.bookings import BookingStore
from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.service import create_service_app
from infra.settings import get_settings
from recovery.queue import DeadLetterQueue, QueueGuard
from resilience import bulkhead_registry, remaining_budget
from runs.leases import RunStore
from runs.runner import execute_run

logger = logging.getLogger(__name__)

SERVICE = "booking-agent"
GRAPH = "booking"
MAX_WAIT_S = 60.0
# How long a shutting-down agent lets the current step of each run finish before cancelling it.
DRAIN_S = 10.0


IsoDate = Annotated[date, BeforeValidator(parse_iso_date)]


class BookingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    city: str = Field(min_length=1, max_length=80)
    checkin: IsoDate
    checkout: IsoDate
    guests: int = Field(ge=MIN_GUESTS, le=MAX_GUESTS, strict=True)
    payment_token: str = Field(min_length=5, max_length=128, pattern=r"^tok_[A-Za-z0-9_]+$")
    hotel_id: str | None = Field(None, min_length=1, max_length=64)
    max_price_per_night: float | None = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("checkin")
    @classmethod
    def within_horizon(cls, checkin: date) -> date:
        return check_checkin(checkin, date.today())

    @field_validator("checkout")
    @classmethod
    def after_checkin(cls, checkout: date, info: ValidationInfo) -> date:
        checkin = info.data.get("checkin")
        if checkin is not None:
            check_nights(checkin, checkout)
        return checkout

    def as_payload(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_payload(), sort_keys=True).encode()).hexdigest()[:32]


class Accepted(BaseModel):
    booking_id: str
    status: str


class BookingService:
    """The booking agent's state: stores, graph, and the runs it owns in this process."""

    def __init__(self, deps: BookingDeps, graph: Any, runs: RunStore, guard: QueueGuard, instance: str) -> None:
        self.deps = deps
        self.bookings: BookingStore = deps.bookings
        self.graph = graph
        self.runs = runs
        self.guard = guard
        self.instance = instance
        self.stopping = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()

    async def accept(self, request: BookingRequest, client_key: str | None) -> tuple[str, bool]:
        """Make the booking durable (run record + lease, then the booking record) and start it.

        Returns the booking id and whether this call created it. The run record comes first: whatever dies after
        it, the scanner finds the run and the recovery worker (re)creates everything from its stored input.
        """
        booking_id = uuid.uuid4().hex
        payload = request.as_payload()
        if client_key is not None:
            booking_id, same_body = await self.bookings.claim_client_key(client_key, request.digest(), booking_id)
            if not same_body:
                raise HTTPException(
                    status_code=422,
                    detail=[
                        {
                            "loc": ["header", "Idempotency-Key"],
                            "msg": "this key was already used with a different request body",
                            "type": "idempotency_key_reuse",
                        }
                    ],
                )
        run_input = dict(booking_input(booking_id, payload))
        lease = await self.runs.create(booking_id, GRAPH, run_input, self.instance)
        created = await self.bookings.create(booking_id, payload)
        if lease is not None:
            self.start(lease, run_input)
        return booking_id, created

    def start(self, lease: Any, run_input: dict[str, Any]) -> None:
        task = asyncio.create_task(self._run(lease, run_input), name=f"booking:{lease.thread_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, lease: Any, run_input: dict[str, Any]) -> None:
        # Not inside the bulkhead: an accepted booking is a promise, not a request we may shed. The bulkhead guards
        # acceptance (below); the run itself is bounded by its own budget.
        await execute_run(
            self.graph,
            lease,
            run_input,
            budget_s=get_settings().booking_budget_s,
            stop=self.stopping,
            hand_off=self.guard.safe_enqueue,
        )

    async def drain(self) -> None:
        """SIGTERM: stop at the next step boundary, hand the runs to recovery, then return."""
        self.stopping.set()
        if not self.tasks:
            return
        logger.info("draining %d booking run(s)", len(self.tasks))
        _done, pending = await asyncio.wait(set(self.tasks), timeout=DRAIN_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    redis = app.state.redis
    async with open_checkpointer() as saver, open_booking_deps(redis) as deps:
        app.state.checkpointer = saver
        graph = build_booking_graph(deps, saver)
        guard = QueueGuard(redis, DeadLetterQueue(redis))
        instance = settings.instance_id or f"{SERVICE}-{uuid.uuid4().hex[:8]}"
        service = BookingService(deps, graph, RunStore(redis), guard, instance)
        app.state.booking = service
        try:
            yield
        finally:
            await service.drain()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready})


def _service() -> BookingService:
    service: BookingService = app.state.booking
    if service.stopping.is_set():
        raise HTTPException(status_code=503, detail="booking-agent is shutting down", headers={"Retry-After": "1"})
    return service


@app.post("/bookings", status_code=202, response_model=Accepted)
async def create_booking(
    body: BookingRequest,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> Accepted:
    booking_id, created = await bulkhead_registry.get("booking_agent").run(_service().accept, body, idempotency_key)
    response.headers["Location"] = f"/bookings/{booking_id}"
    if created:
        return Accepted(booking_id=booking_id, status="pending")
    # a retried request: report how far the booking it already created has got
    booking = await app.state.booking.bookings.get(booking_id)
    return Accepted(booking_id=booking_id, status=booking["status"] if booking else "pending")


@app.get("/bookings/{booking_id}")
async def get_booking(
    booking_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")],
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False)] = 0.0,
) -> dict[str, Any]:
    store: BookingStore = app.state.booking.bookings
    booking = await store.wait_final(booking_id, wait) if wait > 0 else await store.get(booking_id)
    if booking is None:
        raise HTTPException(status_code=404, detail=f"no booking {booking_id}")
    return booking


async def book_hotel(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: accept a booking and wait (within the caller's budget) for its outcome."""
    client_key = data.pop("idempotency_key", None)
    request = BookingRequest.model_validate(data)  # a ValidationError answers invalid_request (the error table)
    booking_id, _ = await _service().accept(request, client_key if isinstance(client_key, str) else None)
    booking = await app.state.booking.bookings.wait_final(booking_id, max(0.0, remaining_budget() - 0.1))
    return booking or {"booking_id": booking_id, "status": "pending"}


mount_a2a(
    app,
    name=SERVICE,
    description="Books a hotel: search, hold, charge and confirm, exactly once, surviving crashes.",
    url=get_settings().booking_agent_url,
    skills=[
        Skill(
            id="book_hotel",
            name="Book hotel",
            description="Book {city, checkin, checkout, guests, payment_token, hotel_id?, max_price_per_night?}.",
            handler=book_hotel,
            tags=("hotels", "booking"),
        )
    ],
    bulkhead="booking_agent",
)
