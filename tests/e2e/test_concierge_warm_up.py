"""concierge-agent warms a local model up at start (LLM_WARMUP): one small request with the concierge's system
prompt and the tools a new chat's first call is offered reaches the model before anyone chats; with LLM_WARMUP=off, none does. llm-api plays the local
model (LLM_BASE_URL on 127.0.0.1) and its request log says what arrived."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.llm import FALLBACK_MODEL, PRIMARY_MODEL
from tests.e2e.test_concierge import START_S
from tests.procs import ServiceProcess, free_port
from tests.stack import Stack, fresh_database

pytestmark = pytest.mark.e2e

WAIT_S = 120.0
"""Generous: a warm-up follows concierge-agent's start on a loaded 2-core machine."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("concierge-warm-up")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database) as stack:
        stack.serve("llm-api", wait=False).wait_ready(START_S)
        yield stack


def llm_log(stack: Stack, model: str) -> list[dict[str, Any]]:
    response = stack.admin("GET", "llm-api", "requests", params={"model": model})
    assert response.status_code == 200, response.text
    return list(response.json()["requests"])


def concierge(stack: Stack, warmup: str, model: str, **extra: str) -> ServiceProcess:
    """A concierge-agent whose model is llm-api named by LLM_BASE_URL (loopback: as a local model would be)."""
    env = {"LLM_BASE_URL": f"{stack.url('llm-api')}/v1", "LLM_WARMUP": warmup, "LLM_MODEL": model, **extra}
    proc = stack.procs.serve("concierge-agent", port=free_port(), env=env, wait=False)
    proc.wait_ready(START_S)
    return proc


def test_a_warm_up_reaches_the_model_at_start_and_off_sends_none(stack: Stack) -> None:
    # off first, under its own model name: whatever it would send arrives while the other starts and warms up
    concierge(stack, "off", FALLBACK_MODEL)
    concierge(stack, "on", PRIMARY_MODEL, LLM_GUIDED_TOOLS="on")  # as a local endpoint is by default
    deadline = time.monotonic() + WAIT_S
    while not (warm_ups := llm_log(stack, PRIMARY_MODEL)):
        if time.monotonic() > deadline:
            raise AssertionError("no warm-up reached llm-api")
        time.sleep(0.1)
    [warm_up] = warm_ups
    assert warm_up["stream"] is True and warm_up["status"] == 200
    assert warm_up["messages"] == 2  # the system prompt and a greeting: no chat was ever made
    # the prefix a new chat's first call sends: guided, only search_hotels, and a call required
    assert (warm_up["tools"], warm_up["tool_choice"]) == (["search_hotels"], "required")
    assert llm_log(stack, FALLBACK_MODEL) == []
