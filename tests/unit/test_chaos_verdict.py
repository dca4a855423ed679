"""``concierge chaos``'s judgement (``stack.chaos_verdict``) and its command line's refusals, without a stack."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from infra.settings import get_settings
from scripts.chaos_run import chaos_options
from stack.chaos import default_settle_s
from stack.chaos_verdict import (
    AFTERMATH_S,
    ApprovalRecord,
    BookingOutcome,
    ChatRecord,
    FaultRecord,
    StayCancel,
    broken_promises,
    judge_chats,
    judge_refunds,
    percentile,
    refusal_to_failed,
    render_verdict,
    summarize,
    target_misses,
)
from stack.cli import main

T0 = 1_000_000.0


def booking(n: int, status: str | None, took: float, *, at: float = T0, code: str | None = None) -> BookingOutcome:
    return BookingOutcome(f"b{n}", at, status=status, error_code=code, final_at=None if status is None else at + took)


def judge(bookings: list[BookingOutcome], faults: list[FaultRecord] = (), **overrides: object):  # type: ignore[assignment,no-untyped-def]
    values: dict[str, object] = {
        "seed": 1,
        "duration_s": 60.0,
        "clients": 8,
        "budget_s": 60.0,
        "bookings": bookings,
        "faults": list(faults),
        "refused": {},
        "disagreements": [],
        "stuck_in_redis": 0,
        "dlq": 0,
        "http_5xx": {},
        "error_lines_by_log": {},
        "minutes": 1.0,
    }
    return summarize(**{**values, **overrides})  # type: ignore[arg-type]


def test_percentile_is_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_counts_by_outcome_and_code_and_time_to_final() -> None:
    bookings = [
        booking(1, "confirmed", 1.0),
        booking(2, "confirmed", 3.0),
        booking(3, "failed", 2.0, code="provider_unavailable"),
        booking(4, "failed", 9.0, code="payment_declined"),
        booking(5, "cancelled", 0.5),
    ]
    bookings[1].pauses, bookings[2].pauses = 2, 1
    verdict = judge(bookings)
    assert verdict.paused == {"bookings": 2, "pauses": 3, "confirmed": 1}
    assert "waited out an outage: 2 booking(s), 3 pause(s), 1 of them confirmed" in render_verdict(verdict)
    assert (verdict.accepted, verdict.confirmed, verdict.cancelled, verdict.unfinished) == (5, 2, 1, 0)
    assert verdict.failed == {"provider_unavailable": 1, "payment_declined": 1}
    assert verdict.time_to_final_s == {"p50": 2.0, "p99": 9.0, "max": 9.0}
    assert broken_promises(verdict) == []


def test_bookings_are_charged_to_the_faults_they_lived_through() -> None:
    kill = FaultRecord("kill", "booking-agent", T0 + 10, T0 + 10)
    slow = FaultRecord("slow", "payment-api", T0 + 30, T0 + 40)
    bookings = [
        booking(1, "confirmed", 1.0, at=T0),  # ends before the kill
        booking(2, "failed", 2.0, at=T0 + 9, code="provider_unavailable"),  # across the kill
        booking(3, "confirmed", 1.0, at=T0 + 10 + AFTERMATH_S - 0.5),  # in the kill's aftermath
        booking(4, "confirmed", 30.0, at=T0 + 5),  # across both
        booking(5, "cancelled", 1.0, at=T0 + 31),
    ]
    bookings[4].cancel_sent = True  # a booking we cancelled is not judged on being confirmed
    verdict = judge(bookings, [kill, slow])
    assert verdict.faults == {"kill": 1, "slow": 1}
    assert verdict.confirmed_by_fault == {
        "kill": {"bookings": 3, "confirmed": 2, "share": round(2 / 3, 4)},
        "none": {"bookings": 1, "confirmed": 1, "share": 1.0},
        "slow": {"bookings": 1, "confirmed": 1, "share": 1.0},
    }
    assert "kill: 67% of uncancelled bookings confirmed < 90%" in target_misses(verdict)


def test_every_broken_promise_is_named() -> None:
    verdict = judge(
        [booking(1, "confirmed", 1.0), booking(2, None, 0.0)],
        disagreements=["b9 confirmed: 0 confirmed reservations, not 1"],
        stuck_in_redis=2,
        http_5xx={"GET /bookings/{id}?wait= → 500": 3},
    )
    assert broken_promises(verdict) == [
        "1 accepted booking(s) not final after the heal",
        "2 booking(s) still in flight in Redis after the heal",
        "verify: 1 disagreement(s) with the ledgers",
        "3 answer(s) 5xx other than 503",
    ]
    text = render_verdict(verdict)
    assert "promise: BROKEN: 1 accepted booking(s) not final" in text
    assert "  unfinished: b2" in text and "  5xx: GET /bookings/{id}?wait= → 500 3" in text


def test_target_misses_are_not_broken_promises() -> None:
    slow = booking(1, "confirmed", 80.0)
    refused = booking(2, "failed", 1.0, code="provider_unavailable")
    refused.refusal_to_failed_s = 30.0
    verdict = judge([slow, refused], error_lines_by_log={"recovery-worker": 6, "console": 0}, minutes=2.0)
    assert broken_promises(verdict) == []
    assert target_misses(verdict) == [
        "time to final p99 80.0s > budget 60s + 15s",
        "none: 50% of uncancelled bookings confirmed < 90%",
        "refusal → failed took up to 30.0s > 1s",
        "6 ERROR line(s) in the logs",
    ]
    assert verdict.error_lines_per_min == 3.0 and verdict.error_lines_by_log == {"recovery-worker": 6}
    text = render_verdict(verdict)
    assert "promise: kept" in text and "targets: missed: time to final p99" in text


def test_a_quiet_run_meets_every_target() -> None:
    verdict = judge([booking(n, "confirmed", 1.0) for n in range(10)])
    assert target_misses(verdict) == [] and "targets: all met" in render_verdict(verdict)
    assert verdict.to_json()["broken_promises"] == [] and verdict.to_json()["accepted"] == 10


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--faults", "kill,meteor"], "unknown fault kind ['meteor']"),
        (["--every", "8-3"], "--every must be 0.1 ≤ MIN ≤ MAX ≤ 3600"),
        (["--every", "soon"], "--every takes seconds as MIN-MAX"),
        (["--at-once", "4"], "must be between 1 and 3"),
        (["--duration", "-5"], "must be between 1 and 86400"),
        (["--cancel-rate", "2"], "must be between 0 and 1"),
        (["--chats", "-1"], "must be between 0 and 16"),
        (["--chats", "many"], "not a number: 'many'"),
        (["--cancel-confirmed", "1.5"], "must be between 0 and 1, got 1.5"),
        (["--cancel-confirmed", "-0.1"], "must be between 0 and 1"),
        (["--cancel-confirmed", "some"], "not a number: 'some'"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(args: list[str], told: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["chaos", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert told in err and "Traceback" not in err


def test_no_stack_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONCIERGE_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    get_settings.cache_clear()
    try:
        code = main(["chaos", "--duration", "1", "--clients", "1", "--settle", "1"])
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith("concierge chaos: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def entry(kind: str, second: int, dependency: str = "payment_agent") -> dict[str, str]:
    at = {"kind": kind, "at": f"2027-01-01T00:00:{second:02d}.000Z"}
    return {**at, "dependency": dependency} if kind == "circuit_rejected" else at


def test_refusal_to_failed_counts_only_the_refused_charge_that_ended_the_booking() -> None:
    searched = [entry("circuit_rejected", 1, "search_agent"), entry("failed", 2)]
    assert refusal_to_failed(searched) is None, "a refused search is not a charge that never left"
    later = [entry("circuit_rejected", 1), entry("circuit_rejected", 3, "hotel_api"), entry("failed", 5)]
    assert refusal_to_failed(later) is None, "the refusal that ended it was the hold's, after the charge"
    ended = [entry("step_started", 0), entry("circuit_rejected", 1), entry("call", 1), entry("failed", 2)]
    assert refusal_to_failed(ended) == 1.0, "its compensation calls are the failure path"
    resumed = [entry("circuit_rejected", 1), entry("owner_lost", 2), entry("resumed", 9), entry("failed", 10)]
    assert refusal_to_failed(resumed) is None, "a kill came between"
    waited = [entry("circuit_rejected", 1), entry("paused", 1), entry("call", 20), entry("failed", 30)]
    assert refusal_to_failed(waited) is None, "it waited the refusal out; something later failed it"
    again = [entry("circuit_rejected", 1), entry("paused", 1), entry("circuit_rejected", 40), entry("failed", 40)]
    assert refusal_to_failed(again) == 0.0
    assert refusal_to_failed([entry("call", 1), entry("failed", 3)]) is None
    assert refusal_to_failed([entry("circuit_rejected", 1)]) is None, "not failed"


# ------------------------------------------------------------------------------------------------ the conversations


def approval(n: int, answers: list[bool], booked: list[str], *, total: float = 100.0, sent: int = 1) -> ApprovalRecord:
    return ApprovalRecord("c1", f"a{n}", total, "EUR", sent=sent, answers=answers, booking_ids=booked)


def charge(booking_id: str, amount: float, currency: str = "EUR", status: str = "captured") -> dict[str, object]:
    return {"reference": booking_id, "amount": amount, "currency": currency, "status": status}


def test_a_kept_conversation_is_one_booking_per_grant_none_per_refusal() -> None:
    approvals = [
        approval(1, [True], ["b1", "b1"], sent=2),  # relayed by its tool result and its journal: one booking
        approval(2, [True, True], ["b2"], sent=2),
        approval(3, [False], []),
        approval(4, [], [], sent=0),  # asked, never decided: the run ended first
    ]
    chats = [ChatRecord("c1", 4, "awaiting_approval", "a4", ["b1", "b2"])]
    statuses = {"b1": "confirmed", "b2": "failed"}  # a declined card, price_changed: made, and refunded
    judged = judge_chats(chats, approvals, statuses, [charge("b1", 100.0), charge("b2", 99.5, status="refunded")])
    assert (judged["granted"], judged["refused"], judged["undecided"], judged["sent_twice"]) == (2, 1, 1, 2)
    assert judged["bookings_made"] == 2 and judged["made_by_status"] == {"confirmed": 1, "failed": 1}
    verdict = judge([booking(1, "confirmed", 1.0)], chats=judged)
    assert broken_promises(verdict) == []
    text = render_verdict(verdict)
    assert "approvals granted → bookings made: 2 → 2 (confirmed 1, failed 1) · not 1:1: 0" in text
    assert "refused → bookings: 1 → 0" in text
    assert "charges above an approved total: 0 · chats left running after the heal: 0" in text
    assert "promise: kept" in text


@pytest.mark.parametrize(
    ("approvals", "chat", "charges", "told"),
    [
        ([approval(1, [True], [])], ChatRecord("c1", 1, "idle"), [], "approvals granted → bookings made not 1:1"),
        (
            [approval(1, [True], ["b1", "b2"])],
            ChatRecord("c1", 1, "idle", bookings=["b1", "b2"]),
            [],
            "approvals granted → bookings made not 1:1 (1 approval(s), 0 booking(s) without a granted approval)",
        ),
        (
            [approval(1, [True], ["b1"])],
            ChatRecord("c1", 1, "idle", bookings=["b1", "b9"]),
            [],
            "(0 approval(s), 1 booking(s) without a granted approval)",
        ),
        ([approval(1, [False], ["b1"])], ChatRecord("c1", 1, "idle"), [], "1 approval(s) not granted yet booked"),
        (
            [ApprovalRecord("c1", "a1", 100.0, "EUR", sent=1, answers=[True], expired=True, booking_ids=["b1"])],
            ChatRecord("c1", 1, "idle"),
            [],
            "1 approval(s) not granted yet booked",
        ),
        ([approval(1, [True, False], ["b1"])], ChatRecord("c1", 1, "idle"), [], "answered two different decisions"),
        (
            [approval(1, [True], ["b1"])],
            ChatRecord("c1", 1, "idle"),
            [charge("b1", 100.01)],
            "1 charge(s) above an approved total",
        ),
        (
            [approval(1, [True], ["b1"])],
            ChatRecord("c1", 1, "idle"),
            [charge("b1", 90.0, currency="USD", status="declined")],
            "1 charge(s) above an approved total",
        ),
        ([approval(1, [True], ["b1"])], ChatRecord("c1", 1, "running"), [], "1 chat(s) left running after the heal"),
        (
            [approval(1, [True], ["b1"]), approval(2, [], [])],
            ChatRecord("c1", 1, "awaiting_approval", "a2"),
            [],
            "1 chat(s) left running after the heal",  # a2's decision was sent (sent=1), yet it still waits
        ),
        ([approval(1, [True], ["b1"])], ChatRecord("c1", 1, None), [], "1 chat(s) left running after the heal"),
    ],
)
def test_every_broken_conversation_promise_is_named(
    approvals: list[ApprovalRecord], chat: ChatRecord, charges: list[dict[str, object]], told: str
) -> None:
    judged = judge_chats([chat], approvals, {"b1": "confirmed", "b2": "confirmed", "b9": "confirmed"}, charges)
    verdict = judge([], chats=judged)
    assert any(told in line for line in broken_promises(verdict)), broken_promises(verdict)
    assert "promise: BROKEN" in render_verdict(verdict)


def test_a_charge_at_the_approved_total_or_of_another_booking_is_not_above_it() -> None:
    approvals = [approval(1, [True], ["b1"], total=112.0)]
    charges = [charge("b1", 112.004), charge("b1", 112.0, status="refunded"), charge("other", 5000.0)]
    judged = judge_chats([ChatRecord("c1", 1, "idle", bookings=["b1"])], approvals, {"b1": "cancelled"}, charges)
    assert judged["over_charged"] == [] and judged["made_by_status"] == {"cancelled": 1}


def test_no_conversations_no_chat_lines() -> None:
    text = render_verdict(judge([booking(1, "confirmed", 1.0)]))
    assert "chats:" not in text and "approvals granted" not in text


def test_a_grant_booking_agent_never_accepted_is_not_made_and_says_why() -> None:
    refused_at_the_door = ApprovalRecord(
        "c1", "a1", 100.0, "EUR", sent=1, answers=[True], tool_error="provider_unavailable"
    )
    judged = judge_chats([ChatRecord("c1", 1, "idle")], [refused_at_the_door], {}, [])
    assert judged["bookings_made"] == 0 and judged["unbooked_by_error"] == {"provider_unavailable": 1}
    text = render_verdict(judge([], chats=judged))
    assert "not 1:1: 1 (none booked: provider_unavailable 1)" in text
    assert "a1 (chat c1) granted: 0 bookings (book_hotel ended provider_unavailable)" in text
    assert "promise: BROKEN: approvals granted → bookings made not 1:1" in text


def test_with_chats_the_settle_outlasts_a_turn_budget(settings_env: pytest.MonkeyPatch) -> None:
    """A turn that met a paused model before the heal may run its whole budget after it: the default settle waits
    that long (plus the minute), not only the booking budget's."""
    settings_env.setenv("BOOKING_BUDGET_S", "30")
    settings_env.setenv("CONCIERGE_TURN_BUDGET_S", "120")
    get_settings.cache_clear()
    assert default_settle_s(chats=False) == 90
    assert default_settle_s(chats=True) == 180
    settings_env.setenv("BOOKING_BUDGET_S", "200")
    get_settings.cache_clear()
    assert default_settle_s(chats=True) == 260


