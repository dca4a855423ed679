"""``infra.llm.ChatModel`` against a real llm-api process: the simulator's faults and its request log say what reached
the model (how many requests, to which model, how far apart), the real ``ChatOpenAI`` underneath."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL, SEARCH_HOTELS
from infra.error_table import answer_for
from infra.llm import (
    Budget,
    ChatModel,
    ModelAuthError,
    ModelBadRequestError,
    ModelCapacityError,
    ModelContextTooLongError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelUnavailableError,
    TokenBudgetExhausted,
    Usage,
)
from infra.redis import create_redis, create_sync_redis
from infra.settings import Settings
from infra.telemetry import configure_telemetry
from resilience import OverloadedError, budget_scope, bulkhead_registry, circuit_registry
from tests.conftest import TEST_ADMIN_TOKEN, TEST_SERVICE_SECRET
from tests.llm import TOOLS, offers
from tests.procs import Processes, ServiceProcess, free_port

KEY = "sk-test-llm-client-0123456789"
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
TOOL_SCHEMAS = [convert_to_openai_tool(t) for t in TOOLS]
SEARCH: list[BaseMessage] = [
    SystemMessage("Today is 2031-12-20."),
    HumanMessage("two nights in Lisbon from 10 March for two"),
]
HELLO: list[BaseMessage] = [HumanMessage("hello")]
NONE = Usage()


class Recorder:
    """The chat's side of ``ModelEvents``: tokens per attempt, and the switches."""

    def __init__(self) -> None:
        self.tokens: list[tuple[int, str]] = []
        self.switches: list[tuple[str, str, str, int]] = []

    async def token(self, text: str, attempt: int) -> None:
        self.tokens.append((attempt, text))

    async def switched(self, reason: str, from_model: str, to_model: str, attempt: int) -> None:
        self.switches.append((reason, from_model, to_model, attempt))

    def text(self, attempt: int) -> str:
        return "".join(t for a, t in self.tokens if a == attempt)


class Sim:
    def __init__(self, proc: ServiceProcess, prefix: str, redis_url: str) -> None:
        self.url = proc.url
        self.prefix = prefix
        self.redis_url = redis_url

    def fault(self, **faults: Any) -> None:
        response = httpx.put(f"{self.url}/admin/faults", json=faults, headers=ADMIN)
        assert response.status_code == 200, response.text

    def log(self, model: str | None = None) -> list[dict[str, Any]]:
        params = {"model": model} if model else {}
        response = httpx.get(f"{self.url}/admin/requests", params=params, headers=ADMIN)
        assert response.status_code == 200, response.text
        return list(response.json()["requests"])

    def reset(self) -> None:
        for path in ("faults", "requests"):
            assert httpx.delete(f"{self.url}/admin/{path}", headers=ADMIN).status_code == 200

    def settings(self, **env: Any) -> Settings:
        values: dict[str, Any] = {
            "LLM_BASE_URL": f"{self.url}/v1",
            "LLM_API_KEY": KEY,
            "CONCIERGE_KEY_PREFIX": f"{self.prefix}-client-{uuid.uuid4().hex[:6]}",
            "REDIS_URL": self.redis_url,
            "LLM_FIRST_TOKEN_TIMEOUT_S": 2.0,
            "LLM_TIMEOUT_S": 20.0,
        }
        values.update(env)
        return Settings(**values)


