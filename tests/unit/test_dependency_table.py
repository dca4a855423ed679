"""The dependency table: one row per dependency gives it every layer, and resilience/ names none of this app's."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import resilience.dependencies as table_module
from infra.dependencies import DEPENDENCIES, ROWS, install
from resilience import (
    BULKHEAD_CONFIGS,
    CALL_SHARES,
    CIRCUIT_CONFIGS,
    OUTBOUND_BULKHEAD_CONFIGS,
    RETRY_CONFIGS,
    BulkheadConfig,
    CircuitBreakerConfig,
    CircuitOpenError,
    CircuitState,
    Dependency,
    DependencyTableMissingError,
    RetryConfig,
    bulkhead_registry,
    circuit_registry,
    install_dependencies,
    installed_dependencies,
    outbound_bulkhead_name,
    policy_for,
    set_testing,
)
from stack.services import SERVICES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    circuit_registry.clear()
    bulkhead_registry.clear()
    yield
    circuit_registry.clear()
    bulkhead_registry.clear()


@pytest.fixture
def no_table() -> Iterator[None]:
    """No table installed, as in a process that forgot to (put back afterwards)."""
    previous = installed_dependencies()
    table_module._put(None)
    yield
    table_module._put(previous)


RESTAURANT = Dependency(
    "restaurant_api",
    breaker=CircuitBreakerConfig(failure_threshold=2, success_threshold=1, recovery_timeout=9.0),
    bulkhead=BulkheadConfig(max_concurrent=7, timeout=4.0, acquire_timeout=0.5),
    retry=RetryConfig(max_attempts=2, base_delay=0.1),
    share=0.3,
    inbound=BulkheadConfig(max_concurrent=3, timeout=6.0),
)


async def test_adding_a_dependency_is_one_row() -> None:
    with install((*ROWS, RESTAURANT)):
        policy = policy_for("restaurant_api")
        assert policy.circuit is circuit_registry.get("restaurant_api")
        assert policy.circuit.cfg == RESTAURANT.breaker
        assert policy.bulkhead is bulkhead_registry.get(outbound_bulkhead_name("restaurant_api"))
        assert policy.bulkhead.cfg == RESTAURANT.bulkhead
        assert policy.retry == RESTAURANT.retry
        assert policy.share == RESTAURANT.share
        assert bulkhead_registry.get("restaurant_api").cfg == RESTAURANT.inbound
        # the old names see the row too
        assert CIRCUIT_CONFIGS["restaurant_api"] == RESTAURANT.breaker
        assert OUTBOUND_BULKHEAD_CONFIGS["restaurant_api"] == RESTAURANT.bulkhead
        assert RETRY_CONFIGS["restaurant_api"] == RESTAURANT.retry
        assert CALL_SHARES["restaurant_api"] == RESTAURANT.share
        assert BULKHEAD_CONFIGS["restaurant_api"] == RESTAURANT.inbound

        # and the layers work: two attempts of the retry, both failures, open the two-failure breaker
        calls = 0

        async def down() -> None:
            nonlocal calls
            calls += 1
            raise ConnectionError("down")

        with set_testing(True), pytest.raises((ConnectionError, CircuitOpenError)):
            await policy.call(down)
        assert calls == 2
        assert policy.circuit.state is CircuitState.OPEN
        assert await policy_for("hotel_api").call(asyncio.sleep, 0, "ok") == "ok"
    assert "restaurant_api" not in CIRCUIT_CONFIGS
    assert policy_for("restaurant_api") is not policy  # the table changed back: the policy is rebuilt


def test_the_table_keeps_every_layers_values() -> None:
    assert CIRCUIT_CONFIGS["payment_api"] == CircuitBreakerConfig(
        failure_threshold=3, success_threshold=3, recovery_timeout=60.0, initial_recovery_timeout=2.0
    )
    assert dict(CALL_SHARES) == {"hotel_api": 0.25, "payment_api": 0.5, "search_agent": 0.25}
    assert set(OUTBOUND_BULKHEAD_CONFIGS) == set(RETRY_CONFIGS) == set(CIRCUIT_CONFIGS)
    assert set(CIRCUIT_CONFIGS) == {"hotel_api", "payment_api", "search_agent", "llm_primary", "llm_fallback"}
    assert set(BULKHEAD_CONFIGS) == {
        "booking_agent",
        "search_agent",
        "payment_agent",
        "recovery_worker",
        "concierge_agent",
    }


def test_every_row_is_a_service_of_the_service_table_or_the_models_endpoint() -> None:
    for name in DEPENDENCIES:
        if name.startswith("llm_"):
            assert "llm-api" in SERVICES
        else:
            assert name.replace("_", "-") in SERVICES, name


def test_resilience_names_no_dependency_of_this_app() -> None:
    names = {name for name in DEPENDENCIES} | {name.replace("_", "-") for name in DEPENDENCIES}
    names |= {service for service in SERVICES} | {service.replace("-", "_") for service in SERVICES}
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\b")
    found = {
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)}"
        for path in sorted((ROOT / "resilience").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if (m := pattern.search(line))
    }
    assert found == set()


def test_policy_for_without_a_table_fails_naming_the_dependency(no_table: None) -> None:
    with pytest.raises(DependencyTableMissingError, match=r"'hotel_api'.*install"):
        policy_for("hotel_api")
    assert dict(CIRCUIT_CONFIGS) == {}


def test_a_name_in_no_row_gets_the_defaults_as_it_always_has_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="resilience.policy"):
        policy = policy_for("nowhere_in_the_table")
        policy_for("nowhere_in_the_table")
    assert policy.retry == RetryConfig()
    assert policy.share is None
    assert policy.circuit is not None and policy.circuit.cfg == CircuitBreakerConfig()
    warned = [r for r in caplog.records if "nowhere_in_the_table" in r.getMessage()]
    assert len(warned) == 1


def test_two_rows_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="'hotel_api' has two rows"):
        install_dependencies((*ROWS, Dependency("hotel_api")))


def test_installing_the_same_table_again_keeps_the_policies() -> None:
    policy = policy_for("payment_api")
    with install():
        assert policy_for("payment_api") is policy


def test_a_share_outside_zero_to_one_is_refused_in_the_row() -> None:
    with pytest.raises(ValueError, match="'x': share"):
        Dependency("x", share=1.5)
