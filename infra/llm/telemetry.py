"""The model calls seen from outside: one OpenTelemetry span per request, following the GenAI semantic conventions,
and the Prometheus metrics of ``infra.metrics.llm_metrics`` (the conventions' two and ours):

- ``gen_ai_client_token_usage{gen_ai_operation_name,gen_ai_request_model,gen_ai_response_model,gen_ai_token_type}``
  (``gen_ai.client.token.usage``), ``gen_ai_client_operation_duration_seconds{...,error_type}``
  (``gen_ai.client.operation.duration``), ``gen_ai_server_time_to_first_token_seconds``;
- ``concierge_llm_retries_total{model,reason}``, ``concierge_llm_retry_after_waited_seconds{model}``,
  ``concierge_llm_fallbacks_total{reason,from_model,to_model}``, ``concierge_llm_budget_stops_total{budget}``,
  ``concierge_llm_limiter_wait_seconds{model}``, ``concierge_llm_limiter_refusals_total{model}``.

Retries are counted from the resilience events (``RetryScheduled`` of ``llm_*``), so the loop stays the one loop.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from langchain_core.messages import AIMessage
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infra.metrics import llm_metrics

__all__ = ["ModelCallSpan", "count_budget_stop", "count_fallback", "observe_limiter_wait"]

_tracer = trace.get_tracer("concierge.llm")


def count_fallback(reason: str, from_model: str, to_model: str) -> None:
    llm_metrics().fallbacks.labels(reason, from_model, to_model).inc()


def count_budget_stop(budget: str) -> None:
    llm_metrics().budget_stops.labels(budget).inc()


def observe_limiter_wait(model: str, seconds: float, *, refused: bool = False) -> None:
    metrics = llm_metrics()
    if refused:
        metrics.limiter_refusals.labels(model).inc()
    else:
        metrics.limiter_wait.labels(model).observe(seconds)


class ModelCallSpan:
    """``chat {model}``: one request to a model (a CLIENT span), its GenAI attributes and its two metrics."""

    __slots__ = ("_begun", "_clock", "_error", "_model", "_response_model", "_span", "_usage")

    def __init__(self, model: str, base_url: str, attempt: int, max_tokens: int | None) -> None:
        self._clock = time.perf_counter
        self._model = model
        self._response_model = model
        self._error: str | None = None
        self._usage: tuple[int, int] | None = None
        address = urlsplit(base_url)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.system": "openai",
            "gen_ai.request.model": model,
            "server.address": address.hostname or "",
            "concierge.llm.attempt": attempt,
        }
        if address.port is not None:
            attributes["server.port"] = address.port
        if max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = max_tokens
        self._span = _tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes)
        self._begun = self._clock()

    def __enter__(self) -> ModelCallSpan:
        return self

    def first_token(self, seconds: float) -> None:
        self._span.add_event("gen_ai.first_token", {"seconds": seconds})
        llm_metrics().time_to_first_token.labels("chat", self._model).observe(seconds)

    def done(self, message: AIMessage, usage: Any, response_model: str) -> None:
        self._response_model = response_model
        metadata = message.response_metadata
        reason = metadata.get("finish_reason")
        attributes: dict[str, Any] = {
            "gen_ai.response.model": response_model,
            "gen_ai.usage.input_tokens": usage.input_tokens,
            "gen_ai.usage.output_tokens": usage.output_tokens,
        }
        if reason:
            attributes["gen_ai.response.finish_reasons"] = (str(reason),)
        if message.id:
            attributes["gen_ai.response.id"] = message.id
        self._span.set_attributes(attributes)
        self._usage = (usage.input_tokens, usage.output_tokens)

    def failed(self, error: BaseException) -> None:
        self._error = str(getattr(error, "code", None) or type(error).__name__)
        self._span.set_attribute("error.type", self._error)
        self._span.set_status(Status(StatusCode.ERROR, str(error)[:200]))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None and self._error is None:
            self._error = type(exc).__name__
            self._span.set_attribute("error.type", self._error)
            self._span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        self._span.end()
        metrics = llm_metrics()
        labels = ("chat", self._model, self._response_model)
        metrics.duration.labels(*labels, self._error or "").observe(self._clock() - self._begun)
        if self._usage is not None:
            metrics.token_usage.labels(*labels, "input").observe(self._usage[0])
            metrics.token_usage.labels(*labels, "output").observe(self._usage[1])