@pytest.fixture(scope="module")
def llm_api(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Sim]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    env = {
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": prefix,
        "CONCIERGE_SERVICE_SECRET": TEST_SERVICE_SECRET,
        "CONCIERGE_ADMIN_TOKEN": TEST_ADMIN_TOKEN,
        "LLM_API_KEY": KEY,
    }
    with Processes(tmp_path_factory.mktemp("llm-client"), env=env) as procs:
        yield Sim(procs.serve("llm-api", timeout=180), prefix, redis_url)
    redis = create_sync_redis(redis_url)
    try:
        keys = list(redis.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            redis.delete(*keys)
    finally:
        redis.close()


@pytest.fixture
def sim(llm_api: Sim) -> Iterator[Sim]:
    llm_api.reset()
    circuit_registry.clear()
    bulkhead_registry.clear()
    yield llm_api
    llm_api.reset()
    circuit_registry.clear()
    bulkhead_registry.clear()


@pytest.fixture
async def make(sim: Sim) -> AsyncIterator[Any]:
    made: list[ChatModel] = []
    clients: list[Any] = []

    def build(redis: bool = False, **env: Any) -> ChatModel:
        settings = sim.settings(**env)
        client = create_redis(sim.redis_url) if redis else None
        if client is not None:
            clients.append(client)
        model = ChatModel(settings, client)
        made.append(model)
        return model

    yield build
    for model in made:
        await model.aclose()
    for client in clients:
        await client.aclose()


async def ask(
    model: ChatModel,
    messages: list[BaseMessage] = SEARCH,
    *,
    budget: Budget | None = None,
    spent_turn: Usage = NONE,
    spent_chat: Usage = NONE,
    events: Recorder | None = None,
) -> Any:
    return await model.respond(
        messages,
        TOOL_SCHEMAS,
        budget=budget or Budget(),
        events=events or Recorder(),
        spent_turn=spent_turn,
        spent_chat=spent_chat,
    )


def spacing(entries: list[dict[str, Any]]) -> list[float]:
    times = [datetime.fromisoformat(e["at"]) for e in entries]
    return [(b - a).total_seconds() for a, b in itertools.pairwise(times)]


# ------------------------------------------------------------------------------------------------ the call


async def test_a_streamed_tool_call_with_the_usage_the_provider_reported(sim: Sim, make: Any) -> None:
    events = Recorder()
    reply = await ask(make(), events=events)
    assert reply.model == PRIMARY_MODEL and reply.attempts == 1
    [call] = reply.message.tool_calls
    assert call["name"] == SEARCH_HOTELS
    assert call["args"] == {"city": "Lisbon", "checkin": "2032-03-10", "checkout": "2032-03-12", "guests": 2}
    [entry] = sim.log()
    assert entry["stream"] is True and entry["usage_reported"] is True and entry["tools"]
    assert reply.usage == Usage(entry["usage"]["prompt_tokens"], entry["usage"]["completion_tokens"], 1)


async def test_text_streams_to_the_events_as_it_comes(sim: Sim, make: Any) -> None:
    events = Recorder()
    reply = await ask(make(), HELLO, events=events)
    assert reply.message.content and not reply.message.tool_calls
    assert len(events.tokens) > 3 and events.text(1) == reply.message.content
    [entry] = sim.log()
    assert entry["text"] == reply.message.content and entry["usage"]["completion_tokens"] == reply.usage.output_tokens


# ------------------------------------------------------------------------------------------------ retries


async def test_a_429_with_retry_after_1_is_waited_then_the_call_succeeds(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=429, error_count=1, retry_after_s=1)
    reply = await ask(make())
    assert reply.model == PRIMARY_MODEL and reply.attempts == 2 and reply.message.tool_calls
    entries = sim.log()
    assert [e["status"] for e in entries] == [429, 200]
    assert spacing(entries)[0] >= 1.0


async def test_a_retry_after_holds_every_replica_until_it_has_passed(sim: Sim, make: Any) -> None:
    """The provider's ``retry-after`` is the account's, not one client's: a replica (or a turn resumed elsewhere after
    a crash) asking meanwhile waits for it too, instead of being refused again."""
    sim.fault(model=PRIMARY_MODEL, error_status=429, error_count=1, retry_after_s=2)
    prefix = f"{sim.prefix}-shared-{uuid.uuid4().hex[:6]}"
    first, other = (make(redis=True, CONCIERGE_KEY_PREFIX=prefix) for _ in range(2))
    waiting = asyncio.create_task(ask(first, HELLO))
    assert first.limiter is not None
    for _ in range(1000):  # the hold is in the shared store (not only the 429 in the provider's log)
        if await first.limiter.wait_for(PRIMARY_MODEL) > 0:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"no hold in the shared store after the 429: {sim.log()}")
    replies = [await ask(other, HELLO), await waiting]
    assert all(r.model == PRIMARY_MODEL for r in replies)
    refused, *answered = sim.log()
    assert refused["status"] == 429 and [e["status"] for e in answered] == [200, 200]
    at = datetime.fromisoformat(refused["at"])
    assert all((datetime.fromisoformat(e["at"]) - at).total_seconds() >= 1.9 for e in answered), sim.log()


