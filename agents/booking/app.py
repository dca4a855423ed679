"""booking-agent: the user-facing booking API, orchestrating search, reservation and payment.

``POST /bookings`` validates, records the booking and its run (with a lease) in Redis, answers **202**, and runs
the booking graph in a background task (thread id = booking id, budget ``BOOKING_BUDGET_S``). ``GET
/bookings/{id}?wait=`` long-polls the outcome. The A2A skill ``book_hotel`` does both in one call (and streams the
journal over ``message/stream``). ``GET /bookings/{id}/events`` serves a booking's journal (``infra.journal``), as
JSON or live as Server-Sent Events; ``GET /bookings`` lists the bookings, newest first.
``POST /bookings/{id}/cancel`` sets the booking's cancel flag in Redis; whichever process runs the saga stops at its
next step boundary, compensates and ends it ``cancelled`` (docs/cancel.md). Any replica answers any booking.

Nothing is accepted that is not durable first: if this process dies after the 202, the run's lease expires and the
recovery worker resumes it from its checkpoint: with presence on (``PRESENCE_ENABLED``) this process keeps one named
Redis connection and one instance lease for all its runs, and a peer takes them over as soon as that connection is
gone (``runs.presence``). On SIGTERM the service stops taking bookings, cancels the step each run is in and hands the
runs to the recovery queue at once (before uvicorn waits for open requests).

An accepted booking is a promise, so the capacity limits act at the door, never on a run: past the door's limit of
runs in this process (bulkhead ``booking_runs``, one slot held per run), a new booking is answered 429 with
``Retry-After`` before anything is recorded (a retry of one already accepted still gets it), and before its body is
read when it carries no ``Idempotency-Key``. The limit adapts to the runs' latency (``resilience.AdaptiveDoor``,
docs/overload.md) unless ``BOOKING_MAX_IN_FLIGHT`` fixes it. A run waits for a full bulkhead within its budget
(``wait_for_slots``) instead of failing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime
from typing import Annotated, Any, Final

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator
from sse_starlette import ServerSentEvent
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from agents.booking.cancellation import (
    CANCELLATION_GRAPH,
    build_cancellation_graph,
    cancel_thread_id,
    cancellation_input,
    cancellation_is_final,
)
from agents.booking.graph import (
    BOOKING_GRAPH,
    BookingDeps,
    booking_deadline,
    booking_input,
    booking_is_final,
    build_booking_graph,
    open_booking_deps,
)
from domain.booking import (
    CURRENCY_PATTERN,
    FINAL_BOOKING_STATUSES,
    MAX_GUESTS,
    MAX_TOTAL_PRICE,
    MIN_GUESTS,
    BookingFinalError,
    BookingStatus,
    JournalKind,
    check_checkin,
    check_nights,
    parse_iso_date,
    to_cents,
)
from domain.cancellation import (
    CancelInProgressError,
    CancellationPolicy,
    CancellationRefusedError,
    RefundQuote,
    quote_refund,
)
from domain.errors import ErrorCode
from identity.people import Caller, IdempotencyKeyReusedError
from infra.a2a.errors import SkillFailure
from infra.a2a.server import Skill, current_caller, current_person, mount_a2a, progress_wanted, report_progress
from infra.a2a.wire import A2A_PATH
from infra.bookings import AfterSaleCancel, BookingStore, CancelOutcome
from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.clients.wire import Cancellation
from infra.error_table import answer_for, answer_response
from infra.journal import is_final, read_journal
from infra.quotas import Release
from infra.service import STREAM_ID_PATTERN, create_service_app, journal_response, shutting_down_event
from infra.service.openapi import (
    RETRY_AFTER,
    answers,
    detail,
    document_service_token,
    error,
    headers_only,
    validation_error,
)
from infra.service.people import PEOPLE_ANSWERS, Who, open_stream
from infra.settings import Settings, get_settings
from process.signals import ShuttingDownError
from recovery.queue import DeadLetterQueue, QueueGuard
from resilience import (
    OUTBOUND_BULKHEAD_CONFIGS,
    AdaptiveDoor,
    AdaptiveLimitConfig,
    Bulkhead,
    BulkheadConfig,
    FixedDoor,
    OverloadedError,
    TimedSlot,
    bulkhead_registry,
    remaining_budget,
    wait_for_slots,
)
from runs.api import RUN_VIEW_STATE, RunView, runs_router
from runs.host import RunHost, hosted_instance
from runs.leases import RunStore
from runs.versions import graph_fingerprint

logger = logging.getLogger(__name__)

SERVICE = "booking-agent"
GRAPH = BOOKING_GRAPH
MAX_WAIT_S = 60.0
# How long a shutting-down agent lets the current step of each run finish before cancelling it.
DRAIN_S = 10.0
RUNS_BULKHEAD = "booking_runs"
"""The in-flight cap: one slot held by each booking run this process owns, from admission to its end."""
RETRY_AFTER_S = 1.0
"""What a refused client is told to wait: under load a run takes about a second, then its slot is free again."""


INITIAL_DOOR_LIMIT: Final = 20


def max_in_flight(settings: Settings) -> int:
    """``BOOKING_MAX_IN_FLIGHT``, or the default its description explains (from the bulkheads and the Redis pool)."""
    if settings.booking_max_in_flight is not None:
        return settings.booking_max_in_flight
    narrowest = min(cfg.max_concurrent for cfg in OUTBOUND_BULKHEAD_CONFIGS.values())
    return max(1, min(2 * narrowest, settings.redis_max_connections // 2))


def open_door(settings: Settings, slots: Bulkhead) -> FixedDoor:
    """The fixed door when ``BOOKING_MAX_IN_FLIGHT`` is set, else the adaptive one, its ceiling the default cap."""
    if settings.booking_max_in_flight is not None:
        return FixedDoor(slots)
    ceiling = slots.cfg.max_concurrent
    # a fresh door knows no latency yet: it starts at 20, as Netflix's Gradient2 does, so an idle agent takes a burst
    # of twenty at once, and sizes itself from there
    limits = AdaptiveLimitConfig(
        min_limit=min(2, ceiling), initial_limit=min(INITIAL_DOOR_LIMIT, ceiling), max_limit=ceiling
    )
    return AdaptiveDoor(slots, limits)


IsoDate = Annotated[date, BeforeValidator(parse_iso_date)]


def _whole_number(value: object) -> object:
    """``2.0`` is the integer 2, as in the JSON Schema this API publishes (``integer``); ``2.5``, ``"2"`` and
    ``true`` are still refused by the strict ``int`` after it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole_number)]

