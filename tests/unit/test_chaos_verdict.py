"""``concierge chaos``'s judgement (``stack.chaos_verdict``) and its command line's refusals, without a stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.settings import get_settings
from stack.chaos_verdict import (
    AFTERMATH_S,
    BookingOutcome,
    FaultRecord,
    broken_promises,
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
