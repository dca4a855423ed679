"""Booking graph: the saga that turns an accepted booking into a confirmed stay, or into nothing at all.

::

    START → search → reserve → charge → confirm → finish → END
              │         │         │         │
              └─────────┴─────────┴─────────┴──(error)──▶ compensate → finish

- ``search``: checks the stay, asks search-agent over A2A (``search_hotels``, ``policy_for("search_agent")``) and
  keeps the candidates: the requested ``hotel_id``, or up to three cheapest offers within ``max_price_per_night``.
  (Validation and choice are pure and live in this step: every super-step costs a checkpoint write.)
- ``reserve``: hotel-api hold; a 409 moves on to the next candidate (only when no hotel was requested).
- ``charge``: A2A ``charge_payment`` on payment-agent (``policy_for("payment_api")``: it is the payment path).
- ``confirm``: hotel-api confirm.
- ``compensate``: cancel the hold, refund whatever the reference captured; runs on a detached budget because it
  must finish even when the booking ran out of time. Only then does the booking show ``failed``.

Side-effect nodes are ``@traced_node(@idempotent_node(...))`` and send ``idempotency_key()`` downstream, so a
resumed run (after a crash, from the last checkpoint) never holds a room or charges a card twice. The graph runs
with ``durability="sync"``: a step's checkpoint is written before the next step starts. Thread id = booking id.

Errors that answer the booking (no rooms, declined card, provider down, out of time) become ``error`` in the state
and route to ``compensate``. Anything else (Redis down, a bug) raises: the run fails, recovery retries it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from redis.asyncio import Redis

from graph.nodes import idempotency_key, idempotent_node, traced_node
from graph.search import InvalidSearchError, validate_stay
from infra.a2a import A2AClient, A2AError, A2ASkillError
from infra.bookings import BookingStore
from infra.providers.clients import HotelApiClient
from infra.providers.errors import NoAvailabilityError, ProviderError, ProviderRejectedError
from infra.settings import get_settings
from resilience import BudgetExhaustedError, ResilienceError, policy_for, remaining_budget
from resilience.budget import detached_budget

logger = logging.getLogger(__name__)

MAX_CANDIDATES = 3
COMPENSATION_BUDGET_S = 30.0


class BookingState(TypedDict, total=False):
    booking_id: str
    city: str
    checkin: str
    checkout: str
    guests: int
    payment_token: str
    hotel_id: str | None
    max_price_per_night: float | None
    candidates: list[dict[str, Any]]
    hotel_name: str | None
    total_price: float | None
    currency: str | None
    reservation_id: str | None
    payment_id: str | None
    charge_attempted: bool
    status: str
    error: dict[str, str] | None


@dataclass(frozen=True)
class BookingDeps:
    """What the booking graph talks to; built once per process (booking-agent, recovery worker)."""

    redis: Redis
    bookings: BookingStore
    hotels: HotelApiClient
    search_agent: A2AClient
    payment_agent: A2AClient


@asynccontextmanager
async def open_booking_deps(redis: Redis) -> AsyncIterator[BookingDeps]:
    settings = get_settings()
    hotels = HotelApiClient(settings.hotel_api_url)
    search_agent = A2AClient(settings.search_agent_url)
    payment_agent = A2AClient(settings.payment_agent_url)
    deps = BookingDeps(
        redis=redis,
        bookings=BookingStore(redis),
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
    return {"error": {"code": code, "message": message}}


def classify(exc: BaseException) -> dict[str, Any]:
    """The booking error for an exception that answers the booking; re-raises anything else."""
    if isinstance(exc, NoAvailabilityError):
        return failure("no_availability", "no rooms left for these dates")
    if isinstance(exc, A2ASkillError) and exc.code in {"payment_declined", "no_availability", "timeout"}:
        return failure(exc.code, exc.message)
    if isinstance(exc, BudgetExhaustedError | TimeoutError) or remaining_budget() <= 0:
        return failure("timeout", "the booking ran out of time")
    if isinstance(exc, A2ASkillError):
        return failure("provider_unavailable", f"{exc.code}: {exc.message}")
    if isinstance(exc, ResilienceError | ProviderError | A2AError):
        return failure("provider_unavailable", str(exc))
    raise exc


def build_booking_graph(
    deps: BookingDeps, checkpointer: BaseCheckpointSaver[str] | None = None
) -> CompiledStateGraph[BookingState, None, BookingState, BookingState]:
    hotel_policy = policy_for("hotel_api")
    search_policy = policy_for("search_agent")
    payment_policy = policy_for("payment_api")
    store = deps.bookings

    def progress(state: BookingState, status: str) -> None:
        # in the background and in order: the step's own calls need not wait for a status people read
        store.report(state["booking_id"], status)

    @traced_node("search")
    async def search(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        try:
            validate_stay(state["checkin"], state["checkout"], state["guests"])
        except InvalidSearchError as exc:
            return failure("invalid_request", str(exc))
        progress(state, "searching")
        query = {
            "city": state["city"],
            "checkin": state["checkin"],
            "checkout": state["checkout"],
            "guests": state["guests"],
            "hotel_id": state.get("hotel_id"),
            "max_price_per_night": state.get("max_price_per_night"),
        }
        try:
            result = await search_policy.call(deps.search_agent.call, "search_hotels", query)
        except Exception as exc:
            return classify(exc)
        offers = result.get("offers", [])
        if not offers:
            return failure("no_availability", "no hotel matches this search")
        # search-agent already filtered by hotel_id / price and sorted cheapest first
        limit = 1 if state.get("hotel_id") else MAX_CANDIDATES
        return {"candidates": offers[:limit], "error": None, "charge_attempted": False}

    @traced_node("reserve")
    @idempotent_node(lambda: deps.redis, "reserve", key_fields=["booking_id"])
    async def reserve(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        progress(state, "reserving")
        base_key = idempotency_key()
        last_error: BaseException | None = None
        for offer in state["candidates"]:
            try:
                held = await hotel_policy.call(
                    deps.hotels.reserve,
                    hotel_id=offer["hotel_id"],
                    checkin=state["checkin"],
                    checkout=state["checkout"],
                    guests=state["guests"],
                    reference=state["booking_id"],
                    idempotency_key=f"{base_key}:{offer['hotel_id']}",
                )
            except NoAvailabilityError as exc:
                last_error = exc
                continue
            except Exception as exc:
                return classify(exc)
            return {
                "hotel_id": offer["hotel_id"],
                "hotel_name": offer["name"],
                "reservation_id": held["reservation_id"],
                "total_price": held["total_price"],
                "currency": held["currency"],
            }
        return classify(last_error or NoAvailabilityError("no candidates"))

    @traced_node("charge")
    @idempotent_node(lambda: deps.redis, "charge", key_fields=["booking_id", "reservation_id"])
    async def charge(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        progress(state, "paying")
        request = {
            "amount": state["total_price"],
            "currency": state["currency"],
            "payment_token": state["payment_token"],
            "reference": state["booking_id"],
        }
        try:
            result = await payment_policy.call(deps.payment_agent.call, "charge_payment", request)
        except Exception as exc:
            outcome = classify(exc)
            # A charge that did not answer may still have been captured: compensation then refunds by reference.
            return {**outcome, "charge_attempted": outcome["error"]["code"] != "payment_declined"}
        return {"payment_id": result["payment_id"], "charge_attempted": True}

    @traced_node("confirm")
    @idempotent_node(lambda: deps.redis, "confirm", key_fields=["booking_id", "reservation_id"])
    async def confirm(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        progress(state, "confirming")
        try:
            await hotel_policy.call(
                deps.hotels.confirm, str(state["reservation_id"]), idempotency_key=idempotency_key()
            )
        except ProviderRejectedError as exc:
            return failure("provider_unavailable", f"hotel refused the confirmation: {exc}")
        except Exception as exc:
            return classify(exc)
        return {"status": "confirmed"}

    @traced_node("compensate")
    @idempotent_node(lambda: deps.redis, "compensate", key_fields=["booking_id", "reservation_id", "payment_id"])
    async def compensate(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        base_key = idempotency_key()
        with detached_budget(COMPENSATION_BUDGET_S):
            if state.get("payment_id") or state.get("charge_attempted"):
                await payment_policy.call(
                    deps.payment_agent.call,
                    "refund_payment",
                    {"reference": state["booking_id"], "payment_id": state.get("payment_id")},
                )
            if state.get("reservation_id"):
                await hotel_policy.call(
                    deps.hotels.cancel, str(state["reservation_id"]), idempotency_key=f"{base_key}:cancel"
                )
        logger.info("booking %s compensated (%s)", state["booking_id"], (state.get("error") or {}).get("code"))
        return {"status": "failed"}

    @traced_node("finish")
    async def finish(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        error = state.get("error")
        status = "failed" if error else "confirmed"
        await store.flush(state["booking_id"])  # "confirming" before "confirmed", never after
        await store.update(
            state["booking_id"],
            status=status,
            hotel_id=state.get("hotel_id"),
            hotel_name=state.get("hotel_name"),
            total_price=state.get("total_price"),
            currency=state.get("currency"),
            reservation_id=state.get("reservation_id"),
            payment_id=state.get("payment_id"),
            error=error,
        )
        return {"status": status}

    def next_or_compensate(next_node: str) -> Any:
        # async on purpose: LangGraph runs a plain function on a thread pool, a round trip per edge for a dict lookup
        async def route(state: BookingState) -> str:
            return "compensate" if state.get("error") else next_node

        return route

    builder = StateGraph(BookingState)
    for name, node in (
        ("search", search),
        ("reserve", reserve),
        ("charge", charge),
        ("confirm", confirm),
        ("compensate", compensate),
        ("finish", finish),
    ):
        builder.add_node(name, node)
    builder.add_edge(START, "search")
    chain = ["search", "reserve", "charge", "confirm", "finish"]
    for current, following in itertools.pairwise(chain):
        builder.add_conditional_edges(current, next_or_compensate(following), [following, "compensate"])
    builder.add_edge("compensate", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name="booking")


def booking_input(booking_id: str, request: dict[str, Any]) -> BookingState:
    """The graph input for an accepted booking request (also what a run record stores)."""
    return BookingState(
        booking_id=booking_id,
        city=request["city"],
        checkin=request["checkin"],
        checkout=request["checkout"],
        guests=int(request["guests"]),
        payment_token=request["payment_token"],
        hotel_id=request.get("hotel_id"),
        max_price_per_night=request.get("max_price_per_night"),
    )
