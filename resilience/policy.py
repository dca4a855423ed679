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

``policy_for(name)`` gives the policy for an outbound dependency, from its row of the dependency table the app
installed at start-up (``resilience.dependencies``): the registry's breaker (the one ``/health/circuits`` shows),
``RETRY_CONFIGS[name]`` and an outbound bulkhead ``outbound:<name>`` from ``OUTBOUND_BULKHEAD_CONFIGS``. Outbound
bulkheads are separate from the services' inbound ones (``BULKHEAD_CONFIGS``): a process calling a peer must not
compete for the slots the peer uses to serve its own requests. One policy per name is cached. No table installed:
``DependencyTableMissingError``; a name in no row gets every layer's default (as it always has), logged once.

Every attempt gets a share of the budget left (``CALL_SHARES``): a dependency that has gone slow costs a caller one
share per attempt, not its whole budget, and the attempt's timeout is a failure the breaker counts (the client's own
timeout, raised inside the attempt), so the breaker opens while the caller still has budget to wait it out or fail
cleanly. A share is a ceiling, not a forecast: a healthy call takes milliseconds of it.

With the layers switched off (``resilience.layers``, for the cascade bench and demo only) a call skips 1–3 and
retries naively: every attempt, whatever the last ones did, each waiting up to the client's default timeout.
``in_flight`` counts the calls inside ``call`` in both worlds (``calls_in_flight()``, shown by ``/health``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from resilience.budget import budget_scope, default_budget, detached_budget, remaining_budget
from resilience.bulkhead import Bulkhead, BulkheadConfig, bulkhead_registry, run_within_budget
from resilience.circuit_breaker import CircuitBreaker, circuit_registry
from resilience.dependencies import (
    DependencyTableMissingError,
    LayerView,
    installed_dependencies,
    table_generation,
)
from resilience.errors import AttemptTimeoutError, BudgetExhaustedError, NonRetryableError
from resilience.layers import layers_on
from resilience.outages import waits_out_outages
from resilience.retry import NO_RETRY, RETRY_CONFIGS, RetryConfig, backoff_delay, call_with_retry

__all__ = [
    "CALL_SHARES",
    "DEFAULT_OUTBOUND_BULKHEAD_CONFIG",
    "OUTBOUND_BULKHEAD_CONFIGS",
    "ResiliencePolicy",
    "calls_in_flight",
    "outbound_bulkhead_name",
    "policy_for",
]

P = ParamSpec("P")
T = TypeVar("T")

OUTBOUND_BULKHEAD_CONFIGS: Mapping[str, BulkheadConfig] = LayerView(lambda row: row.bulkhead)
"""Callers' bulkheads (``outbound:<name>``): the installed dependency table's ``bulkhead`` column."""

DEFAULT_OUTBOUND_BULKHEAD_CONFIG = BulkheadConfig(max_concurrent=20, timeout=30.0, acquire_timeout=1.0)

CALL_SHARES: Mapping[str, float] = LayerView(lambda row: row.share)
"""The fraction of an accepted run's remaining budget one attempt may use, per dependency (none: the whole budget).
Only runs take shares: a request served for a caller (a peer agent's) spends the budget it was sent.
The installed dependency table's ``share`` column."""


def outbound_bulkhead_name(service_name: str) -> str:
    return f"outbound:{service_name}"


class ResiliencePolicy:
    """Breaker → bulkhead → bounded execution → retry around one dependency. Every layer is optional."""

    __slots__ = ("bulkhead", "circuit", "in_flight", "name", "retry", "share")

    def __init__(
        self,
        name: str,
        *,
        circuit: CircuitBreaker | None = None,
        bulkhead: Bulkhead | None = None,
        retry: RetryConfig | None = None,
        share: float | None = None,
    ) -> None:
        if share is not None and not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share!r}")
        self.name = name
        self.share = share
        self.circuit = circuit
        self.bulkhead = bulkhead
        self.retry = retry or NO_RETRY
        self.in_flight = 0

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` through every layer, in the order of the module docstring."""
        if not layers_on():
            return await self._bare(fn, args, kwargs)
        circuit = self.circuit
        if circuit is not None:
            circuit.check()
        if self.share is not None:
            fn = functools.partial(_within_share, self.share, fn)
        self.in_flight += 1
        try:
            if self.bulkhead is not None:
                return await self.bulkhead.run(call_with_retry, fn, args, kwargs, self.retry, circuit, self.name)
            return await run_within_budget(self.name, call_with_retry, fn, args, kwargs, self.retry, circuit, self.name)
        finally:
            self.in_flight -= 1

    async def _bare(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """The layers off: every attempt made, each under the default timeout alone, no breaker, no slot."""
        cfg = self.retry
        self.in_flight += 1
        try:
            attempt = 0
            while True:
                try:
                    with detached_budget(default_budget()):
                        return await fn(*args, **kwargs)
                except Exception as exc:
                    retryable = isinstance(exc, cfg.retryable_exceptions) and not isinstance(
                        exc, (NonRetryableError, cfg.non_retryable_exceptions)
                    )
                    if not retryable or attempt + 1 >= cfg.max_attempts:
                        raise
                await asyncio.sleep(backoff_delay(attempt, cfg))
                attempt += 1
        finally:
            self.in_flight -= 1

    def __repr__(self) -> str:
        return f"<ResiliencePolicy {self.name!r} circuit={self.circuit!r} bulkhead={self.bulkhead!r}>"


async def _within_share(share: float, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
    """One attempt under ``share`` of the budget left: what it calls downstream is told that deadline."""
    left = remaining_budget()
    if left <= 0 or not waits_out_outages():
        # the budget is spent (the call refuses itself), or this is a request: its caller already gave it a share,
        # and a share of that share at every hop would leave the last call almost nothing
        return await fn(*args, **kwargs)
    try:
        with budget_scope(left * share):
            return await fn(*args, **kwargs)
    except BudgetExhaustedError as exc:
        if remaining_budget() <= 0:
            raise  # the run's own budget is spent too
        raise AttemptTimeoutError(f"an attempt ran past its share of the budget ({left * share:.2f}s)") from exc


logger = logging.getLogger(__name__)

# name → (circuit registry generation, bulkhead registry generation, table generation, policy)
_policies: dict[str, tuple[int, int, int, ResiliencePolicy]] = {}
_unlisted: set[str] = set()


def policy_for(service_name: str) -> ResiliencePolicy:
    """The process-wide policy for an outbound dependency, built on first use from its row and the registries."""
    cached = _policies.get(service_name)
    if (
        cached is not None
        and cached[0] == circuit_registry.generation
        and cached[1] == bulkhead_registry.generation
        and cached[2] == table_generation()
    ):
        return cached[3]
    table = installed_dependencies()
    if table is None:
        raise DependencyTableMissingError(service_name)
    if service_name not in table and service_name not in _unlisted:
        _unlisted.add(service_name)
        logger.warning("dependency %r is in no row of the dependency table: every layer is its default", service_name)
    policy = ResiliencePolicy(
        service_name,
        circuit=circuit_registry.get(service_name),
        bulkhead=bulkhead_registry.get(
            outbound_bulkhead_name(service_name),
            OUTBOUND_BULKHEAD_CONFIGS.get(service_name, DEFAULT_OUTBOUND_BULKHEAD_CONFIG),
        ),
        retry=RETRY_CONFIGS.get(service_name, RetryConfig()),
        share=CALL_SHARES.get(service_name),
    )
    _policies[service_name] = (circuit_registry.generation, bulkhead_registry.generation, table_generation(), policy)
    return policy


def calls_in_flight() -> dict[str, int]:
    """Calls inside each dependency's policy right now, layers on or off (what a slow dependency holds)."""
    return {name: policy.in_flight for name, (_, _, _, policy) in sorted(_policies.items())}
