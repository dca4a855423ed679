"""What a ``concierge chaos`` run proves: its bookings and faults turned into the verdict, the broken promises and the
target misses (``docs/chaos.md``). Pure functions of what the run recorded, so they are unit-tested without a stack.

A booking is charged to every fault whose window (start to end, plus ``AFTERMATH_S`` for the restart or failover a
fault sets off) overlaps its life from acceptance to its final state; one that met no fault is charged to ``none``.
The conversations (``--chats``) are judged by ``judge_chats``: every approval granted made exactly one booking, every
refusal none, no charge above the approved total, no chat left running. The confirmed stays the load cancelled
(``--cancel-confirmed``, or an in-flight cancel that came after the confirm) are judged by ``judge_refunds``: each
accepted one ends ``cancelled`` with exactly one refund of total − fee (or ``confirmed`` again, the hotel refusing).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypedDict

from domain.booking import to_cents

__all__ = [
    "AFTERMATH_S",
    "CONFIRMED_TARGET",
    "P99_SLACK_S",
    "ApprovalRecord",
    "BookingOutcome",
    "ChatJudgement",
    "ChatRecord",
    "FaultRecord",
    "RefundJudgement",
    "StayCancel",
    "Verdict",
    "broken_promises",
    "iso_epoch",
    "judge_chats",
    "judge_refunds",
    "percentile",
    "refusal_to_failed",
    "render_verdict",
    "summarize",
    "target_misses",
]

AFTERMATH_S = 5.0
"""After a fault ends, this long it still counts: a killed service's restart, Redis replaying its file."""
P99_SLACK_S = 15.0
"""Target: time to final, p99, at most the booking budget plus this."""
CONFIRMED_TARGET = 0.90
"""Target: this share of the bookings nobody cancelled end confirmed, under every fault kind."""
REFUSAL_TO_FAILED_TARGET_S = 1.0
"""Target: a booking whose charge was refused (by a breaker, before any request) is ``failed`` this soon after."""


ACCEPTED_CANCEL = frozenset({"202", "200"})
"""The answers that accept a confirmed stay's cancel: started now (202), or found started by an earlier one (200)."""


@dataclass
class StayCancel:
    """The cancel of a booking the run saw ``confirmed``, and how it ended as the client saw it."""

    by: Literal["asked", "in_flight"]
    """``asked``: ``--cancel-confirmed`` drew it once the booking was confirmed; ``in_flight``: a ``--cancel-rate``
    cancel that came after the confirm, so it cancelled the stay."""
    answer: str | None = None
    """``202``/``200`` (accepted), else the refusal (``409 not_refundable``); None: no answer before the run gave up."""
    quoted: dict[str, Any] | None = None
    """The ``refund`` {amount, fee, currency} the accepting answer promised."""
    accepted_at: float | None = None
    """Wall clock, when the accepting answer came."""
    status: str | None = None
    """``cancelled``, or ``confirmed`` again (``cancel_error``): what the client last saw final; None: never final."""
    cancel_error: str | None = None
    final_at: float | None = None
    """Wall clock, the record's ``updated_at`` at that end."""

    @property
    def accepted(self) -> bool:
        return self.answer in ACCEPTED_CANCEL


@dataclass
class BookingOutcome:
    """One booking the load accepted, as the run saw it end (``status`` None: not final when the run gave up)."""

    booking_id: str
    accepted_at: float
    """Wall clock, the booking record's ``created_at`` when known."""
    cancel_sent: bool = False
    status: str | None = None
    error_code: str | None = None
    final_at: float | None = None
    """Wall clock, the record's ``updated_at`` at its final status."""
    refusal_to_failed_s: float | None = None
    """For a failed booking that a refused charge ended (``refusal_to_failed``): the refusal to the ``failed`` entry."""
    pauses: int = 0
    """``paused`` entries in its journal: how often its run waited out an outage."""
    stay_cancel: StayCancel | None = None
    """The cancel of the stay once it was confirmed; ``status`` stays the booking's first end (``confirmed``)."""


