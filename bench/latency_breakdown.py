"""Where the time of one booking goes: its trace, split into the parts of its path, for bookings made one at a time.

Run: ``python -m bench.latency_breakdown [--bookings 200]``. Starts the five services as ``bench.booking_throughput``
does (real processes, Postgres checkpointer, fresh database and key prefix, all removed at the end), with their
spans sent over OTLP/HTTP in batches (``OTEL_EXPORTER_OTLP_ENDPOINT``, a receiver in this process) so that no
span is written on the request path; books ``--bookings`` hotels with one client; then splits every booking's
trace, from ``POST /bookings`` to the end of its last step, into:

- each span's own time (its duration minus the time covered by its children), labelled by what the span is:
  a server span is the callee's handling of a request (framework, validation, its Redis calls, its logic); a
  client span minus the callee's server span is the leg itself (the caller's HTTP client, the wire, the callee's
  server before and after the app); ``a2a.call`` minus its request is the A2A SDK's client side; ``a2a.skill``
  minus its graph's nodes is the graph run around them (LangGraph, checkpoint writes where the graph has a
  checkpointer); a node's own time is what it does besides its calls (for a side-effect node: the idempotency
  claim and record, the lease check; for every call: the resilience layers; progress reports);
- the time between the booking run's steps (LangGraph and the checkpoint writes of a ``durability="sync"`` step),
  and from the 202 to the first step (lease, graph start, the first two checkpoints).

The parts add up to the trace's length. Prints the median per booking of each part (and the client's latency to
``confirmed``, which adds the long-poll's answer) and writes ``bench/results/latency_breakdown.json``. No target:
it tells ``bench.booking_throughput``'s latency bound where the time beyond the priced parts goes.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench._stack import machine, percentiles, service_stack, write_results
from bench.booking_throughput import BookingFactory, StopRule, new_event_loop, run_load
from tests.procs import HOST, free_port, serve_in_thread
from tests.stack import TEST_DATABASE_URL

RESULTS = Path(__file__).resolve().parent / "results" / "latency_breakdown.json"


# ------------------------------------------------------------------------------------------------ the receiver


class Receiver:
    """An OTLP/HTTP trace receiver on a thread of its own: keeps the request bodies, decodes them at the end."""

    def __init__(self) -> None:
        self.port = free_port()
        self._bodies: list[bytes] = []
        self._lock = threading.Lock()

        async def traces(request: Request) -> Response:
            body = await request.body()
            if request.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            with self._lock:
                self._bodies.append(body)
            return Response(ExportTraceServiceRequest().SerializeToString(), media_type="application/x-protobuf")

        self._app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @contextmanager
    def running(self) -> Iterator[Receiver]:
        with serve_in_thread(self._app, port=self.port):
            yield self

    def spans(self) -> list[SpanRecord]:
        with self._lock:
            bodies = list(self._bodies)
        records: list[SpanRecord] = []
        for body in bodies:
            request = ExportTraceServiceRequest.FromString(body)
            for resource_spans in request.resource_spans:
                service = next(
                    (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), "?"
                )
                for scope in resource_spans.scope_spans:
                    records += [SpanRecord.of(service, span) for span in scope.spans]
        return records


# ------------------------------------------------------------------------------------------------ the analysis


@dataclass(frozen=True)
class SpanRecord:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str | None
    start: int
    end: int
    thread_id: str | None

    @classmethod
    def of(cls, service: str, span: SpanProto) -> SpanRecord:
        attributes = {a.key: a.value for a in span.attributes}
        thread = attributes.get("langgraph.thread_id")
        return cls(
            service=service,
            name=span.name,
            kind=span.kind,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex() or None,
            start=span.start_time_unix_nano,
            end=span.end_time_unix_nano,
            thread_id=thread.string_value if thread is not None else None,
        )


def _covered(intervals: Sequence[tuple[int, int]], start: int, end: int) -> int:
    """Nanoseconds of [start, end] covered by the union of ``intervals``."""
    total, cursor = 0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, cursor), min(hi, end)
        if hi > lo:
            total += hi - lo
            cursor = hi
    return total


def label(span: SpanRecord) -> str:
    if span.kind == SpanProto.SPAN_KIND_SERVER:
        return f"{span.service}: handling {span.name} (server span, own time)"
    if span.kind == SpanProto.SPAN_KIND_CLIENT and span.name.startswith("a2a.call"):
        return f"{span.service}: A2A client side of {span.name.removeprefix('a2a.call ')} (SDK, conversions)"
    if span.kind == SpanProto.SPAN_KIND_CLIENT:
        return "HTTP legs: caller's client, wire and callee's server around the app (client span - server span)"
    if span.name.startswith("a2a.skill"):
        return f"{span.service}: {span.name} outside its graph's nodes (dispatch, graph run, checkpoints if any)"
    if span.name.startswith("node "):
        return f"{span.service}: {span.name}, own work besides its calls"
    return f"{span.service}: {span.name}"


RUN_START = "booking-agent: from the 202 to the first step (lease, graph start, its first 2 checkpoints)"
BETWEEN_STEPS = "booking-agent: between steps (LangGraph, each step's task writes and checkpoint)"


def by_booking(spans: Sequence[SpanRecord]) -> dict[str, list[SpanRecord]]:
    """Each booking's whole trace (every process), found through its run's node spans (thread id = booking id)."""
    traces: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in spans:
        traces[span.trace_id].append(span)
    return {
        span.thread_id: traces[span.trace_id]
        for span in spans
        if span.service == "booking-agent" and span.thread_id and span.name.startswith("node ")
    }


def breakdown(trace: Sequence[SpanRecord], booking_id: str) -> dict[str, float] | None:
    """Milliseconds per part for one booking's trace; ``None`` if the trace is incomplete."""
    run = [
        s for s in trace if s.service == "booking-agent" and s.thread_id == booking_id and s.name.startswith("node ")
    ]
    if not run:
        return None
    roots = [s for s in trace if s.service == "booking-agent" and s.name == "POST /bookings"]
    if len(roots) != 1:
        return None
    root = roots[0]
    children: dict[str, list[SpanRecord]] = defaultdict(list)
    for span in trace:
        if span.parent_id is not None:
            children[span.parent_id].append(span)
    steps = sorted((s for s in children[root.span_id] if s in run), key=lambda s: s.start)
    parts: dict[str, float] = defaultdict(float)
    # own time of every span in the trace (the steps hang under the POST span but run after it: clip to each span)
    for span in trace:
        own = (span.end - span.start) - _covered(
            [(c.start, c.end) for c in children[span.span_id]], span.start, span.end
        )
        parts[label(span)] += own / 1e6
    parts[RUN_START] += (steps[0].start - root.end) / 1e6
    for previous, following in itertools.pairwise(steps):
        parts[BETWEEN_STEPS] += (following.start - previous.end) / 1e6
    parts["total (POST /bookings to the end of the last step)"] = (steps[-1].end - root.start) / 1e6
    return dict(parts)