async def test_a_retry_after_past_the_budget_goes_to_the_fallback_at_once(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=429, error_rate=1.0, retry_after_s=120)
    events = Recorder()
    with budget_scope(30):
        reply = await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL), events=events)
    assert reply.model == FALLBACK_MODEL and reply.message.tool_calls
    assert [(e["model"], e["status"]) for e in sim.log()] == [(PRIMARY_MODEL, 429), (FALLBACK_MODEL, 200)]
    assert events.switches == [("retry_after_exceeds_budget", PRIMARY_MODEL, FALLBACK_MODEL, 1)]


async def test_a_retry_after_past_the_budget_without_fallback_fails_fast_carrying_the_wait(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=429, error_rate=1.0, retry_after_s=120)
    with budget_scope(30), pytest.raises(ModelRateLimitedError) as caught:
        await ask(make())
    assert caught.value.retry_after == 120
    answer = answer_for(caught.value)
    assert (answer.code, answer.status, answer.retry_after) == ("model_rate_limited", 429, 120)
    assert len(sim.log()) == 1


async def test_insufficient_quota_is_one_request_and_a_clear_code(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=429, error_code="insufficient_quota", error_rate=1.0, retry_after_s=1)
    # the fallback on the same endpoint shares the account's quota: not asked either
    with pytest.raises(ModelQuotaExceededError) as caught:
        await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL))
    assert answer_for(caught.value).code == "model_quota_exceeded" and not answer_for(caught.value).retryable
    assert [e["model"] for e in sim.log()] == [PRIMARY_MODEL]


async def test_x_should_retry_false_is_obeyed(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=503, error_rate=1.0, should_retry=False)
    with pytest.raises(ModelUnavailableError):
        await ask(make())
    assert len(sim.log()) == 1


async def test_503s_are_retried_then_the_call_succeeds(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=503, error_count=2)
    reply = await ask(make())
    assert reply.attempts == 3 and [e["status"] for e in sim.log()] == [503, 503, 200]


@pytest.mark.parametrize("status", [500, 502, 529])
async def test_server_errors_are_retried_up_to_the_policys_attempts(sim: Sim, make: Any, status: int) -> None:
    sim.fault(model=PRIMARY_MODEL, error_status=status, error_rate=1.0)
    with pytest.raises(ModelUnavailableError) as caught:
        await ask(make())
    assert answer_for(caught.value).code == "model_unavailable"
    assert [e["status"] for e in sim.log()] == [status] * 3


async def test_a_context_too_long_is_its_own_code_and_never_retried(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, context_length_exceeded=True)
    with pytest.raises(ModelContextTooLongError) as caught:
        await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL))
    assert answer_for(caught.value).code == "model_context_too_long"
    assert len(sim.log()) == 1


async def test_an_unknown_model_is_a_bad_request_and_a_wrong_key_model_auth(sim: Sim, make: Any) -> None:
    with pytest.raises(ModelBadRequestError) as unknown:
        await ask(make(LLM_MODEL="gpt-unknown"))
    assert answer_for(unknown.value).code == "model_bad_request"
    with pytest.raises(ModelAuthError) as refused:
        await ask(make(LLM_API_KEY="sk-wrong-key-0123456789"))
    assert answer_for(refused.value).code == "model_auth"
    assert [e["model"] for e in sim.log()] == ["gpt-unknown"]  # one request each; a refused key is not logged


# ------------------------------------------------------------------------------------------------ fallback


async def test_the_breaker_opens_then_turns_go_straight_to_the_fallback_until_its_probe(sim: Sim, make: Any) -> None:
    circuit_registry.configure("llm_primary", failure_threshold=3, recovery_timeout=1.5)
    sim.fault(model=PRIMARY_MODEL, error_status=500, error_rate=1.0)
    model = make(LLM_FALLBACK_MODEL=FALLBACK_MODEL)
    first = await ask(model)  # three 500s open the breaker; the fallback answers
    assert first.model == FALLBACK_MODEL
    assert circuit_registry.get("llm_primary").state.value == "open"
    events = Recorder()
    for _ in range(3):
        assert (await ask(model, events=events)).model == FALLBACK_MODEL
    assert {s[0] for s in events.switches} == {"circuit_open"}
    assert len(sim.log(PRIMARY_MODEL)) == 3  # the primary's count stopped growing
    sim.fault(model=PRIMARY_MODEL)  # healthy again
    await asyncio.sleep(1.6)
    probe = await ask(model)
    assert probe.model == PRIMARY_MODEL and len(sim.log(PRIMARY_MODEL)) == 4
    assert circuit_registry.get("llm_primary").state.value == "closed"