@dataclass
class ApprovalRecord:
    """One approval a conversation was asked for, and what the server answered to its decision."""

    chat_id: str
    approval_id: str
    total_price: float
    currency: str
    sent: int = 0
    """Decisions sent for it (2: the same decision sent again, as a retry); 0: left undecided."""
    answers: list[bool] = field(default_factory=list)
    """The server's ``approve`` in each 202 to a decision (a repeat gets the first decision back)."""
    expired: bool = False
    """The decision came after ``APPROVAL_TTL_S`` (409 ``approval_expired``), or the sweeper expired it: no consent."""
    booking_ids: list[str] = field(default_factory=list)
    """Bookings booking-agent accepted for it, as the chat relayed them (its tool result, its booking journal)."""
    tool_error: str | None = None
    """The code of the error its ``book_hotel`` call ended with, when it ended so (e.g. booking-agent's door shut)."""

    @property
    def granted(self) -> bool:
        return bool(self.answers) and self.answers[0] and not self.expired

    @property
    def refused(self) -> bool:
        return bool(self.answers) and not self.answers[0]


@dataclass
class ChatRecord:
    """One conversation as it stood after the heal and the settle."""

    chat_id: str
    turns: int
    status: str | None
    """``idle``, ``running``, ``awaiting_approval``; None: the chat could not be read."""
    pending_approval_id: str | None = None
    bookings: list[str] = field(default_factory=list)
    """The chat's own ``bookings`` (``GET /chats/{id}``) and every booking its journal relayed."""


class RefundJudgement(TypedDict):
    """The refund lines of the verdict (JSON as it is): the confirmed stays cancelled, and what came back."""

    asked: int
    """Confirmed stays the load cancelled: ``asked_after`` drawn by ``--cancel-confirmed``, the rest in-flight cancels
    that came after the confirm."""
    asked_after: int
    accepted: int
    refused: dict[str, int]
    """Cancels not accepted, by answer (``409 not_refundable``...; ``no answer``)."""
    cancelled: int
    refunded_once: int
    """Ended ``cancelled`` with exactly one refund of total − fee (none when the fee took the whole total), as the
    booking's record, its accepting answer and payment-api's ledger all say."""
    with_fee: int
    """Of those, the cancels that kept a fee (the rest refunded the whole total)."""
    refunded: float
    fees: float
    kept: dict[str, int]
    """Confirmed again, the hotel refusing, by ``cancel_error`` code: a legitimate end."""
    time_to_cancelled_s: dict[str, float | None]
    """From the accepting answer to the record's ``updated_at`` at its end."""
    double_refunds: list[str]
    unrefunded: list[str]
    wrong_refund: list[str]
    """Refunded once, but not total − fee; or a refund other than the one promised; or a kept stay refunded."""
    not_final: list[str]


class ChatJudgement(TypedDict):
    """The conversations' lines of the verdict (JSON as it is)."""

    chats: int
    turns: int
    approvals: int
    granted: int
    refused: int
    expired: int
    undecided: int
    sent_twice: int
    bookings_made: int
    made_by_status: dict[str, int]
    unbooked_by_error: dict[str, int]
    """Granted approvals with no booking, by the error their ``book_hotel`` call ended with (``none``: no error)."""
    not_one_to_one: list[str]
    refused_but_booked: list[str]
    unexplained_bookings: list[str]
    answers_disagree: list[str]
    over_charged: list[str]
    left_running: list[str]


@dataclass(frozen=True)
class FaultRecord:
    kind: str
    target: str
    started_at: float
    ended_at: float
    detail: str = ""

    def overlaps(self, start: float, end: float) -> bool:
        return self.started_at <= end and start <= self.ended_at + AFTERMATH_S


@dataclass
class Verdict:
    seed: int
    duration_s: float
    clients: int
    budget_s: float
    faults: dict[str, int]
    accepted: int
    confirmed: int
    failed: dict[str, int]
    cancelled: int
    unfinished: int
    unfinished_ids: list[str]
    refused: dict[str, int]
    """Bookings the door refused for good (a new one is tried), by status and code."""
    retried: dict[str, int]
    """Door answers "not now" (429, 503...) sent again with the same key, by status and code."""
    time_to_final_s: dict[str, float | None]
    confirmed_by_fault: dict[str, dict[str, float | int | None]]
    refusal_to_failed_s: dict[str, float | int | None]
    paused: dict[str, int]
    disagreements: list[str]
    stuck_in_redis: int
    dlq: int
    http_5xx: dict[str, int]
    error_lines: int
    error_lines_per_min: float | None
    error_lines_by_log: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    load: dict[str, float] = field(default_factory=dict)
    """The machine's 1-minute load average at the start and the end, and its cores: the figures' context."""
    chats: ChatJudgement | None = None
    """The conversations' judgement (``--chats``); None when there were none."""
    refunds: RefundJudgement | None = None
    """The confirmed stays cancelled (``judge_refunds``); None when the run cancelled none and was not asked to."""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "broken_promises": broken_promises(self),
            "target_misses": target_misses(self),
        }


