"""The concierge's pure pieces: the model's tool arguments checked like a request body, a history with an
unanswered tool call repaired before it is sent, the transcript people read, the text limit, the once-keys."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agents.concierge.booking import booking_key_for
from agents.concierge.history import repair_history, transcript
from agents.concierge.tools import validate_tool_args
from agents.concierge.views import booking_view
from domain.chat import MAX_TEXT_BYTES, InvalidToolCallError, approval_id_for, check_text

CHECKIN = (date.today() + timedelta(days=30)).isoformat()
CHECKOUT = (date.today() + timedelta(days=32)).isoformat()
STAY = {"city": "Lisbon", "checkin": CHECKIN, "checkout": CHECKOUT, "guests": 2}


def test_valid_arguments_come_back_clean() -> None:
    assert validate_tool_args("search_hotels", {**STAY, "max_price_per_night": 150}) == {
        **STAY,
        "max_price_per_night": 150.0,
    }
    assert validate_tool_args("book_hotel", {**STAY, "hotel_id": "lisbon-01", "guests": 2.0})["guests"] == 2
    assert validate_tool_args("get_booking", {"booking_id": "ab12"}) == {"booking_id": "ab12"}


@pytest.mark.parametrize(
    ("name", "args", "field"),
    [
        ("order_pizza", {}, "unknown tool"),
        ("search_hotels", "Lisbon", "arguments"),
        ("search_hotels", {**STAY, "card": "4242"}, "card"),
        ("search_hotels", {k: v for k, v in STAY.items() if k != "city"}, "city"),
        ("search_hotels", {**STAY, "checkin": "10/03/2031"}, "checkin"),
        ("search_hotels", {**STAY, "checkout": CHECKIN}, "checkout"),
        ("search_hotels", {**STAY, "guests": 0}, "guests"),
        ("search_hotels", {**STAY, "guests": True}, "guests"),
        ("search_hotels", {**STAY, "max_price_per_night": -1}, "max_price_per_night"),
        ("book_hotel", STAY, "hotel_id"),
        ("cancel_booking", {"booking_id": "../admin"}, "booking_id"),
    ],
)
def test_a_bad_tool_call_is_refused_naming_the_argument(name: str, args: object, field: str) -> None:
    with pytest.raises(InvalidToolCallError, match=field):
        validate_tool_args(name, args)


def test_text_is_limited_to_8_kb_and_must_say_something() -> None:
    assert check_text("hi") == "hi"
    assert check_text("é" * (MAX_TEXT_BYTES // 2)) == "é" * (MAX_TEXT_BYTES // 2)
    for bad in ("", "   ", "é" * (MAX_TEXT_BYTES // 2 + 1), None):
        with pytest.raises(ValueError):
            check_text(bad)


def test_a_history_with_an_unanswered_tool_call_gets_its_failure_right_after_it() -> None:
    call = AIMessage(content="", tool_calls=[{"id": "c1", "name": "search_hotels", "args": STAY}])
    answered = AIMessage(content="", tool_calls=[{"id": "c2", "name": "get_booking", "args": {"booking_id": "b1"}}])
    history = [
        HumanMessage("find me a room"),
        call,
        HumanMessage("hello?"),
        answered,
        ToolMessage(content="{}", tool_call_id="c2"),
    ]
    sent, added = repair_history(history)
    assert [m.tool_call_id for m in added] == ["c1"]
    assert sent[2] is added[0] and sent[1] is call  # where providers expect it: after the call
    assert json.loads(str(added[0].content))["error"]["code"] == "interrupted"
    assert repair_history(sent) == (sent, [])  # nothing left to repair


def test_the_transcript_shows_words_not_tool_traffic() -> None:
    messages = [
        HumanMessage("two nights in Lisbon", additional_kwargs={"turn_id": "t1"}),
        AIMessage(content="", tool_calls=[{"id": "c1", "name": "search_hotels", "args": STAY}]),
        ToolMessage(content='{"offers": []}', tool_call_id="c1"),
        AIMessage(content="I found no hotel.", additional_kwargs={"turn_id": "t1"}),
    ]
    assert transcript(messages) == [
        {"role": "user", "content": "two nights in Lisbon", "turn_id": "t1"},
        {"role": "assistant", "content": "I found no hotel.", "turn_id": "t1"},
    ]


def test_once_keys_are_stable_and_tell_calls_apart() -> None:
    assert booking_key_for("chat", "call_1") == booking_key_for("chat", "call_1")
    assert booking_key_for("chat", "call_1") != booking_key_for("chat", "call_2")
    assert booking_key_for("chat", "call_1") != booking_key_for("chat2", "call_1")
    assert approval_id_for("chat", "call_1").startswith("ap_")
    assert approval_id_for("chat", "call_1") != approval_id_for("chat", "call_2")


def test_the_model_reads_no_payment_reference_of_a_booking() -> None:
    view = booking_view({"booking_id": "b1", "status": "confirmed", "payment_id": "pay_1", "reservation_id": "r1"})
    assert view == {"booking_id": "b1", "status": "confirmed"}
