"""llm-api as real processes: two replicas on one Redis agree on "the next N requests fail" and on the published rate
limits (the log, read from either, has every request) and on one script played in order, ``concierge fault llm-api``
drives them, and the real ``ChatOpenAI`` converses across both."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from infra.redis import create_sync_redis
from tests.conftest import TEST_ADMIN_TOKEN, TEST_SERVICE_SECRET
from tests.llm import TOOLS, chat_model, offers, script_model
from tests.procs import Processes, ServiceProcess, concierge_command

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "sk-test-replicas-0123456789"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[list[ServiceProcess]]:
    """Two replicas for the module (starting them is most of its time), one key prefix, removed afterwards."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = {
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": prefix,
        "CONCIERGE_SERVICE_SECRET": TEST_SERVICE_SECRET,
        "CONCIERGE_ADMIN_TOKEN": TEST_ADMIN_TOKEN,
        "LLM_API_KEY": KEY,
    }
    with Processes(tmp_path_factory.mktemp("llm-api"), env=env) as procs:
        yield [procs.serve("llm-api"), procs.serve("llm-api")]
    redis = create_sync_redis(redis_url)
    try:
        keys = list(redis.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            redis.delete(*keys)
    finally:
        redis.close()


@pytest.fixture
def replicas(started: list[ServiceProcess]) -> Iterator[list[ServiceProcess]]:
    yield started
    for path in ("faults", "requests", "script"):
        assert httpx.delete(f"{started[0].url}/admin/{path}", headers=ADMIN).status_code == 200


def client(replica: ServiceProcess) -> openai.OpenAI:
    return openai.OpenAI(api_key=KEY, base_url=f"{replica.url}/v1", max_retries=0, timeout=20)


def log(replica: ServiceProcess) -> list[dict[str, Any]]:
    response = httpx.get(f"{replica.url}/admin/requests", headers=ADMIN)
    assert response.status_code == 200, response.text
    return list(response.json()["requests"])


def concierge(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONCIERGE_ADMIN_TOKEN": TEST_ADMIN_TOKEN}
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_next_n_errors_are_counted_across_replicas_and_set_by_the_cli(replicas: list[ServiceProcess]) -> None:
    first, second = replicas
    done = concierge(
        "fault", "llm-api", "--url", first.url, "--model", PRIMARY_MODEL, "--error-count", "2", "--error-status",
        "429", "--retry-after", "1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"llm-api faults: {PRIMARY_MODEL}: error 429 next 2 (2 left), retry-after 1s"
    outcomes = []
    for replica in (first, second, first, second):
        try:
            client(replica).chat.completions.create(model=PRIMARY_MODEL, messages=HELLO)  # type: ignore[arg-type]
            outcomes.append(200)
        except openai.RateLimitError as exc:
            assert exc.response.headers["retry-after"] == "1"
            outcomes.append(429)
    assert outcomes == [429, 429, 200, 200]
    shown = concierge("fault", "llm-api", "--url", second.url)
    assert f"{PRIMARY_MODEL}: error 429 next 2 (0 left)" in shown.stdout and f"{FALLBACK_MODEL}: none" in shown.stdout
    entries = log(second)
    assert [e["status"] for e in entries] == outcomes
    assert len({e["instance"] for e in entries}) == 2  # both replicas wrote to the one log
    cleared = concierge("fault", "llm-api", "--url", first.url, "--clear")
    assert (
        cleared.returncode == 0
        and cleared.stdout.strip() == f"llm-api faults: {PRIMARY_MODEL}: none; {FALLBACK_MODEL}: none"
    )
    bad = concierge("fault", "llm-api", "--url", first.url, "--error-status", "404")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_the_published_rpm_holds_across_replicas(replicas: list[ServiceProcess]) -> None:
    first, second = replicas
    assert concierge("fault", "llm-api", "--url", first.url, "--model", FALLBACK_MODEL, "--rpm", "3").returncode == 0
    admitted = refused = 0
    for index in range(9):
        replica = replicas[index % 2]
        try:
            answer = client(replica).chat.completions.with_raw_response.create(model=FALLBACK_MODEL, messages=HELLO)  # type: ignore[arg-type]
            assert answer.headers["x-ratelimit-limit-requests"] == "3"
            admitted += 1
        except openai.RateLimitError as exc:
            assert exc.code == "rate_limit_exceeded" and int(exc.response.headers["retry-after"]) >= 1
            assert exc.response.headers["x-ratelimit-remaining-requests"] == "0"
            refused += 1
    assert (admitted, refused) == (3, 6)
    entries = log(first)
    assert [e["outcome"] for e in entries].count("rate_limited") == 6
    assert sum(1 for e in entries if e["status"] == 200) == 3
    # the other model has no limit
    assert client(second).chat.completions.create(model=PRIMARY_MODEL, messages=HELLO)  # type: ignore[arg-type]


async def test_a_conversation_moves_between_replicas(replicas: list[ServiceProcess]) -> None:
    """Nothing of a conversation lives in a replica: each answer comes from the messages alone."""
    first, second = replicas
    messages: list[Any] = [
        SystemMessage("Today is 2031-12-20."),
        HumanMessage("two nights in Lisbon from 10 March for two"),
    ]
    call = await chat_model(f"{first.url}/v1", KEY).bind_tools(TOOLS).ainvoke(messages)
    found = offers()
    messages += [call, ToolMessage(json.dumps({"offers": found}), tool_call_id=call.tool_calls[0]["id"])]
    listing = await chat_model(f"{second.url}/v1", KEY).bind_tools(TOOLS).ainvoke(messages)
    messages += [listing, HumanMessage("book the second one")]
    booking = await chat_model(f"{first.url}/v1", KEY).bind_tools(TOOLS).ainvoke(messages)
    assert booking.tool_calls[0]["args"]["hotel_id"] == found[1]["hotel_id"]


def test_one_script_is_played_in_order_across_replicas(replicas: list[ServiceProcess]) -> None:
    """A step is taken atomically in Redis: whichever replica answers, the steps come in order, each once.
    (Synchronous: ``ChatOpenAI`` keeps its async HTTP client per base URL, bound to the loop of the test before.)"""
    first, second = replicas
    cancel = {"name": "cancel_booking", "arguments": {"booking_id": "f" * 32}}
    steps: list[dict[str, Any]] = [
        {"tool_calls": [cancel]},
        {"text": "step 1"},
        {"tool_calls": [cancel]},
        {"text": "step 3"},
    ]
    shown = script_model(second.url, steps, PRIMARY_MODEL, admin_token=TEST_ADMIN_TOKEN)
    assert shown["steps_left"] == 4 and shown["model"] == PRIMARY_MODEL
    messages = [HumanMessage("two nights in Lisbon from 10 March for two")]
    answers = [
        chat_model(f"{replica.url}/v1", KEY).bind_tools(TOOLS).invoke(messages)
        for replica in (first, second, first, second, first)
    ]
    assert [(c["name"], c["args"]) for c in answers[0].tool_calls] == [("cancel_booking", {"booking_id": "f" * 32})]
    assert answers[1].content == "step 1" and not answers[1].tool_calls
    assert [c["name"] for c in answers[2].tool_calls] == ["cancel_booking"]
    assert answers[3].content == "step 3"
    assert [c["name"] for c in answers[4].tool_calls] == ["search_hotels"]  # the rules again
    entries = log(first)
    assert [e["scripted"] for e in entries] == [True, True, True, True, False]
    assert len({e["instance"] for e in entries if e["scripted"]}) == 2
