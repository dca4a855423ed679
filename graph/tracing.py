"""``traced_node``: one OpenTelemetry span per execution of a LangGraph node.

Use it outermost (``@traced_node(name)`` above ``@idempotent_node(...)``) so the span covers the idempotency
claim too. The wrapped function's signature stays visible to ``inspect.signature``: LangGraph passes ``config``
only to nodes that declare it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphBubbleUp
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from domain.booking import JournalKind
from graph.contract import F, check_node, thread_id_of
from infra.journal import current_scope, note
from resilience.budget import remaining_budget
from resilience.switches import Restore

TRACER_NAME = "concierge.graph"
ATTR_NODE = "langgraph.node"
ATTR_BUDGET = "concierge.budget_remaining_s"
ATTR_THREAD_ID = "langgraph.thread_id"
ATTR_SERVICE = "service.name"

# ---------------------------------------------------------------------------------------------------------------
# tracing


@dataclasses.dataclass(frozen=True)
class _TracerEntry:
    provider: trace.TracerProvider
    tracer: trace.Tracer
    service: str | None


_provider_override: trace.TracerProvider | None = None
_tracer_cache: _TracerEntry | None = None


def use_tracer_provider(provider: trace.TracerProvider | None) -> Restore[trace.TracerProvider | None]:
    """Make ``traced_node`` use ``provider`` instead of the global one (``None``: back to global).

    The global provider can be set only once per process, so tests inject their own here:
    ``with use_tracer_provider(provider): ...`` puts the previous one back on exit.
    """
    global _provider_override
    old, _provider_override = _provider_override, provider
    return Restore(old, _put_provider)


def _put_provider(provider: trace.TracerProvider | None) -> None:
    global _provider_override
    _provider_override = provider


def _tracer() -> _TracerEntry:
    # Looked up per call (not at decoration time) so a provider configured after the graph was built is used;
    # cached per provider object because SDK ``get_tracer`` builds a new tracer each time.
    global _tracer_cache
    provider = _provider_override or trace.get_tracer_provider()
    entry = _tracer_cache
    if entry is None or entry.provider is not provider:
        resource = getattr(provider, "resource", None)
        service = resource.attributes.get("service.name") if resource is not None else None
        entry = _TracerEntry(provider, provider.get_tracer(TRACER_NAME), str(service) if service else None)
        _tracer_cache = entry
    return entry


def traced_node(name: str) -> Callable[[F], F]:
    """One span ``node <name>`` per execution of an async node ``(state, config) -> dict``; use it outermost.

    Attributes: ``langgraph.node``, ``langgraph.thread_id`` (when the config has one), ``service.name``,
    ``concierge.budget_remaining_s`` (the timeout budget left when the node starts). An
    exception is recorded and sets ERROR status, then re-raised. Inside a ``journal_scope`` (a booking run) it also
    journals ``step_started`` and ``step_finished`` (attempt, outcome, duration; the scope adds the fence). LangGraph control flow (interrupts, parent
    commands) and cancellation are not failures of the node: they end the span without ERROR.
    """

    def decorate(fn: F) -> F:
        check_node(fn, "traced_node", name)

        @functools.wraps(fn)
        async def node(state: Any, config: RunnableConfig) -> dict[str, Any]:
            entry = _tracer()
            # the budget left when the node starts: shows in a trace how each hop shrank the caller's deadline
            attributes: dict[str, str | float] = {ATTR_NODE: name, ATTR_BUDGET: round(remaining_budget(), 3)}
            thread_id = thread_id_of(config)
            if thread_id is not None:
                attributes[ATTR_THREAD_ID] = thread_id
            if entry.service is not None:
                attributes[ATTR_SERVICE] = entry.service
            scope = current_scope()
            if scope is not None and not scope.steps:
                scope = None
            attempt = 0
            if scope is not None:
                attempt = scope.attempts[name] = scope.attempts.get(name, 0) + 1
                note(JournalKind.STEP_STARTED, step=name, attempt=attempt)
            started = time.perf_counter()
            outcome = "ok"
            with entry.tracer.start_as_current_span(
                f"node {name}", attributes=attributes, record_exception=False, set_status_on_exception=False
            ) as span:
                try:
                    return await fn(state, config=config)
                except GraphBubbleUp as exc:
                    span.set_attribute("langgraph.control_flow", type(exc).__name__)
                    raise
                except asyncio.CancelledError:
                    span.set_attribute("cancelled", True)
                    outcome = "cancelled"
                    raise
                except Exception as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                    outcome = type(exc).__name__
                    raise
                finally:
                    if scope is not None:
                        duration_ms = round((time.perf_counter() - started) * 1000, 1)
                        note(
                            JournalKind.STEP_FINISHED,
                            step=name,
                            attempt=attempt,
                            outcome=outcome,
                            duration_ms=duration_ms,
                        )

        return cast(F, node)

    return decorate
