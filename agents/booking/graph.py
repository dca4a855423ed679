"""Booking graph: the saga that turns an accepted booking into a confirmed stay, or into nothing at all.

::

    START → search → reserve → charge → confirm → finish → END
              │         │         │         │
              └─────────┴─────────┴─────────┴─(error, cancel)─▶ compensate ─┬─▶ release_hold ─┬─▶ finish
                                                                              └─▶ refund ───────┘

- ``search``: checks the stay, asks search-agent over A2A (``search_hotels``, ``policy_for("search_agent")``) and
  keeps the candidates: the requested ``hotel_id``, or up to three cheapest offers within ``max_price_per_night``.
  (Validation and choice are pure and live in this step: every super-step costs a checkpoint write.)
- ``reserve``: hotel-api hold; a 409 moves on to the next candidate (only when no hotel was requested). A hold that
  costs more than the booking's ``max_total_price`` (in cents), or in another ``currency`` than it named, is no
  hold to charge: the step answers ``price_changed`` (with the held and allowed totals) beside the reservation, so
  the compensation releases it and nothing is charged (``domain.booking.check_hold_price``).
- ``charge``: A2A ``charge_payment`` on payment-agent (``policy_for("payment_api")``: it is the payment path).
- ``confirm``: hotel-api confirm.
- ``compensate`` shows the booking ``compensating``; then ``release_hold`` (cancel the hold) and ``refund`` (whatever
  the reference captured) run side by side, each on a detached budget because they must finish even when the
  booking ran out of time. One that fails raises: the run fails and recovery retries it, backing off for as long as
  its dependency is down. Only when both are done does the booking show ``failed`` (or ``cancelled``).

Side-effect nodes are ``@traced_node(@idempotent_node(...))`` and send ``idempotency_key()`` downstream, so a
resumed run (after a crash, from the last checkpoint) never holds a room or charges a card twice. The graph runs
with ``durability="sync"``: a step's checkpoint is written before the next step starts. Thread id = booking id.

Errors that answer the booking (no rooms, declined card, provider down, out of time) become ``error`` in the state
and route to ``compensate``. Anything else (Redis down, a bug) raises: the run fails, recovery retries it. A
provider or peer down is an answer only when the run cannot wait for it: inside a run (``wait_out_outages``) the
step raises ``OutageWaitError`` and the run pauses until the breaker's next probe and runs the step again, as long
as that fits its budget (``classify``, docs/liveness.md).

``charge_attempted`` says whether a charge may have reached payment-api (``infra.error_table.may_have_reached``:
not when our breaker or bulkhead refused it, the connection never opened, or payment-agent says its own request
never left); only then does ``refund`` run. The booking record keeps a mark written before each charge is sent, so
an attempt that may have left (or a process that died mid-call) is remembered across re-runs.

Cancel (``POST /bookings/{id}/cancel`` sets a durable flag on the booking record): ``search``, ``reserve`` and
``charge`` ask for it as the last thing they do, and the edge after them routes to ``compensate`` when it was set
(edges only read the state: ``_then_ask_for_cancel`` says why); ``search`` also asks before it starts, and ``confirm`` passes the point of no return (``BookingStore.commit``) only without it. ``compensate``
without an error marks the run ``cancelled`` and ``finish`` writes that. Whichever process runs the saga (the owner,
or the recovery worker resuming it after a crash) stops at the next step boundary the same way. A step with a side
effect is never skipped on the way in: after a crash it may have acted already, and only its idempotent replay
learns what it did (the hold to release, the charge to refund). See docs/cancel.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypedDict, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from domain.booking import (
    FINAL_BOOKING_STATUSES,
    BookingStatus,
    InvalidStayError,
    JournalKind,
    PriceChangedError,
    check_hold_price,
    validate_stay,
)
from domain.errors import ErrorCode
from graph.idempotency import idempotency_key, idempotent_node
from graph.migrations import Migration
from graph.outages import raise_if_waited_out
from graph.tracing import traced_node
from infra.a2a.client import A2AClient
from infra.bookings import BookingStore
from infra.clients.errors import NoAvailabilityError
from infra.clients.providers import HotelApiClient
from infra.error_table import answer_for, may_have_reached
from infra.journal import note
from infra.payment_tokens import PaymentTokens
from infra.settings import get_settings
from resilience import policy_for
from resilience.budget import detached_budget

logger = logging.getLogger(__name__)

BOOKING_GRAPH: Final = "booking"
"""``RunRecord.graph`` of booking runs, and the compiled graph's name."""
MAX_CANDIDATES = 3
COMPENSATION_BUDGET_S = 30.0


