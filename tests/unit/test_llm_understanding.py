"""llm-api's understanding, without a server: what it reads in English (many phrasings, dates across a year boundary,
missing pieces), what it answers to a conversation (tool calls, words after tool results, one retry), and its
tokenizer and history rule."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.llm import BOOK_HOTEL, CANCEL_BOOKING, GET_BOOKING, LIST_BOOKINGS, SEARCH_HOTELS, TOOL_NAMES
from providers.inventory import CITIES
from providers.llm.conversation import Conversation, Decision
from providers.llm.language import Intent, read, resolve_day
from providers.llm.tokens import count_tokens, prompt_tokens, split_tokens
from providers.llm.wire import (
    AssistantMessage,
    FunctionCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    history_error,
)
from tests.llm import offers

TODAY = date(2030, 12, 20)
BOOKING = "0123456789abcdef0123456789abcdef"


def user(text: str) -> UserMessage:
    return UserMessage(role="user", content=text)


def call(name: str, arguments: dict[str, Any] | str, call_id: str = "call_1") -> AssistantMessage:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    function = FunctionCall(name=name, arguments=raw)
    return AssistantMessage(role="assistant", tool_calls=[ToolCall(id=call_id, type="function", function=function)])


def result(content: Any, call_id: str = "call_1") -> ToolMessage:
    return ToolMessage(
        role="tool", content=content if isinstance(content, str) else json.dumps(content), tool_call_id=call_id
    )


def said(text: str) -> AssistantMessage:
    return AssistantMessage(role="assistant", content=text)


def decide(*messages: Any, tools: tuple[str, ...] = TOOL_NAMES, today: date = TODAY) -> Decision:
    return Conversation(list(messages), tools, today, CITIES).decide()


def called(decision: Decision) -> tuple[str, dict[str, Any]]:
    assert decision.call is not None, decision.text
    return decision.call.name, decision.call.arguments


# ------------------------------------------------------------------------------------------------ reading English


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "two nights in Lisbon from 10 March for two, under 150 a night",
            {
                "city": "Lisbon",
                "checkin": "2031-03-10",
                "checkout": "2031-03-12",
                "guests": 2,
                "max_price_per_night": 150.0,
            },
        ),
        (
            "Hotels in Porto from March 10th for 3 nights, 2 guests",
            {"city": "Porto", "checkin": "2031-03-10", "checkout": "2031-03-13", "guests": 2},
        ),
        (
            "I need a room in paris, checkin 2031-05-01 checkout 2031-05-04, for 3 people, max 200 per night",
            {
                "city": "Paris",
                "checkin": "2031-05-01",
                "checkout": "2031-05-04",
                "guests": 3,
                "max_price_per_night": 200.0,
            },
        ),
        (
            "Madrid, 10-12 April, party of 4",
            {"city": "Madrid", "checkin": "2031-04-10", "checkout": "2031-04-12", "guests": 4},
        ),
        (
            "between 3 and 6 January in London for 2 adults",
            {"city": "London", "checkin": "2031-01-03", "checkout": "2031-01-06", "guests": 2},
        ),
        (
            "a week in Berlin from tomorrow, just me",
            {"city": "Berlin", "checkin": "2030-12-21", "checkout": "2030-12-28", "guests": 1},
        ),
        (
            "Rome from the 5th of February until 8 Feb for three guests, below €120",
            {
                "city": "Rome",
                "checkin": "2031-02-05",
                "checkout": "2031-02-08",
                "guests": 3,
                "max_price_per_night": 120.0,
            },
        ),
        (
            "one night in Vienna on 24 December for 2 people",
            {"city": "Vienna", "checkin": "2030-12-24", "checkout": "2030-12-25", "guests": 2},
        ),
        (
            "checkout 14 March, checkin 10 March, in Amsterdam for 2",
            {"city": "Amsterdam", "checkin": "2031-03-10", "checkout": "2031-03-14", "guests": 2},
        ),
        (
            "Can you find a hotel in Tokyo from June 3, 2031 to June 5 for 2 guests?",
            {"city": "Tokyo", "checkin": "2031-06-03", "checkout": "2031-06-05", "guests": 2},
        ),
        (
            "Porto the day after tomorrow for a night for 2",
            {"city": "Porto", "checkin": "2030-12-22", "checkout": "2030-12-23", "guests": 2},
        ),
        (
            "Lisbon, Mar 10th for 2 nights, 2 guests, 150 max",
            {
                "city": "Lisbon",
                "checkin": "2031-03-10",
                "checkout": "2031-03-12",
                "guests": 2,
                "max_price_per_night": 150.0,
            },
        ),
        (
            "Paris March 10-12 for 2 adults",
            {"city": "Paris", "checkin": "2031-03-10", "checkout": "2031-03-12", "guests": 2},
        ),
        (
            "guests: 3 in Vienna, visiting from 1 May for 2 nights",
            {"city": "Vienna", "checkin": "2031-05-01", "checkout": "2031-05-03", "guests": 3},
        ),
        (
            "Barcelona for 2 from 1 May for 4 nights, up to 180 EUR",
            {
                "city": "Barcelona",
                "checkin": "2031-05-01",
                "checkout": "2031-05-05",
                "guests": 2,
                "max_price_per_night": 180.0,
            },
        ),
    ],
)
def test_phrasings_become_one_search(text: str, expected: dict[str, Any]) -> None:
    assert called(decide(user(text))) == (SEARCH_HOTELS, expected)


@pytest.mark.parametrize(
    ("text", "today", "checkin", "checkout"),
    [
        ("Lisbon from 28 December to 3 January for two", date(2030, 12, 20), "2030-12-28", "2031-01-03"),
        ("Lisbon from 2 January for 3 nights for two", date(2030, 12, 20), "2031-01-02", "2031-01-05"),
        ("Lisbon from 10 December for 2 nights for two", date(2030, 12, 20), "2031-12-10", "2031-12-12"),
        ("Lisbon from 20 December for 2 nights for two", date(2030, 12, 20), "2030-12-20", "2030-12-22"),
        ("Lisbon from 30 December for 5 nights for two", date(2030, 12, 20), "2030-12-30", "2031-01-04"),
        ("Lisbon from 29 February for 1 night for two", date(2031, 3, 1), "2032-02-29", "2032-03-01"),
    ],
)
def test_dates_are_the_next_such_day_across_a_year_boundary(
    text: str, today: date, checkin: str, checkout: str
) -> None:
    _, arguments = called(decide(user(text), today=today))
    assert (arguments["checkin"], arguments["checkout"]) == (checkin, checkout)


def test_the_prompts_today_wins_over_the_clock() -> None:
    prompt = SystemMessage(role="system", content="You are a concierge. Today is 2031-11-30.")
    _, arguments = called(decide(prompt, user("Lisbon from 10 March for 2 nights for two")))
    assert arguments["checkin"] == "2032-03-10"


def test_resolve_day_skips_impossible_days() -> None:
    assert resolve_day(31, 4, None, TODAY) is None
    assert resolve_day(31, 4, 2031, TODAY) is None
    assert resolve_day(1, 1, None, TODAY) == date(2031, 1, 1)


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("a hotel please", ["the city", "check-in", "how many guests"]),
        ("Lisbon for two", ["check-in"]),
        ("Lisbon from 10 March for two", ["how many nights"]),
        ("Lisbon from 10 March for 2 nights", ["how many guests"]),
        ("from 10 March for 2 nights for two", ["the city"]),
    ],
)
def test_missing_pieces_are_asked_for_in_words(text: str, missing: list[str]) -> None:
    answer = decide(user(text))
    assert answer.text is not None and answer.text.startswith("To search for a hotel I still need")
    assert all(piece in answer.text for piece in missing), answer.text


def test_a_conversation_fills_in_what_was_missing_and_later_words_override() -> None:
    history = [user("Lisbon from 10 March for two"), said("How many nights?"), user("3 nights")]
    assert called(decide(*history))[1] == {
        "city": "Lisbon",
        "checkin": "2031-03-10",
        "checkout": "2031-03-13",
        "guests": 2,
    }
    history = [user("Lisbon from 10 March for 2 nights"), said("How many guests?"), user("4")]
    assert called(decide(*history))[1]["guests"] == 4
    history = [user("Lisbon from 10 March for 2 nights for two, under 100 a night"), said("..."), user("and in Porto?")]
    assert called(decide(*history))[1] == {
        "city": "Porto",
        "checkin": "2031-03-10",
        "checkout": "2031-03-12",
        "guests": 2,
        "max_price_per_night": 100.0,
    }
    history.append(user("any price"))
    assert "max_price_per_night" not in called(decide(*history))[1]


@pytest.mark.parametrize(
    "text", ["Lisbon on 10/03 for 2 nights for two", "Porto from 03.10.2031 for a night, 2 guests"]
)
def test_numeric_dates_are_ambiguous_and_never_guessed(text: str) -> None:
    answer = decide(user(text))
    assert answer.text is not None and "write the month as a word" in answer.text


def test_prices_and_nights_are_told_apart() -> None:
    reading = read("under 150 a night in Lisbon", TODAY, CITIES)
    assert (reading.slots.max_price, reading.slots.nights) == (150.0, None)
    reading = read("for a night in Lisbon for two", TODAY, CITIES)
    assert (reading.slots.nights, reading.slots.guests) == (1, 2)
    reading = read("for 10 March for 2", TODAY, CITIES)
    assert reading.slots.guests == 2


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        ("book the cheapest", Intent.BOOK),
        ("I'll take the second one", Intent.BOOK),
        (f"cancel booking {BOOKING}", Intent.CANCEL),
        ("please cancel it", Intent.CANCEL),
        (f"status of {BOOKING}", Intent.STATUS),
        ("is my booking confirmed?", Intent.STATUS),
        ("thanks!", Intent.THANKS),
        ("no, nothing", Intent.DECLINE),
        ("what can you do?", Intent.OTHER),
    ],
)
def test_intents(text: str, intent: Intent) -> None:
    assert read(text, TODAY, CITIES).intent is intent


# ---------------------------------------------------------------------------------------------- a conversation

SEARCHED = {"city": "Lisbon", "checkin": "2031-03-10", "checkout": "2031-03-12", "guests": 2}
LISBON = offers("Lisbon")


def after_search(*more: Any, found: list[dict[str, Any]] = LISBON) -> list[Any]:
    return [
        user("two nights in Lisbon from 10 March for two"),
        call(SEARCH_HOTELS, SEARCHED),
        result({"offers": found}),
        said("(the offers)"),
        *more,
    ]


def test_offers_are_listed_with_names_and_prices() -> None:
    answer = decide(*after_search()[:3])
    assert answer.text is not None
    assert answer.text.startswith("I found 6 hotels in Lisbon from 10 March to 12 March 2031 (2 nights, 2 guests)")
    for number, offer in enumerate(LISBON, 1):
        assert (
            f"{number}. {offer['name']}, {offer['stars']} stars: {offer['price_per_night']:.0f} EUR a night"
            in answer.text
        )
    some = [*after_search()[:2], result({"offers": LISBON[:5], "found": 6})]
    five = decide(*some)
    assert five.text is not None and "I found 6 hotels in Lisbon" in five.text and "the 5 cheapest:" in five.text
    assert LISBON[5]["name"] not in five.text
    nothing = decide(*after_search(found=[])[:3])
    assert nothing.text is not None and nothing.text.startswith("I found no hotel in Lisbon with rooms")


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ("book the cheapest", 0),
        ("book the first", 0),
        ("I'll take the second one", 1),
        ("book number 3", 2),
        ("book the last one", -1),
        ("the most expensive, please book it", "priciest"),
        ("book the best one", "best"),
    ],
)
def test_book_picks_the_offer_from_the_last_search_and_its_stay(text: str, index: int | str) -> None:
    if index == "priciest":
        offer = max(LISBON, key=lambda o: o["price_per_night"])
    elif index == "best":
        offer = max(LISBON, key=lambda o: (o["stars"], -o["price_per_night"]))
    else:
        assert isinstance(index, int)
        offer = LISBON[index]
    assert called(decide(*after_search(user(text)))) == (BOOK_HOTEL, {"hotel_id": offer["hotel_id"], **SEARCHED})


def test_book_by_name_or_id() -> None:
    target = LISBON[3]
    short = str(target["name"]).removesuffix(" Lisbon")
    assert called(decide(*after_search(user(f"book the {short}"))))[1]["hotel_id"] == target["hotel_id"]
    assert called(decide(*after_search(user(f"book {target['hotel_id']}"))))[1]["hotel_id"] == target["hotel_id"]
    unclear = decide(*after_search(user("book one of them")))
    assert unclear.text is not None and unclear.text.startswith("Which one should I book?")
    alone = decide(*after_search(user("book it"), found=LISBON[:1]))
    assert called(alone)[1]["hotel_id"] == LISBON[0]["hotel_id"]


def test_book_in_one_sentence_searches_then_books() -> None:
    first = user("book the cheapest hotel in Lisbon from 10 March for 2 nights for two")
    assert called(decide(first)) == (SEARCH_HOTELS, SEARCHED)
    then = decide(first, call(SEARCH_HOTELS, SEARCHED), result({"offers": LISBON}))
    assert called(then) == (BOOK_HOTEL, {"hotel_id": LISBON[0]["hotel_id"], **SEARCHED})


def test_book_without_any_search_asks_for_one() -> None:
    answer = decide(user("book the cheapest"))
    assert answer.text is not None and "I still need the city" in answer.text


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            {
                "booking_id": BOOKING,
                "status": "confirmed",
                "hotel_name": LISBON[0]["name"],
                "total_price": 164.0,
                "currency": "EUR",
            },
            f"Booked: {LISBON[0]['name']}, booking {BOOKING}, confirmed. Total 164 EUR.",
        ),
        ({"booking_id": BOOKING, "status": "pending"}, f"Booked: {LISBON[0]['name']}, booking {BOOKING}, pending."),
        (
            {
                "booking_id": BOOKING,
                "status": "failed",
                "error": {"code": "payment_declined", "message": "card declined"},
            },
            f"The booking of {LISBON[0]['name']} failed (booking {BOOKING}): the card was declined (card declined).",
        ),
        ({"approved": False}, f"All right, I did not book {LISBON[0]['name']}."),
        ({"status": "declined"}, f"All right, I did not book {LISBON[0]['name']}."),
        ({"error": {"code": "approval_declined", "message": "the person said no"}}, "All right, I did not book"),
        ("The person declined the booking.", "All right, I did not book"),
        ({"error": {"code": "approval_expired"}}, f"I could not book {LISBON[0]['name']}: the approval expired"),
    ],
)
def test_after_book_hotel_it_reports_in_words(content: Any, expected: str) -> None:
    history = after_search(
        user("book the cheapest"), call(BOOK_HOTEL, {"hotel_id": LISBON[0]["hotel_id"], **SEARCHED}, "call_2")
    )
    answer = decide(*history, result(content, "call_2"))
    assert answer.text is not None and answer.text.startswith(expected), answer.text


def test_status_and_cancel_use_the_id_given_or_the_one_in_the_conversation() -> None:
    assert called(decide(user(f"what's the status of {BOOKING}?"))) == (GET_BOOKING, {"booking_id": BOOKING})
    booked = after_search(
        user("book the first"),
        call(BOOK_HOTEL, {"hotel_id": LISBON[0]["hotel_id"], **SEARCHED}, "call_2"),
        result({"booking_id": BOOKING, "status": "confirmed"}, "call_2"),
        said(f"Booked: X, booking {BOOKING}, confirmed."),
    )
    assert called(decide(*booked, user("cancel it"))) == (CANCEL_BOOKING, {"booking_id": BOOKING})
    assert called(decide(*booked, user("is my booking confirmed?"))) == (GET_BOOKING, {"booking_id": BOOKING})
    unknown = decide(user("cancel my booking"), tools=(SEARCH_HOTELS, BOOK_HOTEL, GET_BOOKING, CANCEL_BOOKING))
    assert unknown.text == "Which booking should I cancel? Please give me its booking id."
    # offered the person's list: it looks which bookings there are first, from any chat
    assert called(decide(user("cancel my booking"))) == (LIST_BOOKINGS, {})
    assert called(decide(user("What bookings do I have?"))) == (LIST_BOOKINGS, {})
    assert decide(user("What bookings do I have?"), tools=(SEARCH_HOTELS,)).text == "I can't list your bookings here."


def test_after_get_booking_and_cancel_booking() -> None:
    view = {
        "booking_id": BOOKING,
        "status": "confirmed",
        "hotel_name": "Casa",
        "checkin": "2031-03-10",
        "checkout": "2031-03-12",
        "guests": 2,
        "total_price": 164.0,
        "currency": "EUR",
    }
    status = decide(user(f"status of {BOOKING}"), call(GET_BOOKING, {"booking_id": BOOKING}), result(view))
    assert status.text == f"Booking {BOOKING}: confirmed, Casa, 2031-03-10 to 2031-03-12, 2 guests, total 164 EUR."
    cancelled = decide(
        user(f"cancel {BOOKING}"),
        call(CANCEL_BOOKING, {"booking_id": BOOKING}),
        result({**view, "status": "cancelled"}),
    )
    assert cancelled.text == f"Booking {BOOKING} is cancelled."
    late = decide(
        user(f"cancel {BOOKING}"),
        call(CANCEL_BOOKING, {"booking_id": BOOKING}),
        result({"error": {"code": "already_final", "message": "booking is confirmed"}}),
    )
    assert (
        late.text
        == "I could not cancel the booking: the booking is already final and can no longer be cancelled (booking is confirmed)."
    )


def test_a_tool_error_naming_a_field_is_retried_once_with_corrected_arguments() -> None:
    broken = {**SEARCHED, "checkin": SEARCHED["checkout"], "checkout": SEARCHED["checkin"]}
    error = {"error": {"code": "invalid_request", "message": "checkout: must be after checkin"}}
    first = [user("two nights in Lisbon from 10 March for two"), call(SEARCH_HOTELS, broken), result(error)]
    assert called(decide(*first)) == (SEARCH_HOTELS, SEARCHED)
    second = [*first, call(SEARCH_HOTELS, broken, "call_2"), result(error, "call_2")]
    answer = decide(*second)
    assert answer.text == "I could not search for hotels: checkout: must be after checkin (invalid_request)."
    not_json = [
        user("two nights in Lisbon from 10 March for two"),
        call(SEARCH_HOTELS, "{'city': 'Lisbon'"),
        result("Error: arguments are not JSON"),
    ]
    assert called(decide(*not_json)) == (SEARCH_HOTELS, SEARCHED)


def test_an_error_it_cannot_fix_is_explained() -> None:
    error = {"error": {"code": "provider_unavailable", "message": "hotel-api: circuit open"}}
    answer = decide(user("two nights in Lisbon from 10 March for two"), call(SEARCH_HOTELS, SEARCHED), result(error))
    assert answer.text == (
        "I could not search for hotels: the service behind it is not answering right now; please try again in a "
        "moment (hotel-api: circuit open)."
    )


def test_it_only_calls_tools_the_request_offers() -> None:
    answer = decide(user("two nights in Lisbon from 10 March for two"), tools=(BOOK_HOTEL,))
    assert answer.text == "I can't search for hotels here (no search tool)."
    assert decide(user(f"cancel {BOOKING}"), tools=()).text == "I can't cancel bookings here."
    books = decide(*after_search(user("book the cheapest")), tools=(SEARCH_HOTELS,))
    assert books.text is not None and books.text.startswith("I can't book here")
    listing = decide(
        user("book the cheapest hotel in Lisbon from 10 March for 2 nights for two"),
        call(SEARCH_HOTELS, SEARCHED),
        result({"offers": LISBON}),
        tools=(SEARCH_HOTELS,),
    )
    assert listing.text is not None and listing.text.startswith("I found 6 hotels")


def test_small_talk() -> None:
    assert decide(user("hello")).text is not None and "find and book hotels" in str(decide(user("hello")).text)
    assert decide(user("thank you")).text == "You're welcome! Anything else I can do for you?"
    assert decide(user("no thanks")).text == "All right, nothing booked. Anything else?"


# ------------------------------------------------------------------------------------------ tokens and history


@given(st.text())
def test_tokens_join_back_into_the_text(text: str) -> None:
    assert "".join(split_tokens(text)) == text
    assert count_tokens(text) == len(split_tokens(text))


def test_the_tokenizer_splits_words_numbers_and_signs() -> None:
    assert split_tokens("Book 2 rooms, 12345 EUR!") == ["Book", " 2", " rooms", ",", " 123", "45", " EUR", "!"]
    messages = [{"role": "user", "content": "hi there"}]
    assert prompt_tokens(messages) == 3 + 3 + 2
    tools = [{"type": "function", "function": {"name": "x"}}]
    assert prompt_tokens(messages, tools) > prompt_tokens(messages)


def test_a_history_needs_every_tool_call_answered_before_it_goes_on() -> None:
    searched = call(SEARCH_HOTELS, SEARCHED)
    assert history_error([user("x"), searched, result("{}")]) is None
    orphan = history_error([user("x"), searched, user("well?")])
    assert orphan is not None and "call_1" in orphan
    assert history_error([user("x"), searched]) is not None  # ends waiting for its result
    assert history_error([user("x"), result("{}")]) is not None  # a result nobody asked for
    two = AssistantMessage(
        role="assistant",
        tool_calls=[
            ToolCall(id=i, type="function", function=FunctionCall(name=SEARCH_HOTELS, arguments="{}"))
            for i in ("a", "b")
        ],
    )
    assert history_error([user("x"), two, result("{}", "a"), result("{}", "b"), user("y")]) is None
    only_one = history_error([user("x"), two, result("{}", "b"), user("y")])
    assert only_one is not None and only_one.endswith(": a")
