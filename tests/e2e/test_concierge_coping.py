"""The concierge copes with what small models do (issue 33), played by a scripted model (llm-api's scripted mode)
against real processes: a call repeated in one turn is answered from its earlier result without asking the peer
again, a ``book_hotel`` for a hotel search does not offer is answered with the offers it does (nothing booked, no
approval asked), a model still calling tools on the turn's last allowed call gets the turn answered in words, and
with guided tools (``LLM_GUIDED_TOOLS=on``, a local endpoint's default) the model is offered search first, then
``book_hotel`` once a search shows hotels, then the booking tools once the chat has one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.concierge.graph import OUT_OF_STEPS
from domain.llm import TOOL_NAMES
from tests.e2e.test_concierge import approve, awaiting, chat, events, new_chat, say, start
from tests.e2e.test_concierge_consent import calls, error_code, offers, results, stay_args, text
from tests.stack import CORE, Stack, fresh_database

pytestmark = pytest.mark.e2e

SERVICES = (*CORE, "llm-api", "concierge-agent")
MAX_CALLS = 4
"""``LLM_MAX_CALLS_PER_TURN`` of this module's stack: a runaway turn is over in a few calls."""


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("coping")
    # guided as a local model would be (llm-api is not one): a scripted step plays whatever the request offers
    env = {"APPROVAL_TTL_S": "600", "LLM_MAX_CALLS_PER_TURN": str(MAX_CALLS), "LLM_GUIDED_TOOLS": "on"}
    with Stack(tmp, redis_url, database_url=database, env=env) as stack:
        start(stack, SERVICES)
        yield stack


@pytest.fixture(autouse=True)
def no_script(stack: Stack) -> Iterator[None]:
    """Every test starts and ends with no script."""
    stack.script_model(None)
    yield
    stack.script_model(None)


def hotel_searches(stack: Stack) -> int:
    """The searches hotel-api answered (its ``GET /hotels`` in its /metrics): each search-agent search asks once."""
    page = stack.http.get(f"{stack.url('hotel-api')}/metrics").text
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
            if sample.name == "concierge_http_requests_total"
            and sample.labels.get("method") == "GET"
            and sample.labels.get("route") == "/hotels"
        )
    )


def offered(stack: Stack) -> list[tuple[list[str], str | None]]:
    """Each model request llm-api received, oldest first: the tools it offered and its ``tool_choice``."""
    response = stack.admin("GET", "llm-api", "requests")
    assert response.status_code == 200, response.text
    return [(r["tools"], r["tool_choice"]) for r in response.json()["requests"]]


def kinds(stack: Stack, chat_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(stack, chat_id) if e["kind"] == kind]


# --------------------------------------------------------------------------------------------------- tests


def test_a_repeated_search_is_answered_from_the_earlier_result_without_searching_again(stack: Stack) -> None:
    args = stay_args("Porto")
    reordered = dict(reversed(list(args.items())))  # the same arguments, in another order
    chat_id = new_chat(stack)
    before = hotel_searches(stack)
    stack.script_model([calls(("search_hotels", args)), calls(("search_hotels", reordered)), text("Here.")])
    say(stack, chat_id, "hotels in Porto please")
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and view["last_turn"]["outcome"] == "answered", view
    assert view["last_turn"]["usage"]["calls"] == 3, view["last_turn"]  # the repeat still took a model call

    first, second = results(stack, chat_id)
    assert first["status"] == "success" and first["repeated"] is False, first
    assert second["status"] == "success" and second["repeated"] is True, second
    assert second["content"]["offers"] == first["content"]["offers"] and first["content"]["offers"], second
    assert second["content"].get("repeated") is True, second
    assert "already called search_hotels" in second["content"]["note"], second
    assert hotel_searches(stack) - before == 1  # the repeat asked nobody