_LATER_FIELDS: Final = ("max_total_price", "currency")
"""Optional fields added after ``Idempotency-Key``s were bound to bodies (issue 32): hashed only when given."""


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
    max_total_price: float | None = Field(
        None,
        gt=0,
        le=MAX_TOTAL_PRICE,
        allow_inf_nan=False,
        strict=True,
        description="The most the stay may cost (compared in cents with what the hotel holds it at): a hold above "
        "it is released, nothing is charged and the booking fails `price_changed`.",
    )
    currency: str | None = Field(
        None,
        pattern=CURRENCY_PATTERN,
        description="The currency the stay must be charged in (ISO 4217, `EUR`): a hold in another one is released "
        "and the booking fails `price_changed`, with or without `max_total_price`.",
    )

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
        """The body's hash an ``Idempotency-Key`` is bound to: another ceiling or currency is another request. Left
        out when not given, so a body without them hashes as it did before they existed."""
        payload = self.as_payload()
        for name in _LATER_FIELDS:
            if payload[name] is None:
                del payload[name]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


class Accepted(BaseModel):
    booking_id: str
    status: str


class BookingError(BaseModel):
    """Documentation of ``agents.booking.graph.BookingError``."""

    code: str
    message: str | None = None
    held_total: float | None = Field(None, description="`price_changed`: what the hotel held the stay at.")
    currency: str | None = Field(None, description="`price_changed`: the hold's currency.")
    allowed_total: float | None = Field(None, description="`price_changed`: the request's `max_total_price`.")
    allowed_currency: str | None = Field(None, description="`price_changed`: the request's `currency`.")


class RefundView(BaseModel):
    amount: float
    fee: float
    currency: str


class BookingView(BaseModel):
    """``GET /bookings/{id}`` (documentation only: the route answers the stored record's public view)."""

    booking_id: str
    status: BookingStatus
    owner: str | None = None
    """The person it belongs to (their token's ``sub``); ``None`` for a service's own."""
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
    cancellation: Cancellation | None = None
    """The stay's cancellation policy as the hotel held it: free until ``free_until``, then ``fee`` (docs/cancel.md)."""
    refund: RefundView | None = None
    """A confirmed booking cancelled (``cancelling``, then ``cancelled``): what its policy gives back, fixed when the
    cancel was accepted: ``amount`` = total − ``fee``."""
    cancel_error: BookingError | None = None
    """Why the last cancel of the confirmed booking did not happen (the hotel refused it): it stays ``confirmed``."""
    error: BookingError | None
    """Why a ``failed`` booking failed (an ``ErrorCode``)."""
    cancel_requested_at: str | None = None
    """When a cancel was asked for (the booking then ends ``cancelled``, or was past confirming already)."""
    created_at: str | None
    updated_at: str | None


