"""booking-agent: the user-facing booking API, orchestrating search, reservation and payment.

``POST /bookings`` validates, records the booking and its run (with a lease) in Redis, answers **202**, and runs
the booking graph in a background task (thread id = booking id, budget ``BOOKING_BUDGET_S``). ``GET
/bookings/{id}?wait=`` long-polls the outcome. The A2A skill ``book_hotel`` does both in one call.

Nothing is accepted that is not durable first: if this process dies after the 202, the run's lease expires and the
recovery worker resumes it from its checkpoint: with presence on (``PRESENCE_ENABLED``) this process keeps one named
Redis connection and one instance lease for all its runs, and a peer takes them over as soon as that connection is
gone (``runs.presence``). On SIGTERM the service stops taking bookings, cancels the step each run is in and hands the
runs to the recovery queue at once (before uvicorn waits for open requests).

An accepted booking is a promise, so the capacity limits act at the door, never on a run: past
``BOOKING_MAX_IN_FLIGHT`` runs in this process (bulkhead ``booking_runs``, one slot held per run), a new booking is
answered 429 with ``Retry-After`` before anything is recorded (a retry of one already accepted still gets it). A run
waits for a full bulkhead within its budget (``wait_for_slots``) instead of failing.
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

from domain.booking import (
    MAX_GUESTS,
    MIN_GUESTS,
    BookingStatus,
    ErrorCode,
    check_checkin,
    check_nights,
    parse_iso_date,
)
from graph.booking import BookingDeps, booking_input, build_booking_graph, open_booking_deps
from infra.a2a.server import Skill, mount_a2a
from infra.a2a.wire import A2A_PATH
from infra.bookings import BookingStore
from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.service import create_service_app
from infra.service.openapi import (
    RETRY_AFTER,
    answers,
    detail,
    document_service_token,
    error,
    headers_only,
    validation_error,
)
from infra.settings import Settings, get_settings
from infra.signals import on_terminate
from recovery.queue import DeadLetterQueue, QueueGuard
from resilience import (
    OUTBOUND_BULKHEAD_CONFIGS,
    Bulkhead,
    BulkheadConfig,
    HeldSlot,
    OverloadedError,
    bulkhead_registry,
    remaining_budget,
    wait_for_slots,
)
from runs.leases import RunStore, instance_name
from runs.presence import Presence
from runs.runner import execute_run

logger = logging.getLogger(__name__)

SERVICE = "booking-agent"
GRAPH = "booking"
MAX_WAIT_S = 60.0
# How long a shutting-down agent lets the current step of each run finish before cancelling it.
DRAIN_S = 10.0
RUNS_BULKHEAD = "booking_runs"
"""The in-flight cap: one slot held by each booking run this process owns, from admission to its end."""
RETRY_AFTER_S = 1.0
"""What a refused client is told to wait: under load a run takes about a second, then its slot is free again."""


def max_in_flight(settings: Settings) -> int:
    """``BOOKING_MAX_IN_FLIGHT``, or the default its description explains (from the bulkheads and the Redis pool)."""
    if settings.booking_max_in_flight is not None:
        return settings.booking_max_in_flight
    narrowest = min(cfg.max_concurrent for cfg in OUTBOUND_BULKHEAD_CONFIGS.values())
    return max(1, min(2 * narrowest, settings.redis_max_connections // 2))


IsoDate = Annotated[date, BeforeValidator(parse_iso_date)]


def _whole_number(value: object) -> object:
    """``2.0`` is the integer 2, as in the JSON Schema this API publishes (``integer``); ``2.5``, ``"2"`` and
    ``true`` are still refused by the strict ``int`` after it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]


class BookingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    # ``json_schema_extra``: documentation only, what str_strip_whitespace + min_length already refuse (blank)
    city: str = Field(min_length=1, max_length=80, json_schema_extra={"pattern": r"\S"})
    checkin: IsoDate
    checkout: IsoDate
    guests: WholeNumber = Field(ge=MIN_GUESTS, le=MAX_GUESTS, strict=True)
    payment_token: str = Field(min_length=5, max_length=128, pattern=r"^tok_[A-Za-z0-9_]+$")
    hotel_id: str | None = Field(None, min_length=1, max_length=64, json_schema_extra={"pattern": r"\S"})
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


