"""llm-api's faults, rate limits and request log, each seen as the concierge sees it: through ``ChatOpenAI`` and the
openai exceptions (``max_retries=0``), against a real socket and real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from infra.settings import get_settings
from providers import llm_api
from tests.conftest import TEST_ADMIN_TOKEN
from tests.llm import TOOLS, chat_model, offers, streamed
from tests.procs import serve_in_process

KEY = "sk-test-llm-faults-0123456789"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
SYSTEM = SystemMessage("Today is 2031-12-20.")
SEARCH = [SYSTEM, HumanMessage("two nights in Lisbon from 10 March for two")]
HELLO = [HumanMessage("hello")]


class Simulator:
    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url = url
        self.v1 = f"{url}/v1"
        self.http = http

    def chat(self, name: str = PRIMARY_MODEL, **kwargs: Any) -> Any:
        return chat_model(self.v1, KEY, name, **kwargs).bind_tools(TOOLS)

    def client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=KEY, base_url=self.v1, max_retries=0, **kwargs)

    async def fault(self, **faults: Any) -> dict[str, Any]:
        response = await self.http.put(f"{self.url}/admin/faults", json=faults, headers=ADMIN)
        assert response.status_code == 200, response.text
        return dict(response.json())

    async def log(self, **params: Any) -> list[dict[str, Any]]:
        response = await self.http.get(f"{self.url}/admin/requests", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        return list(response.json()["requests"])

    async def wait_log(self, count: int, within_s: float = 10) -> list[dict[str, Any]]:
        deadline = time.monotonic() + within_s
        while True:
            entries = await self.log()
            if len(entries) >= count or time.monotonic() > deadline:
                return entries
            await asyncio.sleep(0.05)


@pytest.fixture
async def sim(redis: object, settings_env: pytest.MonkeyPatch) -> AsyncIterator[Simulator]:
    settings_env.setenv("LLM_API_KEY", KEY)
    get_settings.cache_clear()
    async with serve_in_process(llm_api.create_app()) as url, httpx.AsyncClient(timeout=10) as http:
        yield Simulator(url, http)


# ---------------------------------------------------------------------------------------------------- errors


async def test_one_429_with_retry_after_then_fine(sim: Simulator) -> None:
    await sim.fault(model=PRIMARY_MODEL, error_status=429, error_count=1, retry_after_s=1)
    with pytest.raises(openai.RateLimitError) as caught:
        await sim.chat().ainvoke(SEARCH)
    error = caught.value
    assert error.code == "rate_limit_exceeded"
    assert error.response.headers["retry-after"] == "1" and error.response.headers["retry-after-ms"] == "1000"
    assert error.request_id is not None and error.request_id.startswith("req_")
    answer = await sim.chat().ainvoke(SEARCH)
    assert answer.tool_calls[0]["name"] == "search_hotels"
    log = await sim.log()
    assert [(e["status"], e["outcome"]) for e in log] == [(429, "error"), (200, "tool_calls")]
    assert log[0]["request_id"] == error.request_id and log[0]["fault"] == "error_429"
    view = (await sim.http.get(f"{sim.url}/admin/faults", headers=ADMIN)).json()
    assert view["errors_left"] == {PRIMARY_MODEL: 0, FALLBACK_MODEL: None}


async def test_insufficient_quota_says_retrying_cannot_help(sim: Simulator) -> None:
    await sim.fault(error_status=429, error_code="insufficient_quota", error_rate=1, should_retry=False)
    with pytest.raises(openai.RateLimitError) as caught:
        await sim.chat().ainvoke(HELLO)
    assert caught.value.code == "insufficient_quota" and caught.value.type == "insufficient_quota"
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in caught.value.response.headers


@pytest.mark.parametrize("status", [500, 502, 503, 529])
async def test_server_errors_are_internal_server_errors(sim: Simulator, status: int) -> None:
    await sim.fault(error_status=status, error_rate=1, retry_after_s=0.5, should_retry=True)
    for streaming in (False, True):
        with pytest.raises(openai.InternalServerError) as caught:
            if streaming:
                await streamed(sim.chat(), HELLO)
            else:
                await sim.chat().ainvoke(HELLO)
        assert caught.value.status_code == status
        assert caught.value.response.headers["retry-after-ms"] == "500"
        assert caught.value.response.headers["x-should-retry"] == "true"
    assert {e["status"] for e in await sim.log()} == {status}


async def test_faults_are_per_model(sim: Simulator) -> None:
    await sim.fault(model=PRIMARY_MODEL, error_status=503, error_rate=1)
    with pytest.raises(openai.InternalServerError):
        await sim.chat(PRIMARY_MODEL).ainvoke(HELLO)
    assert (await sim.chat(FALLBACK_MODEL).ainvoke(HELLO)).content
    await sim.http.delete(f"{sim.url}/admin/faults", params={"model": PRIMARY_MODEL}, headers=ADMIN)
    assert (await sim.chat(PRIMARY_MODEL).ainvoke(HELLO)).content


async def test_context_length_exceeded_injected_and_real(sim: Simulator) -> None:
    await sim.fault(model=PRIMARY_MODEL, context_length_exceeded=True)
    with pytest.raises(openai.BadRequestError) as caught:
        await sim.chat().ainvoke(HELLO)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    long = [HumanMessage("word " * 17_000)]  # over sim-small's 16384 tokens, under sim-large's 32768
    with pytest.raises(openai.BadRequestError) as caught:
        await sim.chat(FALLBACK_MODEL).ainvoke(long)
    assert caught.value.code == "context_length_exceeded" and "16384" in caught.value.message


# ------------------------------------------------------------------------------------------- time and streams


async def test_latency_to_the_first_token_and_between_tokens(sim: Simulator) -> None:
    await sim.fault(first_token_latency_s=0.6, token_delay_s=0.02)
    started = time.monotonic()
    first_at = None
    pieces = 0
    async for chunk in sim.chat().astream(HELLO):
        if chunk.content:
            first_at = first_at or time.monotonic()
            pieces += 1
    ended = time.monotonic()
    assert first_at is not None and first_at - started >= 0.6
    assert ended - first_at >= 0.02 * (pieces - 1)
    entry = (await sim.log())[-1]
    assert entry["fault"] == "latency" and entry["outcome"] == "text"
    assert entry["first_token_ms"] >= 600 and entry["duration_ms"] >= entry["first_token_ms"]


async def test_a_cut_stream_raises_mid_iteration_after_n_tokens(sim: Simulator) -> None:
    await sim.fault(cut_after_tokens=5)
    received = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in sim.chat().astream(HELLO):
            received.append(chunk.content)
    assert len([c for c in received if c]) == 5
    raw = sim.client()
    with pytest.raises(openai.APIConnectionError):
        stream = await raw.chat.completions.create(
            model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hello"}], stream=True
        )
        async for _ in stream:
            pass
    entry = (await sim.log())[-1]
    assert (entry["outcome"], entry["tokens_sent"], entry["usage"]["completion_tokens"]) == ("cut", 5, 5)
    assert entry["usage_reported"] is False


async def test_a_cut_tool_call_stream_breaks_its_arguments_midway(sim: Simulator) -> None:
    await sim.fault(cut_after_tokens=4)
    with pytest.raises(openai.APIConnectionError):
        await streamed(sim.chat(), SEARCH)
    await sim.fault(cut_after_tokens=4)
    with pytest.raises(openai.APIConnectionError):  # a whole answer cut: the body breaks off
        await sim.chat().ainvoke(SEARCH)


async def test_a_hang_meets_the_clients_timeout_and_is_logged(sim: Simulator) -> None:
    await sim.fault(model=PRIMARY_MODEL, hang=True)
    for streaming in (False, True):
        with pytest.raises(openai.APITimeoutError):
            chat = sim.chat(timeout=0.5)
            if streaming:
                await streamed(chat, HELLO)
            else:
                await chat.ainvoke(HELLO)
    entries = await sim.wait_log(2)
    assert [(e["outcome"], e["status"], e["stream"]) for e in entries] == [("hang", 499, False), ("hang", 499, True)]
    assert (await sim.chat(FALLBACK_MODEL).ainvoke(HELLO)).content  # the other model answers


# --------------------------------------------------------------------------------------- what the model writes


async def test_malformed_tool_arguments_invalid_json_and_bad_stay(sim: Simulator) -> None:
    await sim.fault(malformed_tool_args="invalid_json")
    answer = await sim.chat().ainvoke(SEARCH)
    assert not answer.tool_calls and answer.invalid_tool_calls[0]["name"] == "search_hotels"
    streamed_answer = await streamed(sim.chat(), SEARCH)
    assert not streamed_answer.tool_calls and streamed_answer.invalid_tool_calls
    await sim.fault(malformed_tool_args="bad_stay")
    args = (await sim.chat().ainvoke(SEARCH)).tool_calls[0]["args"]
    assert date.fromisoformat(args["checkout"]) < date.fromisoformat(args["checkin"])


async def test_a_tool_error_naming_a_field_is_retried_once_then_explained(sim: Simulator) -> None:
    await sim.fault(malformed_tool_args="bad_stay")
    chat = sim.chat()
    messages: list[BaseMessage] = list(SEARCH)
    for _ in range(2):
        call = await chat.ainvoke(messages)
        assert call.tool_calls[0]["name"] == "search_hotels"
        error = {
            "error": {"code": "invalid_request", "message": "checkout: must be after checkin", "field": "checkout"}
        }
        messages += [call, ToolMessage(json.dumps(error), tool_call_id=call.tool_calls[0]["id"])]
    answer = await chat.ainvoke(messages)
    assert not answer.tool_calls
    assert "I could not search for hotels: checkout: must be after checkin" in str(answer.content)


async def test_a_runaway_model_searches_on_every_request(sim: Simulator) -> None:
    await sim.fault(loop_tool=True)
    chat = sim.chat()
    messages: list[BaseMessage] = list(SEARCH)
    for _ in range(3):
        call = await streamed(chat, messages)
        assert [c["name"] for c in call.tool_calls] == ["search_hotels"]
        messages += [call, ToolMessage(json.dumps({"offers": offers()}), tool_call_id=call.tool_calls[0]["id"])]
    log = await sim.log()
    assert [e["fault"] for e in log] == ["loop_tool"] * 3
    assert sum(e["usage"]["total_tokens"] for e in log) > 0


async def test_max_tokens_cuts_the_answer_with_finish_reason_length(sim: Simulator) -> None:
    answer = await sim.chat(max_tokens=5).ainvoke(HELLO)
    assert answer.response_metadata["finish_reason"] == "length"
    assert answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 5


# --------------------------------------------------------------------------------------------------- rate limits


async def test_published_rate_limits_refuse_over_rpm_with_retry_after_and_headers(sim: Simulator) -> None:
    await sim.fault(model=PRIMARY_MODEL, rpm=2)
    raw = sim.client()
    for remaining in (1, 0):
        answer = await raw.chat.completions.with_raw_response.create(
            model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hello"}]
        )
        assert answer.headers["x-ratelimit-limit-requests"] == "2"
        assert answer.headers["x-ratelimit-remaining-requests"] == str(remaining)
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
    with pytest.raises(openai.RateLimitError) as caught:
        await sim.chat().ainvoke(HELLO)
    headers = caught.value.response.headers
    assert caught.value.code == "rate_limit_exceeded" and caught.value.type == "requests"
    assert 55 <= int(headers["retry-after"]) <= 60 and headers["x-ratelimit-remaining-requests"] == "0"
    assert (await sim.chat(FALLBACK_MODEL).ainvoke(HELLO)).content  # the limit is per model
    assert [e["outcome"] for e in await sim.log(model=PRIMARY_MODEL)] == ["text", "text", "rate_limited"]


async def test_published_rate_limits_refuse_over_tpm(sim: Simulator) -> None:
    await sim.fault(tpm=100)
    first = await sim.client().chat.completions.with_raw_response.create(
        model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hello"}]
    )
    used = first.parse().usage
    assert used is not None and 100 - used.total_tokens == int(first.headers["x-ratelimit-remaining-tokens"])
    with pytest.raises(openai.RateLimitError) as caught:
        await chat_model(sim.v1, KEY).ainvoke([HumanMessage("hello")])  # no tools: fits in a minute, not now
    assert caught.value.type == "tokens" and "retry-after" in caught.value.response.headers
    with pytest.raises(openai.RateLimitError) as never:
        await sim.chat().ainvoke(HELLO)  # the tools alone are more than the minute's tokens
    assert "retry-after" not in never.value.response.headers


# ------------------------------------------------------------------------------------------ the admin routes


async def test_the_admin_routes_need_the_admin_token_and_refuse_bad_faults(sim: Simulator) -> None:
    assert (await sim.http.get(f"{sim.url}/admin/faults")).status_code == 401
    assert (
        await sim.http.get(f"{sim.url}/admin/requests", headers={"Authorization": f"Bearer {KEY}"})
    ).status_code == 401
    for bad in (
        {"error_rate": 2},
        {"error_code": "Not a code"},
        {"error_status": 418},
        {"model": "gpt-5"},
        {"hang": "yes"},
        {"rpm": 0},
    ):
        response = await sim.http.put(f"{sim.url}/admin/faults", json=bad, headers=ADMIN)
        assert response.status_code == 422, (bad, response.text)
    view = await sim.fault(model=FALLBACK_MODEL, token_delay_s=0.01)
    assert view["models"][FALLBACK_MODEL]["token_delay_s"] == 0.01
    assert view["models"][PRIMARY_MODEL]["token_delay_s"] == 0
    cleared = (await sim.http.delete(f"{sim.url}/admin/faults", headers=ADMIN)).json()
    assert all(not any(v for k, v in f.items() if k != "error_status") for f in cleared["models"].values())


async def test_the_request_log_keeps_what_reached_the_model(sim: Simulator) -> None:
    chat = sim.chat()
    call = await streamed(chat, SEARCH)
    messages = [*SEARCH, call, ToolMessage(json.dumps({"offers": offers()}), tool_call_id=call.tool_calls[0]["id"])]
    text = await chat.ainvoke(messages)
    with pytest.raises(openai.NotFoundError):
        await sim.chat("nope").ainvoke(HELLO)
    with pytest.raises(openai.AuthenticationError):  # refused at the door: not logged
        await chat_model(sim.v1, "sk-wrong").ainvoke(HELLO)
    log = await sim.log()
    assert [(e["model"], e["stream"], e["status"], e["outcome"]) for e in log] == [
        (PRIMARY_MODEL, True, 200, "tool_calls"),
        (PRIMARY_MODEL, False, 200, "text"),
        ("nope", False, 404, "error"),
    ]
    first, second, _ = log
    assert first["tools"] == ["search_hotels", "book_hotel", "get_booking", "cancel_booking"]
    assert first["last_user"] == "two nights in Lisbon from 10 March for two" and first["messages"] == 2
    assert json.loads(first["tool_calls"][0]["arguments"]) == call.tool_calls[0]["args"]
    assert first["usage_reported"] is True  # stream_usage: the last chunk carried it
    assert call.usage_metadata is not None and first["usage"]["total_tokens"] == call.usage_metadata["total_tokens"]
    assert text.usage_metadata is not None and second["usage"]["prompt_tokens"] == text.usage_metadata["input_tokens"]
    assert second["text"] == text.content and second["messages"] == 4
    assert [e["model"] for e in await sim.log(model="nope")] == ["nope"]
    assert len(await sim.log(limit=1)) == 1
    assert (await sim.http.delete(f"{sim.url}/admin/requests", headers=ADMIN)).json() == {"requests": [], "count": 0}
    assert await sim.log() == []


async def test_a_conversation_that_ends_while_streaming_is_logged_as_client_gone(sim: Simulator) -> None:
    await sim.fault(token_delay_s=0.05)
    raw = sim.client()
    stream = await raw.chat.completions.create(
        model=PRIMARY_MODEL, messages=[{"role": "user", "content": "hello"}], stream=True
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    await stream.close()
    entries = await sim.wait_log(1)
    assert entries[-1]["outcome"] == "client_gone" and 0 < entries[-1]["tokens_sent"] < 53
