"""The service shell hands the dependency table to resilience at start-up, and CONCIERGE_CIRCUITS still applies on top."""

from __future__ import annotations

import json

import httpx
import pytest

from infra.dependencies import DEPENDENCIES
from infra.service import create_service_app
from infra.settings import get_settings
from resilience import bulkhead_registry, circuit_registry, install_dependencies, installed_dependencies, policy_for


async def test_the_shell_installs_the_table_and_the_circuit_overrides_apply_on_top(
    redis: object, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("CONCIERGE_CIRCUITS", json.dumps({"hotel_api": {"recovery_timeout": 2.0}}))
    get_settings.cache_clear()
    circuit_registry.clear()
    bulkhead_registry.clear()
    app = create_service_app("dependency-table-test")
    try:
        with install_dependencies(()):  # an empty table: the one the shell installs must replace it
            async with app.router.lifespan_context(app):
                assert installed_dependencies() == DEPENDENCIES
                breaker = policy_for("hotel_api").circuit
                assert breaker is not None
                row = DEPENDENCIES["hotel_api"].breaker
                assert row is not None
                assert breaker.cfg.recovery_timeout == 2.0
                assert breaker.cfg.failure_threshold == row.failure_threshold
                assert breaker.cfg.initial_recovery_timeout == row.initial_recovery_timeout
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://dependency-table-test") as client:
                    circuits = (await client.get("/health/circuits")).json()
                assert circuits["hotel_api"]["state"] == "closed"
    finally:
        circuit_registry.clear()
        bulkhead_registry.clear()
        get_settings.cache_clear()
