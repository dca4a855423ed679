"""llm-api through the real ``ChatOpenAI`` (tools bound, ``max_retries=0``) over a real socket, state in real Redis:
whole and streamed answers, tool calls that reassemble, usage, a whole conversation, and the errors OpenAI gives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import date, timedelta
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_openai import ChatOpenAI

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from infra.settings import get_settings
from providers import llm_api
from tests.llm import TOOLS, chat_model, offers, streamed
from tests.procs import serve_in_process

KEY = "sk-test-llm-api-0123456789"
TODAY = date(2031, 12, 20)
SYSTEM = SystemMessage(f"You are a hotel concierge. Today is {TODAY.isoformat()}.")


@pytest.fixture
async def base_url(redis: object, settings_env: pytest.MonkeyPatch) -> AsyncIterator[str]:
    settings_env.setenv("LLM_API_KEY", KEY)
    get_settings.cache_clear()
    async with serve_in_process(llm_api.create_app()) as url:
        yield f"{url}/v1"


def model(base_url: str, name: str = PRIMARY_MODEL, **kwargs: Any) -> ChatOpenAI:
    return chat_model(base_url, KEY, name, **kwargs)


SEARCH = "two nights in Lisbon from 10 March for two, under 150 a night"
STAY = {"city": "Lisbon", "checkin": "2032-03-10", "checkout": "2032-03-12", "guests": 2, "max_price_per_night": 150.0}


async def test_a_whole_answer_is_a_tool_call_with_parsed_arguments_and_usage(base_url: str) -> None:
    answer = await model(base_url).bind_tools(TOOLS).ainvoke([SYSTEM, HumanMessage(SEARCH)])
    assert isinstance(answer, AIMessage)
    assert answer.tool_calls == [
        {"name": "search_hotels", "args": STAY, "id": answer.tool_calls[0]["id"], "type": "tool_call"}
    ]
    assert str(answer.tool_calls[0]["id"]).startswith("call_")
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    assert answer.response_metadata["model_name"] == PRIMARY_MODEL
    assert str(answer.id or answer.response_metadata.get("id", "")).startswith(("chatcmpl-", "run-", "lc_"))
    usage = answer.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_a_streamed_tool_call_reassembles_and_the_stream_reports_usage(base_url: str) -> None:
    chat = model(base_url).bind_tools(TOOLS)
    whole = await chat.ainvoke([SYSTEM, HumanMessage(SEARCH)])
    answer = await streamed(chat, [SYSTEM, HumanMessage(SEARCH)])
    assert [(c["name"], c["args"]) for c in answer.tool_calls] == [("search_hotels", STAY)]
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    assert answer.usage_metadata is not None
    assert whole.usage_metadata is not None
    # the same answer costs the same, streamed or not
    assert answer.usage_metadata["input_tokens"] == whole.usage_metadata["input_tokens"]
    assert answer.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


async def test_the_raw_stream_is_what_openai_sends(base_url: str) -> None:
    """Fragments exactly as OpenAI streams them: index, id, type and name first with empty arguments, then the
    arguments in pieces; ``finish_reason`` at the end; a last chunk with the usage and no choices; ``[DONE]``."""
    client = openai.AsyncOpenAI(api_key=KEY, base_url=base_url, max_retries=0)
    stream = await client.chat.completions.create(
        model=FALLBACK_MODEL,
        messages=[{"role": "user", "content": SEARCH}],
        tools=[{"type": "function", "function": {"name": "search_hotels", "parameters": {"type": "object"}}}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.tool_calls is not None
    opening = first.tool_calls[0]
    assert (opening.index, opening.type, opening.function.name, opening.function.arguments) == (
        0,
        "function",
        "search_hotels",
        "",
    )
    assert opening.id is not None and opening.id.startswith("call_")
    fragments = [c.choices[0].delta.tool_calls[0] for c in chunks[1:] if c.choices and c.choices[0].delta.tool_calls]
    assert len(fragments) > 3 and all(f.id is None and f.function.name is None for f in fragments)
    assert json.loads("".join(f.function.arguments or "" for f in fragments))["city"] == "Lisbon"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(fragments) + 1
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert {c.model for c in chunks} == {FALLBACK_MODEL}


async def test_text_streams_token_by_token(base_url: str) -> None:
    chat = model(base_url).bind_tools(TOOLS)
    pieces = [chunk.content async for chunk in chat.astream([HumanMessage("hello")]) if chunk.content]
    assert len(pieces) > 10
    assert "find and book hotels" in "".join(pieces)


async def test_a_whole_conversation_searches_lists_books_the_cheapest_and_reports_it(base_url: str) -> None:
    chat = model(base_url).bind_tools(TOOLS)
    messages: list[BaseMessage] = [SYSTEM, HumanMessage(SEARCH)]
    search = await streamed(chat, messages)
    messages.append(search)
    found = offers(max_price=150)
    messages.append(ToolMessage(json.dumps({"offers": found}), tool_call_id=search.tool_calls[0]["id"]))
    listing = await streamed(chat, messages)
    assert not listing.tool_calls
    assert all(o["name"] in str(listing.content) for o in found)
    assert f"{found[0]['price_per_night']:.0f} EUR a night" in str(listing.content)
    messages += [listing, HumanMessage("book the cheapest")]
    booking = await streamed(chat, messages)
    assert [(c["name"], c["args"]) for c in booking.tool_calls] == [
        (
            "book_hotel",
            {
                "hotel_id": found[0]["hotel_id"],
                "city": "Lisbon",
                "checkin": "2032-03-10",
                "checkout": "2032-03-12",
                "guests": 2,
            },
        )
    ]
    messages.append(booking)
    booked = {
        "booking_id": "b" * 32,
        "status": "confirmed",
        "hotel_name": found[0]["name"],
        "total_price": found[0]["price_per_night"] * 2,
        "currency": "EUR",
    }
    messages.append(ToolMessage(json.dumps(booked), tool_call_id=booking.tool_calls[0]["id"]))
    answer = await streamed(chat, messages)
    assert not answer.tool_calls
    assert f"Booked: {found[0]['name']}, booking {'b' * 32}, confirmed." in str(answer.content)


async def test_a_wrong_or_missing_key_is_401_invalid_api_key(base_url: str) -> None:
    for key in ("sk-wrong", ""):
        client = openai.AsyncOpenAI(api_key=key or "unused", base_url=base_url, max_retries=0)
        if not key:
            client = client.with_options(default_headers={"Authorization": ""})
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"


async def test_an_unknown_model_is_404_model_not_found(base_url: str) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await model(base_url, "gpt-nonexistent").ainvoke([HumanMessage("hi")])
    assert caught.value.code == "model_not_found" and caught.value.param == "model"


async def test_the_models_are_listed(base_url: str) -> None:
    client = openai.AsyncOpenAI(api_key=KEY, base_url=base_url, max_retries=0)
    listed = [m.id async for m in client.models.list()]
    assert listed == [PRIMARY_MODEL, FALLBACK_MODEL]
    assert (await client.models.retrieve(FALLBACK_MODEL)).id == FALLBACK_MODEL
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("nope")


async def test_a_tool_call_without_its_result_is_refused_as_providers_refuse_it(base_url: str) -> None:
    call = {"name": "search_hotels", "args": STAY, "id": "call_orphan", "type": "tool_call"}
    history: list[BaseMessage] = [HumanMessage(SEARCH), AIMessage(content="", tool_calls=[call]), HumanMessage("well?")]
    with pytest.raises(openai.BadRequestError) as caught:
        await model(base_url).bind_tools(TOOLS).ainvoke(history)
    assert caught.value.type == "invalid_request_error" and "call_orphan" in caught.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": PRIMARY_MODEL}, "messages"),
        ({"model": PRIMARY_MODEL, "messages": [], "stream": True}, "messages"),
        ({"model": PRIMARY_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        ({"model": PRIMARY_MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages.[0]"),
        ({"model": PRIMARY_MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"model": PRIMARY_MODEL, "messages": [{"role": "user", "content": "hi"}], "colour": "red"}, "colour"),
    ],
)
async def test_a_bad_body_is_400_invalid_request_error_naming_the_parameter(
    base_url: str, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as http:
        response = await http.post(f"{base_url}/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and str(error["param"]).startswith(param), error
        broken = await http.post(f"{base_url}/chat/completions", content=b"{not json")
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"


async def test_dates_are_the_next_such_day_after_the_prompts_today(base_url: str) -> None:
    today = TODAY - timedelta(days=TODAY.day)  # 30 November
    prompt = SystemMessage(f"Today is {today.isoformat()}.")
    answer = (
        await model(base_url)
        .bind_tools(TOOLS)
        .ainvoke([prompt, HumanMessage("Paris, checkin 28 December checkout 2 January, for 3 people")])
    )
    assert answer.tool_calls[0]["args"] == {
        "city": "Paris",
        "checkin": "2031-12-28",
        "checkout": "2032-01-02",
        "guests": 3,
    }