_WENT_ON = frozenset({"paused", "resumed", "owner_lost", "queued_for_recovery", "handed_off"})
"""Journal kinds after a refusal that show the run went on (waited it out, lost its owner, was resumed): then the
refusal did not end it. Calls after it do not count: compensation calls are the failure path."""


_CHARGE_BREAKERS = frozenset({"payment_agent", "payment_api"})
"""The breakers in front of a charge: refused by one of them, the charge never left (the issue's measure)."""


def refusal_to_failed(entries: Iterable[Mapping[str, Any]]) -> float | None:
    """Seconds from the refused charge that ended a booking (its last ``circuit_rejected`` by a charge's breaker, with
    no pause or recovery after it) to its ``failed`` entry; None when no refused charge ended it. Entries oldest
    first, each with ``kind``, ``at`` and, for a refusal, the ``dependency`` whose breaker refused."""
    refused_at: float | None = None
    for entry in entries:
        kind = entry.get("kind")
        if kind == "circuit_rejected":
            charge = entry.get("dependency") in _CHARGE_BREAKERS
            refused_at = iso_epoch(entry.get("at")) if charge else None
        elif kind in _WENT_ON:
            refused_at = None
        elif kind == "failed":
            failed_at = iso_epoch(entry.get("at"))
            return None if refused_at is None or failed_at is None else round(max(0.0, failed_at - refused_at), 3)
    return None


