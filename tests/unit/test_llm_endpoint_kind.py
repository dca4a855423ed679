"""A local model endpoint gets limits that fit a CPU model and a warm-up; the simulated llm-api and a hosted model
keep today's; an explicitly set limit always wins (``Settings.llm_limits``, ``Settings.llm_warm_up``); a local
one is offered the tools the chat allows (``Settings.llm_guides_tools``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from identity.hosts import is_local_host
from infra.llm import ChatModel
from infra.settings import ModelLimits, Settings
from resilience import bulkhead_registry

HOSTED = ModelLimits(first_token_s=15.0, call_s=60.0)
LOCAL = ModelLimits(first_token_s=60.0, call_s=300.0)
OLLAMA = "http://127.0.0.1:11434/v1"


def settings(**env: Any) -> Settings:
    return Settings(**{"LLM_API_URL": "http://127.0.0.1:8012", **env})


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("gpu.localhost", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.7", True),
        ("192.168.1.20", True),
        ("172.17.0.1", True),
        ("api.openai.com", False),
        ("llm-api", False),  # a name is not resolved
        ("8.8.8.8", False),
        ("", False),
    ],
)
def test_a_local_host_is_loopback_private_or_localhost(host: str, local: bool) -> None:
    assert is_local_host(host) is local


@pytest.mark.parametrize(
    "base_url", [OLLAMA, "http://localhost:8000/v1", "http://192.168.1.20:8080/v1", "http://[::1]:8080/v1"]
)
def test_a_local_endpoint_gets_the_local_limits_and_a_warm_up(base_url: str) -> None:
    s = settings(LLM_BASE_URL=base_url)
    assert s.llm_limits(base_url) == LOCAL
    assert s.llm_warm_up is True
    assert s.llm_guides_tools is True


@pytest.mark.parametrize(
    "env",
    [
        {},  # the simulated llm-api, LLM_API_URL + /v1
        {"LLM_BASE_URL": "http://127.0.0.1:8012/v1"},  # the same, named
        {"LLM_BASE_URL": "https://api.openai.com/v1"},
        {"LLM_BASE_URL": "http://llm-api:8012/v1"},  # compose's and k8s's
    ],
)
def test_the_simulator_and_a_hosted_model_keep_todays_limits_and_no_warm_up(env: dict[str, str]) -> None:
    s = settings(**env)
    assert s.llm_limits(s.llm_primary_base_url) == HOSTED
    assert s.llm_warm_up is False
    assert s.llm_guides_tools is False


def test_an_explicit_limit_always_wins() -> None:
    s = settings(LLM_BASE_URL=OLLAMA, LLM_FIRST_TOKEN_TIMEOUT_S="5")
    assert s.llm_limits(OLLAMA) == ModelLimits(first_token_s=5.0, call_s=300.0)
    s = settings(LLM_BASE_URL=OLLAMA, LLM_TIMEOUT_S="40", LLM_LOCAL_FIRST_TOKEN_TIMEOUT_S="90")
    assert s.llm_limits(OLLAMA) == ModelLimits(first_token_s=90.0, call_s=40.0)


def test_the_endpoint_kind_decides_for_every_endpoint() -> None:
    local = settings(LLM_ENDPOINT_KIND="local", LLM_BASE_URL="https://models.example.com/v1")
    assert local.llm_limits("https://models.example.com/v1") == LOCAL
    assert local.llm_warm_up is True
    remote = settings(LLM_ENDPOINT_KIND="remote", LLM_BASE_URL=OLLAMA)
    assert remote.llm_limits(OLLAMA) == HOSTED
    assert remote.llm_warm_up is False


def test_a_malformed_base_url_keeps_the_hosted_limits() -> None:
    s = settings(LLM_BASE_URL="http://127.0.0.1:port/v1")
    assert s.llm_limits(s.llm_primary_base_url) == HOSTED


def test_each_endpoint_has_its_own_limits() -> None:
    s = settings(LLM_BASE_URL=OLLAMA, LLM_FALLBACK_BASE_URL="https://api.openai.com/v1")
    assert s.llm_limits(OLLAMA) == LOCAL
    assert s.llm_limits("https://api.openai.com/v1") == HOSTED


@pytest.mark.parametrize(("warmup", "base_url", "expected"), [("on", None, True), ("off", OLLAMA, False)])
def test_llm_warmup_on_or_off_decides_alone(warmup: str, base_url: str | None, expected: bool) -> None:
    assert settings(LLM_WARMUP=warmup, LLM_BASE_URL=base_url).llm_warm_up is expected


def test_a_bad_kind_or_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="LLM_ENDPOINT_KIND"):
        settings(LLM_ENDPOINT_KIND="cpu")
    with pytest.raises(ValueError, match="LLM_WARMUP"):
        settings(LLM_WARMUP="yes")
    with pytest.raises(ValueError, match="LLM_GUIDED_TOOLS"):
        settings(LLM_GUIDED_TOOLS="small")


@pytest.mark.parametrize(("guided", "base_url", "expected"), [("on", None, True), ("off", OLLAMA, False)])
def test_llm_guided_tools_on_or_off_decides_alone(guided: str, base_url: str | None, expected: bool) -> None:
    assert settings(LLM_GUIDED_TOOLS=guided, LLM_BASE_URL=base_url).llm_guides_tools is expected


def test_the_model_client_gives_each_endpoint_its_limits() -> None:
    s = settings(
        LLM_BASE_URL=OLLAMA, LLM_FALLBACK_MODEL="gpt-4o-mini", LLM_FALLBACK_BASE_URL="https://api.openai.com/v1"
    )
    model = ChatModel(s)
    assert model.primary.limits == LOCAL
    assert model.fallback is not None and model.fallback.limits == HOSTED


@pytest.fixture
def fresh_bulkheads() -> Iterator[None]:
    bulkhead_registry.clear()
    yield
    bulkhead_registry.clear()


@pytest.mark.usefixtures("fresh_bulkheads")
def test_a_model_s_bulkhead_never_cuts_a_call_its_endpoint_allows() -> None:
    ChatModel(settings(LLM_BASE_URL=OLLAMA, LLM_FALLBACK_MODEL="gpt-4o-mini"))
    # a local endpoint's 300 s call (a CPU model reading a new prompt under load) outlasts the bulkhead's 120 s
    assert bulkhead_registry.get("outbound:llm_primary").cfg.timeout == LOCAL.call_s
    assert bulkhead_registry.get("outbound:llm_fallback").cfg.timeout == LOCAL.call_s
    bulkhead_registry.clear()
    ChatModel(settings(LLM_BASE_URL="https://api.openai.com/v1", LLM_TIMEOUT_S="1800"))
    assert bulkhead_registry.get("outbound:llm_primary").cfg.timeout == 1800.0
    bulkhead_registry.clear()
    ChatModel(settings())  # the hosted 60 s: the bulkhead keeps its own bound
    assert bulkhead_registry.get("outbound:llm_primary").cfg.timeout == 120.0