# ------------------------------------------------------------------------------------------------ the cancelled stays


def stay(
    n: int,
    answer: str | None = "202",
    *,
    fee: float = 0.0,
    total: float = 200.0,
    by: Literal["asked", "in_flight"] = "asked",
) -> BookingOutcome:
    """A confirmed booking whose stay the run cancelled, answered ``answer`` (with the refund its policy gives)."""
    outcome = booking(n, "confirmed", 1.0)
    quoted = {"amount": round(total - fee, 2), "fee": fee, "currency": "EUR"} if answer in ("202", "200") else None
    accepted_at = T0 + 10 if quoted else None
    outcome.stay_cancel = StayCancel(by, answer=answer, quoted=quoted, accepted_at=accepted_at)
    if quoted:
        outcome.stay_cancel.status, outcome.stay_cancel.final_at = "cancelled", T0 + 10 + n
    return outcome


def record(status: str, *, fee: float = 0.0, total: float = 200.0, error: str | None = None) -> dict[str, object]:
    """The booking's record after the settle: ``cancelled`` with its refund, or ``confirmed`` (kept: ``error``)."""
    refund = {"amount": round(total - fee, 2), "fee": fee, "currency": "EUR"} if status != "confirmed" else None
    return {
        "status": status,
        "total_price": total,
        "currency": "EUR",
        "refund": refund,
        "cancel_error": {"code": error, "message": "refused"} if error else None,
    }