class BookingService:
    """The booking agent's state: stores, graph, and the runs it owns in this process."""

    def __init__(
        self,
        deps: BookingDeps,
        graph: Any,
        runs: RunStore,
        guard: QueueGuard,
        instance: str,
        slots: Bulkhead,
        door: FixedDoor | None = None,
        cancellation: Any = None,
    ) -> None:
        self.deps = deps
        self.cancellation = cancellation
        """The graph that cancels a confirmed booking (``agents.booking.cancellation``); ``None``: this process does not."""
        self.bookings: BookingStore = deps.bookings
        self.graph = graph
        self.version = None if graph is None else graph_fingerprint(graph)
        """What every run this process starts records: the shape it runs on (``runs.versions``)."""
        self.runs = runs
        self.guard = guard
        self.instance = instance
        self.slots = slots
        """The runs' slots (``RUNS_BULKHEAD``)."""
        self.door = door or FixedDoor(slots)
        """Who decides how many of them are taken: the fixed cap or the adaptive limit."""
        self.host = RunHost(guard.safe_enqueue, what=SERVICE, drain_s=DRAIN_S)
        """Where its runs execute (``runs.host``): bookings and the cancels of confirmed ones."""

    async def admit(
        self,
        request: BookingRequest,
        client_key: str | None,
        *,
        owner: str | None = None,
        inbound: Bulkhead | None = None,
    ) -> tuple[str, bool]:
        """``accept`` within the in-flight cap; past it, the booking this key already has, else ``OverloadedError``.

        The slot is taken before anything else (no Redis, no wait, not even in the ``inbound`` bulkhead's queue,
        which bounds the accepting itself), so a refusal is quick and records nothing. Once admitted, a request
        waits for ``inbound`` within its budget: the cap already bounds that queue, and a 503 now would refuse a
        booking the door just decided to take.
        """
        slot = self.door.try_hold()
        if slot is None:
            return await self.refuse(request, client_key, owner)
        try:
            if inbound is None:
                return await self.accept(request, client_key, slot, owner)
            with wait_for_slots():
                return await inbound.run(self.accept, request, client_key, slot, owner)
        except BaseException:
            slot.discard()
            raise

    async def refuse(self, request: BookingRequest, client_key: str | None, owner: str | None) -> tuple[str, bool]:
        """At capacity: a retry of a booking already accepted still gets it (it costs no run), anything else 429s."""
        if client_key is not None:
            bound = await self.bookings.find_client_key(client_key, request.digest(), owner)
            if bound is not None:
                booking_id, same_body = bound
                if not same_body:
                    raise _key_reused()
                if await self.bookings.status(booking_id) is not None:
                    return booking_id, False
        raise self.overloaded()

    def overloaded(self) -> OverloadedError:
        """The refusal, naming which limit was reached (a fixed one is the operator's, an adaptive one the load's)."""
        door = self.door
        if isinstance(door, AdaptiveDoor):
            limit = f"its adaptive limit now (at most {self.slots.cfg.max_concurrent}, docs/overload.md)"
        else:
            limit = "its limit (BOOKING_MAX_IN_FLIGHT)"
        return OverloadedError(
            RUNS_BULKHEAD,
            door.limit,
            f"{SERVICE} has {door.in_use} bookings in flight, {limit}; nothing was recorded: "
            f"send the same request again in {RETRY_AFTER_S:g}s",
            retry_after=RETRY_AFTER_S,
        )

    async def accept(
        self, request: BookingRequest, client_key: str | None, slot: TimedSlot, owner: str | None = None
    ) -> tuple[str, bool]:
        """Make the booking durable (run record + lease, then the booking record) and start it in ``slot``, as
        ``owner``'s (the person's ``sub``; kept in the run's input too, so a resumed run recreates it as theirs).

        Returns the booking id and whether this call created it. The run record comes first: whatever dies after
        it, the scanner finds the run and the recovery worker (re)creates everything from its stored input. The
        slot goes to the run, or back at once when there is no run to start (a retried request).
        """
        booking_id = uuid.uuid4().hex
        payload = {**request.as_payload(), "owner": owner}
        if client_key is not None:
            booking_id, same_body = await self.bookings.claim_client_key(
                client_key, request.digest(), booking_id, owner
            )
            if not same_body:
                raise _key_reused()
        run_input = dict(booking_input(booking_id, payload))  # without the payment token: that waits apart
        await self.deps.payment_tokens.put(booking_id, request.payment_token)
        lease = await self.runs.create(booking_id, GRAPH, run_input, self.instance, version=self.version)
        try:
            created = await self.bookings.create(booking_id, payload)
        except BaseException:
            if lease is not None:
                # not started here: a TTL lease runs out, a held run is released by this process's presence audit,
                # and the recovery worker recreates the booking from the run's input
                lease.abandon()
            raise
        if lease is not None:
            self.start(lease, run_input, slot)
        else:
            slot.discard()  # no run: its latency is no sample
        return booking_id, created

    def start(self, lease: Any, run_input: dict[str, Any], slot: TimedSlot) -> None:
        """Run the booking in ``slot``; only a confirmed booking's time is a latency sample for the door.

        A failed run's time is its dependency's answer, not this door's queue: a breaker's refusal in milliseconds
        would become the baseline no booking reaches again, and hold the door at its floor once the fault clears.
        Not inside the inbound bulkhead: an accepted booking is a promise, not a request we may shed (the cap guards
        acceptance; the run is bounded by its own budget, and waits out full bulkheads within it).
        """

        def then(result: Any) -> None:
            confirmed = result is not None and (result.values or {}).get("status") == BookingStatus.CONFIRMED
            if confirmed:
                slot.release()
            else:
                slot.discard()

        self.host.start(
            self.graph,
            lease,
            run_input,
            budget_s=get_settings().booking_budget_s,
            is_final=booking_is_final,
            promised_until=booking_deadline(time.time()),  # accepted just now
            then=then,
            name="booking",
        )

    async def cancel_confirmed(
        self, booking: dict[str, Any], max_fee: float | None
    ) -> tuple[AfterSaleCancel, dict[str, Any] | None]:
        """Cancel a confirmed booking under its policy: the refund quoted now (``CancellationRefusedError``,
        ``FeeExceedsLimitError``), its run recorded, the booking ``cancelling``, the run started here.

        Returns whether this call started it and the refund in force. The run record comes first, with the refund
        in its input: if this process dies before the booking shows ``cancelling``, its recovery makes it so.
        """
        booking_id = str(booking["booking_id"])
        if self.cancellation is None:
            raise RuntimeError("this process runs no cancellation graph")
        wire = booking.get("cancellation")
        if not isinstance(wire, dict):
            raise CancellationRefusedError(
                "not_refundable", f"booking {booking_id} has no cancellation policy recorded"
            )
        policy = CancellationPolicy.from_wire(wire, parse_iso_date(booking["checkin"]))
        quote = quote_refund(policy, float(booking["total_price"]), datetime.now(UTC), max_fee=max_fee)
        thread_id = _next_cancel_thread(booking_id, await self.bookings.cancel_thread(booking_id))
        run_input = dict(cancellation_input(booking, quote.to_wire()))
        version = graph_fingerprint(self.cancellation)
        lease = await self.runs.create(thread_id, CANCELLATION_GRAPH, run_input, self.instance, version=version)
        outcome, refund = await self.bookings.begin_cancel(booking_id, quote.to_wire(), thread_id)
        if lease is not None:  # whoever recorded the run runs it; the booking names it (``begin_cancel``)
            budget_s = get_settings().booking_budget_s
            self.host.start(
                self.cancellation, lease, run_input, budget_s=budget_s, is_final=cancellation_is_final, name="cancel"
            )
        return outcome, refund if isinstance(refund, dict) else None

    async def drain(self) -> None:
        """SIGTERM: cancel each run's current step, hand the runs to recovery, then return."""
        await self.host.drain()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    redis = app.state.redis
    async with open_checkpointer() as saver, open_booking_deps(redis) as deps, hosted_instance(SERVICE) as instance:
        app.state.checkpointer = saver
        graph = build_booking_graph(deps, saver)
        guard = QueueGuard(redis, DeadLetterQueue(redis))
        # never waited for (try_hold), and a run bounds itself: acquire_timeout and timeout are not used
        slots = bulkhead_registry.configure(
            RUNS_BULKHEAD,
            BulkheadConfig(
                max_concurrent=max_in_flight(settings), timeout=settings.booking_budget_s, acquire_timeout=0
            ),
        )
        service = BookingService(
            deps,
            graph,
            RunStore(redis),
            guard,
            instance,
            slots,
            open_door(settings, slots),
            cancellation=build_cancellation_graph(deps, saver),
        )
        app.state.booking = service
        graphs = {GRAPH: graph, CANCELLATION_GRAPH: service.cancellation}
        setattr(app.state, RUN_VIEW_STATE, RunView(service.runs, graphs))  # GET /runs/{id}
        app.state.vitals.runs_in_flight = lambda: len(service.host.tasks)
        # SIGTERM (the shell's ``stopping``): runs stop at their next step boundary, long-polls answer at once
        app.state.stopping.add(service.host.stopping.set)
        app.state.stopping.add(service.bookings.release_waiters)
        try:
            yield
        finally:
            await service.drain()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready}, people=True)