class BookingError(TypedDict, total=False):
    """Why a booking failed, as its record and ``GET /bookings/{id}`` show it (``code``: an ``ErrorCode``)."""

    code: str
    message: str
    held_total: float
    """``price_changed``: what the hold cost (``currency``), and what the booking allowed."""
    currency: str
    allowed_total: float | None
    allowed_currency: str | None


class BookingState(TypedDict, total=False):
    booking_id: str
    owner: str | None
    """The person it is for (``sub``): a run resumed elsewhere recreates the booking as theirs."""
    city: str
    checkin: str
    checkout: str
    guests: int
    hotel_id: str | None
    max_price_per_night: float | None
    max_total_price: float | None
    """The most the hold may cost (the total the person approved): above it, nothing is charged."""
    allowed_currency: str | None
    """The request's ``currency``: a hold in another one is not charged either."""
    candidates: list[dict[str, Any]]
    hotel_name: str | None
    total_price: float | None
    currency: str | None
    reservation_id: str | None
    cancellation: dict[str, Any] | None
    """The stay's cancellation policy as the hotel held it (``domain.cancellation``): on the booking record."""
    payment_id: str | None
    charge_attempted: bool
    status: str
    error: BookingError | None
    cancelled: bool
    """The booking's cancel flag was found (by a step, or ``confirm``'s commit): it compensates, ends ``cancelled``."""


class Peer(Protocol):
    """Another agent, as the saga calls it (``infra.a2a.client.A2AClient``, or an in-process fake in a test)."""

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BookingDeps:
    """What the booking graph talks to; built once per process (booking-agent, recovery worker)."""

    redis: Redis
    bookings: BookingStore
    payment_tokens: PaymentTokens
    hotels: HotelApiClient
    search_agent: Peer
    payment_agent: Peer


@asynccontextmanager
async def open_booking_deps(redis: Redis) -> AsyncIterator[BookingDeps]:
    settings = get_settings()
    # hotel-api issues its key to booking-agent; the recovery worker, running the same saga, presents that one
    hotels = HotelApiClient(settings.hotel_api_url, client="booking-agent")
    # the tokens name the peer (``aud``) and, from the service shell's identity, this service: booking-agent or
    # recovery-worker, the only callers payment-agent charges and refunds for
    search_agent = A2AClient(settings.search_agent_url, audience="search-agent")
    payment_agent = A2AClient(settings.payment_agent_url, audience="payment-agent")
    deps = BookingDeps(
        redis=redis,
        bookings=BookingStore(redis),
        payment_tokens=PaymentTokens(redis),
        hotels=hotels,
        search_agent=search_agent,
        payment_agent=payment_agent,
    )
    try:
        yield deps
    finally:
        # progress reports still in flight: give them a moment to land before the clients go
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2):
                await deps.bookings.flush()
        await hotels.aclose()
        await search_agent.aclose()
        await payment_agent.aclose()


def failure(code: str, message: str) -> dict[str, Any]:
    return {"error": BookingError(code=str(code), message=message)}


def price_changed(exc: PriceChangedError) -> dict[str, Any]:
    """The booking error for a hold above what it allows: the table's code, message and figures."""
    answer = answer_for(exc)
    return {"error": cast(BookingError, {"code": answer.code, "message": answer.message, **answer.fields})}


def classify(exc: BaseException, dependency: str | None = None) -> dict[str, Any]:
    """The booking error for an exception that answers the booking (``infra.error_table``); re-raises the rest.

    ``internal`` (a bug) is not an answer: the run fails and recovery runs it again. Nor is
    ``dependency_unavailable``, ours or a peer's (its Redis or Postgres unreachable, answered as its skill error):
    the stores are coming back, so the run pauses and the step runs again (``runs.runner``), its effects deduplicated.
    Nor, inside a run that may wait, is ``dependency`` being down: ``OutageWaitError`` when the pause fits
    (``graph.outages``).
    """
    answer = answer_for(exc)
    if answer.code in (ErrorCode.INTERNAL, ErrorCode.DEPENDENCY_UNAVAILABLE):
        raise exc
    if dependency is not None:
        raise_if_waited_out(exc, dependency)
    return failure(answer.code, answer.message)


