"""infra.http: what every request between services carries, and the CLIENT span around it."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from identity.auth import NoServiceIdentityError, use_service_identity, verify_service_token
from infra.http import create_http_client, never_connected
from infra.settings import get_settings
from infra.telemetry import configure_telemetry
from resilience import BUDGET_HEADER, budget_scope

SECRET = "http-client-test-secret-" + "x" * 32


@pytest.fixture
def booking_agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process plays booking-agent, as the service shell would set it up."""
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", SECRET)
    get_settings.cache_clear()
    with use_service_identity("booking-agent", get_settings()):
        yield
    get_settings.cache_clear()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    configure_telemetry("http-client-test", exporter=exporter)
    yield exporter
    exporter.clear()


def client_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]


async def test_a_request_carries_budget_token_and_the_context_of_its_own_client_span(
    spans: InMemorySpanExporter, booking_agent: None
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    tracer = trace.get_tracer("test")
    async with create_http_client(
        "http://payment-agent:8002", audience="payment-agent", transport=httpx.MockTransport(answer)
    ) as http:
        with tracer.start_as_current_span("node charge") as parent, budget_scope(10):
            response = await http.get("/charges", params={"reference": "b-1"})
    assert response.json() == {"ok": True}

    (span,) = client_spans(spans)
    assert span.name == "GET"
    assert span.parent is not None and span.parent.span_id == parent.get_span_context().span_id
    assert dict(span.attributes or {}) == {
        "http.request.method": "GET",
        "url.full": "http://payment-agent:8002/charges",  # no query string in the trace
        "server.address": "payment-agent",
        "server.port": 8002,
        "http.response.status_code": 200,
    }
    assert span.status.status_code == StatusCode.UNSET

    (request,) = seen
    context = span.get_span_context()
    # the callee's server span will be a child of this client span, in the caller's trace
    assert request.headers["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert 0 < float(request.headers[BUDGET_HEADER]) < 10
    scheme, _, token = request.headers["Authorization"].partition(" ")
    assert scheme == "Bearer"
    claims = verify_service_token(token, secret=SECRET, audience="payment-agent")
    assert (claims.issuer, claims.audience) == ("booking-agent", "payment-agent")


async def test_the_service_token_is_minted_once_and_reused_not_signed_per_request(booking_agent: None) -> None:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["Authorization"])
        return httpx.Response(200, json={})

    async with create_http_client(
        "http://payment-agent:8002", audience="payment-agent", transport=httpx.MockTransport(answer)
    ) as http:
        for _ in range(3):
            await http.get("/")
    assert len(seen) == 3 and len(set(seen)) == 1


async def test_providers_get_no_token_and_a_peer_needs_a_service_identity() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    async with create_http_client("http://hotel-api", transport=httpx.MockTransport(answer)) as http:
        await http.get("/hotels")
    assert "Authorization" not in seen[0].headers
    # outside a running service, with no issuer named, there is no one to mint a token for
    with pytest.raises(NoServiceIdentityError):
        create_http_client("http://payment-agent:8002", audience="payment-agent")


async def test_each_attempt_is_its_own_span_and_failures_mark_it(spans: InMemorySpanExporter) -> None:
    answers = iter([httpx.Response(503, json={"error": "unavailable"}), httpx.ConnectError("refused")])

    def answer(request: httpx.Request) -> httpx.Response:
        reply = next(answers)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async with create_http_client("http://hotel-api", transport=httpx.MockTransport(answer)) as http:
        assert (await http.post("/reservations", json={})).status_code == 503
        with pytest.raises(httpx.ConnectError):
            await http.post("/reservations", json={})

    unavailable, refused = client_spans(spans)
    assert unavailable.status.status_code == StatusCode.ERROR
    assert unavailable.attributes is not None and unavailable.attributes["error.type"] == "503"
    assert refused.status.status_code == StatusCode.ERROR
    assert refused.attributes is not None and refused.attributes["error.type"] == "ConnectError"
    assert "http.response.status_code" not in refused.attributes
    assert [event.name for event in refused.events] == ["exception"]


def test_every_client_verifies_tls_with_one_shared_context_as_httpx_builds_it() -> None:
    from infra.http import _ssl_context

    context = _ssl_context()
    assert context is _ssl_context()  # built once per process, not per client (docs/benchmarks.md#start-up)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname  # httpx's verify=True
    assert context.cert_store_stats()["x509_ca"] > 0


@pytest.mark.parametrize(
    ("exc", "never"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ConnectTimeout("slow"), True),
        (httpx.PoolTimeout("no free connection"), True),
        (httpx.ReadTimeout("sent, no answer"), False),
        (httpx.RemoteProtocolError("reset"), False),
        (RuntimeError("no request at all"), False),
    ],
)
def test_never_connected_names_the_failures_before_a_byte_left(exc: Exception, never: bool) -> None:
    assert never_connected(exc) is never
    try:
        raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert never_connected(wrapped) is never  # what it was raised from counts