app.include_router(runs_router())


class ShedAtTheDoor:
    """``POST /bookings`` without an ``Idempotency-Key`` is refused before its body is read while the door is full.

    Under overload most requests are refused, and parsing each would spend the CPU the accepted runs need. A keyed
    request goes on to ``admit``: it may be the retry of a booking already accepted, which still gets its answer.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/bookings":
            service: BookingService | None = getattr(app.state, "booking", None)
            if service is not None and service.door.full() and not _has_idempotency_key(scope):
                service.slots.count_refusal()  # in /health/bulkheads, as admit's refusal is
                status, body, headers = answer_response(answer_for(service.overloaded()))
                await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _has_idempotency_key(scope: Scope) -> bool:
    return any(name.lower() == b"idempotency-key" for name, _ in scope.get("headers", ()))


# innermost: behind the shell's host check, metrics, error boundary and budget (add_middleware would go outermost)
app.user_middleware.append(Middleware(ShedAtTheDoor))


@app.get("/health/door", tags=["health"])
async def door() -> dict[str, Any]:
    """The door's size now: the adaptive limit (and the latency it follows) or the fixed ``BOOKING_MAX_IN_FLIGHT``."""
    service: BookingService = app.state.booking
    return dict(service.door.stats())


def _key_reused() -> IdempotencyKeyReusedError:
    return IdempotencyKeyReusedError("Idempotency-Key: this key was already used with a different request body")


def _service() -> BookingService:
    service: BookingService = app.state.booking
    if service.host.stopping.is_set():
        raise ShuttingDownError(SERVICE)
    return service


