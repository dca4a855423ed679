"""The model dependency under concierge-agent, real processes: a stream cut mid-answer is discarded
(``model_switched``) and the chat shows one answer from the fallback; both models down ends the turn ``failed`` with
``model_unavailable`` and books nothing; replicas sharing the model's rate limit never send more than the provider
allows, and the door refuses with 429 ``overloaded`` and ``Retry-After`` what would not fit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from tests.e2e.test_concierge import chat, events, new_chat, say, start
from tests.procs import free_port
from tests.stack import CORE, Stack, fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SEARCH = "two nights in Lisbon from 10 March for two"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("concierge-model")
    env = {"LLM_FALLBACK_MODEL": FALLBACK_MODEL, "LLM_FIRST_TOKEN_TIMEOUT_S": "3"}
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=env) as stack:
        start(stack, (*CORE, "llm-api", "concierge-agent"))
        yield stack


@pytest.fixture
def sim(stack: Stack) -> Iterator[Stack]:
    stack.fault("llm-api")
    assert stack.admin("DELETE", "llm-api", "requests").status_code == 200
    yield stack
    stack.fault("llm-api")


def llm_log(stack: Stack) -> list[dict[str, Any]]:
    response = stack.admin("GET", "llm-api", "requests")
    assert response.status_code == 200, response.text
    return list(response.json()["requests"])


def test_a_cut_stream_is_discarded_and_the_chat_shows_one_answer_from_the_fallback(sim: Stack) -> None:
    chat_id = new_chat(sim)
    sim.fault("llm-api", model=PRIMARY_MODEL, cut_after_tokens=20)
    turn = say(sim, chat_id, SEARCH)["turn_id"]
    view = chat(sim, chat_id)
    assert view["last_turn"]["outcome"] == "answered", view
    answers = [m for m in view["messages"] if m["role"] == "assistant"]
    assert len(answers) == 1 and "Lisbon" in answers[0]["content"]
    journal = [e for e in events(sim, chat_id) if e.get("turn_id") == turn]
    switches = [e for e in journal if e["kind"] == "model_switched"]
    assert switches and {e["reason"] for e in switches} == {"stream_broken"}
    assert all((e["from_model"], e["to_model"]) == (PRIMARY_MODEL, FALLBACK_MODEL) for e in switches)
    # what the last call streamed on its final attempt is the answer, word for word
    last = max(e["call"] for e in journal if e["kind"] == "token")
    final = max(e["attempt"] for e in journal if e["kind"] == "token" and e["call"] == last)
    streamed = "".join(
        e["text"] for e in journal if e["kind"] == "token" and (e["call"], e["attempt"]) == (last, final)
    )
    assert streamed == answers[0]["content"]
    assert [e["kind"] for e in journal].count("assistant_message") == 1
    assert {e["model"] for e in llm_log(sim) if e["outcome"] == "cut"} == {PRIMARY_MODEL}
    # a cut on purpose is a WARNING in llm-api's log, not the ERROR uvicorn writes for an unfinished response
    log = sim.services["llm-api"].log_text()
    assert "a stream cut on purpose" in log
    assert "ERROR" not in log, sim.services["llm-api"].log_tail()


def test_both_models_down_fails_the_turn_with_model_unavailable_and_books_nothing(sim: Stack) -> None:
    chat_id = new_chat(sim)
    sim.fault("llm-api", model=None, error_status=503, error_rate=1.0)
    say(sim, chat_id, "Book the cheapest hotel in Lisbon from 10 March for 2 nights for two")
    view = chat(sim, chat_id)
    assert view["status"] == "idle" and view["last_turn"]["outcome"] == "failed", view
    assert view["last_turn"]["error"]["code"] == "model_unavailable"  # its own answer, not the turn's budget's
    assert view["bookings"] == []
    assert {e["model"] for e in llm_log(sim)} == {PRIMARY_MODEL, FALLBACK_MODEL}


def test_replicas_sharing_the_limit_send_none_over_it_and_the_door_refuses_with_retry_after(sim: Stack) -> None:
    rpm = 6
    sim.fault("llm-api", model=PRIMARY_MODEL, rpm=rpm)
    env = {"LLM_RPM": str(rpm), "CONCIERGE_TURN_BUDGET_S": "15", "LLM_FALLBACK_MODEL": ""}
    replicas = [sim.procs.serve("concierge-agent", port=free_port(), env=env, wait=False) for _ in range(2)]
    try:
        for proc in replicas:
            proc.wait_ready(180)
        turns_through_the_door(sim, replicas, rpm)
    finally:
        for proc in replicas:
            proc.terminate()


def turns_through_the_door(sim: Stack, replicas: list[Any], rpm: int) -> None:
    accepted: list[tuple[str, str]] = []
    refused: list[httpx.Response] = []
    for i in range(3 * rpm):
        base = replicas[i % 2].url
        created = sim.http.post(f"{base}/chats")
        chat_id = created.json()["chat_id"]
        response = sim.http.post(f"{base}/chats/{chat_id}/messages", json={"text": "hello"})
        if response.status_code == 202:
            accepted.append((base, chat_id))
        else:
            assert response.status_code == 429, response.text
            assert response.json()["error"]["code"] == "overloaded"
            assert int(response.headers["Retry-After"]) >= 1
            refused.append(response)
        time.sleep(0.3)
    outcomes = []
    for base, chat_id in accepted:
        view = httpx.get(f"{base}/chats/{chat_id}", params={"wait": 30}, timeout=40).json()
        outcomes.append((view["last_turn"] or {}).get("outcome"))
        if outcomes[-1] == "failed":
            assert view["last_turn"]["error"]["code"] == "model_rate_limited", view
    entries = llm_log(sim)
    assert [e["status"] for e in entries] == [200] * len(entries) and len(entries) <= rpm
    assert refused and outcomes.count("answered") >= 1
    assert outcomes.count("answered") == len(entries)
