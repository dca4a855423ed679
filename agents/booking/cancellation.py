"""Cancellation graph: a confirmed booking cancelled under its policy, the stay given back and ``total − fee`` refunded.

::

    START → cancel_stay ─(done)──▶ refund → finish → END
                 └──(refused)──▶ keep → END

A run of its own (thread ``<booking_id>:cancel``, ``cancel_thread_id``), started by ``POST /bookings/{id}/cancel``
once the booking moved ``confirmed`` → ``cancelling`` with its refund fixed (``BookingStore.begin_cancel``), and
resumed by the recovery worker like any run; its journal is the booking's (``infra.journal.journal_of``).

- ``cancel_stay``: hotel-api cancels the confirmed reservation (its rooms go back). An answer that refuses it, or an
  outage that never let the call leave and outlasts the run's budget, goes to ``keep``: nothing has moved, the
  booking is ``confirmed`` again with ``cancel_error`` saying why. A call that may have reached the hotel (a timeout,
  a 5xx) raises instead: the run is retried, the same key learns what the hotel did.
- ``refund``: payment-agent's ``refund_cancellation`` gives back what the booking record says (payment-agent reads
  it; nobody passes an amount). Past ``cancel_stay`` there is no way back: a refund that fails raises, the run fails,
  and recovery runs it again for as long as payment-api stays down (a cancelled stay is never left unrefunded).
- ``finish``: ``cancelled``, with ``refund`` on the record.

Both side effects are ``@idempotent_node`` with keys derived from the booking, so a replay after kill -9 never
cancels or refunds twice. docs/cancel.md.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from agents.booking.graph import COMPENSATION_BUDGET_S, BookingDeps, BookingError, classify
from domain.booking import BookingStatus, JournalKind
from domain.errors import ErrorCode
from graph.idempotency import idempotency_key, idempotent_node
from graph.migrations import Migration
from graph.tracing import traced_node
from infra.clients.errors import ProviderRejectedError
from infra.error_table import may_have_reached
from infra.journal import flush as journal_flush
from infra.journal import note
from resilience import policy_for
from resilience.budget import detached_budget

CANCELLATION_GRAPH: Final = "cancellation"
"""``RunRecord.graph`` of the runs that cancel a confirmed booking, and the compiled graph's name."""


class Refund(TypedDict):
    """What the cancel gives back, fixed when it was accepted (``domain.cancellation.RefundQuote``)."""

    amount: float
    fee: float
    currency: str


class CancellationState(TypedDict, total=False):
    booking_id: str
    reservation_id: str
    payment_id: str
    refund: Refund
    stay_cancelled: bool
    """hotel-api cancelled the stay: from here the run only goes forward, to the refund."""
    refund_id: str | None
    error: BookingError | None
    """Why the hotel did not cancel: the booking stays ``confirmed`` (``cancel_error`` on its record)."""
    status: str


def cancel_thread_id(booking_id: str) -> str:
    """The thread (and run record) of a booking's cancel: beside the booking's own, which is done."""
    return f"{booking_id}:cancel"


