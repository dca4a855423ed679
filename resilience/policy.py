"""How the layers compose. The order lives here, once::

    policy.call(fn, *args, **kwargs)
     1. circuit breaker check   OPEN (or HALF_OPEN with its probes taken) → CircuitOpenError at once:
                                no slot taken, no connection, no wait
     2. bulkhead slot           none within acquire_timeout → BulkheadFullError; fn is never called
                                (inside ``wait_for_slots()``, an accepted run's: none within the budget →
                                BudgetExhaustedError)
     3. bounded execution       min(bulkhead timeout, remaining budget) — with no bulkhead, the budget alone
                                (→ BulkheadTimeoutError / BudgetExhaustedError, fn cancelled)
     4. retry                   full-jitter backoff inside that bound, never sleeping past the budget; every attempt
                                goes through the breaker (failures feed it; once it opens, retrying stops at once)

Fail as early and as cheaply as possible: the breaker check costs a comparison, so a dead dependency costs its
callers microseconds and no resources; the bulkhead caps how many calls can be retrying at once; retrying happens
only inside a slot already held and a budget already bounded. Business errors (``NonRetryableError``, the retry
config's ``non_retryable_exceptions``) pass through untouched and never count against the breaker.

``policy_for(name)`` gives the policy for an outbound dependency (``hotel_api``, ``payment_api``,
``search_agent``): the registry's breaker (the one ``/health/circuits`` shows), ``RETRY_CONFIGS[name]`` and an
outbound bulkhead ``outbound:<name>`` from ``OUTBOUND_BULKHEAD_CONFIGS``. Outbound bulkheads are separate from the
agents' inbound ones (``BULKHEAD_CONFIGS``): a process calling the search agent must not compete for the slots
the search agent uses to serve its own requests. One policy per name is cached.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import ParamSpec, TypeVar

from resilience.bulkhead import Bulkhead, BulkheadConfig, bulkhead_registry, run_within_budget
from resilience.circuit_breaker import CircuitBreaker, circuit_registry
from resilience.retry import NO_RETRY, RETRY_CONFIGS, RetryConfig, call_with_retry

__all__ = [
    "DEFAULT_OUTBOUND_BULKHEAD_CONFIG",
    "OUTBOUND_BULKHEAD_CONFIGS",
    "ResiliencePolicy",
    "outbound_bulkhead_name",
    "policy_for",
]

P = ParamSpec("P")
T = TypeVar("T")

OUTBOUND_BULKHEAD_CONFIGS: Mapping[str, BulkheadConfig] = {
    "hotel_api": BulkheadConfig(max_concurrent=50, timeout=30.0, acquire_timeout=1.0),
    # payments: a small pool, so a stalling provider pushes back early instead of piling up charges in flight
    "payment_api": BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0),
    # as many as the search agent accepts (its inbound bulkhead has 20 slots)
    "search_agent": BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0),
}

DEFAULT_OUTBOUND_BULKHEAD_CONFIG = BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0)


def outbound_bulkhead_name(service_name: str) -> str:
    return f"outbound:{service_name}"


class ResiliencePolicy:
    """Breaker → bulkhead → bounded execution → retry around one dependency. Every layer is optional."""

    __slots__ = ("bulkhead", "circuit", "name", "retry")

    def __init__(
        self,
        name: str,
        *,
        circuit: CircuitBreaker | None = None,
        bulkhead: Bulkhead | None = None,
        retry: RetryConfig | None = None,
    ) -> None:
        self.name = name
        self.circuit = circuit
        self.bulkhead = bulkhead
        self.retry = retry or NO_RETRY

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` through every layer, in the order of the module docstring."""
        circuit = self.circuit
        if circuit is not None:
            circuit.check()
        if self.bulkhead is not None:
            return await self.bulkhead.run(call_with_retry, fn, args, kwargs, self.retry, circuit, self.name)
        return await run_within_budget(self.name, call_with_retry, fn, args, kwargs, self.retry, circuit, self.name)

    def __repr__(self) -> str:
        return f"<ResiliencePolicy {self.name!r} circuit={self.circuit!r} bulkhead={self.bulkhead!r}>"


# name → (circuit registry generation, bulkhead registry generation, policy)
_policies: dict[str, tuple[int, int, ResiliencePolicy]] = {}


def policy_for(service_name: str) -> ResiliencePolicy:
    """The process-wide policy for an outbound dependency, built on first use from the registries and configs."""
    cached = _policies.get(service_name)
    if cached is not None and cached[0] == circuit_registry.generation and cached[1] == bulkhead_registry.generation:
        return cached[2]
    policy = ResiliencePolicy(
        service_name,
        circuit=circuit_registry.get(service_name),
        bulkhead=bulkhead_registry.get(
            outbound_bulkhead_name(service_name),
            OUTBOUND_BULKHEAD_CONFIGS.get(service_name, DEFAULT_OUTBOUND_BULKHEAD_CONFIG),
        ),
        retry=RETRY_CONFIGS.get(service_name, RetryConfig()),
    )
    _policies[service_name] = (circuit_registry.generation, bulkhead_registry.generation, policy)
    return policy