_SHUTTING_DOWN = error(
    503,
    ErrorCode.SHUTTING_DOWN,
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
        validation_error("The body breaks a rule (a field, a stay rule)."),
        error(
            422,
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            description="The caller used this `Idempotency-Key` before with a different body (keys are per person).",
        ),
        *PEOPLE_ANSWERS,
        error(
            429,
            ErrorCode.OVERLOADED,
            description="The door's limit of bookings in flight is reached (adaptive, or `BOOKING_MAX_IN_FLIGHT`); "
            "nothing was recorded: send the same request again after `Retry-After`.",
            headers={"Retry-After": RETRY_AFTER},
        ),
        _SHUTTING_DOWN,
        error(504, ErrorCode.TIMEOUT, description="The request's budget ran out before the booking was recorded."),
    ),
)
async def create_booking(
    body: BookingRequest,
    response: Response,
    who: Who,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> Accepted:
    """Book for the caller: the booking is theirs (``owner``), and their ``Idempotency-Key`` theirs alone."""
    inbound = bulkhead_registry.get("booking_agent")
    booking_id, created = await _service().admit(body, idempotency_key, owner=who.person, inbound=inbound)
    response.headers["Location"] = f"/bookings/{booking_id}"
    if created:
        return Accepted(booking_id=booking_id, status="pending")
    # a retried request: report how far the booking it already created has got
    booking = await app.state.booking.bookings.get(booking_id)
    return Accepted(booking_id=booking_id, status=booking["status"] if booking else "pending")


BookingId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


@app.get(
    "/bookings/{booking_id}",
    responses={
        200: {
            "model": BookingView,
            "description": "The booking as it stands (with `wait`: once final, when the wait is over, or at once "
            "when this process is stopping: ask again, a replica or the restarted process answers the rest).",
        },
        **answers(detail(404, description="No booking with this id (or another person's)."), *PEOPLE_ANSWERS),
    },
)
async def get_booking(
    booking_id: BookingId,
    who: Who,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False)] = 0.0,
) -> dict[str, Any]:
    store: BookingStore = app.state.booking.bookings
    if wait > 0:
        await _visible(store, booking_id, who)  # a long-poll on another person's booking answers 404 at once
        booking = await store.wait_final(booking_id, wait)
    else:
        booking = await store.get(booking_id)
    if booking is None or not who.may_see(booking.get("owner")):
        raise _no_booking(booking_id)
    return booking


def _no_booking(booking_id: str) -> HTTPException:
    """Unknown and another person's answer alike: nobody learns which ids exist (OWASP API1)."""
    return HTTPException(status_code=404, detail=f"no booking {booking_id}")


async def _visible(store: BookingStore, booking_id: str, who: Caller) -> None:
    """404 unless the booking exists and is the caller's (the operator sees every one)."""
    exists, owner = await store.owner(booking_id)
    if not exists or not who.may_see(owner):
        raise _no_booking(booking_id)


# ------------------------------------------------------------------------------------------ journal and list

FOLLOW_POLL_S = 0.2
"""How often a live stream looks for new journal entries (any process, any replica may write them)."""
FOLLOW_STATUS_EVERY = 5
"""Idle polls between two looks at the booking's status (a journal that lost its final entry still ends)."""
"""An entry id (``<ms>-<seq>``; ``<ms>`` alone: after every entry of that millisecond, ``0``: from the start), each
part within Redis's 64-bit range."""


class JournalEntry(BaseModel):
    """One journal entry (documentation only): ``kind`` and its own fields (README, docs/journal.md)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(description="The entry's stream id (SSE `id:`; send it back as `Last-Event-ID` to resume).")
    kind: JournalKind
    at: str = Field(description="ISO 8601 UTC.")
    instance: str = Field(description="The process that wrote it (as in run lease owners).")


class Journal(BaseModel):
    booking_id: str
    events: list[JournalEntry]


class BookingSummary(BaseModel):
    booking_id: str
    status: BookingStatus
    created_at: str | None
    updated_at: str | None


class BookingPage(BaseModel):
    bookings: list[BookingSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; `null` on the last one.")


def _field_error(where: str, name: str, message: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": [where, name], "msg": message, "type": "value_error"}])


def _encode_cursor(position: tuple[float, str]) -> str:
    return base64.urlsafe_b64encode(f"{position[0]!r}|{position[1]}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        score, booking_id = raw.split("|", 1)
        position = float(score)
    except (ValueError, UnicodeDecodeError):
        raise _field_error("query", "cursor", "not a cursor this API gave out (use next_cursor as it is)") from None
    if not math.isfinite(position) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", booking_id):
        raise _field_error("query", "cursor", "not a cursor this API gave out (use next_cursor as it is)")
    return position, booking_id


@app.get(
    "/bookings",
    response_model=BookingPage,
    responses=answers(
        validation_error("`status` is not a booking status, or `cursor` is not one this API gave out."),
        *PEOPLE_ANSWERS,
    ),
)
async def list_bookings(
    who: Who,
    status: Annotated[BookingStatus | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> BookingPage:
    """The caller's bookings newest first (the operator's: everyone's), a page at a time (kept for `JOURNAL_TTL_S`)."""
    store: BookingStore = app.state.booking.bookings
    position = _decode_cursor(cursor) if cursor is not None else None
    found, last = await store.page(
        status=None if status is None else str(status),
        limit=limit,
        cursor=position,
        owner=who.person,
        everyone=who.operator,
    )
    return BookingPage(
        bookings=[BookingSummary.model_validate(item) for item in found],
        next_cursor=None if last is None else _encode_cursor(last),
    )


