"""OpenTelemetry set-up for one process.

``configure_telemetry(service_name)`` installs a tracer provider named after the service. Spans go to OTLP when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, to a JSON-lines file when ``CONCIERGE_SPAN_FILE`` is set (how the
cross-process tracing test reads them), to an exporter a test passes in, and nowhere otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from infra.settings import get_settings

logger = logging.getLogger(__name__)
_configured: dict[str, TracerProvider] = {}


class JsonLinesSpanExporter(SpanExporter):
    """Appends one JSON object per finished span; small enough to read in a test."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            parent = span.parent
            lines.append(
                json.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
                        "span_id": f"{ctx.span_id:016x}" if ctx else None,
                        "parent_id": f"{parent.span_id:016x}" if parent else None,
                        # Epoch nanoseconds: spans from different processes line up on one time axis.
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "attributes": {k: _plain(v) for k, v in (span.attributes or {}).items()},
                        "status": span.status.status_code.name,
                        "events": [e.name for e in span.events],
                    }
                )
            )
        with self._lock, self._path.open("a", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def configure_telemetry(service_name: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install (once per process) the tracer provider for ``service_name`` and return it."""
    existing = _configured.get("provider")
    if existing is not None:
        if exporter is not None:
            existing.add_span_processor(SimpleSpanProcessor(exporter))
        return existing
    settings = get_settings()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = settings.otlp_endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if settings.span_file is not None:
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(settings.span_file)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured["provider"] = provider
    return provider


def shutdown_telemetry() -> None:
    """Flush and stop exporters (called from a service's lifespan on exit)."""
    provider = _configured.get("provider")
    if provider is not None:
        provider.force_flush()
