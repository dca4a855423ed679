"""Events: hooks, the default log lines and span events, broken instrumentation, Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from infra.metrics import install_resilience_metrics, uninstall_resilience_metrics
from resilience import (
    Bulkhead,
    BulkheadConfig,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitBreaker,
    CircuitBreakerConfig,
    CircuitOpenError,
    CircuitRejected,
    CircuitState,
    CircuitTransition,
    ResilienceEvent,
    RetryConfig,
    RetryScheduled,
    add_hook,
    budget_scope,
    bulkhead_registry,
    circuit_registry,
    emit,
    hooks,
    remove_hook,
    run_within_budget,
    with_retry,
)
from tests.fakes import FakeClock


class Down(ConnectionError):
    pass


async def down() -> None:
    raise Down("refused")


async def ok() -> str:
    return "ok"


@pytest.fixture
def seen() -> Iterator[list[ResilienceEvent]]:
    events: list[ResilienceEvent] = []

    def hook(event: ResilienceEvent) -> None:
        events.append(event)

    add_hook(hook)
    yield events
    remove_hook(hook)


@pytest.fixture(autouse=True)
def clean_registries() -> Iterator[None]:
    circuit_registry.clear()
    bulkhead_registry.clear()
    yield
    circuit_registry.clear()
    bulkhead_registry.clear()


async def cycle(cb: CircuitBreaker, clock: FakeClock) -> None:
    """CLOSED → OPEN, one refusal, → HALF_OPEN → CLOSED."""
    with pytest.raises(Down):
        await cb.call(down)
    with pytest.raises(CircuitOpenError):
        await cb.call(ok)
    clock.now += cb.cfg.recovery_timeout
    await cb.call(ok)


def breaker(clock: FakeClock, name: str = "hotel_api") -> CircuitBreaker:
    cfg = CircuitBreakerConfig(failure_threshold=1, success_threshold=1, recovery_timeout=5.0)
    return CircuitBreaker(name, cfg, clock=clock)


# ------------------------------------------------------------------------------------------------ hooks


async def test_hooks_receive_every_event_in_order(seen: list[ResilienceEvent]) -> None:
    clock = FakeClock()
    await cycle(breaker(clock), clock)
    assert seen == [
        CircuitTransition("hotel_api", CircuitState.CLOSED, CircuitState.OPEN),
        CircuitRejected("hotel_api", CircuitState.OPEN),
        CircuitTransition("hotel_api", CircuitState.OPEN, CircuitState.HALF_OPEN),
        CircuitTransition("hotel_api", CircuitState.HALF_OPEN, CircuitState.CLOSED),
    ]
    # states are a StrEnum: hooks may compare with plain strings
    assert seen[0].new == "open"  # type: ignore[attr-defined]


def test_add_hook_is_idempotent_and_remove_hook_is_forgiving() -> None:
    def hook(event: ResilienceEvent) -> None:
        return None

    before = hooks()
    add_hook(hook)
    add_hook(hook)
    assert hooks() == (*before, hook)
    remove_hook(hook)
    remove_hook(hook)
    assert hooks() == before


async def test_a_broken_hook_never_breaks_a_call(seen: list[ResilienceEvent], caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: ResilienceEvent) -> None:
        raise RuntimeError("metrics backend on fire")

    add_hook(broken)
    try:
        clock = FakeClock()
        cb = breaker(clock)
        with caplog.at_level(logging.ERROR, logger="resilience"):
            await cycle(cb, clock)
    finally:
        remove_hook(broken)
    assert cb.state is CircuitState.CLOSED
    # the hooks installed before the broken one still got every event
    assert len(seen) == 4
    failures = [r for r in caplog.records if r.levelno == logging.ERROR and "hook" in r.getMessage()]
    assert len(failures) == 4
    assert all(r.exc_info is not None for r in failures)


def test_an_event_that_cannot_be_reported_still_reaches_the_hooks(
    seen: list[ResilienceEvent], caplog: pytest.LogCaptureFixture
) -> None:
    class Odd(ResilienceEvent):
        __slots__ = ()

        def log(self, log: logging.Logger) -> None:
            raise ValueError("cannot format")

        def attributes(self) -> dict[str, str]:  # type: ignore[override]
            return {}

    odd = Odd()
    with caplog.at_level(logging.WARNING, logger="resilience"):
        emit(odd)
    assert seen == [odd]
    assert any("reporting" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------------ defaults


async def test_events_land_on_the_current_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    clock = FakeClock()
    cb = breaker(clock)
    with tracer.start_as_current_span("reserve"):
        await cycle(cb, clock)
        with pytest.raises(Down):
            await with_retry(down, config=RetryConfig(max_attempts=2, base_delay=0.0), service_name="hotel_api")
    (span,) = exporter.get_finished_spans()
    names = [e.name for e in span.events]
    assert names == [
        "circuit.transition",
        "circuit.rejected",
        "circuit.transition",
        "circuit.transition",
        "retry.scheduled",
        "retry.gave_up",
    ]
    first = span.events[0].attributes
    assert first is not None
    assert dict(first) == {"circuit.name": "hotel_api", "circuit.from": "closed", "circuit.to": "open"}
    retry = span.events[4].attributes
    assert retry is not None and retry["retry.attempt"] == 1 and retry["retry.error"] == "Down"


async def test_bulkhead_events_are_warnings(seen: list[ResilienceEvent], caplog: pytest.LogCaptureFixture) -> None:
    bulkhead = Bulkhead("booking_agent", BulkheadConfig(max_concurrent=1, timeout=0.05, acquire_timeout=0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(gate.wait))
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="resilience"):
        with pytest.raises(BulkheadFullError):
            await bulkhead.run(ok)
        with pytest.raises(BulkheadTimeoutError):
            await holder
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages[0].startswith("[BH:booking_agent] full: 1 in use")
    assert messages[1] == "[BH:booking_agent] call exceeded 0.050s and was cancelled"


# ------------------------------------------------------------------------------------------------ metrics


@pytest.fixture
def metrics_registry() -> Iterator[CollectorRegistry]:
    registry = CollectorRegistry()
    yield registry
    uninstall_resilience_metrics(registry)


def test_installing_metrics_twice_installs_once(metrics_registry: CollectorRegistry) -> None:
    before = len(hooks())
    first = install_resilience_metrics(metrics_registry)
    assert install_resilience_metrics(metrics_registry) is first
    assert len(hooks()) == before + 1
    uninstall_resilience_metrics(metrics_registry)
    assert len(hooks()) == before


async def test_events_become_prometheus_samples(metrics_registry: CollectorRegistry) -> None:
    install_resilience_metrics(metrics_registry)

    def value(metric: str, /, **labels: str) -> float | None:
        return metrics_registry.get_sample_value(metric, labels)

    cb = circuit_registry.configure("hotel_api", CircuitBreakerConfig(failure_threshold=1, recovery_timeout=0.05))
    with pytest.raises(Down):
        await cb.call(down)
    for _ in range(3):
        with pytest.raises(CircuitOpenError):
            await cb.call(ok)
    assert value("concierge_circuit_transitions_total", name="hotel_api", **{"from": "closed", "to": "open"}) == 1
    assert value("concierge_circuit_rejections_total", name="hotel_api") == 3
    assert value("concierge_circuit_state", name="hotel_api") == 1
    await asyncio.sleep(0.06)
    await cb.call(ok)
    assert value("concierge_circuit_state", name="hotel_api") == 2

    with pytest.raises(Down):
        await with_retry(down, config=RetryConfig(max_attempts=3, base_delay=0.0), service_name="search_agent")
    assert value("concierge_retries_total", service="search_agent") == 2
    assert value("concierge_retry_give_ups_total", service="search_agent", reason="attempts_exhausted") == 1

    bulkhead = bulkhead_registry.configure("booking_agent", max_concurrent=1, timeout=0.05, acquire_timeout=0)
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(gate.wait))
    await asyncio.sleep(0)
    assert value("concierge_bulkhead_in_use", name="booking_agent") == 1
    assert value("concierge_bulkhead_max", name="booking_agent") == 1
    with pytest.raises(BulkheadFullError):
        await bulkhead.run(ok)
    with pytest.raises(BulkheadTimeoutError):
        await holder
    assert value("concierge_bulkhead_rejections_total", name="booking_agent") == 1
    assert value("concierge_bulkhead_timeouts_total", name="booking_agent") == 1
    assert value("concierge_bulkhead_in_use", name="booking_agent") == 0

    with budget_scope(0.02), pytest.raises(TimeoutError):
        await run_within_budget("payment_api", asyncio.sleep, 5)
    assert value("concierge_budget_expirations_total", name="payment_api") == 1


async def test_retry_events_carry_the_error(seen: list[ResilienceEvent]) -> None:
    with pytest.raises(Down):
        await with_retry(down, config=RetryConfig(max_attempts=2, base_delay=0.0), service_name="hotel_api")
    scheduled = [e for e in seen if isinstance(e, RetryScheduled)]
    assert len(scheduled) == 1
    assert isinstance(scheduled[0].error, Down)
