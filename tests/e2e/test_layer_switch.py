"""The layer switch and search-agent's faults on real processes: what the cascade bench and demo stand on.

One Redis key with a TTL switches the layers off in every service (``/health`` says so within a second); its
``Restore`` or its TTL switch them back on. ``PUT /admin/faults`` on search-agent slows or hangs every search, behind
the admin token; with the layers on, a hung search costs a booking no more than its budget and the breaker opens.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.redis import create_sync_redis
from infra.service.vitals import layers_off_key, layers_switched_off
from tests.stack import Stack, fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = ("search-agent", "booking-agent", "payment-agent")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("layers")
    env = {"BOOKING_BUDGET_S": "6", "CONCIERGE_CIRCUITS": '{"search_agent": {"recovery_timeout": 60.0}}'}
    with fresh_database() as database_url, Stack(tmp, redis_url, database_url=database_url, env=env) as stack:
        stack.start()
        yield stack


@pytest.fixture
def redis(stack: Stack) -> Iterator[Any]:
    with contextlib.closing(create_sync_redis(stack.env["REDIS_URL"])) as client:
        yield client


def vitals(stack: Stack, service: str) -> dict[str, Any]:
    body = stack.http.get(f"{stack.url(service)}/health").json()
    return dict(body["vitals"])


def wait_for_layers(stack: Stack, state: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while {vitals(stack, s)["layers"] for s in SERVICES} != {state}:
        assert time.monotonic() < deadline, {s: vitals(stack, s)["layers"] for s in SERVICES}
        time.sleep(0.1)


def test_health_shows_the_process_vitals(stack: Stack) -> None:
    seen = vitals(stack, "booking-agent")
    assert seen["layers"] == "on"
    assert seen["rss_kib"] > 10_000
    assert seen["redis_connections"]["open"] >= 1
    assert seen["runs_in_flight"] == 0
    assert "booking_runs" in seen["bulkheads_held"]
    assert seen["loop_lag_ms"] >= 0


def test_the_switch_turns_the_layers_off_everywhere_and_its_restore_back_on(stack: Stack, redis: Any) -> None:
    with layers_switched_off(redis, ttl_s=30, prefix=stack.prefix):
        wait_for_layers(stack, "off")
        assert redis.pttl(layers_off_key(stack.prefix)) > 0
    wait_for_layers(stack, "on")


def test_the_switch_ends_with_its_ttl_when_nobody_restores_it(stack: Stack, redis: Any) -> None:
    layers_switched_off(redis, ttl_s=1.5, prefix=stack.prefix)  # the bench died: no restore
    wait_for_layers(stack, "off")
    wait_for_layers(stack, "on")


def test_search_faults_need_the_admin_token(stack: Stack) -> None:
    url = f"{stack.url('search-agent')}/admin/faults"
    assert httpx.put(url, json={"hang": True}).status_code == 401
    bad = stack.admin("PUT", "search-agent", "faults", json={"latency_s": "5"})
    assert bad.status_code == 422
    assert "latency_s" in bad.text
    assert stack.admin("GET", "search-agent", "faults").json() == {"latency_s": 0.0, "hang": False}


def test_a_hung_search_fails_bookings_within_their_budget_until_the_breaker_opens(stack: Stack) -> None:
    circuits = f"{stack.url('booking-agent')}/health/circuits"
    try:
        stack.fault("search-agent", hang=True)
        ids = [stack.book(city="Lisbon")["booking_id"] for _ in range(12)]
        finals = [stack.wait(i, timeout=60) for i in ids]  # a search that hangs for ever: each ended by its budget
        assert {b["status"] for b in finals} == {"failed"}, finals
        assert stack.http.get(circuits).json()["search_agent"]["state"] == "open"
        held = vitals(stack, "search-agent")
        assert held["bulkheads_held"].get("search_agent", 0) == 0  # the hung searches were cancelled
    finally:
        stack.fault("search-agent")