def refund(booking_id: str, amount: float) -> dict[str, object]:
    return {"refund_id": f"r-{booking_id}-{amount}", "payment_id": f"p-{booking_id}", "reference": booking_id,
            "amount": amount, "currency": "EUR"}  # fmt: skip


def test_cancelled_stays_refunded_total_minus_fee_once_keep_the_promise() -> None:
    bookings = [
        stay(1),  # free: the whole total back
        stay(2, "200", fee=56.0),  # a second cancel found the first: the same refund
        stay(3),  # the hotel refused: confirmed again, nothing refunded
        stay(4, "409 not_refundable"),  # refused before anything moved
        stay(5, fee=40.0, by="in_flight"),  # an in-flight cancel that came after the confirm
        booking(6, "confirmed", 1.0),  # never cancelled: not judged here
    ]
    records = {
        "b1": record("cancelled"),
        "b2": record("cancelled", fee=56.0),
        "b3": record("confirmed", error="hotel_refused"),
        "b4": record("confirmed"),
        "b5": record("cancelled", fee=40.0),
    }
    ledger = [refund("b1", 200.0), refund("b2", 144.0), refund("b5", 160.0), refund("b6-other", 9.0)]
    judged = judge_refunds(bookings, records, ledger)
    assert (judged["asked"], judged["asked_after"], judged["accepted"], judged["cancelled"]) == (5, 4, 4, 3)
    assert judged["refused"] == {"409 not_refundable": 1} and judged["kept"] == {"hotel_refused": 1}
    assert (judged["refunded_once"], judged["with_fee"], judged["refunded"], judged["fees"]) == (3, 2, 504.0, 96.0)
    assert judged["time_to_cancelled_s"] == {"p50": 2.0, "max": 5.0}
    verdict = judge(bookings, refunds=judged)
    assert broken_promises(verdict) == []
    assert verdict.to_json()["refunds"]["refunded_once"] == 3
    text = render_verdict(verdict)
    assert (
        "  confirmed stays cancelled: 5 (4 drawn by --cancel-confirmed, 1 in-flight cancels after the confirm) · "
        "accepted (202/200) 4 · not accepted 1 (409 not_refundable 1)"
    ) in text
    assert (
        "  refunds: cancelled 3 · exactly one refund of total − fee 3 (504.00 refunded, 96.00 kept as fees by 2) · "
        "kept confirmed (the hotel refused) 1 (hotel_refused 1) · accepted → final: p50 2.00s, max 5.00s"
    ) in text
    assert (
        "  double refunds: 0 · cancelled without the refund owed: 0 · refunded other than total − fee: 0 · "
        "cancels not final after the heal: 0"
    ) in text
    assert "promise: kept" in text


