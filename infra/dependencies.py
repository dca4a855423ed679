"""The one dependency table: each dependency's layers (breaker, bulkhead and its timeouts, retry, share), one row each.

It sits in infra, not beside the service table (stack/services.py), because the service shell and the agents hand
it to resilience at start-up and infra cannot import stack (the floors, pyproject.toml). Names are the services'
(``hotel-api`` → ``hotel_api``) or the model's endpoints (``llm_primary``, ``llm_fallback``); a new dependency is one
row here (docs/patterns.md, "One row per dependency"). Start-up overrides still apply on top
(``CONCIERGE_CIRCUITS``, ``registry.configure``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from resilience import (
    WITHIN_BUDGET,
    BulkheadConfig,
    CircuitBreakerConfig,
    Dependency,
    Restore,
    RetryConfig,
    install_dependencies,
)

__all__ = ["DEPENDENCIES", "ROWS", "install"]

ROWS: tuple[Dependency, ...] = (
    Dependency(
        "hotel_api",
        # an external provider: a few blips are normal, five in a row are not; probe after 2 s, then 4, 8 ... 30 s
        breaker=CircuitBreakerConfig(
            failure_threshold=5, success_threshold=2, recovery_timeout=30.0, initial_recovery_timeout=2.0
        ),
        bulkhead=BulkheadConfig(max_concurrent=50, timeout=30.0, acquire_timeout=1.0),
        # a bad hotel id or a missing field will not get better on the second try
        retry=RetryConfig(max_attempts=3, base_delay=1.0, non_retryable_exceptions=(ValueError, KeyError)),
        share=0.25,
    ),
    Dependency(
        "payment_api",
        # payments are critical: open early, close cautiously (three good probes); the probes back off to 60 s
        breaker=CircuitBreakerConfig(
            failure_threshold=3, success_threshold=3, recovery_timeout=60.0, initial_recovery_timeout=2.0
        ),
        # a small pool, so a stalling provider pushes back early instead of piling up charges in flight
        bulkhead=BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0),
        retry=RetryConfig(max_attempts=2, base_delay=2.0, non_retryable_exceptions=(ValueError,)),
        # a charge may legitimately take longer (3-D Secure, a slow acquirer)
        share=0.5,
    ),
    Dependency(
        "search_agent",
        # an internal agent: tolerate fluctuations, recover quickly (a restart takes about a second)
        breaker=CircuitBreakerConfig(
            failure_threshold=10, success_threshold=1, recovery_timeout=15.0, initial_recovery_timeout=1.0
        ),
        # as many as the search agent accepts (its inbound bulkhead has 20 slots)
        bulkhead=BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0),
        retry=RetryConfig(max_attempts=4, base_delay=0.5),
        # a search is the first of a booking's four calls: a quarter of what is left
        share=0.25,
        # The peer agents queue within their caller's budget: their callers are booking runs (of every booking-agent
        # replica and the recovery worker), which must not fail because a peer was momentarily full. No per-process
        # cap upstream keeps the sum of those callers under 20 or 5; the budget each caller sends bounds every wait
        # (a person's GET /hotels too: 30 s unless it sends X-Timeout-Budget).
        inbound=BulkheadConfig(max_concurrent=20, timeout=10.0, acquire_timeout=WITHIN_BUDGET),
    ),
    # called as payment_api (it is the payment path), so only its door is here
    Dependency("payment_agent", inbound=BulkheadConfig(max_concurrent=5, timeout=15.0, acquire_timeout=WITHIN_BUDGET)),
    # the concierge's calls to it take every layer's default; its door holds ten
    Dependency("booking_agent", inbound=BulkheadConfig(max_concurrent=10, timeout=30.0)),
    Dependency("recovery_worker", inbound=BulkheadConfig(max_concurrent=3, timeout=120.0)),
    # the concierge's A2A skill: one slot per conversation turn a client waits for (up to a turn's budget)
    Dependency("concierge_agent", inbound=BulkheadConfig(max_concurrent=100, timeout=180.0)),
    # The model: a person waits on every turn, so a failing endpoint is given up quickly for the fallback and probed
    # again soon (one probe brings it back; docs/model-dependency.md). Few, quick retries, the provider's retry-after
    # obeyed within the turn's budget; which errors retry is the model client's to say (infra.llm narrows
    # retryable_exceptions). Calls stream for tens of seconds: the bound is the turn's budget, the slots what one
    # replica streams.
    Dependency(
        "llm_primary",
        breaker=CircuitBreakerConfig(
            failure_threshold=5, success_threshold=1, recovery_timeout=20.0, initial_recovery_timeout=2.0
        ),
        bulkhead=BulkheadConfig(max_concurrent=64, timeout=120.0, acquire_timeout=1.0),
        retry=RetryConfig(max_attempts=3, base_delay=0.25, max_delay=4.0, server_hints=True),
    ),
    Dependency(
        "llm_fallback",
        breaker=CircuitBreakerConfig(
            failure_threshold=5, success_threshold=1, recovery_timeout=20.0, initial_recovery_timeout=2.0
        ),
        bulkhead=BulkheadConfig(max_concurrent=64, timeout=120.0, acquire_timeout=1.0),
        retry=RetryConfig(max_attempts=2, base_delay=0.25, max_delay=4.0, server_hints=True),
    ),
)

DEPENDENCIES: Mapping[str, Dependency] = MappingProxyType({row.name: row for row in ROWS})
"""``ROWS`` by name, for code that reads a row without installing the table (the demo, the benches' reports)."""


def install(rows: tuple[Dependency, ...] = ROWS) -> Restore[Mapping[str, Dependency] | None]:
    """Hand this app's table to resilience: the service shell's lifespan does, as must any process calling
    ``policy_for`` outside a service (tests, benches)."""
    return install_dependencies(rows)