class BookingError(BaseModel):
    code: str
    message: str | None = None


class BookingView(BaseModel):
    """``GET /bookings/{id}`` (documentation only: the route answers the stored record's public view)."""

    booking_id: str
    status: BookingStatus
    city: str | None
    checkin: str | None
    checkout: str | None
    guests: int | None
    hotel_id: str | None
    hotel_name: str | None
    total_price: float | None
    currency: str | None
    reservation_id: str | None
    payment_id: str | None
    error: BookingError | None
    """Why a ``failed`` booking failed (an ``ErrorCode``)."""
    created_at: str | None
    updated_at: str | None


class BookingService:
    """The booking agent's state: stores, graph, and the runs it owns in this process."""

    def __init__(
        self, deps: BookingDeps, graph: Any, runs: RunStore, guard: QueueGuard, instance: str, slots: Bulkhead
    ) -> None:
        self.deps = deps
        self.bookings: BookingStore = deps.bookings
        self.graph = graph
        self.runs = runs
        self.guard = guard
        self.instance = instance
        self.slots = slots
        """The in-flight cap (``RUNS_BULKHEAD``)."""
        self.stopping = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()

    async def admit(
        self, request: BookingRequest, client_key: str | None, *, inbound: Bulkhead | None = None
    ) -> tuple[str, bool]:
        """``accept`` within the in-flight cap; past it, the booking this key already has, else ``OverloadedError``.

        The slot is taken before anything else (no Redis, no wait, not even in the ``inbound`` bulkhead's queue,
        which bounds the accepting itself), so a refusal is quick and records nothing. Once admitted, a request
        waits for ``inbound`` within its budget: the cap already bounds that queue, and a 503 now would refuse a
        booking the door just decided to take.
        """
        slot = self.slots.try_hold()
        if slot is None:
            return await self.refuse(request, client_key)
        try:
            if inbound is None:
                return await self.accept(request, client_key, slot)
            with wait_for_slots():
                return await inbound.run(self.accept, request, client_key, slot)
        except BaseException:
            slot.release()
            raise

    async def refuse(self, request: BookingRequest, client_key: str | None) -> tuple[str, bool]:
        """At capacity: a retry of a booking already accepted still gets it (it costs no run), anything else 429s."""
        if client_key is not None:
            bound = await self.bookings.find_client_key(client_key, request.digest())
            if bound is not None:
                booking_id, same_body = bound
                if not same_body:
                    raise _key_reused()
                if await self.bookings.status(booking_id) is not None:
                    return booking_id, False
        in_flight = self.slots.in_use
        raise OverloadedError(
            RUNS_BULKHEAD,
            self.slots.cfg.max_concurrent,
            f"{SERVICE} has {in_flight} bookings in flight, its limit (BOOKING_MAX_IN_FLIGHT); nothing was recorded: "
            f"send the same request again in {RETRY_AFTER_S:g}s",
            retry_after=RETRY_AFTER_S,
        )

    async def accept(self, request: BookingRequest, client_key: str | None, slot: HeldSlot) -> tuple[str, bool]:
        """Make the booking durable (run record + lease, then the booking record) and start it in ``slot``.

        Returns the booking id and whether this call created it. The run record comes first: whatever dies after
        it, the scanner finds the run and the recovery worker (re)creates everything from its stored input. The
        slot goes to the run, or back at once when there is no run to start (a retried request).
        """
        booking_id = uuid.uuid4().hex
        payload = request.as_payload()
        if client_key is not None:
            booking_id, same_body = await self.bookings.claim_client_key(client_key, request.digest(), booking_id)
            if not same_body:
                raise _key_reused()
        run_input = dict(booking_input(booking_id, payload))  # without the payment token: that waits apart
        await self.deps.payment_tokens.put(booking_id, request.payment_token)
        lease = await self.runs.create(booking_id, GRAPH, run_input, self.instance)
        created = await self.bookings.create(booking_id, payload)
        if lease is not None:
            self.start(lease, run_input, slot)
        else:
            slot.release()
        return booking_id, created

    def start(self, lease: Any, run_input: dict[str, Any], slot: HeldSlot) -> None:
        task = asyncio.create_task(self._run(lease, run_input), name=f"booking:{lease.thread_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(lambda _: slot.release())

    async def _run(self, lease: Any, run_input: dict[str, Any]) -> None:
        # Not inside the inbound bulkhead: an accepted booking is a promise, not a request we may shed. The cap
        # guards acceptance (above); the run is bounded by its own budget, and waits out full bulkheads within it.
        await execute_run(
            self.graph,
            lease,
            run_input,
            budget_s=get_settings().booking_budget_s,
            stop=self.stopping,
            hand_off=self.guard.safe_enqueue,
        )

    async def drain(self) -> None:
        """SIGTERM: cancel each run's current step, hand the runs to recovery, then return."""
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
        instance = instance_name(settings.instance_id or f"{SERVICE}-{uuid.uuid4().hex[:8]}")
        presence = Presence(instance) if settings.presence_enabled else None
        if presence is not None:
            await presence.start()  # registered before the first run, so every run is held by it
        # never waited for (try_hold), and a run bounds itself: acquire_timeout and timeout are not used
        slots = bulkhead_registry.configure(
            RUNS_BULKHEAD,
            BulkheadConfig(
                max_concurrent=max_in_flight(settings), timeout=settings.booking_budget_s, acquire_timeout=0
            ),
        )
        service = BookingService(deps, graph, RunStore(redis), guard, instance, slots)
        app.state.booking = service
        try:
            with on_terminate(service.stopping.set):
                yield
        finally:
            try:
                await service.drain()
            finally:
                if presence is not None:
                    await presence.stop()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready})


