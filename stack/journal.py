"""A booking's journal for people: one line per entry, and the SSE stream of ``GET /bookings/{id}/events`` parsed.

``concierge book`` prints the story as it happens with it, ``concierge show`` a booking's timeline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from domain.booking import FINAL_JOURNAL_KINDS, BookingStatus, JournalKind
from runs.audit import HOLD_NOT_EXECUTING

__all__ = [
    "STATUS_OF_STEP",
    "describe",
    "is_final",
    "seconds_between",
    "sse_entries",
    "story_worthy",
]

STATUS_OF_STEP = {
    "search": BookingStatus.SEARCHING,
    "reserve": BookingStatus.RESERVING,
    "charge": BookingStatus.PAYING,
    "confirm": BookingStatus.CONFIRMING,
    "compensate": BookingStatus.COMPENSATING,
}
"""The status a booking shows while a step runs (what ``concierge book`` prints as the step starts)."""
_NO_SECOND = {"POST /charges": "no second charge", "POST /reservations": "no second hold"}


def is_final(entry: Mapping[str, Any]) -> bool:
    return entry.get("kind") in FINAL_JOURNAL_KINDS


def sse_entries(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Journal entries from the lines of an SSE stream (comments, i.e. keep-alives, skipped)."""
    data: list[str] = []
    for line in lines:
        if line.startswith(":"):
            continue
        if not line:
            if data:
                yield json.loads("\n".join(data))
            data = []
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield json.loads("\n".join(data))


def story_worthy(entry: Mapping[str, Any]) -> bool:
    """What ``concierge book`` tells beyond the statuses: recovery, replays, retries, refusals, the outcome."""
    kind = entry.get("kind")
    if kind == JournalKind.CALL:
        return bool(entry.get("replayed"))
    return kind not in {JournalKind.ACCEPTED, JournalKind.STEP_STARTED, JournalKind.STEP_FINISHED}


def describe(entry: Mapping[str, Any]) -> str:
    """One line saying what the entry tells."""
    kind = entry.get("kind")
    get = entry.get
    match kind:
        case JournalKind.ACCEPTED:
            return f"accepted by {get('instance')}: {get('city')} {get('checkin')} → {get('checkout')}"
        case JournalKind.STEP_STARTED:
            return f"{get('step')} started on {get('instance')} (attempt {get('attempt')}, fence {get('fence')})"
        case JournalKind.STEP_FINISHED:
            return f"{get('step')} finished: {get('outcome')} in {get('duration_ms')} ms"
        case JournalKind.CALL:
            if get("dependency") == "idempotency-record":
                return f"{get('operation')} answered from its stored result (not run again)"
            operation = str(get("operation"))
            if get("replayed"):
                why = _NO_SECOND.get(operation)
                return f"{get('dependency')} replayed {operation} → {get('outcome')} ({why or 'not done again'})"
            return f"{get('dependency')} {operation} → {get('outcome')} ({get('duration_ms')} ms)"
        case JournalKind.RETRY_SCHEDULED:
            return f"{get('dependency')}: attempt {get('attempt')} failed ({get('error')}); retry in {get('delay_s')} s"
        case JournalKind.CIRCUIT_REJECTED:
            return f"{get('dependency')}: circuit {get('state')}, call refused"
        case JournalKind.PAUSED:
            return f"waiting out {get('dependency')} for {get('wait_s')} s (pause {get('attempt')}), then again"
        case JournalKind.OWNER_LOST:
            if get("reason") == "presence gone":  # its Redis connection closed, or its instance lease ran out
                return f"{get('owner')} lost (presence gone), noticed by {get('noticed_by')}"
            if get("reason") == HOLD_NOT_EXECUTING:  # its own audit released a run it held but no longer ran
                return f"{get('owner')} lost (held run not executing), noticed by {get('noticed_by')}"
            ttl = f" {get('lease_ttl_s')} s" if get("lease_ttl_s") is not None else ""
            return f"{get('owner')} lost (lease expired{ttl}), noticed by {get('noticed_by')}"
        case JournalKind.QUEUED_FOR_RECOVERY:
            return f"queued for recovery (queue depth {get('queue_depth')})"
        case JournalKind.RESUMED:
            return f"{get('instance')} resumed at {get('at_step')} (fence {get('fence')})"
        case JournalKind.HANDED_OFF:
            return f"{get('owner')} handed the run off ({get('reason')})"
        case JournalKind.MIGRATED:
            return f"migrated from graph version {get('from')} to {get('to')}"
        case JournalKind.WAITING_FOR_VERSION:
            return f"waiting for graph version {get('version')} (this code runs {get('runs')})"
        case JournalKind.COMPENSATION:
            undo = [what for what in ("release_hold", "refund") if get(what)]
            return f"compensating ({get('reason')}): {', '.join(undo) or 'nothing to undo'}"
        case JournalKind.CANCEL_REQUESTED:
            return f"cancel requested ({get('instance')})"
        case JournalKind.CANCEL_ACCEPTED:
            return f"cancel accepted: refund {get('amount')} {get('currency')} (fee {get('fee')})"
        case JournalKind.STAY_CANCELLED:
            return f"stay cancelled at the hotel (reservation {get('reservation_id')}): the rooms are given back"
        case JournalKind.REFUNDED:
            return f"refunded {get('amount')} {get('currency')} on payment {get('payment_id')}"
        case JournalKind.CANCEL_FAILED:
            return f"cancel failed, the booking stays confirmed: {get('code')}: {get('message')}"
        case JournalKind.CONFIRMED:
            return f"confirmed (reservation {get('reservation_id')}, payment {get('payment_id')})"
        case JournalKind.FAILED:
            return f"failed: {get('error_code')}: {get('error_message')}"
        case _:
            fields = {k: v for k, v in entry.items() if k not in {"id", "kind", "at", "instance"}}
            return f"{kind} {json.dumps(fields, separators=(',', ':'))}"


def seconds_between(start: str, at: str) -> float:
    try:
        return (datetime.fromisoformat(at) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return 0.0