def iso_epoch(value: Any) -> float | None:
    """An ISO 8601 time (``...Z``) as epoch seconds; None for anything else."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0–100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summarize(
    *,
    seed: int,
    duration_s: float,
    clients: int,
    budget_s: float,
    bookings: Iterable[BookingOutcome],
    faults: Sequence[FaultRecord],
    refused: Mapping[str, int],
    disagreements: Sequence[str],
    stuck_in_redis: int,
    dlq: int,
    http_5xx: Mapping[str, int],
    error_lines_by_log: Mapping[str, int],
    minutes: float | None,
    notes: Sequence[str] = (),
    retried: Mapping[str, int] | None = None,
    load: Mapping[str, float] | None = None,
    chats: ChatJudgement | None = None,
    refunds: RefundJudgement | None = None,
) -> Verdict:
    outcomes = list(bookings)
    statuses = Counter(b.status for b in outcomes)
    failed = Counter(b.error_code or "unknown" for b in outcomes if b.status == "failed")
    unfinished = [b.booking_id for b in outcomes if b.status is None]
    times = [b.final_at - b.accepted_at for b in outcomes if b.final_at is not None]
    by_kind: dict[str, list[bool]] = {}
    for booking in outcomes:
        if booking.cancel_sent or booking.status is None:
            continue
        end = booking.final_at if booking.final_at is not None else booking.accepted_at
        kinds = {f.kind for f in faults if f.overlaps(booking.accepted_at, end)} or {"none"}
        for kind in kinds:
            by_kind.setdefault(kind, []).append(booking.status == "confirmed")
    refusals = [b.refusal_to_failed_s for b in outcomes if b.refusal_to_failed_s is not None]
    error_lines = sum(error_lines_by_log.values())
    paused = [b for b in outcomes if b.pauses]
    return Verdict(
        seed=seed,
        duration_s=duration_s,
        clients=clients,
        budget_s=budget_s,
        faults=dict(Counter(f.kind for f in faults)),
        accepted=len(outcomes),
        confirmed=statuses["confirmed"],
        failed=dict(failed.most_common()),
        cancelled=statuses["cancelled"],
        unfinished=len(unfinished),
        unfinished_ids=unfinished[:20],
        refused=dict(refused),
        retried=dict(retried or {}),
        time_to_final_s={
            "p50": _round(percentile(times, 50)),
            "p99": _round(percentile(times, 99)),
            "max": _round(max(times) if times else None),
        },
        confirmed_by_fault={
            kind: {"bookings": len(done), "confirmed": sum(done), "share": round(sum(done) / len(done), 4)}
            for kind, done in sorted(by_kind.items())
        },
        refusal_to_failed_s={
            "bookings": len(refusals),
            "p50": _round(percentile(refusals, 50)),
            "max": _round(max(refusals) if refusals else None),
        },
        paused={
            "bookings": len(paused),
            "pauses": sum(b.pauses for b in paused),
            "confirmed": sum(b.status == "confirmed" for b in paused),
        },
        disagreements=list(disagreements),
        stuck_in_redis=stuck_in_redis,
        dlq=dlq,
        http_5xx=dict(http_5xx),
        error_lines=error_lines,
        error_lines_per_min=round(error_lines / minutes, 2) if minutes else None,
        error_lines_by_log={name: n for name, n in sorted(error_lines_by_log.items()) if n},
        notes=list(notes),
        load=dict(load or {}),
        chats=chats,
        refunds=refunds,
    )


PRICE_EPSILON = 0.005
"""Half a cent: a charge is above its approved total only by more than rounding."""


def judge_chats(
    chats: Sequence[ChatRecord],
    approvals: Sequence[ApprovalRecord],
    booking_status: Mapping[str, str],
    charges: Iterable[Mapping[str, Any]],
) -> ChatJudgement:
    """The conversations against their promises. A granted approval's booking is *made* when booking-agent accepted
    one for it (its id relayed into the chat), whatever its end: ``failed`` (a declined card, ``price_changed``) is
    made and refunded, not missing. ``booking_status`` maps booking id → status (Redis); ``charges`` is payment-api's
    ledger (``reference`` is the booking id; every entry counts, declined ones too: none may ask above consent)."""
    approved = {a.approval_id: a for a in approvals}
    of_booking: dict[str, ApprovalRecord] = {}
    not_one_to_one: list[str] = []
    refused_but_booked: list[str] = []
    answers_disagree: list[str] = []
    made: Counter[str] = Counter()
    unbooked: Counter[str] = Counter()
    for approval in approvals:
        ids = list(dict.fromkeys(approval.booking_ids))
        for booking_id in ids:
            of_booking.setdefault(booking_id, approval)
        if len(set(approval.answers)) > 1:
            answers_disagree.append(f"{approval.approval_id}: answered {approval.answers}")
        if approval.granted:
            if not ids:
                unbooked[approval.tool_error or "none"] += 1
            if len(ids) != 1:
                why = f" (book_hotel ended {approval.tool_error})" if approval.tool_error and not ids else ""
                not_one_to_one.append(
                    f"{approval.approval_id} (chat {approval.chat_id}) granted: {len(ids)} bookings{why}"
                )
            for booking_id in ids:
                made[booking_status.get(booking_id, "unknown")] += 1
        elif ids:
            refused_but_booked.append(f"{approval.approval_id} (chat {approval.chat_id}) not granted: {ids}")
    unexplained = sorted(
        {
            f"{booking_id} (chat {chat.chat_id})"
            for chat in chats
            for booking_id in chat.bookings
            if booking_id not in of_booking or not of_booking[booking_id].granted
        }
    )
    over_charged: list[str] = []
    for charge in charges:
        consent = of_booking.get(str(charge.get("reference")))
        if consent is None:
            continue
        amount, currency = float(charge.get("amount") or 0), str(charge.get("currency"))
        if currency != consent.currency or amount > consent.total_price + PRICE_EPSILON:
            over_charged.append(
                f"{charge.get('reference')}: charged {amount:.2f} {currency} ({charge.get('status')}) > approved "
                f"{consent.total_price:.2f} {consent.currency}"
            )
    decided = {a.approval_id for a in approvals if a.sent}
    left_running = [
        f"{chat.chat_id} {chat.status or 'unreadable'}"
        for chat in chats
        if chat.status != "idle"
        and not (chat.status == "awaiting_approval" and chat.pending_approval_id not in decided)
    ]
    return ChatJudgement(
        chats=len(chats),
        turns=sum(c.turns for c in chats),
        approvals=len(approved),
        granted=sum(a.granted for a in approvals),
        refused=sum(a.refused for a in approvals),
        expired=sum(a.expired for a in approvals),
        undecided=sum(not a.sent for a in approvals),
        sent_twice=sum(a.sent > 1 for a in approvals),
        bookings_made=sum(made.values()),
        made_by_status=dict(made.most_common()),
        unbooked_by_error=dict(unbooked.most_common()),
        not_one_to_one=not_one_to_one,
        refused_but_booked=refused_but_booked,
        unexplained_bookings=unexplained,
        answers_disagree=answers_disagree,
        over_charged=over_charged,
        left_running=left_running,
    )


def judge_refunds(
    bookings: Iterable[BookingOutcome],
    records: Mapping[str, Mapping[str, Any] | None],
    refunds: Iterable[Mapping[str, Any]],
) -> RefundJudgement:
    """The confirmed stays the run cancelled against their promise, from their end as the stack holds it: ``records``
    maps booking id → its record after the settle (``total_price``, ``status``, ``refund``, ``cancel_error``; None:
    gone or unread), ``refunds`` is payment-api's ledger of refunds (``reference`` is the booking id)."""
    given: dict[str, list[int]] = {}
    for refund in refunds:
        given.setdefault(str(refund.get("reference")), []).append(to_cents(float(refund.get("amount") or 0)))
    stays = [(b.booking_id, b.stay_cancel) for b in bookings if b.stay_cancel is not None]
    refused: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    found: dict[str, list[str]] = {"double": [], "unrefunded": [], "wrong": [], "not_final": []}
    took: list[float] = []
    once: list[_StayEnd] = []
    cancelled = 0
    for booking_id, stay in stays:
        if not stay.accepted:
            refused[stay.answer or "no answer"] += 1
        elif stay.accepted_at is not None and stay.final_at is not None:
            took.append(max(0.0, stay.final_at - stay.accepted_at))
        record = records.get(booking_id)
        cancelled += record is not None and record.get("status") == "cancelled"
        end = _judge_stay(booking_id, stay, record, given.get(booking_id, []))
        if end.kind in found:
            found[end.kind].append(end.detail)
        elif end.kind == "kept":
            kept[end.detail] += 1
        elif end.kind == "refunded":
            once.append(end)
    return RefundJudgement(
        asked=len(stays),
        asked_after=sum(stay.by == "asked" for _, stay in stays),
        accepted=sum(stay.accepted for _, stay in stays),
        refused=dict(refused.most_common()),
        cancelled=cancelled,
        refunded_once=len(once),
        with_fee=sum(end.fee > 0 for end in once),
        refunded=sum(end.amount for end in once) / 100,
        fees=sum(end.fee for end in once) / 100,
        kept=dict(kept.most_common()),
        time_to_cancelled_s={"p50": _round(percentile(took, 50)), "max": _round(max(took) if took else None)},
        double_refunds=found["double"],
        unrefunded=found["unrefunded"],
        wrong_refund=found["wrong"],
        not_final=found["not_final"],
    )