async def test_a_stream_cut_after_20_tokens_is_discarded_and_the_fallback_answers(sim: Sim, make: Any) -> None:
    messages = await listing_conversation(make())
    sim.fault(model=PRIMARY_MODEL, cut_after_tokens=20)
    events = Recorder()
    reply = await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL), messages, events=events)
    assert reply.model == FALLBACK_MODEL and reply.attempts == 2
    assert events.switches == [("stream_broken", PRIMARY_MODEL, FALLBACK_MODEL, 1)]
    partial, answer = events.text(1), events.text(2)
    assert partial and len([a for a, _ in events.tokens if a == 1]) <= 20
    assert answer == reply.message.content and answer.startswith(partial)  # the same words, once, from the fallback
    assert [(e["model"], e["outcome"]) for e in sim.log()][-2:] == [(PRIMARY_MODEL, "cut"), (FALLBACK_MODEL, "text")]


async def test_a_cut_stream_without_fallback_starts_again_marked_discarded(sim: Sim, make: Any) -> None:
    messages = await listing_conversation(make())
    sim.fault(model=PRIMARY_MODEL, cut_after_tokens=20)
    events = Recorder()
    model = make()
    with pytest.raises(ModelUnavailableError):
        await ask(model, messages, events=events)
    assert events.switches == [("stream_broken", PRIMARY_MODEL, PRIMARY_MODEL, 1)]
    assert len(sim.log(PRIMARY_MODEL)) == 3  # the first listing, the cut one, one fresh start (cut again)


async def test_a_hang_meets_the_first_token_limit_then_the_fallback(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, hang=True)
    events = Recorder()
    with budget_scope(30):
        reply = await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL, LLM_FIRST_TOKEN_TIMEOUT_S=1.0), events=events)
    assert reply.model == FALLBACK_MODEL
    assert events.switches == [("first_token_timeout", PRIMARY_MODEL, FALLBACK_MODEL, 1)]
    # the hung one is asked once (its entry is written when the client leaves it)
    assert sorted(e["model"] for e in sim.log()) == [PRIMARY_MODEL, FALLBACK_MODEL]


async def test_both_models_down_fails_model_unavailable_well_under_the_budget(sim: Sim, make: Any) -> None:
    sim.fault(model=None, error_status=503, error_rate=1.0)
    with budget_scope(30), pytest.raises(ModelUnavailableError) as caught:
        await ask(make(LLM_FALLBACK_MODEL=FALLBACK_MODEL))
    # its own answer, not the budget's: it gave up on both models rather than retrying into the 30 s
    assert answer_for(caught.value).code == "model_unavailable"
    assert [e["model"] for e in sim.log()] == [PRIMARY_MODEL] * 3 + [FALLBACK_MODEL] * 2


# ------------------------------------------------------------------------------------------------ budgets


async def loop_turn(model: ChatModel, budget: Budget) -> tuple[Usage, BaseException]:
    """A turn whose model calls ``search_hotels`` forever, each result given back, until a budget stops it."""
    messages = list(SEARCH)
    spent = Usage()
    while True:
        try:
            reply = await ask(model, messages, budget=budget, spent_turn=spent, spent_chat=spent)
        except TokenBudgetExhausted as exc:
            return spent, exc
        spent = spent + reply.usage
        messages.append(reply.message)
        for call in reply.message.tool_calls:
            messages.append(ToolMessage(json.dumps({"offers": offers(), "found": 3}), tool_call_id=call["id"]))


async def test_a_model_calling_a_tool_forever_is_stopped_by_the_calls_per_turn(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, loop_tool=True)
    spent, stop = await loop_turn(make(), Budget(calls_per_turn=4))
    assert stop.budget == "turn_calls" and answer_for(stop).code == "token_budget_exhausted"
    entries = sim.log()
    assert len(entries) == 4 == spent.calls
    assert spent.input_tokens == sum(e["usage"]["prompt_tokens"] for e in entries)
    assert spent.output_tokens == sum(e["usage"]["completion_tokens"] for e in entries)


