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

``llm_metrics()`` adds the model calls' (the GenAI conventions' ``gen_ai_client_token_usage`` and
``gen_ai_client_operation_duration_seconds``, and ours: retries by reason, retry-after waited, fallbacks, budget
stops, limiter waits; ``infra.llm.telemetry`` feeds them, ``docs/model-dependency.md``).

``story_metrics()`` adds what the bookings went through (outcomes, time to final, recovery time, duplicates
prevented, cancel requests): see ``StoryMetrics``.

Serve them with ``prometheus_client.generate_latest()`` (the service shell's ``/metrics``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
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

__all__ = [
    "CIRCUIT_STATE_VALUES",
    "LlmMetrics",
    "ResilienceMetrics",
    "StoryMetrics",
    "count_cancel_request",
    "count_duplicate_prevented",
    "count_final",
    "install_resilience_metrics",
    "llm_metrics",
    "observe_recovery",
    "story_metrics",
    "uninstall_resilience_metrics",
]

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


# ------------------------------------------------------------------------------------------------- the story

TIME_TO_FINAL_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
RECOVERY_TIME_BUCKETS = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class StoryMetrics:
    """What the bookings went through, the journal's story in numbers (the Grafana dashboard's rows):

    - ``concierge_bookings_final_total{outcome}``: bookings that reached ``confirmed``/``failed``/``cancelled``,
      counted once, by the process that wrote the final status
    - ``concierge_booking_time_to_final_seconds{outcome}``: accepted → final
    - ``concierge_recovery_time_seconds``: owner lost (its lease ran out, or it handed the run off) → resumed by a
      recovery worker
    - ``concierge_duplicates_prevented_total{source}``: calls answered from a stored result instead of acting again
      (a provider's ``Idempotent-Replayed``, or an idempotent node's record)
    - ``concierge_cancel_requests_total{outcome}``: ``POST /bookings/{id}/cancel`` by what it found
    """

    bookings_final: Counter
    time_to_final: Histogram
    recovery_time: Histogram
    duplicates_prevented: Counter
    cancel_requests: Counter


@lru_cache(maxsize=1)
def story_metrics() -> StoryMetrics:
    """Registered in prometheus_client's global registry on first use; the service shell calls it at start-up, so
    every service's ``/metrics`` lists them from the start (zero until something happens)."""
    return StoryMetrics(
        bookings_final=Counter("concierge_bookings_final", "Bookings that reached a final status", ["outcome"]),
        time_to_final=Histogram(
            "concierge_booking_time_to_final_seconds",
            "Time from a booking's acceptance to its final status",
            ["outcome"],
            buckets=TIME_TO_FINAL_BUCKETS,
        ),
        recovery_time=Histogram(
            "concierge_recovery_time_seconds",
            "Time from a run's owner lost (lease expired or handed off) to its resume by a recovery worker",
            buckets=RECOVERY_TIME_BUCKETS,
        ),
        duplicates_prevented=Counter(
            "concierge_duplicates_prevented",
            "Calls answered from a stored result instead of acting again (provider replays, idempotent nodes)",
            ["source"],
        ),
        cancel_requests=Counter("concierge_cancel_requests", "Cancel requests, by what they found", ["outcome"]),
    )


def count_final(outcome: str, seconds: float | None) -> None:
    metrics = story_metrics()
    metrics.bookings_final.labels(outcome).inc()
    if seconds is not None and seconds >= 0:
        metrics.time_to_final.labels(outcome).observe(seconds)


def count_duplicate_prevented(source: str) -> None:
    story_metrics().duplicates_prevented.labels(source).inc()


def observe_recovery(seconds: float) -> None:
    story_metrics().recovery_time.observe(max(0.0, seconds))


def count_cancel_request(outcome: str) -> None:
    story_metrics().cancel_requests.labels(outcome).inc()


# ------------------------------------------------------------------------------------------------- the model

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
"""The conventions' advised buckets for ``gen_ai.client.token.usage``."""
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
"""The conventions' advised buckets for ``gen_ai.client.operation.duration``."""
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class LlmMetrics:
    token_usage: Histogram
    duration: Histogram
    time_to_first_token: Histogram
    retries: Counter
    retry_after_waited: Histogram
    fallbacks: Counter
    budget_stops: Counter
    limiter_wait: Histogram
    limiter_refusals: Counter


_llm_hook_lock = threading.Lock()


@lru_cache(maxsize=1)
def llm_metrics() -> LlmMetrics:
    """Registered on first use; the service shell calls it at start-up, so every ``/metrics`` lists them from the
    start (the dashboard's panels exist before the first model call)."""
    model_labels = ["gen_ai_operation_name", "gen_ai_request_model", "gen_ai_response_model"]
    metrics = LlmMetrics(
        token_usage=Histogram(
            "gen_ai_client_token_usage",
            "Tokens per model call as the provider reported them (gen_ai.client.token.usage)",
            [*model_labels, "gen_ai_token_type"],
            buckets=TOKEN_BUCKETS,
        ),
        duration=Histogram(
            "gen_ai_client_operation_duration_seconds",
            "Duration of one model request (gen_ai.client.operation.duration)",
            [*model_labels, "error_type"],
            buckets=DURATION_BUCKETS,
        ),
        time_to_first_token=Histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Time from a model request to its first streamed token",
            ["gen_ai_operation_name", "gen_ai_request_model"],
            buckets=DURATION_BUCKETS,
        ),
        retries=Counter("concierge_llm_retries", "Model requests retried, by the failure's code", ["model", "reason"]),
        retry_after_waited=Histogram(
            "concierge_llm_retry_after_waited_seconds",
            "Waits a provider asked for (retry-after) and that were waited",
            ["model"],
            buckets=WAIT_BUCKETS,
        ),
        fallbacks=Counter(
            "concierge_llm_fallbacks", "Model calls moved to another model", ["reason", "from_model", "to_model"]
        ),
        budget_stops=Counter(
            "concierge_llm_budget_stops", "Model calls refused before they were made, by budget", ["budget"]
        ),
        limiter_wait=Histogram(
            "concierge_llm_limiter_wait_seconds",
            "Waits for the shared rate limiter's capacity before a model request",
            ["model"],
            buckets=WAIT_BUCKETS,
        ),
        limiter_refusals=Counter(
            "concierge_llm_limiter_refusals", "Model requests refused: the limiter's wait did not fit", ["model"]
        ),
    )
    with _llm_hook_lock:
        add_hook(_count_retries)
    return metrics


def _count_retries(event: ResilienceEvent) -> None:
    if not isinstance(event, RetryScheduled) or not event.service.startswith("llm_"):
        return
    metrics = llm_metrics()
    error = event.error
    model = getattr(error, "model", None) or event.service
    metrics.retries.labels(model, str(getattr(error, "code", type(error).__name__))).inc()
    if getattr(error, "retry_after", None) is not None:
        metrics.retry_after_waited.labels(model).observe(event.delay)