@app.get(
    "/bookings/{booking_id}/events",
    responses={
        200: {
            "model": Journal,
            "description": "The booking's journal, oldest first. With `Accept: text/event-stream`: Server-Sent "
            "Events, live, one per entry (`id:` the entry id, `data:` the entry as JSON), keep-alive comments "
            "while waiting; the stream ends after the final entry (`confirmed`, `failed`, `cancelled`).",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **answers(
            detail(404, description="No booking with this id (or another person's)."),
            validation_error("`Last-Event-ID` is not an entry id."),
            *PEOPLE_ANSWERS,
        ),
    },
)
async def booking_events(
    request: Request,
    booking_id: BookingId,
    who: Who,
    # a string defaulting to "" (none), not an optional one: the schema then has no `null` for a header to carry
    last_event_id: Annotated[str, Header(alias="Last-Event-ID", pattern=STREAM_ID_PATTERN)] = "",
) -> Any:
    """The journal as JSON, or followed live as SSE (resumes after `Last-Event-ID`, on any replica)."""
    redis = app.state.redis
    store: BookingStore = app.state.booking.bookings
    await _visible(store, booking_id, who)
    if "text/event-stream" not in request.headers.get("accept", ""):
        return {"booking_id": booking_id, "events": await read_journal(redis, booking_id, after=last_event_id or None)}
    release = await open_stream(request, who)
    return journal_response(_follow(redis, store, booking_id, last_event_id or None, release))


async def _follow(
    redis: Any, store: BookingStore, booking_id: str, after: str | None, release: Release
) -> AsyncIterator[ServerSentEvent]:
    try:
        final = False
        async for entry in _entries(redis, store, booking_id, after):
            final = is_final(entry)
            yield ServerSentEvent(data=json.dumps(entry, separators=(",", ":")), id=entry["id"])
        if not final and app.state.stopping.is_set():
            yield shutting_down_event(SERVICE)  # ended by a shutdown, not by the booking
    finally:
        await release()


async def _entries(
    redis: Any, store: BookingStore, booking_id: str, after: str | None
) -> AsyncIterator[dict[str, Any]]:
    """Every entry after ``after``, then new ones as they are written, until the final one (or a shutdown)."""
    idle = 0
    stopping = app.state.stopping
    while True:
        entries = await read_journal(redis, booking_id, after=after, count=100)
        for entry in entries:
            after = entry["id"]
            yield entry
            if is_final(entry):
                return
        if entries:
            idle = 0
            continue
        idle += 1
        if idle % FOLLOW_STATUS_EVERY == 0:
            status = await store.status(booking_id)
            # final status and final entry are written together: one more read finds it, unless it was trimmed
            if status is None or status in FINAL_BOOKING_STATUSES:
                for entry in await read_journal(redis, booking_id, after=after):
                    yield entry
                return
        if stopping.is_set():  # what is written so far was sent: the rest from a replica, or after the restart
            return
        await asyncio.sleep(FOLLOW_POLL_S)


class CancelRequest(BaseModel):
    """``POST /bookings/{id}/cancel``'s optional body: the most the cancel of a confirmed stay may cost."""

    model_config = ConfigDict(extra="forbid")

    max_fee: float | None = Field(
        None,
        ge=0,
        le=MAX_TOTAL_PRICE,
        description="A confirmed booking's cancel is refused (409 `fee_exceeds_limit`, nothing changed) when its fee "
        "now is above this: the fee rises as the clock passes `free_until`. Ignored for a booking in flight.",
    )


def _next_cancel_thread(booking_id: str, previous: str | None) -> str:
    """The run of a new cancel: ``<id>:cancel``, then ``<id>:cancel2``... after a cancel the hotel refused."""
    if previous is None:
        return cancel_thread_id(booking_id)
    number = previous.removeprefix(cancel_thread_id(booking_id))
    return f"{cancel_thread_id(booking_id)}{int(number or 1) + 1}"


@app.post(
    "/bookings/{booking_id}/cancel",
    status_code=202,
    responses={
        200: {
            "model": BookingView,
            "description": "Already `cancelled`, or being cancelled by an earlier cancel of the confirmed stay on "
            "terms this one allows (`refund` says them): nothing changed.",
        },
        202: {
            "model": BookingView,
            "description": "Cancel recorded. In flight: the run stops at its next step boundary, releases the hold, "
            "refunds anything captured and ends `cancelled`. Confirmed: `cancelling` with `refund` {amount, fee, "
            "currency} under its policy; the hotel cancels the stay, `amount` (total − fee) is refunded, and it "
            "ends `cancelled` (or `confirmed` again, `cancel_error` saying why, when the hotel refused).",
        },
        **answers(
            detail(404, description="No booking with this id (or another person's)."),
            *PEOPLE_ANSWERS,
            error(
                409,
                ErrorCode.ALREADY_FINAL,
                description="The booking is `failed`, or being confirmed (its confirm was sent): nothing changed.",
            ),
            error(409, ErrorCode.STAY_STARTED, description="The confirmed stay has started: nothing changed."),
            error(409, ErrorCode.NOT_REFUNDABLE, description="A non-refundable rate: nothing changed."),
            error(
                409,
                ErrorCode.FEE_EXCEEDS_LIMIT,
                description="Its fee now is above `max_fee` (`fee`, `max_fee`, `currency`): nothing changed.",
            ),
            error(
                409,
                ErrorCode.CANCEL_IN_PROGRESS,
                description="Another cancel of the confirmed stay won with a fee above this `max_fee`: it goes on.",
            ),
        ),
    },
)
async def cancel_booking(
    booking_id: BookingId, response: Response, who: Who, body: CancelRequest | None = None
) -> dict[str, Any]:
    store: BookingStore = app.state.booking.bookings
    await _visible(store, booking_id, who)
    return await _cancel(store, booking_id, response, None if body is None else body.max_fee)


async def _cancel(store: BookingStore, booking_id: str, response: Response, max_fee: float | None) -> dict[str, Any]:
    status = await store.status(booking_id)
    if status in (BookingStatus.CONFIRMED, BookingStatus.CANCELLING) or (
        status == BookingStatus.CANCELLED and await store.cancel_thread(booking_id) is not None
    ):
        return await _cancel_confirmed(store, booking_id, response, max_fee)
    outcome, status = await store.request_cancel(booking_id)
    if outcome is CancelOutcome.UNKNOWN:
        raise HTTPException(status_code=404, detail=f"no booking {booking_id}")
    if outcome is CancelOutcome.TOO_LATE:
        if status == BookingStatus.CONFIRMED:  # confirmed in between: cancelled as a confirmed stay
            return await _cancel_confirmed(store, booking_id, response, max_fee)
        why = f"is {status}" if status == BookingStatus.FAILED else "had its confirm sent"
        raise BookingFinalError(booking_id, str(status), f"booking {booking_id} {why}: it can no longer be cancelled")
    booking = await store.get(booking_id)
    if booking is None:  # expired in between
        raise HTTPException(status_code=404, detail=f"no booking {booking_id}")
    if outcome is CancelOutcome.CANCELLED:
        response.status_code = 200
    return booking


async def _cancel_confirmed(
    store: BookingStore, booking_id: str, response: Response, max_fee: float | None
) -> dict[str, Any]:
    """A confirmed stay: started here (202), or found started by an earlier cancel (200, or 409 on other terms)."""
    booking = await store.get(booking_id)
    if booking is None:
        raise HTTPException(status_code=404, detail=f"no booking {booking_id}")
    if booking["status"] == BookingStatus.CONFIRMED:
        outcome, _refund = await app.state.booking.cancel_confirmed(booking, max_fee)
        booking = await store.get(booking_id) or booking
        if outcome is AfterSaleCancel.STARTED:
            return booking
    refund = booking.get("refund") or {}
    if booking["status"] not in (BookingStatus.CANCELLING, BookingStatus.CANCELLED) or not refund:
        raise BookingFinalError(booking_id, str(booking["status"]), f"booking {booking_id} is {booking['status']}")
    quote = RefundQuote.from_wire(refund)
    if max_fee is not None and to_cents(quote.fee) > to_cents(max_fee):
        raise CancelInProgressError(booking_id, quote.fee, quote.currency)
    response.status_code = 200
    return booking


async def book_hotel(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: accept a booking and wait (within the caller's budget) for its outcome; streamed (``message/stream``),
    every journal entry on the way is a ``working`` status update."""
    client_key = data.pop("idempotency_key", None)
    request = BookingRequest.model_validate(data)  # a ValidationError answers invalid_request (the error table)
    owner = _person_acted_for()
    booking_id, _ = await _service().admit(request, client_key if isinstance(client_key, str) else None, owner=owner)
    store: BookingStore = app.state.booking.bookings
    if progress_wanted():
        # message/stream: the booking's journal, entry by entry, as working updates; then the outcome
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, remaining_budget() - 0.1)):
                async for entry in _entries(app.state.redis, store, booking_id, None):
                    await report_progress({"booking_id": booking_id, "journal": entry})
        return await store.get(booking_id) or {"booking_id": booking_id, "status": "pending"}
    booking = await store.wait_final(booking_id, max(0.0, remaining_budget() - 0.1))
    return booking or {"booking_id": booking_id, "status": "pending"}


_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _booking_id_of(data: dict[str, Any]) -> str:
    booking_id = data.get("booking_id")
    if not isinstance(booking_id, str) or not _ID_PATTERN.match(booking_id):
        raise SkillFailure(ErrorCode.INVALID_REQUEST, "booking_id: letters, digits, _ and - (1 to 64)")
    return booking_id


async def get_booking_skill(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: a booking as ``GET /bookings/{id}`` shows it to the person acted for (``not_found`` otherwise)."""
    booking_id = _booking_id_of(data)
    booking = await app.state.booking.bookings.get(booking_id)
    if booking is None or booking.get("owner") != _person_acted_for():
        raise SkillFailure(ErrorCode.NOT_FOUND, f"no booking {booking_id}")
    return dict(booking)


LIST_LIMIT: Final = 20
"""The newest bookings ``list_bookings`` answers (a person's list is for reading, not for paging)."""


async def list_bookings_skill(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: the newest bookings of the person acted for (a service for itself: those made without a person), each as
    ``GET /bookings/{id}`` shows it."""
    limit = data.get("limit", LIST_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIST_LIMIT:
        raise SkillFailure(ErrorCode.INVALID_REQUEST, f"limit: a whole number from 1 to {LIST_LIMIT}")
    store: BookingStore = app.state.booking.bookings
    owner = _person_acted_for()
    page, _ = await store.page(status=None, limit=limit, cursor=None, owner=owner, everyone=False)
    found = [await store.get(item["booking_id"]) for item in page]
    return {"bookings": [booking for booking in found if booking is not None and booking.get("owner") == owner]}


async def cancel_booking_skill(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: ``POST /bookings/{id}/cancel`` for the person acted for; the booking as it stands (``already_final``
    when too late)."""
    booking_id = _booking_id_of(data)
    store: BookingStore = app.state.booking.bookings
    exists, owner = await store.owner(booking_id)
    if not exists or owner != _person_acted_for():
        raise SkillFailure(ErrorCode.NOT_FOUND, f"no booking {booking_id}")
    max_fee = data.get("max_fee")
    if max_fee is not None and (not isinstance(max_fee, int | float) or isinstance(max_fee, bool) or max_fee < 0):
        raise SkillFailure(ErrorCode.INVALID_REQUEST, "max_fee: a number of at least 0")
    return await _cancel(store, booking_id, Response(), None if max_fee is None else float(max_fee))


PERSON_ACTORS: frozenset[str] = frozenset({"concierge-agent", "recovery-worker"})
"""The services that may act for a person (their token's ``sub``, RFC 8693 ``act``): the concierge, and the recovery
worker resuming its turns. A booking made, read or cancelled over A2A is that person's, exactly as over HTTP."""


def _person_acted_for() -> str | None:
    """The person the calling service acts for (``None``: the service for itself); ``forbidden`` from a service
    that may not act for people."""
    person = current_person()
    if person is not None and current_caller() not in PERSON_ACTORS:
        raise SkillFailure(ErrorCode.FORBIDDEN, f"{current_caller()} may not act for a person")
    return person


BOOKING_READERS: frozenset[str] | None = None
"""Who may call ``get_booking`` / ``cancel_booking``: any service of the deployment; each sees only the bookings of
the person it acts for (a service for itself: only the bookings made without a person)."""


mount_a2a(
    app,
    name=SERVICE,
    description="Books a hotel: search, hold, charge and confirm, exactly once, surviving crashes.",
    url=get_settings().booking_agent_url,
    skills=[
        Skill(
            id="book_hotel",
            name="Book hotel",
            description="Book {city, checkin, checkout, guests, payment_token, hotel_id?, max_price_per_night?, "
            "max_total_price?, currency?}: a hold above max_total_price or in another currency fails price_changed, "
            "nothing charged.",
            handler=book_hotel,
            tags=("hotels", "booking"),
            inputs=(
                "city",
                "checkin",
                "checkout",
                "guests",
                "payment_token",
                "hotel_id?",
                "max_price_per_night?",
                "max_total_price?",
                "currency?",
                "idempotency_key?",
            ),
        ),
        Skill(
            id="get_booking",
            name="Get booking",
            description="A booking by {booking_id}: its status, hotel, price and error.",
            handler=get_booking_skill,
            tags=("hotels", "booking"),
            callers=BOOKING_READERS,
            inputs=("booking_id",),
        ),
        Skill(
            id="list_bookings",
            name="List bookings",
            description="The newest bookings (up to {limit?}, at most 20) of the person acted for.",
            handler=list_bookings_skill,
            tags=("hotels", "booking"),
            callers=BOOKING_READERS,
            inputs=("limit?",),
        ),
        Skill(
            id="cancel_booking",
            name="Cancel booking",
            description="Cancel {booking_id}: in flight, the saga stops at its next step, releases the hold and "
            "refunds; confirmed, the stay is cancelled under its policy and total − fee refunded (a fee above "
            "{max_fee?} refuses it, fee_exceeds_limit).",
            handler=cancel_booking_skill,
            tags=("hotels", "booking"),
            callers=BOOKING_READERS,
            inputs=("booking_id", "max_fee?"),
        ),
    ],
    bulkhead="booking_agent",
    streaming=True,
)
document_service_token(app, A2A_PATH)
