"""Prometheus metrics for the resilience layers.

``install_resilience_metrics()`` (idempotent: once per registry however often it is called) adds:

counters, fed by a ``resilience.events`` hook (one increment per event; label children are cached):

- ``concierge_circuit_transitions_total{name,from,to}``
- ``concierge_circuit_rejections_total{name}``: calls refused by a breaker without being made
- ``concierge_bulkhead_rejections_total{name}`` / ``concierge_bulkhead_timeouts_total{name}``
- ``concierge_budget_expirations_total{name}``: calls cancelled because the timeout budget ran out
- ``concierge_retries_total{service}`` / ``concierge_retry_give_ups_total{service,reason}``

gauges, read from the registries when scraped (always current, and nothing on the request path):

- ``concierge_circuit_state{name}``: 0 closed, 1 open, 2 half-open
- ``concierge_bulkhead_in_use{name}`` / ``concierge_bulkhead_max{name}``

Serve them with ``prometheus_client.generate_latest()`` (the service shell's ``/metrics``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from resilience import (
    BudgetExpired,
    BulkheadRejected,
    BulkheadTimedOut,
    CircuitBreakerRegistry,
    CircuitRejected,
    CircuitState,
    CircuitTransition,
    ResilienceEvent,
    RetryGaveUp,
    RetryScheduled,
    add_hook,
    bulkhead_registry,
    circuit_registry,
    remove_hook,
)
from resilience.bulkhead import BulkheadRegistry

__all__ = ["CIRCUIT_STATE_VALUES", "ResilienceMetrics", "install_resilience_metrics", "uninstall_resilience_metrics"]

CIRCUIT_STATE_VALUES: dict[str, int] = {CircuitState.CLOSED: 0, CircuitState.OPEN: 1, CircuitState.HALF_OPEN: 2}


class _RegistryGauges(Collector):
    """Gauges computed from the breaker and bulkhead registries at scrape time."""

    def __init__(self, circuits: CircuitBreakerRegistry, bulkheads: BulkheadRegistry) -> None:
        self._circuits = circuits
        self._bulkheads = bulkheads

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "concierge_circuit_state", "Circuit breaker state (0 closed, 1 open, 2 half-open)", labels=["name"]
            ),
            GaugeMetricFamily("concierge_bulkhead_in_use", "Bulkhead slots in use", labels=["name"]),
            GaugeMetricFamily("concierge_bulkhead_max", "Bulkhead slots in total", labels=["name"]),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        state, in_use, maximum = self._families()
        for name, circuit in self._circuits.stats().items():
            state.add_metric([name], CIRCUIT_STATE_VALUES[circuit["state"]])
        for name, bulkhead in self._bulkheads.stats().items():
            in_use.add_metric([name], bulkhead["in_use"])
            maximum.add_metric([name], bulkhead["max"])
        return (state, in_use, maximum)


@dataclass
class ResilienceMetrics:
    """The metrics installed in one registry, and the hook that feeds them."""

    registry: CollectorRegistry
    transitions: Counter
    circuit_rejections: Counter
    bulkhead_rejections: Counter
    bulkhead_timeouts: Counter
    budget_expirations: Counter
    retries: Counter
    retry_give_ups: Counter
    gauges: _RegistryGauges
    # label values → child: `Counter.labels()` takes a lock and validates on every call; the hook runs per event
    _children: dict[tuple[object, ...], Counter] = field(default_factory=dict)
    _rejections: dict[str, Counter] = field(default_factory=dict)

    def _child(self, counter: Counter, *labels: str) -> Counter:
        cache_key = (id(counter), *labels)
        child = self._children.get(cache_key)
        if child is None:
            child = self._children[cache_key] = counter.labels(*labels)
        return child

    def hook(self, event: ResilienceEvent) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_rejected(self, event: CircuitRejected) -> None:
        # the one per-call event: its own single-key cache keeps a refused call cheap
        child = self._rejections.get(event.name)
        if child is None:
            child = self._rejections[event.name] = self.circuit_rejections.labels(event.name)
        child.inc()

    def _on_transition(self, event: CircuitTransition) -> None:
        self._child(self.transitions, event.name, str(event.old), str(event.new)).inc()

    def _on_retry(self, event: RetryScheduled) -> None:
        self._child(self.retries, event.service).inc()

    def _on_give_up(self, event: RetryGaveUp) -> None:
        self._child(self.retry_give_ups, event.service, event.reason).inc()

    def _on_bulkhead_rejected(self, event: BulkheadRejected) -> None:
        self._child(self.bulkhead_rejections, event.name).inc()

    def _on_bulkhead_timeout(self, event: BulkheadTimedOut) -> None:
        self._child(self.bulkhead_timeouts, event.name).inc()

    def _on_budget_expired(self, event: BudgetExpired) -> None:
        self._child(self.budget_expirations, event.name).inc()

    def _collectors(self) -> Iterator[Collector]:
        yield from (
            self.transitions,
            self.circuit_rejections,
            self.bulkhead_rejections,
            self.bulkhead_timeouts,
            self.budget_expirations,
            self.retries,
            self.retry_give_ups,
            self.gauges,
        )


_HANDLERS: dict[type[ResilienceEvent], Callable[[ResilienceMetrics, Any], None]] = {
    CircuitRejected: ResilienceMetrics._on_rejected,
    CircuitTransition: ResilienceMetrics._on_transition,
    RetryScheduled: ResilienceMetrics._on_retry,
    RetryGaveUp: ResilienceMetrics._on_give_up,
    BulkheadRejected: ResilienceMetrics._on_bulkhead_rejected,
    BulkheadTimedOut: ResilienceMetrics._on_bulkhead_timeout,
    BudgetExpired: ResilienceMetrics._on_budget_expired,
}

_lock = threading.Lock()
# id(registry) → metrics; the value keeps the registry alive, so an id is never reused while installed
_installed: dict[int, ResilienceMetrics] = {}


def install_resilience_metrics(registry: CollectorRegistry | None = None) -> ResilienceMetrics:
    """Register the resilience metrics in ``registry`` (default: prometheus_client's global one) and the hook that
    feeds them. Calling it again for the same registry returns the first installation."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _installed.get(id(registry))
        if metrics is not None:
            return metrics
        metrics = ResilienceMetrics(
            registry=registry,
            transitions=Counter(
                "concierge_circuit_transitions",
                "Circuit breaker state changes",
                ["name", "from", "to"],
                registry=registry,
            ),
            circuit_rejections=Counter(
                "concierge_circuit_rejections",
                "Calls refused by an open circuit breaker without being made",
                ["name"],
                registry=registry,
            ),
            bulkhead_rejections=Counter(
                "concierge_bulkhead_rejections",
                "Calls refused for want of a bulkhead slot",
                ["name"],
                registry=registry,
            ),
            bulkhead_timeouts=Counter(
                "concierge_bulkhead_timeouts",
                "Calls cancelled at their bulkhead's execution bound",
                ["name"],
                registry=registry,
            ),
            budget_expirations=Counter(
                "concierge_budget_expirations",
                "Calls cancelled because the timeout budget ran out",
                ["name"],
                registry=registry,
            ),
            retries=Counter("concierge_retries", "Retries scheduled", ["service"], registry=registry),
            retry_give_ups=Counter(
                "concierge_retry_give_ups", "Retry loops that gave up", ["service", "reason"], registry=registry
            ),
            gauges=_RegistryGauges(circuit_registry, bulkhead_registry),
        )
        registry.register(metrics.gauges)
        add_hook(metrics.hook)
        _installed[id(registry)] = metrics
        return metrics


def uninstall_resilience_metrics(registry: CollectorRegistry | None = None) -> None:
    """Undo ``install_resilience_metrics`` for ``registry`` (tests); does nothing when not installed."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _installed.pop(id(registry), None)
        if metrics is None:
            return
        remove_hook(metrics.hook)
        for collector in metrics._collectors():
            registry.unregister(collector)