CANCELLED: dict[str, Any] = {"cancelled": True}
"""What ``search`` and ``confirm`` return instead of doing their work once the booking's cancel was requested."""


async def cancel_requested(deps: BookingDeps, state: BookingState) -> bool:
    """Whether the booking's cancel was requested: asked at every step boundary (see the module docstring)."""
    return await deps.bookings.cancel_requested(state["booking_id"])


def progress(deps: BookingDeps, state: BookingState, status: BookingStatus) -> None:
    # in the background and in order: the step's own calls need not wait for a status people read
    deps.bookings.report(state["booking_id"], status)


# Each step is a module-level function of (state, config, deps): ``build_booking_graph`` binds the deps and wraps
# it in its decorators, and a test can run the whole saga in process against fakes.


async def search(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    if await cancel_requested(deps, state):
        return CANCELLED
    try:
        validate_stay(state["checkin"], state["checkout"], state["guests"])
    except InvalidStayError as exc:
        return classify(exc)
    progress(deps, state, BookingStatus.SEARCHING)
    query = {
        "city": state["city"],
        "checkin": state["checkin"],
        "checkout": state["checkout"],
        "guests": state["guests"],
        "hotel_id": state.get("hotel_id"),
        "max_price_per_night": state.get("max_price_per_night"),
    }
    try:
        result = await policy_for("search_agent").call(deps.search_agent.call, "search_hotels", query)
    except Exception as exc:
        return classify(exc, "search_agent")
    offers = result.get("offers", [])
    if not offers:
        return failure(ErrorCode.NO_AVAILABILITY, "no hotel matches this search")
    # search-agent already filtered by hotel_id / price and sorted cheapest first
    limit = 1 if state.get("hotel_id") else MAX_CANDIDATES
    return {"candidates": offers[:limit], "error": None, "charge_attempted": False}


async def reserve(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    progress(deps, state, BookingStatus.RESERVING)
    base_key = idempotency_key()
    last_error: BaseException | None = None
    for offer in state["candidates"]:
        try:
            held = await policy_for("hotel_api").call(
                deps.hotels.reserve,
                hotel_id=offer["hotel_id"],
                checkin=state["checkin"],
                checkout=state["checkout"],
                guests=state["guests"],
                reference=state["booking_id"],
                idempotency_key=f"{base_key}:{offer['hotel_id']}",
            )
        except NoAvailabilityError as exc:
            last_error = exc  # taken meanwhile: the next candidate
            continue
        except Exception as exc:
            return classify(exc, "hotel_api")
        update = {
            "hotel_id": offer["hotel_id"],
            "hotel_name": offer["name"],
            "reservation_id": held["reservation_id"],
            "total_price": held["total_price"],
            "currency": held["currency"],
            "cancellation": held.get("cancellation"),
        }
        try:
            check_hold_price(
                held["total_price"], held["currency"], state.get("max_total_price"), state.get("allowed_currency")
            )
        except PriceChangedError as exc:
            # the hold is kept in the state: the compensation releases it, and nothing is ever charged for it
            return {**update, **price_changed(exc)}
        return update
    return classify(last_error or NoAvailabilityError("no candidates"))


async def charge(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    progress(deps, state, BookingStatus.PAYING)
    token = await deps.payment_tokens.get(state["booking_id"])
    if token is None:  # kept for days (TOKEN_TTL_S): only a booking resumed after that finds it gone
        return {
            **failure(ErrorCode.INVALID_REQUEST, "payment_token: no longer held for this booking"),
            "charge_attempted": False,
        }
    request = {
        "amount": state["total_price"],
        "currency": state["currency"],
        "payment_token": token,
        "reference": state["booking_id"],
    }
    # written ahead: if we die mid-call, whoever resumes the run knows this charge may have left
    left_before = await deps.bookings.charge_leaving(state["booking_id"])
    try:
        result = await policy_for("payment_api").call(deps.payment_agent.call, "charge_payment", request)
    except Exception as exc:
        if answer_for(exc).code == ErrorCode.PAYMENT_DECLINED:  # an answer: nothing was captured
            return {**classify(exc), "charge_attempted": False}
        # A charge that did not answer may still have been captured: compensation then refunds by reference. One
        # refused before it left (our breaker or bulkhead, no connection, payment-agent's own breaker) was not.
        attempted = left_before or may_have_reached(exc)
        if not attempted:
            await deps.bookings.charge_never_left(state["booking_id"])
        return {**classify(exc, "payment_api"), "charge_attempted": attempted}
    return {"payment_id": result["payment_id"], "charge_attempted": True}


async def confirm(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    # the point of no return: from here a cancel answers 409 already_final; before it, the cancel wins
    if not await deps.bookings.commit(state["booking_id"]):
        return CANCELLED
    progress(deps, state, BookingStatus.CONFIRMING)
    await deps.payment_tokens.drop(state["booking_id"])  # charged: the token is not needed any more
    try:
        await policy_for("hotel_api").call(
            deps.hotels.confirm, str(state["reservation_id"]), idempotency_key=idempotency_key()
        )
    except Exception as exc:
        return classify(exc, "hotel_api")
    return {"status": BookingStatus.CONFIRMED}


async def compensate(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    # no side effect: says the booking is being undone, then release_hold and refund run side by side
    progress(deps, state, BookingStatus.COMPENSATING)
    error = state.get("error") or {}
    note(
        JournalKind.COMPENSATION,
        reason=error.get("code"),
        release_hold=bool(state.get("reservation_id")),
        refund=bool(state.get("payment_id") or state.get("charge_attempted")),
    )
    await deps.payment_tokens.drop(state["booking_id"])  # no charge will be made any more
    # only an error or a cancel leads here: without an error, the edge found the booking's cancel flag
    return {} if state.get("error") else CANCELLED


async def release_hold(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    """Cancel the hold, whatever the refund is waiting for: a room is not kept from other guests by a payment outage."""
    if state.get("reservation_id"):
        with detached_budget(COMPENSATION_BUDGET_S):
            await policy_for("hotel_api").call(
                deps.hotels.cancel, str(state["reservation_id"]), idempotency_key=idempotency_key()
            )
    return {}


async def refund(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    """Refund whatever the reference captured (a charge that did not answer may have been taken)."""
    if state.get("payment_id") or state.get("charge_attempted"):
        with detached_budget(COMPENSATION_BUDGET_S):
            await policy_for("payment_api").call(
                deps.payment_agent.call,
                "refund_payment",
                {"reference": state["booking_id"], "payment_id": state.get("payment_id")},
            )
    logger.info("booking %s refunded if charged (%s)", state["booking_id"], (state.get("error") or {}).get("code"))
    return {}


async def finish(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    error = state.get("error")
    if state.get("cancelled"):
        status = BookingStatus.CANCELLED
    else:
        status = BookingStatus.FAILED if error else BookingStatus.CONFIRMED
    store = deps.bookings
    await store.flush(state["booking_id"])  # "confirming" before "confirmed", never after
    # ``failed`` becomes ``cancelled`` when a cancel was requested meanwhile (the store decides, atomically)
    ended, written = await store.finalize(
        state["booking_id"],
        status,
        hotel_id=state.get("hotel_id"),
        hotel_name=state.get("hotel_name"),
        total_price=state.get("total_price"),
        currency=state.get("currency"),
        reservation_id=state.get("reservation_id"),
        payment_id=state.get("payment_id"),
        cancellation=state.get("cancellation"),
        error=error,
    )
    if written and ended == BookingStatus.CANCELLED:
        booking_cancelled(state)
    return {"status": ended or status}


def booking_cancelled(state: BookingState) -> None:
    """The booking ended ``cancelled``: its hold released, anything captured refunded. Called once, by ``finish``."""
    logger.info("booking %s cancelled", state["booking_id"])


# (name, step, key_fields of its idempotency record; None: no side effect, no record)
STEPS: tuple[tuple[str, Any, list[str] | None], ...] = (
    ("search", search, None),
    ("reserve", reserve, ["booking_id"]),
    ("charge", charge, ["booking_id", "reservation_id"]),
    ("confirm", confirm, ["booking_id", "reservation_id"]),
    ("compensate", compensate, None),
    ("release_hold", release_hold, ["booking_id", "reservation_id"]),
    ("refund", refund, ["booking_id", "payment_id"]),
    ("finish", finish, None),
)


ASKS_FOR_CANCEL: frozenset[str] = frozenset({"search", "reserve", "charge"})
"""The steps that end by asking for the booking's cancel flag: the step boundaries where a cancelled run stops.
After ``confirm`` there is nothing to ask: it passed the commit (no cancel can follow) or returned ``cancelled``."""


def _then_ask_for_cancel(step: Any, deps: BookingDeps) -> Any:
    """``step``, then the cancel flag read as the last thing the step does, its answer in the step's own update.

    Not in the edge: LangGraph runs a routing function inside the step's task after the step's writes, and a
    routing function that raises (Redis unreachable for the read) leaves those writes checkpointed with no branch
    taken, so the resumed run ended there, ``done`` with its booking unfinished. Here a failed read fails the
    whole step, which the resume runs again (its side effects deduplicated), and the edge only reads the state.
    """

    @functools.wraps(step)
    async def asking(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        update: dict[str, Any] = await step(state, config)
        if not (update.get("error") or update.get("cancelled")) and await cancel_requested(deps, state):
            return {**update, **CANCELLED}
        return update

    return asking


def _next_or_compensate(next_node: str) -> Any:
    # async on purpose: LangGraph runs a plain function on a thread pool, a round trip per edge for a dict lookup.
    # Pure: whatever the route needs is in the state (see ``_then_ask_for_cancel``).
    async def route(state: BookingState) -> str:
        return "compensate" if state.get("error") or state.get("cancelled") else next_node

    return route


def build_booking_graph(
    deps: BookingDeps, checkpointer: BaseCheckpointSaver[str] | None = None
) -> CompiledStateGraph[BookingState, None, BookingState, BookingState]:
    builder = StateGraph(BookingState)
    for name, step, key_fields in STEPS:
        node: Any = functools.partial(step, deps=deps)
        if key_fields is not None:
            node = idempotent_node(lambda: deps.redis, name, key_fields=key_fields)(node)
        if name in ASKS_FOR_CANCEL:
            node = _then_ask_for_cancel(node, deps)  # outside the idempotency record: a replay asks afresh
        builder.add_node(name, traced_node(name)(node))
    builder.add_edge(START, "search")
    chain = ["search", "reserve", "charge", "confirm", "finish"]
    for current, following in itertools.pairwise(chain):
        builder.add_conditional_edges(current, _next_or_compensate(following), [following, "compensate"])
    # both undo steps run in one super-step: one that fails (its provider is down) is retried on its own, the other's
    # result is already in the checkpoint
    builder.add_edge("compensate", "release_hold")
    builder.add_edge("compensate", "refund")
    builder.add_edge(["release_hold", "refund"], "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name=BOOKING_GRAPH)


BOOKING_BUILDERS: Final = (build_booking_graph,)
"""Every version of the booking graph this code runs, current first: an earlier shape's builder stays here while runs
of it may be in flight (docs/upgrades.md)."""

BOOKING_MIGRATIONS: Final[tuple[Migration, ...]] = (
    # booking@1 → booking@2: the hold's cancellation policy kept in the state (a run of @1 held its stay without)
    Migration("ce82de42196f23b8", defaults={"cancellation": None}),
)
"""How runs of an earlier shape move onto the current builder instead (``graph.migrations``), each tested against a
checkpoint recorded from that shape (tests/data/checkpoints; docs/upgrades.md)."""


def booking_is_final(values: Mapping[str, Any]) -> bool:
    """A booking run is over only when its booking is: ``done`` with it ``paying`` would strand a paid booking."""
    return values.get("status") in FINAL_BOOKING_STATUSES


def booking_deadline(accepted_at: float) -> float:
    """When an accepted booking promised its caller an end (seconds since the epoch): ``BOOKING_BUDGET_S`` from its
    acceptance, however often it is resumed (``execute_run(promised_until=)``)."""
    return accepted_at + get_settings().booking_budget_s


def booking_input(booking_id: str, request: dict[str, Any]) -> BookingState:
    """The graph input for an accepted booking request (also what a run record stores)."""
    return BookingState(
        booking_id=booking_id,
        owner=request.get("owner"),
        city=request["city"],
        checkin=request["checkin"],
        checkout=request["checkout"],
        guests=int(request["guests"]),
        hotel_id=request.get("hotel_id"),
        max_price_per_night=request.get("max_price_per_night"),
        max_total_price=request.get("max_total_price"),
        allowed_currency=request.get("currency"),
    )