def test_a_hotel_search_does_not_offer_is_answered_with_the_offers_then_an_offered_one_is_asked(stack: Stack) -> None:
    args = stay_args("Lisbon")
    chosen = offers(stack, args)[1]["hotel_id"]
    chat_id = new_chat(stack)
    stack.script_model(
        [
            calls(("book_hotel", {"hotel_id": "12345", **args})),
            calls(("book_hotel", {"hotel_id": chosen, **args})),
            text("Booked."),
        ]
    )
    say(stack, chat_id, "book a hotel in Lisbon", payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    assert pending["action"] == "book" and pending["hotel_id"] == chosen, pending

    (refused,) = results(stack, chat_id)
    assert refused["status"] == "error" and error_code(refused) == "not_offered", refused
    error = refused["content"]["error"]
    assert "12345" in error["message"] and error["found"] >= len(error["offers"]) > 0, error
    assert chosen in [offer["hotel_id"] for offer in error["offers"]], error
    assert {"hotel_id", "name", "total_price", "currency"} <= set(error["offers"][0]), error
    # only the offered hotel was put to the person
    (asked,) = kinds(stack, chat_id, "approval_requested")
    assert asked["approval"]["hotel_id"] == chosen, asked

    assert approve(stack, chat_id, pending["approval_id"], {"approve": False}).status_code == 202
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and view["bookings"] == [], view


def test_a_model_still_calling_tools_on_its_last_allowed_call_gets_the_turn_answered_in_words(stack: Stack) -> None:
    searches = [calls(("search_hotels", {**stay_args(), "guests": guests})) for guests in range(1, MAX_CALLS + 1)]
    chat_id = new_chat(stack)
    stack.script_model(searches)  # a tool call on every call the turn allows, each a new one
    say(stack, chat_id, "find me something")
    view = chat(stack, chat_id)
    assert view["status"] == "idle", view
    assert view["last_turn"]["outcome"] == "answered" and view["last_turn"]["error"] is None, view["last_turn"]
    assert view["last_turn"]["usage"]["calls"] == MAX_CALLS, view["last_turn"]
    assert view["messages"][-1] == {
        "role": "assistant",
        "content": OUT_OF_STEPS,
        "turn_id": view["last_turn"]["turn_id"],
    }
    # the calls before the last ran; the last one's did not
    ran = kinds(stack, chat_id, "tool_call")
    assert [c["arguments"]["guests"] for c in ran] == list(range(1, MAX_CALLS)), ran
    assert len(results(stack, chat_id)) == MAX_CALLS - 1
    (said,) = kinds(stack, chat_id, "assistant_message")
    assert said["text"] == OUT_OF_STEPS, said
    # the chat takes the next message, with a history the provider accepts
    stack.script_model([text("Anything else?")])
    say(stack, chat_id, "thanks")
    assert chat(stack, chat_id)["last_turn"]["outcome"] == "answered"


def test_guided_the_model_is_offered_search_first_then_book_once_it_shows_hotels_then_the_booking_tools(
    stack: Stack,
) -> None:
    args = stay_args("Lisbon")
    chosen = offers(stack, args)[0]["hotel_id"]
    chat_id = new_chat(stack)
    assert stack.admin("DELETE", "llm-api", "requests").status_code == 200
    stack.script_model(
        [calls(("search_hotels", args)), calls(("book_hotel", {"hotel_id": chosen, **args})), text("Booked.")]
    )
    say(stack, chat_id, "book the cheapest in Lisbon", payment_token="tok_visa")
    pending = awaiting(stack, chat_id)
    assert pending["hotel_id"] == chosen, pending
    assert approve(stack, chat_id, pending["approval_id"], {"approve": True}).status_code == 202
    view = chat(stack, chat_id)
    assert view["status"] == "idle" and len(view["bookings"]) == 1, view
    assert stack.booking(view["bookings"][0])["status"] == "confirmed"
    stack.script_model([text("It is confirmed.")])
    say(stack, chat_id, "is it booked?")
    assert chat(stack, chat_id)["last_turn"]["outcome"] == "answered"

    search, book, every = ["search_hotels"], ["search_hotels", "book_hotel"], list(TOOL_NAMES)
    assert offered(stack) == [
        (search, "required"),  # nothing found yet: the turn starts with a call, and only a search can succeed
        (book, None),  # the search showed hotels
        (every, None),  # after the approved booking: the chat has one
        (every, None),  # the next turn: its first call may answer in words
    ]