# ------------------------------------------------------------------------------------------------ the run


async def book(url: str, count: int, seed: int) -> tuple[list[str], list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await run_load(http, clients=1, stop=StopRule(confirmed=20), new_booking=BookingFactory(seed))  # warm-up
        result = await run_load(
            http, clients=1, stop=StopRule(confirmed=count), new_booking=BookingFactory(seed + 1), keep_ids=count
        )
    return result.confirmed_ids, result.confirmed_latencies_s()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_breakdown", description=__doc__.splitlines()[0])
    parser.add_argument("--bookings", type=int, default=200, help="bookings made one at a time (default 200)")
    parser.add_argument("--seed", type=int, default=20241129)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--admin-database-url", default=TEST_DATABASE_URL)
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    if options.bookings < 1:
        parser.error("--bookings must be at least 1")

    receiver = Receiver()
    with receiver.running():
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "500"}
        with service_stack(
            redis_url=options.redis_url, admin_database_url=options.admin_database_url, env=env
        ) as stack:
            ids, latencies = new_event_loop().run_until_complete(
                book(stack.url("booking-agent"), options.bookings, options.seed)
            )
            time.sleep(2)  # the last batches (500 ms schedule) reach the receiver before the services are killed
        spans = receiver.spans()

    traces = by_booking(spans)
    per_booking = [b for i in ids if i in traces and (b := breakdown(traces[i], i)) is not None]
    if not per_booking:
        print(f"no complete trace among {len(ids)} bookings ({len(spans)} spans received)", file=sys.stderr)
        return 1
    names = sorted({name for b in per_booking for name in b})
    medians = {name: statistics.median(b.get(name, 0.0) for b in per_booking) for name in names}
    total = "total (POST /bookings to the end of the last step)"
    print(f"\n# where one booking's time goes: {len(per_booking)} bookings, one at a time\n")
    print("| part | median ms per booking |")
    print("|---|---:|")
    for name, ms in sorted(medians.items(), key=lambda item: -item[1]):
        if name != total:
            print(f"| {name} | {ms:.2f} |")
    print(f"| **{total}** | **{medians[total]:.2f}** |")
    client = percentiles(latencies, scale=1000)
    print(
        f"\nclient latency to `confirmed` (adds the POST's request and the long-poll's answer): p50 {client['p50']:.1f} ms"
    )
    write_results(
        options.output,
        {
            "machine": machine(),
            "bookings": len(per_booking),
            "median_ms_per_booking": medians,
            "client_latency_ms": client,
            "per_booking": per_booking,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