@dataclass(frozen=True)
class _StayEnd:
    """How one cancelled stay ended: ``refunded`` once as owed (``fee``, ``amount`` in cents), ``kept`` (``detail``:
    its ``cancel_error`` code), ``untouched`` (refused, nothing moved), or a broken promise (``detail`` says it)."""

    kind: Literal["refunded", "kept", "untouched", "double", "unrefunded", "wrong", "not_final"]
    detail: str = ""
    fee: int = 0
    amount: int = 0


def _judge_stay(booking_id: str, stay: StayCancel, record: Mapping[str, Any] | None, back: Sequence[int]) -> _StayEnd:
    status = None if record is None else record.get("status")
    recorded = None if record is None else record.get("refund")
    if record is not None and status == "cancelled" and isinstance(recorded, Mapping):
        fee, amount, _currency = _fee_amount(recorded)
        owed = to_cents(float(record.get("total_price") or 0)) - fee
        if len(back) > (1 if amount else 0):
            return _StayEnd("double", f"{booking_id}: {len(back)} refunds ({_cents(back)}), {amount / 100:.2f} owed")
        if amount and not back:
            return _StayEnd("unrefunded", f"{booking_id}: cancelled, {amount / 100:.2f} owed, no refund in the ledger")
        problems = []
        if amount != owed:
            problems.append(f"its record refunds {amount / 100:.2f}, not total − fee {owed / 100:.2f}")
        if stay.quoted is not None and _fee_amount(stay.quoted) != _fee_amount(recorded):
            problems.append(f"answered refund {_wire(stay.quoted)}, its record {_wire(recorded)}")
        if sum(back) != amount:
            problems.append(f"refunded {sum(back) / 100:.2f}, not {amount / 100:.2f}")
        if problems:
            return _StayEnd("wrong", f"{booking_id}: {'; '.join(problems)}")
        return _StayEnd("refunded", fee=fee, amount=amount)
    if status == "cancelled":
        return _StayEnd("unrefunded", f"{booking_id}: cancelled after the confirm, its record keeps no refund")
    if record is not None and status == "confirmed" and record.get("cancel_error"):
        if back:
            return _StayEnd("wrong", f"{booking_id}: kept confirmed (the hotel refused), yet refunded {_cents(back)}")
        error = record["cancel_error"]
        return _StayEnd("kept", str(error.get("code")) if isinstance(error, Mapping) else str(error))
    if status == "confirmed" and not stay.accepted:
        if back:
            answer = stay.answer or "no answer"
            return _StayEnd("wrong", f"{booking_id}: its cancel not accepted ({answer}), yet refunded {_cents(back)}")
        return _StayEnd("untouched")
    if stay.accepted or status == "cancelling":
        where = "its record gone" if record is None else str(status)
        return _StayEnd("not_final", f"{booking_id}: {where} after the cancel ({stay.answer or 'no answer'})")
    return _StayEnd("untouched")


