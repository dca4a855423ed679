"""How the terminal reads a journal: SSE frames parsed (keep-alives skipped), and one line for every kind."""

from __future__ import annotations

from domain.booking import FINAL_JOURNAL_KINDS, JournalKind
from stack.journal import describe, is_final, sse_entries, story_worthy


def test_sse_frames_become_entries_and_keep_alives_are_skipped() -> None:
    lines = [
        ": ping - 2027-01-01 00:00:00",
        "",
        "id: 1-0",
        'data: {"id": "1-0", "kind": "accepted"}',
        "",
        ": ping",
        "id: 2-0",
        'data: {"id": "2-0",',
        'data: "kind": "confirmed"}',
        "",
    ]
    assert list(sse_entries(lines)) == [{"id": "1-0", "kind": "accepted"}, {"id": "2-0", "kind": "confirmed"}]


def test_every_kind_has_a_line_and_the_recovery_story_reads_as_one() -> None:
    for kind in JournalKind:
        assert describe({"kind": kind, "at": "2027-01-01T00:00:00.000Z", "instance": "x"})
    assert {JournalKind(k) for k in FINAL_JOURNAL_KINDS} == {
        JournalKind.CONFIRMED,
        JournalKind.FAILED,
        JournalKind.CANCELLED,
    }
    lost = {"kind": "owner_lost", "owner": "booking-agent:1", "lease_ttl_s": 5.0, "noticed_by": "recovery-worker"}
    assert describe(lost) == "booking-agent:1 lost (lease expired 5.0 s), noticed by recovery-worker"
    audited = {"kind": "owner_lost", "owner": "booking-agent:1", "reason": "held run not executing", "noticed_by": "w"}
    assert describe(audited) == "booking-agent:1 lost (held run not executing), noticed by w"
    resumed = {"kind": "resumed", "instance": "recovery-worker", "at_step": "charge", "fence": 2}
    assert describe(resumed) == "recovery-worker resumed at charge (fence 2)"
    replayed = {
        "kind": "call",
        "dependency": "payment-api",
        "operation": "POST /charges",
        "outcome": "201",
        "replayed": True,
    }
    assert describe(replayed) == "payment-api replayed POST /charges → 201 (no second charge)"
    assert story_worthy(replayed) and story_worthy(lost) and story_worthy(resumed)
    assert not story_worthy({**replayed, "replayed": False})
    assert not story_worthy({"kind": "step_started", "step": "search"})
    assert is_final({"kind": "cancelled"}) and not is_final({"kind": "resumed"})
