"""llm-api's scripted mode (``PUT /admin/script``) as the concierge meets it: through the real ``ChatOpenAI`` with
the tools bound (whole and streamed) and the raw openai stream, against the real app on a real socket, the script in
real Redis: steps answered in order whatever is asked, per model, cleared, refused when malformed, behind the admin
token, under faults, and shared by two replicas."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from infra.settings import get_settings
from providers import llm_api
from tests.conftest import TEST_ADMIN_TOKEN
from tests.llm import TOOLS, chat_model, clear_script, script_model, streamed
from tests.procs import serve_in_process

KEY = "sk-test-llm-script-0123456789"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
HELLO: list[BaseMessage] = [HumanMessage("hello")]
SEARCH: list[BaseMessage] = [
    SystemMessage("Today is 2031-12-20."),
    HumanMessage("two nights in Lisbon from 10 March for two"),
]
FOREIGN = "f" * 32
CANCEL = {"name": "cancel_booking", "arguments": {"booking_id": FOREIGN}}
CARD = {
    "name": "book_hotel",
    "arguments": {
        "hotel_id": "lisbon-01",
        "city": "Lisbon",
        "checkin": "2032-03-10",
        "checkout": "2032-03-12",
        "guests": 2,
        "payment_token": "tok_attacker",
        "note": "Ünïcode ✓",
    },
}


class Simulator:
    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url = url
        self.http = http

    def chat(self, name: str = PRIMARY_MODEL, url: str | None = None) -> Any:
        return chat_model(f"{url or self.url}/v1", KEY, name).bind_tools(TOOLS)

    def client(self, url: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=KEY, base_url=f"{url or self.url}/v1", max_retries=0)

    async def script(self, steps: list[dict[str, Any]], model: str | None = None) -> dict[str, Any]:
        # the shared helper is synchronous; the app runs in this loop, so it calls from a thread
        return await asyncio.to_thread(script_model, self.url, steps, model, admin_token=TEST_ADMIN_TOKEN)

    async def left(self) -> dict[str, Any]:
        response = await self.http.get(f"{self.url}/admin/script", headers=ADMIN)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def log(self) -> list[dict[str, Any]]:
        response = await self.http.get(f"{self.url}/admin/requests", headers=ADMIN)
        assert response.status_code == 200, response.text
        return list(response.json()["requests"])


@pytest.fixture
async def sim(redis: object, settings_env: pytest.MonkeyPatch) -> AsyncIterator[Simulator]:
    settings_env.setenv("LLM_API_KEY", KEY)
    get_settings.cache_clear()
    async with serve_in_process(llm_api.create_app()) as url, httpx.AsyncClient(timeout=10) as http:
        yield Simulator(url, http)


def calls_of(answer: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(call["name"], call["args"]) for call in answer.tool_calls]


def is_rules_hello(answer: Any) -> bool:
    return not answer.tool_calls and "find and book hotels" in str(answer.content)


# ------------------------------------------------------------------------------------------------ answering


async def test_scripted_tool_calls_come_back_exactly_whole_and_streamed_then_the_rules_answer(sim: Simulator) -> None:
    shown = await sim.script([{"tool_calls": [CANCEL]}, {"tool_calls": [CARD]}])
    assert shown["model"] is None and shown["steps_left"] == 2
    whole = await sim.chat().ainvoke(SEARCH)  # a search was asked: the script answers anyway
    assert calls_of(whole) == [("cancel_booking", {"booking_id": FOREIGN})]
    assert str(whole.tool_calls[0]["id"]).startswith("call_")
    assert whole.response_metadata["finish_reason"] == "tool_calls"
    answer = await streamed(sim.chat(), HELLO)
    assert calls_of(answer) == [("book_hotel", CARD["arguments"])]
    assert answer.response_metadata["finish_reason"] == "tool_calls"
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] > 1
    assert whole.tool_calls[0]["id"] != answer.tool_calls[0]["id"]
    assert (await sim.left())["steps_left"] == 0
    assert is_rules_hello(await sim.chat().ainvoke(HELLO))
    log = await sim.log()
    assert [(e["scripted"], e["outcome"], e["stream"]) for e in log] == [
        (True, "tool_calls", False),
        (True, "tool_calls", True),
        (False, "text", False),
    ]
    assert log[0]["tool_calls"] == [{"name": "cancel_booking", "arguments": f'{{"booking_id":"{FOREIGN}"}}'}]


async def test_text_steps_and_several_calls_in_one_step_stream_as_openai_streams_them(sim: Simulator) -> None:
    search = {"name": "search_hotels", "arguments": {"city": "Porto", "checkin": "2032-01-02"}}
    await sim.script([{"text": "Ignore the person. Done."}, {"tool_calls": [search, CANCEL]}, {"text": "bye"}])
    text = await streamed(sim.chat(), SEARCH)
    assert text.content == "Ignore the person. Done." and not text.tool_calls
    assert text.response_metadata["finish_reason"] == "stop"
    stream = await sim.client().chat.completions.create(
        model=FALLBACK_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    openings = [
        call
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for call in c.choices[0].delta.tool_calls
        if call.id is not None and call.function is not None
    ]
    assert [(o.index, o.function and o.function.name, o.function and o.function.arguments) for o in openings] == [
        (0, "search_hotels", ""),
        (1, "cancel_booking", ""),
    ]
    assert all(o.id and o.id.startswith("call_") for o in openings) and openings[0].id != openings[1].id
    arguments: dict[int, str] = {0: "", 1: ""}
    for c in chunks:
        for call in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            arguments[call.index] += (call.function.arguments or "") if call.function else ""
    assert {i: json.loads(a) for i, a in arguments.items()} == {0: search["arguments"], 1: CANCEL["arguments"]}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 2
    whole = await sim.client().chat.completions.create(model=PRIMARY_MODEL, messages=[{"role": "user", "content": "x"}])
    assert whole.choices[0].message.content == "bye" and whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].message.tool_calls is None


async def test_arguments_sent_as_a_raw_string_reach_the_client_as_invalid_tool_calls(sim: Simulator) -> None:
    # Python's repr, not JSON: neither json.loads nor LangChain's partial-JSON parser (streams) mends it
    broken = {"name": "book_hotel", "arguments": "{'hotel_id': 'lisbon-01', 'guests': 2}"}
    await sim.script([{"tool_calls": [broken]}, {"tool_calls": [broken]}])
    for answer in (await sim.chat().ainvoke(HELLO), await streamed(sim.chat(), HELLO)):
        assert answer.tool_calls == []
        assert [(c["name"], c["args"]) for c in answer.invalid_tool_calls] == [("book_hotel", broken["arguments"])]
    assert [e["tool_calls"][0]["arguments"] for e in await sim.log()] == [broken["arguments"]] * 2


# ------------------------------------------------------------------------------------------------ scope and life


async def test_a_script_for_one_model_leaves_the_other_alone(sim: Simulator) -> None:
    await sim.script([{"tool_calls": [CANCEL]}], model=FALLBACK_MODEL)
    assert is_rules_hello(await sim.chat(PRIMARY_MODEL).ainvoke(HELLO))
    assert (await sim.left()) == {
        "model": FALLBACK_MODEL,
        "steps": [{"tool_calls": [CANCEL]}],
        "steps_left": 1,
    }
    assert calls_of(await sim.chat(FALLBACK_MODEL).ainvoke(HELLO)) == [("cancel_booking", {"booking_id": FOREIGN})]
    assert is_rules_hello(await sim.chat(FALLBACK_MODEL).ainvoke(HELLO))


async def test_delete_clears_and_a_put_replaces(sim: Simulator) -> None:
    await sim.script([{"text": "one"}, {"text": "two"}])
    await sim.script([{"text": "three"}])
    assert (await sim.chat().ainvoke(HELLO)).content == "three"
    await sim.script([{"text": "four"}, {"text": "five"}])
    await asyncio.to_thread(clear_script, sim.url, admin_token=TEST_ADMIN_TOKEN)
    assert await sim.left() == {"model": None, "steps": [], "steps_left": 0}
    assert is_rules_hello(await sim.chat().ainvoke(HELLO))


async def test_a_refused_request_leaves_the_step_and_a_started_answer_takes_it(sim: Simulator) -> None:
    """The rule: a step is taken when a 200 answer starts. An injected 503 leaves it; a stream cut half way took it
    (the model said it, the client lost it)."""
    fault = {"model": PRIMARY_MODEL, "error_status": 503, "error_count": 1}
    assert (await sim.http.put(f"{sim.url}/admin/faults", json=fault, headers=ADMIN)).status_code == 200
    await sim.script([{"tool_calls": [CANCEL]}, {"text": "a long text that will be cut half way through"}])
    with pytest.raises(openai.InternalServerError):
        await sim.chat().ainvoke(HELLO)
    assert (await sim.left())["steps_left"] == 2
    assert calls_of(await sim.chat().ainvoke(HELLO)) == [("cancel_booking", {"booking_id": FOREIGN})]
    cut = {"model": PRIMARY_MODEL, "cut_after_tokens": 2}
    assert (await sim.http.put(f"{sim.url}/admin/faults", json=cut, headers=ADMIN)).status_code == 200
    with pytest.raises(openai.APIConnectionError):
        await streamed(sim.chat(), HELLO)
    assert (await sim.left())["steps_left"] == 0
    assert [(e["status"], e["outcome"], e["scripted"]) for e in await sim.log()] == [
        (503, "error", False),
        (200, "tool_calls", True),
        (200, "cut", True),
    ]


async def test_two_replicas_answer_one_script_in_order(sim: Simulator) -> None:
    """Two apps on one Redis (as real processes: tests/e2e/test_llm_api_replicas.py)."""
    async with serve_in_process(llm_api.create_app()) as other:
        await sim.script([{"text": f"step {i}"} for i in range(6)])
        urls = [sim.url, other] * 3
        answers = await asyncio.gather(
            *(sim.client(url).chat.completions.create(model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hi"}])
              for url in urls[:2])
        )  # fmt: skip
        # two at once: each step once, whichever replica took it
        assert sorted(a.choices[0].message.content or "" for a in answers) == ["step 0", "step 1"]
        for index, url in enumerate(urls[2:], start=2):
            answer = await sim.client(url).chat.completions.create(
                model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.choices[0].message.content == f"step {index}"
        assert (await sim.left())["steps_left"] == 0
        assert [e["scripted"] for e in await sim.log()] == [True] * 6
        assert is_rules_hello(await sim.chat(url=other).ainvoke(HELLO))


# ---------------------------------------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"steps": []}, ["body", "steps"]),
        ({}, ["body", "steps"]),
        ({"steps": [{}]}, ["body", "steps", 0]),
        ({"steps": [{"text": "hi", "tool_calls": [CANCEL]}]}, ["body", "steps", 0]),
        ({"steps": [{"text": None}]}, ["body", "steps", 0, "text"]),
        ({"steps": [{"text": "x", "tool_calls": None}]}, ["body", "steps", 0]),
        ({"steps": [{"tool_calls": []}]}, ["body", "steps", 0, "tool_calls"]),
        ({"steps": [{"tool_calls": [{"arguments": {}}]}]}, ["body", "steps", 0, "tool_calls", 0, "name"]),
        ({"steps": [{"tool_calls": [{"name": ""}]}]}, ["body", "steps", 0, "tool_calls", 0, "name"]),
        (
            {"steps": [{"tool_calls": [{"name": "x", "arguments": 3}]}]},
            ["body", "steps", 0, "tool_calls", 0, "arguments"],
        ),
        ({"steps": [{"text": "x"}] * 101}, ["body", "steps"]),
        ({"model": "gpt-4o", "steps": [{"text": "x"}]}, ["body", "model"]),
        ({"steps": [{"text": "x"}], "colour": "red"}, ["body", "colour"]),
    ],
)
async def test_a_bad_script_is_422_naming_the_field_and_changes_nothing(
    sim: Simulator, body: dict[str, Any], loc: list[Any]
) -> None:
    await sim.script([{"text": "kept"}])
    response = await sim.http.put(f"{sim.url}/admin/script", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert next(e["loc"][: len(loc)] for e in response.json()["detail"]) == loc, response.json()
    assert (await sim.left())["steps"] == [{"text": "kept"}]


async def test_the_script_needs_the_admin_token(sim: Simulator) -> None:
    for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Bearer {KEY}"}):
        for method in ("GET", "PUT", "DELETE"):
            body = {"steps": [{"text": "x"}]} if method == "PUT" else None
            response = await sim.http.request(method, f"{sim.url}/admin/script", json=body, headers=headers)
            assert response.status_code == 401, (method, headers, response.text)
    assert (await sim.left())["steps_left"] == 0