async def test_the_turn_token_budget_stops_the_call_that_would_pass_it(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, loop_tool=True)
    spent, stop = await loop_turn(make(), Budget(turn_tokens=3000, calls_per_turn=100))
    assert stop.budget == "turn_tokens" and spent.total <= 3000
    entries = sim.log()
    assert len(entries) == spent.calls >= 2
    assert spent.total == sum(e["usage"]["total_tokens"] for e in entries)


async def test_the_chat_budget_is_checked_before_anything_is_sent(sim: Sim, make: Any) -> None:
    with pytest.raises(TokenBudgetExhausted) as caught:
        await ask(make(), budget=Budget(chat_tokens=100), spent_chat=Usage(90, 5, 3))
    assert caught.value.budget == "chat_tokens" and sim.log() == []


async def listing_conversation(model: ChatModel) -> list[BaseMessage]:
    """The search asked and its result given: the model's next answer is a long listing in words."""
    reply = await ask(model)
    [call] = reply.message.tool_calls
    result = ToolMessage(json.dumps({"offers": offers(), "found": len(offers())}), tool_call_id=call["id"])
    return [*SEARCH, reply.message, result]


# ------------------------------------------------------------------------------------------------ the shared limiter


async def offer_at_once(replicas: list[ChatModel], calls: int, *, budget_s: float) -> list[str]:
    """``calls`` calls at once, spread over ``replicas``, each within ``budget_s``: ``answered`` or ``refused`` (the
    shared limiter had no room in time, and said when it would)."""

    async def call(i: int) -> str:
        with budget_scope(budget_s):
            try:
                await ask(replicas[i % len(replicas)], HELLO)
            except ModelCapacityError as exc:
                assert exc.retry_after is not None and exc.retry_after > 0
                return "refused"
        return "answered"

    return await asyncio.gather(*(call(i) for i in range(calls)))


async def test_two_replicas_at_3x_the_providers_rpm_never_send_a_request_over_it(sim: Sim, make: Any) -> None:
    rpm = 20
    sim.fault(model=PRIMARY_MODEL, rpm=rpm)
    prefix = f"{sim.prefix}-shared-{uuid.uuid4().hex[:6]}"
    replicas = [make(redis=True, LLM_RPM=rpm, CONCIERGE_KEY_PREFIX=prefix) for _ in range(2)]

    outcomes = await offer_at_once(replicas, 3 * rpm, budget_s=6)
    entries = sim.log()
    assert [e["status"] for e in entries] == [200] * len(entries)  # none over the provider's limit
    assert len(entries) == outcomes.count("answered") <= rpm
    assert outcomes.count("answered") >= 3 and outcomes.count("refused") >= rpm
    gaps = spacing(entries)
    assert sum(1 for g in gaps if g < 1.0) <= 2  # a burst of two (rpm / 10), then one every 60 / 19 s


async def test_two_replicas_sharing_the_providers_tpm_never_send_tokens_over_it(sim: Sim, make: Any) -> None:
    """``LLM_TPM``: each request reserves its prompt estimate (plus ``max_tokens``), settled to the usage reported,
    so the tokens of every replica together stay within the provider's minute."""
    tpm = 6000  # about ten of these requests (584 tokens each) a minute: thirty offered at once
    sim.fault(model=PRIMARY_MODEL, tpm=tpm)
    prefix = f"{sim.prefix}-shared-{uuid.uuid4().hex[:6]}"
    replicas = [make(redis=True, LLM_TPM=tpm, CONCIERGE_KEY_PREFIX=prefix) for _ in range(2)]

    outcomes = await offer_at_once(replicas, 30, budget_s=15)
    entries = sim.log()
    assert [e["status"] for e in entries] == [200] * len(entries)  # none over the provider's limit
    assert sum(e["usage"]["total_tokens"] for e in entries) <= tpm
    assert len(entries) == outcomes.count("answered") >= 2 and outcomes.count("refused") >= 10, outcomes


