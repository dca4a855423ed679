"""traced_node: one span per node execution, with the attributes an operator filters on, inside a real StateGraph."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from graph import traced_node, use_tracer_provider


class State(TypedDict, total=False):
    value: int
    seen_thread: str | None
    answer: str


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    provider = TracerProvider(resource=Resource.create({"service.name": "booking-agent"}))
    try:
        with use_tracer_provider(provider):
            yield provider
    finally:
        provider.shutdown()


@pytest.fixture
def spans(provider: TracerProvider) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def node_spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == f"node {name}"]


def test_signature_and_name_are_those_of_the_wrapped_node() -> None:
    @traced_node("reserve")
    async def reserve(state: State, config: RunnableConfig) -> dict[str, Any]:
        return {}

    assert list(inspect.signature(reserve).parameters) == ["state", "config"]
    assert reserve.__name__ == "reserve"
    assert inspect.iscoroutinefunction(reserve)


async def test_span_in_a_real_graph_carries_node_thread_and_service(spans: InMemorySpanExporter) -> None:
    @traced_node("double")
    async def double(state: State, config: RunnableConfig) -> dict[str, Any]:
        # LangGraph passes config only when the (visible) signature declares it.
        return {"value": state["value"] * 2, "seen_thread": config["configurable"].get("thread_id")}

    builder = StateGraph(State)
    builder.add_node("double", double)
    builder.add_edge(START, "double")
    builder.add_edge("double", END)
    graph = builder.compile(checkpointer=InMemorySaver())

    out = await graph.ainvoke({"value": 21}, {"configurable": {"thread_id": "booking-42"}})

    assert out["value"] == 42
    assert out["seen_thread"] == "booking-42"
    [span] = node_spans(spans, "double")
    assert span.attributes is not None
    assert span.attributes["langgraph.node"] == "double"
    assert span.attributes["langgraph.thread_id"] == "booking-42"
    assert span.attributes["service.name"] == "booking-agent"
    assert span.status.status_code is not StatusCode.ERROR


async def test_failure_is_recorded_as_error_and_re_raised(spans: InMemorySpanExporter) -> None:
    @traced_node("charge")
    async def charge(state: State, config: RunnableConfig) -> dict[str, Any]:
        raise LookupError("card vault unreachable")

    builder = StateGraph(State)
    builder.add_node("charge", charge)
    builder.add_edge(START, "charge")
    graph = builder.compile()

    with pytest.raises(LookupError, match="card vault unreachable"):
        await graph.ainvoke({"value": 1}, {"configurable": {"thread_id": "t-err"}})

    [span] = node_spans(spans, "charge")
    assert span.status.status_code is StatusCode.ERROR
    assert "card vault unreachable" in (span.status.description or "")
    [event] = [e for e in span.events if e.name == "exception"]
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "LookupError"


async def test_interrupt_is_control_flow_not_an_error(spans: InMemorySpanExporter) -> None:
    @traced_node("ask")
    async def ask(state: State, config: RunnableConfig) -> dict[str, Any]:
        return {"answer": interrupt("which hotel?")}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t-interrupt"}}

    paused = await graph.ainvoke({"value": 1}, config)
    assert "__interrupt__" in paused
    resumed = await graph.ainvoke(Command(resume="Ritz"), config)
    assert resumed["answer"] == "Ritz"

    first, second = node_spans(spans, "ask")
    assert first.status.status_code is not StatusCode.ERROR
    assert not [e for e in first.events if e.name == "exception"]
    assert second.status.status_code is not StatusCode.ERROR


async def test_cancellation_ends_the_span_and_propagates(spans: InMemorySpanExporter) -> None:
    started = asyncio.Event()

    @traced_node("slow")
    async def slow(state: State, config: RunnableConfig) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(60)
        return {}

    task = asyncio.create_task(slow({}, {"configurable": {"thread_id": "t-cancel"}}))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    [span] = node_spans(spans, "slow")
    assert span.end_time is not None
    assert span.status.status_code is not StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["cancelled"] is True


async def test_no_thread_id_means_no_thread_attribute(spans: InMemorySpanExporter) -> None:
    @traced_node("plain")
    async def plain(state: State, config: RunnableConfig) -> dict[str, Any]:
        return {"value": 1}

    assert await plain({}, {}) == {"value": 1}

    [span] = node_spans(spans, "plain")
    assert span.attributes is not None
    assert "langgraph.thread_id" not in span.attributes
    assert span.attributes["langgraph.node"] == "plain"


async def test_spans_nest_under_the_callers_span(provider: TracerProvider, spans: InMemorySpanExporter) -> None:
    @traced_node("inner")
    async def inner(state: State, config: RunnableConfig) -> dict[str, Any]:
        return {}

    with provider.get_tracer("test").start_as_current_span("request") as parent:
        await inner({}, {"configurable": {"thread_id": "t"}})

    [span] = node_spans(spans, "inner")
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id


async def _no_config(state: State) -> dict[str, Any]:
    return {}


async def _config_typed_as_dict(state: State, config: dict[str, Any]) -> dict[str, Any]:
    return {}


def _sync_node(state: State, config: RunnableConfig) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize("fn", [_no_config, _config_typed_as_dict, _sync_node])
def test_a_node_langgraph_would_not_pass_config_to_is_refused_when_the_graph_is_built(fn: Any) -> None:
    # LangGraph silently drops config for these; failing at build time beats failing on every run.
    with pytest.raises(TypeError, match="bad"):
        traced_node("bad")(fn)


async def test_keyword_only_config_is_passed_by_the_graph(spans: InMemorySpanExporter) -> None:
    @traced_node("kw")
    async def kw(state: State, *, config: RunnableConfig) -> dict[str, Any]:
        return {"seen_thread": config["configurable"]["thread_id"]}

    builder = StateGraph(State)
    builder.add_node("kw", kw)  # type: ignore[arg-type]  # the stubs model positional config only
    builder.add_edge(START, "kw")
    graph = builder.compile()

    out = await graph.ainvoke({"value": 1}, {"configurable": {"thread_id": "t-kw"}})

    assert out["seen_thread"] == "t-kw"