def _key_reused() -> HTTPException:
    return HTTPException(
        status_code=422,
        detail=[
            {
                "loc": ["header", "Idempotency-Key"],
                "msg": "this key was already used with a different request body",
                "type": "idempotency_key_reuse",
            }
        ],
    )


def _service() -> BookingService:
    service: BookingService = app.state.booking
    if service.stopping.is_set():
        raise HTTPException(status_code=503, detail="booking-agent is shutting down", headers={"Retry-After": "1"})
    return service


_SHUTTING_DOWN = detail(
    503,
    description="booking-agent is shutting down and takes no new booking: send it again (to a replica, or once "
    "restarted) after `Retry-After`.",
    headers={"Retry-After": RETRY_AFTER},
)


@app.post(
    "/bookings",
    status_code=202,
    response_model=Accepted,
    responses=answers(
        headers_only(
            202,
            {"Location": {"description": "`/bookings/{booking_id}`", "required": True, "schema": {"type": "string"}}},
            "Accepted and durable (or, for a retry with the same `Idempotency-Key`, the booking it created); the "
            "outcome follows at `Location`.",
        ),
        validation_error(
            "The body breaks a rule (a field, a stay rule), or the `Idempotency-Key` was already used with a "
            "different body (`type`: `idempotency_key_reuse`)."
        ),
        error(
            429,
            ErrorCode.OVERLOADED,
            description="`BOOKING_MAX_IN_FLIGHT` bookings are in flight; nothing was recorded: send the same request "
            "again after `Retry-After`.",
            headers={"Retry-After": RETRY_AFTER},
        ),
        _SHUTTING_DOWN,
        error(504, ErrorCode.TIMEOUT, description="The request's budget ran out before the booking was recorded."),
    ),
)
async def create_booking(
    body: BookingRequest,
    response: Response,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> Accepted:
    inbound = bulkhead_registry.get("booking_agent")
    booking_id, created = await _service().admit(body, idempotency_key, inbound=inbound)
    response.headers["Location"] = f"/bookings/{booking_id}"
    if created:
        return Accepted(booking_id=booking_id, status="pending")
    # a retried request: report how far the booking it already created has got
    booking = await app.state.booking.bookings.get(booking_id)
    return Accepted(booking_id=booking_id, status=booking["status"] if booking else "pending")


@app.get(
    "/bookings/{booking_id}",
    responses={
        200: {
            "model": BookingView,
            "description": "The booking as it stands (with `wait`: once final, or when the wait is over).",
        },
        **answers(detail(404, description="No booking with this id.")),
    },
)
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
    booking_id, _ = await _service().admit(request, client_key if isinstance(client_key, str) else None)
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
document_service_token(app, A2A_PATH)