async def test_the_providers_remaining_headers_tighten_the_limiter_and_the_door_refuses(sim: Sim, make: Any) -> None:
    sim.fault(model=PRIMARY_MODEL, rpm=3)
    model = make(redis=True)  # no LLM_RPM: only what the provider says
    for _ in range(3):
        await ask(model, HELLO)
    with budget_scope(5), pytest.raises(ModelCapacityError) as caught:
        await ask(model, HELLO)
    assert caught.value.retry_after is not None and caught.value.retry_after > 30
    assert [e["status"] for e in sim.log()] == [200, 200, 200]  # the fourth never reached the provider
    with pytest.raises(OverloadedError) as door:
        await model.check_capacity(5)
    answer = answer_for(door.value)
    assert (answer.code, answer.status) == ("overloaded", 429) and answer.retry_after and answer.retry_after > 30


async def test_the_door_sees_the_limiters_queue_and_refuses_what_would_not_fit(sim: Sim, make: Any) -> None:
    model = make(redis=True, LLM_RPM=10)  # a burst of 1, then one request every 6 s
    assert await model.check_capacity(30) == 0.0
    await ask(model, HELLO)
    wait = await model.check_capacity(30)
    assert 5.0 < wait <= 6.0
    with pytest.raises(OverloadedError) as door:
        await model.check_capacity(3)
    assert door.value.retry_after >= 5.0
    assert len(sim.log()) == 1  # asking the door sends nothing


# ------------------------------------------------------------------------------------------------ telemetry


async def test_each_request_is_a_genai_span_and_counted_in_the_genai_metrics(sim: Sim, make: Any) -> None:
    exporter = InMemorySpanExporter()
    configure_telemetry("llm-client-test", exporter)
    labels = {
        "gen_ai_operation_name": "chat",
        "gen_ai_request_model": PRIMARY_MODEL,
        "gen_ai_response_model": PRIMARY_MODEL,
        "gen_ai_token_type": "input",
    }
    before = REGISTRY.get_sample_value("gen_ai_client_token_usage_sum", labels) or 0.0
    sim.fault(model=PRIMARY_MODEL, error_status=503, error_count=1)
    reply = await ask(make())
    spans = [s for s in exporter.get_finished_spans() if s.name == f"chat {PRIMARY_MODEL}"][-2:]
    failed, answered = (dict(s.attributes or {}) for s in spans)
    assert failed["error.type"] == "model_unavailable" and failed["concierge.llm.attempt"] == 1
    assert answered["gen_ai.operation.name"] == "chat" and answered["gen_ai.request.model"] == PRIMARY_MODEL
    assert answered["gen_ai.response.model"] == PRIMARY_MODEL and answered["concierge.llm.attempt"] == 2
    assert answered["gen_ai.usage.input_tokens"] == reply.usage.input_tokens
    assert answered["gen_ai.usage.output_tokens"] == reply.usage.output_tokens
    assert tuple(answered["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    after = REGISTRY.get_sample_value("gen_ai_client_token_usage_sum", labels)
    assert after == before + reply.usage.input_tokens
    retries = REGISTRY.get_sample_value(
        "concierge_llm_retries_total", {"model": PRIMARY_MODEL, "reason": "model_unavailable"}
    )
    assert retries is not None and retries >= 1


# ------------------------------------------------------------------------------------------------ warm-up


async def test_a_warm_up_is_one_small_request_with_the_prompt_and_the_tools(make: Any, sim: Sim) -> None:
    model = make()
    assert await model.warm_up(SEARCH, TOOL_SCHEMAS) is True
    [request] = sim.log()
    assert request["messages"] == len(SEARCH)
    assert request["tools"] == [t["function"]["name"] for t in TOOL_SCHEMAS]
    assert request["stream"] is True


async def test_a_failed_warm_up_is_logged_once_never_raised(make: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = make(LLM_BASE_URL=f"http://127.0.0.1:{free_port()}/v1")  # nobody listens there
    with caplog.at_level(logging.INFO, logger="infra.llm.model"):
        assert await model.warm_up(SEARCH, TOOL_SCHEMAS) is False
    warnings = [r for r in caplog.records if "warm-up" in r.getMessage()]
    assert [r.levelno for r in warnings] == [logging.WARNING]


async def test_a_warm_up_is_cancelled_cleanly(make: Any, sim: Sim) -> None:
    sim.fault(hang=True)  # the model never answers: the warm-up waits until the service shuts down
    model = make()
    task = asyncio.create_task(model.warm_up(SEARCH, TOOL_SCHEMAS))
    for _ in range(1200):  # until its client is built (the request is on its way), or the task ended: 60 s at most
        if model.primary._chat is not None or task.done():
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