def _fee_amount(refund: Mapping[str, Any]) -> tuple[int, int, str]:
    return (
        to_cents(float(refund.get("fee") or 0)),
        to_cents(float(refund.get("amount") or 0)),
        str(refund.get("currency")),
    )


def _wire(refund: Mapping[str, Any]) -> str:
    fee, amount, currency = _fee_amount(refund)
    return f"{amount / 100:.2f} {currency} (fee {fee / 100:.2f})"


def _cents(amounts: Sequence[int]) -> str:
    return " + ".join(f"{a / 100:.2f}" for a in amounts) or "nothing"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def broken_promises(verdict: Verdict) -> list[str]:
    """The safety promise: every accepted booking final after the heal, the ledgers agree, no 5xx but 503; and with
    the conversations and the cancelled stays, theirs."""
    broken: list[str] = []
    if verdict.unfinished:
        broken.append(f"{verdict.unfinished} accepted booking(s) not final after the heal")
    if verdict.stuck_in_redis:
        broken.append(f"{verdict.stuck_in_redis} booking(s) still in flight in Redis after the heal")
    if verdict.disagreements:
        broken.append(f"verify: {len(verdict.disagreements)} disagreement(s) with the ledgers")
    if verdict.http_5xx:
        broken.append(f"{sum(verdict.http_5xx.values())} answer(s) 5xx other than 503")
    chats = verdict.chats
    if chats is not None:
        if chats["not_one_to_one"] or chats["unexplained_bookings"]:
            broken.append(
                f"approvals granted → bookings made not 1:1 ({len(chats['not_one_to_one'])} approval(s), "
                f"{len(chats['unexplained_bookings'])} booking(s) without a granted approval)"
            )
        if chats["refused_but_booked"]:
            broken.append(f"{len(chats['refused_but_booked'])} approval(s) not granted yet booked")
        if chats["answers_disagree"]:
            broken.append(f"{len(chats['answers_disagree'])} approval(s) answered two different decisions")
        if chats["over_charged"]:
            broken.append(f"{len(chats['over_charged'])} charge(s) above an approved total")
        if chats["left_running"]:
            broken.append(f"{len(chats['left_running'])} chat(s) left running after the heal")
    refunds = verdict.refunds
    if refunds is not None:
        if refunds["double_refunds"]:
            broken.append(f"{len(refunds['double_refunds'])} cancelled stay(s) refunded twice")
        if refunds["unrefunded"]:
            broken.append(f"{len(refunds['unrefunded'])} cancelled stay(s) without the refund owed")
        if refunds["wrong_refund"]:
            broken.append(f"{len(refunds['wrong_refund'])} stay(s) refunded other than total − fee, once")
        if refunds["not_final"]:
            broken.append(f"{len(refunds['not_final'])} cancel(s) of confirmed stays not final after the heal")
    return broken


