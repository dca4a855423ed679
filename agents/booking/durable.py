"""What recovery needs of booking-agent's graphs: a booking (``booking``) and the cancel of a confirmed stay
(``cancellation``), read by the recovery worker through ``DURABLE_AGENTS`` (``recovery.registry``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from agents.booking.cancellation import (
    CANCELLATION_BUILDERS,
    CANCELLATION_GRAPH,
    CANCELLATION_MIGRATIONS,
    cancellation_give_up,
    cancellation_is_final,
)
from agents.booking.graph import (
    BOOKING_BUILDERS,
    BOOKING_GRAPH,
    BOOKING_MIGRATIONS,
    BookingDeps,
    booking_deadline,
    booking_is_final,
    open_booking_deps,
)
from domain.errors import ErrorCode
from recovery.consumer import Graph, RecoverableGraph
from recovery.registry import DurableGraph
from runs.leases import RunRecord

__all__ = ["DURABLE_GRAPHS", "booking_recovery", "cancellation_recovery"]

logger = logging.getLogger(__name__)


def booking_recovery(graph: Graph, deps: BookingDeps) -> RecoverableGraph:
    """How the consumer resumes booking runs: recreate a missing booking record, give up into compensation."""
    bookings = deps.bookings

    async def prepare(record: RunRecord) -> None:
        # booking-agent writes the run record first: if it died before the booking record, the run input has it all
        if await bookings.get(record.thread_id) is None and await bookings.create(record.thread_id, record.input):
            logger.warning(
                "booking %s had no record (its agent died right after accepting it); recreated", record.thread_id
            )

    def give_up_update(state: Mapping[str, Any], last_error: str) -> dict[str, Any]:
        if state.get("error") or state.get("cancelled"):
            return {}  # already on its way to compensation: run that again as it stands
        update: dict[str, Any] = {
            "error": {"code": ErrorCode.PROVIDER_UNAVAILABLE.value, "message": f"recovery gave up: {last_error}"},
        }
        if state.get("reservation_id") and not state.get("payment_id"):
            # the charge step may have run without its checkpoint: refund by reference (a no-op if nothing was taken)
            update["charge_attempted"] = True
        return update

    def promised_until(record: RunRecord) -> float:
        return booking_deadline(record.created_at)  # the run record was written when the booking was accepted

    async def committed(record: RunRecord) -> bool:
        return await bookings.committed(record.thread_id)

    return RecoverableGraph(
        graph=graph,
        give_up_update=give_up_update,
        prepare=prepare,
        promised_until=promised_until,
        is_final=booking_is_final,
        committed=committed,
    )


def cancellation_recovery(graph: Graph, deps: BookingDeps) -> RecoverableGraph:
    """How the consumer resumes the cancel of a confirmed booking: the booking made ``cancelling`` first (its agent
    may have died between the run record and that write), then forward; never steered when given up on."""

    async def prepare(record: RunRecord) -> None:
        booking_id = str(record.input["booking_id"])
        await deps.bookings.begin_cancel(booking_id, record.input["refund"], record.thread_id)  # idempotent

    return RecoverableGraph(
        graph=graph, give_up_update=cancellation_give_up, prepare=prepare, is_final=cancellation_is_final
    )


DURABLE_GRAPHS: Final = (
    DurableGraph(BOOKING_GRAPH, BOOKING_BUILDERS, open_booking_deps, booking_recovery, BOOKING_MIGRATIONS),
    DurableGraph(
        CANCELLATION_GRAPH, CANCELLATION_BUILDERS, open_booking_deps, cancellation_recovery, CANCELLATION_MIGRATIONS
    ),
)