async def cancel_stay(state: CancellationState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    thread_id = config.get("configurable", {}).get("thread_id")
    status = await deps.bookings.status(state["booking_id"])
    if status != BookingStatus.CANCELLING or await deps.bookings.cancel_thread(state["booking_id"]) != thread_id:
        # a cancel whose acceptance did not stick (another one won the booking): nothing to do, nothing done
        message = f"booking {state['booking_id']} is {status}, not being cancelled by this run"
        return {"error": BookingError(code=ErrorCode.ALREADY_FINAL, message=message)}
    try:
        await policy_for("hotel_api").call(
            deps.hotels.cancel, state["reservation_id"], idempotency_key=idempotency_key()
        )
    except Exception as exc:
        if isinstance(exc, ProviderRejectedError) or not may_have_reached(exc):
            return classify(exc, "hotel_api")  # nothing happened at the hotel: ``keep`` (an outage first pauses)
        raise  # it may have cancelled: only the same call again (same key) tells, so the run retries it
    note(JournalKind.STAY_CANCELLED, reservation_id=state["reservation_id"])
    return {"stay_cancelled": True, "error": None}


async def refund(state: CancellationState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    await journal_flush()  # ours first: payment-agent writes its payment-api calls into the same journal at once
    with detached_budget(COMPENSATION_BUDGET_S):  # owed whatever the run's budget says: retried until done
        result = await policy_for("payment_api").call(
            deps.payment_agent.call, "refund_cancellation", {"reference": state["booking_id"]}
        )
    amount = state["refund"]["amount"]
    note(JournalKind.REFUNDED, amount=amount, currency=state["refund"]["currency"], payment_id=state["payment_id"])
    return {"refund_id": result.get("refund_id")}


async def finish(state: CancellationState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    ended, _ = await deps.bookings.finalize(
        state["booking_id"],
        BookingStatus.CANCELLED,
        refund=dict(state["refund"]),
        reservation_id=state["reservation_id"],
        payment_id=state["payment_id"],
    )
    return {"status": ended or BookingStatus.CANCELLED}


async def keep(state: CancellationState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    error = state.get("error") or {}
    await deps.bookings.keep_confirmed(
        state["booking_id"], {"code": error.get("code"), "message": error.get("message")}
    )
    return {"status": BookingStatus.CONFIRMED}


async def _after_cancel_stay(state: CancellationState) -> str:
    # async on purpose: LangGraph runs a plain function on a thread pool
    return "refund" if state.get("stay_cancelled") else "keep"


def build_cancellation_graph(
    deps: BookingDeps, checkpointer: BaseCheckpointSaver[str] | None = None
) -> CompiledStateGraph[CancellationState, None, CancellationState, CancellationState]:
    def bound(step: Any) -> Any:
        return functools.partial(step, deps=deps)

    once = functools.partial(idempotent_node, lambda: deps.redis)
    builder = StateGraph(CancellationState)
    builder.add_node(
        "cancel_stay", traced_node("cancel_stay")(once("cancel_stay", key_fields=["booking_id"])(bound(cancel_stay)))
    )
    builder.add_node("refund", traced_node("refund")(once("cancel_refund", key_fields=["booking_id"])(bound(refund))))
    builder.add_node("finish", traced_node("finish")(bound(finish)))
    builder.add_node("keep", traced_node("keep")(bound(keep)))
    builder.add_edge(START, "cancel_stay")
    builder.add_conditional_edges("cancel_stay", _after_cancel_stay, ["refund", "keep"])
    builder.add_edge("refund", "finish")
    builder.add_edge("finish", END)
    builder.add_edge("keep", END)
    return builder.compile(checkpointer=checkpointer, name=CANCELLATION_GRAPH)


CANCELLATION_BUILDERS: Final = (build_cancellation_graph,)
"""Every version of the cancellation graph this code runs, current first (docs/upgrades.md)."""

CANCELLATION_MIGRATIONS: Final[tuple[Migration, ...]] = ()


def cancellation_is_final(values: Mapping[str, Any]) -> bool:
    """Over once the booking is ``cancelled``, or ``confirmed`` again (or another run's): never ``done`` with it
    ``cancelling`` by this run."""
    return values.get("status") in (BookingStatus.CANCELLED, BookingStatus.CONFIRMED) or (
        (values.get("error") or {}).get("code") == ErrorCode.ALREADY_FINAL
    )


def cancellation_give_up(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
    """Recovery never steers a cancel: whether the hotel cancelled is known only by calling it again, and after it
    did the refund is owed. The run is run again as it stands, for as long as its dependency stays down."""
    return {}


def cancellation_input(booking: Mapping[str, Any], refund: Mapping[str, Any]) -> CancellationState:
    """The run's input for a confirmed booking whose cancel was accepted with ``refund``."""
    return CancellationState(
        booking_id=str(booking["booking_id"]),
        reservation_id=str(booking["reservation_id"]),
        payment_id=str(booking["payment_id"]),
        refund=Refund(amount=float(refund["amount"]), fee=float(refund["fee"]), currency=str(refund["currency"])),
    )