def test_a_fee_that_takes_the_whole_total_refunds_nothing_and_keeps_the_promise() -> None:
    judged = judge_refunds([stay(1, fee=200.0)], {"b1": record("cancelled", fee=200.0)}, [])
    assert judged["refunded_once"] == 1 and judged["unrefunded"] == [] and judged["fees"] == 200.0


@pytest.mark.parametrize(
    ("outcome", "end", "ledger", "told", "item"),
    [
        (
            stay(1),
            record("cancelled"),
            [refund("b1", 200.0), refund("b1", 200.0)],
            "1 cancelled stay(s) refunded twice",
            "double refund: b1: 2 refunds (200.00 + 200.00), 200.00 owed",
        ),
        (
            stay(1, fee=200.0),
            record("cancelled", fee=200.0),
            [refund("b1", 0.01)],
            "1 cancelled stay(s) refunded twice",
            "double refund: b1: 1 refunds (0.01), 0.00 owed",
        ),
        (
            stay(1, fee=56.0),
            record("cancelled", fee=56.0),
            [refund("reference-of-another", 144.0)],
            "1 cancelled stay(s) without the refund owed",
            "no refund: b1: cancelled, 144.00 owed, no refund in the ledger",
        ),
        (
            stay(1),
            {**record("cancelled"), "refund": None},
            [],
            "1 cancelled stay(s) without the refund owed",
            "no refund: b1: cancelled after the confirm, its record keeps no refund",
        ),
        (
            stay(1, fee=56.0),
            record("cancelled", fee=56.0),
            [refund("b1", 200.0)],
            "1 stay(s) refunded other than total − fee, once",
            "wrong refund: b1: refunded 200.00, not 144.00",
        ),
        (
            stay(1),
            {**record("cancelled"), "refund": {"amount": 180.0, "fee": 0.0, "currency": "EUR"}},
            [refund("b1", 180.0)],
            "1 stay(s) refunded other than total − fee, once",
            "wrong refund: b1: its record refunds 180.00, not total − fee 200.00; answered refund 200.00 EUR (fee 0.00)"
            ", its record 180.00 EUR (fee 0.00)",
        ),
        (
            stay(1),
            record("confirmed", error="hotel_refused"),
            [refund("b1", 200.0)],
            "1 stay(s) refunded other than total − fee, once",
            "wrong refund: b1: kept confirmed (the hotel refused), yet refunded 200.00",
        ),
        (
            stay(1, "409 not_refundable"),
            record("confirmed"),
            [refund("b1", 200.0)],
            "1 stay(s) refunded other than total − fee, once",
            "wrong refund: b1: its cancel not accepted (409 not_refundable), yet refunded 200.00",
        ),
        (
            stay(1),
            record("cancelling"),
            [],
            "1 cancel(s) of confirmed stays not final after the heal",
            "cancel not final: b1: cancelling after the cancel (202)",
        ),
        (
            stay(1, None),  # the answer was lost to the give-up, yet the cancel started
            record("cancelling"),
            [],
            "1 cancel(s) of confirmed stays not final after the heal",
            "cancel not final: b1: cancelling after the cancel (no answer)",
        ),
        (
            stay(1),
            record("confirmed"),  # accepted, yet confirmed with no cancel_error: not the cancel's end
            [],
            "1 cancel(s) of confirmed stays not final after the heal",
            "cancel not final: b1: confirmed after the cancel (202)",
        ),
        (
            stay(1),
            None,
            [],
            "1 cancel(s) of confirmed stays not final after the heal",
            "cancel not final: b1: its record gone after the cancel (202)",
        ),
    ],
)
def test_every_broken_refund_promise_is_named(
    outcome: BookingOutcome, end: dict[str, object] | None, ledger: list[dict[str, object]], told: str, item: str
) -> None:
    verdict = judge([outcome], refunds=judge_refunds([outcome], {"b1": end}, ledger))
    assert broken_promises(verdict) == [told]
    text = render_verdict(verdict)
    assert f"promise: BROKEN: {told}" in text and f"  {item}" in text, text
    assert verdict.to_json()["broken_promises"] == [told]


def test_a_run_that_cancelled_no_stay_has_no_refund_lines() -> None:
    verdict = judge([booking(1, "confirmed", 1.0)])
    assert verdict.refunds is None and verdict.to_json()["refunds"] is None
    assert "confirmed stays cancelled" not in render_verdict(verdict)
    empty = judge_refunds([booking(1, "confirmed", 1.0)], {}, [refund("b1", 10.0)])
    assert empty["asked"] == 0 and empty["time_to_cancelled_s"] == {"p50": None, "max": None}
    text = render_verdict(judge([], refunds=empty))
    assert "confirmed stays cancelled: 0" in text and "accepted → final: p50 -, max -" in text


def test_make_chaos_cancels_confirmed_stays_unless_told_otherwise() -> None:
    assert chaos_options([]) == ["--chats", "2", "--cancel-confirmed", "0.1"]
    assert chaos_options(["--", "--seed", "3"]) == ["--chats", "2", "--cancel-confirmed", "0.1", "--seed", "3"]
    assert chaos_options(["--cancel-confirmed", "0.3", "--chats=0"]) == ["--cancel-confirmed", "0.3", "--chats=0"]
    assert chaos_options(["--cancel-confirmed=0"]) == ["--chats", "2", "--cancel-confirmed=0"]
