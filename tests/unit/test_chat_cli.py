"""``concierge ask`` / ``concierge chat`` without a stack: what is refused before any request (one line, exit 2),
how a turn's journal reads in a terminal, and which exit code each ending gives."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.settings import get_settings
from stack.chat import (
    EXIT_AWAITING_APPROVAL,
    EXIT_CODES,
    MAX_TEXT_BYTES,
    Printer,
    TurnOutcome,
    check_text,
)
from stack.cli import main
from stack.errors import UsageError


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CONCIERGE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    yield tmp_path / "data"
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ask", ""], "the message is empty"),
        (["ask", "   \n"], "the message is empty"),
        (["ask", "é" * (MAX_TEXT_BYTES // 2 + 1)], f"at most {MAX_TEXT_BYTES}"),
        (["ask", "hello", "--chat", "../admin"], "not a chat id"),
        (["ask", "hello", "--payment-token", "4242 4242 4242 4242"], "not a payment token"),
        (["chat", "--chat", "a b"], "not a chat id"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_request(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    # --url names a port nothing listens on: a request would fail differently (exit 1, "unreachable")
    code = main([*argv, "--url", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err and err.startswith(f"concierge {argv[0]}: ")


def test_nothing_listening_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ask", "hello", "--url", "http://127.0.0.1:9", "--timeout", "0.5"])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1 and "unreachable" in err


def test_a_text_of_exactly_8_kb_is_taken() -> None:
    assert check_text("a" * MAX_TEXT_BYTES) == "a" * MAX_TEXT_BYTES
    with pytest.raises(UsageError):
        check_text("a" * (MAX_TEXT_BYTES + 1))


def test_a_turn_reads_as_a_conversation() -> None:
    out = io.StringIO()
    printer = Printer(out)
    for entry in [
        {"kind": "user_message", "text": "hotels in Lisbon"},
        {
            "kind": "tool_call",
            "name": "search_hotels",
            "arguments": {"city": "Lisbon", "guests": 2},
            "tool_call_id": "c1",
        },
        {"kind": "tool_result", "tool_call_id": "c1", "content": {"offers": [{}, {}], "found": 2}},
        {"kind": "token", "text": "I found", "call": 2, "attempt": 1},
        {"kind": "token", "text": " 2", "call": 2, "attempt": 1},
        {"kind": "token", "text": "I found 2 hotels", "call": 2, "attempt": 2},
        {"kind": "assistant_message", "text": "I found 2 hotels"},
        {"kind": "turn_finished", "outcome": "answered"},
    ]:
        printer.entry(entry)
    assert out.getvalue().splitlines() == [
        '  → search_hotels(city="Lisbon", guests=2)',
        "  ← search_hotels: 2 offer(s)",
        "I found 2",
        "  … the model's answer broke off; asked again (attempt 2)",
        "I found 2 hotels",
    ]


def test_an_answer_not_streamed_is_printed_whole() -> None:
    out = io.StringIO()
    Printer(out).entry({"kind": "assistant_message", "text": "Booked."})
    assert out.getvalue() == "Booked.\n"


def test_each_ending_has_its_exit_code() -> None:
    assert TurnOutcome("answered").exit_code == 0
    assert TurnOutcome("answered", bookings=[{"status": "confirmed"}]).exit_code == 0
    assert TurnOutcome("answered", bookings=[{"status": "failed"}]).exit_code == 1
    assert TurnOutcome("failed", error={"code": "model_unavailable"}).exit_code == 1
    assert TurnOutcome("awaiting_approval").exit_code == EXIT_AWAITING_APPROVAL
    assert set(EXIT_CODES) == {0, 1, 2, 3, 130}