def target_misses(verdict: Verdict) -> list[str]:
    """Issue 24's liveness targets this run missed (``--strict`` turns them into exit 1)."""
    misses: list[str] = []
    p99 = verdict.time_to_final_s.get("p99")
    if p99 is not None and p99 > verdict.budget_s + P99_SLACK_S:
        misses.append(f"time to final p99 {p99:.1f}s > budget {verdict.budget_s:g}s + {P99_SLACK_S:g}s")
    for kind, row in verdict.confirmed_by_fault.items():
        share = row["share"]
        if isinstance(share, float) and share < CONFIRMED_TARGET:
            misses.append(f"{kind}: {share:.0%} of uncancelled bookings confirmed < {CONFIRMED_TARGET:.0%}")
    worst = verdict.refusal_to_failed_s.get("max")
    if isinstance(worst, float) and worst > REFUSAL_TO_FAILED_TARGET_S:
        misses.append(f"refusal → failed took up to {worst:.1f}s > {REFUSAL_TO_FAILED_TARGET_S:g}s")
    if verdict.error_lines:
        misses.append(f"{verdict.error_lines} ERROR line(s) in the logs")
    return misses


def _seconds(value: float | int | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def render_verdict(verdict: Verdict) -> str:
    failed = ", ".join(f"{code} {n}" for code, n in verdict.failed.items())
    times = verdict.time_to_final_s
    by_kind = " · ".join(
        f"{kind} {row['share']:.0%} ({row['confirmed']}/{row['bookings']})"
        for kind, row in verdict.confirmed_by_fault.items()
    )
    refusals = verdict.refusal_to_failed_s
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(verdict.faults.items())) or "none"
    per_min = "-" if verdict.error_lines_per_min is None else f"{verdict.error_lines_per_min:g}/min"
    logs = ", ".join(f"{name} {n}" for name, n in verdict.error_lines_by_log.items())
    lines = [
        f"verdict (seed {verdict.seed}, {verdict.duration_s:g}s, {verdict.clients} clients, faults: {faults})",
        f"  accepted {verdict.accepted} · confirmed {verdict.confirmed} · "
        f"failed {sum(verdict.failed.values())}{f' ({failed})' if failed else ''} · cancelled {verdict.cancelled} · "
        f"unfinished {verdict.unfinished}",
        f"  time to final: p50 {_seconds(times['p50'])} · p99 {_seconds(times['p99'])} · max {_seconds(times['max'])}"
        f"  (budget {verdict.budget_s:g}s; target p99 ≤ {verdict.budget_s + P99_SLACK_S:g}s)",
        f"  confirmed of the uncancelled, by fault kind met: {by_kind or '-'}",
        f"  ended by a refused charge → failed: {refusals['bookings']} booking(s), p50 {_seconds(refusals['p50'])}, "
        f"max {_seconds(refusals['max'])}",
        f"  waited out an outage: {verdict.paused['bookings']} booking(s), {verdict.paused['pauses']} pause(s), "
        f"{verdict.paused['confirmed']} of them confirmed",
        f"  verify: {len(verdict.disagreements)} disagreement(s) · in flight in Redis: {verdict.stuck_in_redis} · "
        f"DLQ: {verdict.dlq} · 5xx but 503: {sum(verdict.http_5xx.values())}",
        f"  ERROR lines in the logs: {verdict.error_lines} ({per_min}){f': {logs}' if logs else ''}",
    ]
    if verdict.retried:
        lines.append(
            f"  door said not now (sent again): {', '.join(f'{why} {n}' for why, n in verdict.retried.items())}"
        )
    if verdict.refused:
        lines.append(f"  not accepted: {', '.join(f'{why} {n}' for why, n in verdict.refused.items())}")
    if verdict.chats is not None:
        lines += _chat_lines(verdict.chats)
    if verdict.refunds is not None:
        lines += _refund_lines(verdict.refunds)
    lines += [f"  disagreement: {item}" for item in verdict.disagreements[:10]]
    lines += [f"  5xx: {route} {n}" for route, n in verdict.http_5xx.items()]
    lines += [f"  unfinished: {booking_id}" for booking_id in verdict.unfinished_ids[:10]]
    lines += [f"  note: {note}" for note in verdict.notes]
    if verdict.load:
        lines.append(
            f"  machine load (1 min): {verdict.load.get('start', 0):.1f} at the start, {verdict.load.get('end', 0):.1f}"
            f" at the end, {verdict.load.get('cores', 0):g} cores"
        )
    broken = broken_promises(verdict)
    lines.append(f"promise: {'BROKEN: ' + '; '.join(broken) if broken else 'kept'}")
    misses = target_misses(verdict)
    lines.append(f"targets: {'missed: ' + '; '.join(misses) if misses else 'all met'}")
    return "\n".join(lines)


def _chat_lines(chats: ChatJudgement) -> list[str]:
    made = ", ".join(f"{status} {n}" for status, n in chats["made_by_status"].items())
    unbooked = ", ".join(f"{code} {n}" for code, n in chats["unbooked_by_error"].items())
    refused_booked = len(chats["refused_but_booked"])
    lines = [
        f"  chats: {chats['chats']} · turns {chats['turns']} · approvals asked {chats['approvals']}: granted "
        f"{chats['granted']}, refused {chats['refused']}, expired {chats['expired']}, undecided {chats['undecided']}"
        f" · the same decision sent twice {chats['sent_twice']}",
        f"  approvals granted → bookings made: {chats['granted']} → {chats['bookings_made']}"
        f"{f' ({made})' if made else ''} · not 1:1: {len(chats['not_one_to_one'])}"
        f"{f' (none booked: {unbooked})' if unbooked else ''} · booked without a granted "
        f"approval: {len(chats['unexplained_bookings'])} · refused → bookings: {chats['refused']} → {refused_booked}",
        f"  charges above an approved total: {len(chats['over_charged'])} · chats left running after the heal: "
        f"{len(chats['left_running'])}",
    ]
    return lines + _examples(
        ("not 1:1", chats["not_one_to_one"]),
        ("booked without a granted approval", chats["unexplained_bookings"]),
        ("refused yet booked", chats["refused_but_booked"]),
        ("answers disagree", chats["answers_disagree"]),
        ("over charged", chats["over_charged"]),
        ("left running", chats["left_running"]),
    )


def _examples(*found: tuple[str, Sequence[object]]) -> list[str]:
    """A line per broken case (the first ten of each kind), labelled: what the verdict's counts are made of."""
    return [f"  {label}: {item}" for label, items in found for item in items[:10]]


def _refund_lines(refunds: RefundJudgement) -> list[str]:
    refused = ", ".join(f"{why} {n}" for why, n in refunds["refused"].items())
    kept = ", ".join(f"{code} {n}" for code, n in refunds["kept"].items())
    took = refunds["time_to_cancelled_s"]
    lines = [
        f"  confirmed stays cancelled: {refunds['asked']} ({refunds['asked_after']} drawn by --cancel-confirmed, "
        f"{refunds['asked'] - refunds['asked_after']} in-flight cancels after the confirm) · accepted (202/200) "
        f"{refunds['accepted']} · not accepted {sum(refunds['refused'].values())}{f' ({refused})' if refused else ''}",
        f"  refunds: cancelled {refunds['cancelled']} · exactly one refund of total − fee {refunds['refunded_once']}"
        f" ({refunds['refunded']:.2f} refunded, {refunds['fees']:.2f} kept as fees by {refunds['with_fee']}) · kept "
        f"confirmed (the hotel refused) {sum(refunds['kept'].values())}{f' ({kept})' if kept else ''} · accepted → "
        f"final: p50 {_seconds(took['p50'])}, max {_seconds(took['max'])}",
        f"  double refunds: {len(refunds['double_refunds'])} · cancelled without the refund owed: "
        f"{len(refunds['unrefunded'])} · refunded other than total − fee: {len(refunds['wrong_refund'])} · "
        f"cancels not final after the heal: {len(refunds['not_final'])}",
    ]
    return lines + _examples(
        ("double refund", refunds["double_refunds"]),
        ("no refund", refunds["unrefunded"]),
        ("wrong refund", refunds["wrong_refund"]),
        ("cancel not final", refunds["not_final"]),
    )
