"""The service shell every service is built on: edge limits, budget, error mapping, health, metrics (real Redis)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import psycopg
import pytest
from fastapi import FastAPI, Request, WebSocket
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, Field
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from infra.service import MAX_BODY_BYTES, create_service_app
from infra.settings import get_settings
from infra.telemetry import configure_telemetry
from resilience import (
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    circuit_registry,
    current_deadline,
    remaining_budget,
)
from tests.conftest import free_port


class Item(BaseModel):
    name: str
    quantity: int = Field(ge=1)


def build_app(**kwargs: object) -> FastAPI:
    app = create_service_app("shell-test", **kwargs)  # type: ignore[arg-type]
    app.state.calls = 0

    @app.middleware("http")
    async def counting(request: Request, call_next):  # type: ignore[no-untyped-def]
        # a service's own middleware: the host check must answer before it runs
        request.app.state.calls += 1
        return await call_next(request)

    @app.post("/items")
    async def create_item(item: Item) -> dict[str, object]:
        return item.model_dump()

    @app.post("/size")
    async def size(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    @app.get("/budget")
    async def budget() -> dict[str, float]:
        return {"remaining": remaining_budget()}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail")

    errors: dict[str, Exception] = {
        "circuit": CircuitOpenError("hotel_api", 2.2),
        "bulkhead-full": BulkheadFullError("search_agent", 4, 0.1),
        "bulkhead-timeout": BulkheadTimeoutError("search_agent", 1.0),
        "budget": BudgetExhaustedError("timeout budget exhausted"),
        # a virtual row of the error table (psycopg is not imported for it): the error boundary answers it
        "postgres": psycopg.OperationalError("server closed the connection unexpectedly"),
    }

    @app.get("/fail/{kind}")
    async def fail(kind: str) -> None:
        raise errors[kind]

    return app


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        # raise_app_exceptions stays on: an exception escaping the shell would fail the test.
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shell-test") as client:
            yield client


@pytest.fixture
async def client(redis: object, settings_env: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    async with running(build_app()) as client:
        yield client


async def chunks(total: int, size: int = 8192) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        part = min(size, total - sent)
        sent += part
        yield b"x" * part


# ------------------------------------------------------------------------------------------------ body limit


async def test_body_over_64_kib_with_content_length_is_413(client: httpx.AsyncClient) -> None:
    response = await client.post("/size", content=b"x" * (65 * 1024))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"


async def test_chunked_body_over_64_kib_is_413_even_for_a_json_route(client: httpx.AsyncClient) -> None:
    for path in ("/size", "/items"):
        response = await client.post(path, content=chunks(65 * 1024), headers={"content-type": "application/json"})
        assert "content-length" not in response.request.headers
        assert response.status_code == 413, path
        assert response.json()["error"]["code"] == "body_too_large"


async def test_chunked_body_at_the_limit_is_read_whole(client: httpx.AsyncClient) -> None:
    response = await client.post("/size", content=chunks(MAX_BODY_BYTES))
    assert response.status_code == 200
    assert response.json() == {"bytes": MAX_BODY_BYTES}


# ------------------------------------------------------------------------------------------------ host check

REBINDING = {"Host": "evil.example:8090", "Origin": "http://evil.example:8090"}


async def test_a_host_that_is_not_ours_is_421_before_any_middleware_or_route_runs(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="infra.service"):
        for path in ("/items", "/size"):
            response = await client.post(path, json={"name": "a", "quantity": 1}, headers=REBINDING)
            assert response.status_code == 421, response.text
            error = response.json()["error"]
            assert error["code"] == "host_not_allowed"
            assert "'evil.example:8090'" in error["message"] and "CONCIERGE_ALLOWED_HOSTS" in error["message"]
        # another port of the same host is the same host; another host is logged too
        assert (await client.get("/health", headers={"Host": "evil.example:1"})).status_code == 421
        assert (await client.get("/health", headers={"Host": "other.example"})).status_code == 421
    assert app.state.calls == 0, "the service's own middleware ran for a refused request"
    refused = [r.getMessage() for r in caplog.records if "refusing requests for Host" in r.getMessage()]
    assert len(refused) == 2, refused  # once per host, not per request
    assert "evil.example" in refused[0] and "other.example" in refused[1]
    metrics = (await client.get("/metrics")).text
    assert 'concierge_http_refused_host_requests_total{service="shell-test"} 4.0' in metrics
    assert app.state.calls == 1  # /metrics itself


@pytest.mark.parametrize(
    "host", ["shell-test", "shell-test:8000", "127.0.0.1:9", "localhost:8090", "console.localhost", "[::1]:80"]
)
async def test_our_own_names_are_served(client: httpx.AsyncClient, host: str) -> None:
    response = await client.post("/items", json={"name": "a", "quantity": 1}, headers={"Host": host})
    assert response.status_code == 200, response.text


async def test_a_pod_ip_as_the_kubelet_sends_it_is_served(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health", headers={"Host": "10.244.1.17:8000"})).status_code == 200


async def test_two_host_headers_are_refused(client: httpx.AsyncClient) -> None:
    request = client.build_request("GET", "/health")
    request.headers = httpx.Headers([("host", "shell-test"), ("host", "evil.example")])
    assert (await client.send(request)).status_code == 421


async def test_the_hosts_of_the_url_settings_and_the_allowed_hosts_are_served(
    redis: object, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("SEARCH_AGENT_URL", "http://search.internal:8001")
    settings_env.setenv("CONCIERGE_ALLOWED_HOSTS", "concierge.example.com, .corp.example")
    get_settings.cache_clear()
    async with running(build_app()) as client:
        for host in ("search.internal:8001", "concierge.example.com", "corp.example", "a.b.corp.example:443"):
            assert (await client.get("/health", headers={"Host": host})).status_code == 200, host
        for host in ("example.com", "evilcorp.example", "concierge.example.com.evil.example"):
            assert (await client.get("/health", headers={"Host": host})).status_code == 421, host


async def test_a_websocket_from_another_host_is_closed_before_it_is_accepted(
    redis: object, settings_env: pytest.MonkeyPatch
) -> None:
    app = build_app()

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    with TestClient(app, base_url="http://shell-test") as sync_client:
        with sync_client.websocket_connect("/ws", headers={"Host": "shell-test"}) as socket:
            assert socket.receive_text() == "hello"
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            sync_client.websocket_connect("/ws", headers={"Host": "evil.example"}),
        ):
            pass
        assert refused.value.code == 1008


# ------------------------------------------------------------------------------------------------ budget


@pytest.mark.parametrize("value", ["abc", "nan", "-1", "0", "inf"])
async def test_invalid_budget_header_is_400_naming_the_header(client: httpx.AsyncClient, value: str) -> None:
    response = await client.get("/budget", headers={"X-Timeout-Budget": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_header"
    assert error["header"] == "X-Timeout-Budget"
    assert value in error["message"]


async def test_budget_header_reaches_the_endpoint_capped_at_the_maximum(
    redis: object, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("CONCIERGE_MAX_BUDGET_S", "5")
    settings_env.setenv("CONCIERGE_DEFAULT_BUDGET_S", "3")
    get_settings.cache_clear()
    async with running(build_app()) as client:
        given = (await client.get("/budget", headers={"X-Timeout-Budget": "2.5"})).json()["remaining"]
        capped = (await client.get("/budget", headers={"X-Timeout-Budget": "9999"})).json()["remaining"]
        default = (await client.get("/budget")).json()["remaining"]
    assert 2.0 < given <= 2.5
    assert 4.0 < capped <= 5.0
    assert 2.5 < default <= 3.0
    # the request's deadline ended with the request, even though the app ran in this task
    assert current_deadline() is None


# ------------------------------------------------------------------------------------------------ errors


async def test_malformed_json_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/items", content=b'{"name": ', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


async def test_bad_field_is_422_naming_the_field(client: httpx.AsyncClient) -> None:
    response = await client.post("/items", json={"name": "towel", "quantity": 0})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "quantity"]
    assert "greater than or equal to 1" in error["msg"]


async def test_open_circuit_is_503_with_retry_after(client: httpx.AsyncClient) -> None:
    response = await client.get("/fail/circuit")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "3"
    assert response.json()["error"]["code"] == "provider_unavailable"  # the error table's one answer
    assert response.json()["error"]["circuit"] == "hotel_api"


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [("bulkhead-full", 503, "bulkhead_full"), ("bulkhead-timeout", 504, "timeout"), ("budget", 504, "timeout")],
)
async def test_resilience_errors_map_to_503_and_504(
    client: httpx.AsyncClient, kind: str, status: int, code: str
) -> None:
    response = await client.get(f"/fail/{kind}")
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


async def test_a_postgres_outage_is_503_dependency_unavailable_with_retry_after(client: httpx.AsyncClient) -> None:
    response = await client.get("/fail/postgres")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "dependency_unavailable"


async def test_unexpected_error_is_500_without_traceback_and_is_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="infra.service"):
        response = await client.get("/boom")
    assert response.status_code == 500
    assert response.json() == {"error": {"code": "internal"}}
    assert "secret" not in response.text and "Traceback" not in response.text
    [record] = [r for r in caplog.records if r.name == "infra.service"]
    assert record.exc_info is not None and "secret internal detail" in str(record.exc_info[1])


# ------------------------------------------------------------------------------------------------ health


async def test_health_names_the_service_and_instance(client: httpx.AsyncClient) -> None:
    body = (await client.get("/health")).json()
    assert body["status"] == "ok"
    assert body["service"] == "shell-test"
    assert body["instance_id"]
    assert body["uptime_s"] >= 0


async def test_ready_checks_redis_and_the_callers_checks(redis: object, settings_env: pytest.MonkeyPatch) -> None:
    healthy = True

    async def flaky() -> bool:
        return healthy

    async def broken() -> None:
        raise ConnectionError("database is down")

    async with running(build_app(ready_checks={"flaky": flaky})) as client:
        response = await client.get("/health/ready")
        assert response.status_code == 200
        assert response.json()["checks"] == {"redis": "ok", "flaky": "ok"}
        healthy = False
        response = await client.get("/health/ready")
        assert response.status_code == 503
        assert response.json()["failing"] == ["flaky"]

    async with running(build_app(ready_checks={"db": broken})) as client:
        response = await client.get("/health/ready")
        assert response.status_code == 503
        assert "database is down" in response.json()["checks"]["db"]


async def test_a_slow_ready_check_is_cut_off(redis: object, settings_env: pytest.MonkeyPatch) -> None:
    async def slow() -> None:
        await asyncio.sleep(30)

    async with running(build_app(ready_checks={"slow": slow}, ready_timeout_s=0.2)) as client:
        response = await client.get("/health/ready")
    assert response.status_code == 503
    assert "timed out" in response.json()["checks"]["slow"], "cut at 0.2 s, not left to sleep out its 30 s"


async def test_ready_is_503_when_redis_is_unreachable(redis: object, settings_env: pytest.MonkeyPatch) -> None:
    settings_env.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    get_settings.cache_clear()
    async with running(build_app()) as client:
        assert (await client.get("/health")).status_code == 200  # alive, just not ready
        response = await client.get("/health/ready")
    assert response.status_code == 503
    assert response.json()["failing"] == ["redis"]


async def test_circuits_and_bulkheads_are_listed(client: httpx.AsyncClient) -> None:
    circuit_registry.get("shell_test_dependency")
    circuits = (await client.get("/health/circuits")).json()
    assert circuits["shell_test_dependency"]["state"] == "closed"
    assert isinstance((await client.get("/health/bulkheads")).json(), dict)


async def test_metrics_count_requests_by_route_template(client: httpx.AsyncClient) -> None:
    await client.get("/fail/budget")
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    lines = [line for line in response.text.splitlines() if line.startswith("concierge_http_requests_total{")]
    assert any(
        'route="/fail/{kind}"' in line and 'status="504"' in line and 'service="shell-test"' in line for line in lines
    )


# ------------------------------------------------------------------------------------------------ lifespan


async def test_callers_lifespan_runs_inside_with_redis_ready(redis: object, settings_env: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        seen.append(f"start ping={await app.state.redis.ping()}")
        try:
            yield
        finally:
            seen.append(f"stop ping={await app.state.redis.ping()}")

    async with running(build_app(lifespan=lifespan)) as client:
        assert (await client.get("/health")).status_code == 200
    assert seen == ["start ping=True", "stop ping=True"]


async def test_incoming_trace_context_is_continued(client: httpx.AsyncClient) -> None:
    exporter = InMemorySpanExporter()
    configure_telemetry("shell-test", exporter=exporter)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    await client.get("/budget", headers={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    await client.get("/health")
    await client.get("/health/ready")
    spans = [s for s in exporter.get_finished_spans() if "/budget" in s.name]
    assert spans, [s.name for s in exporter.get_finished_spans()]
    assert all(f"{s.context.trace_id:032x}" == trace_id for s in spans)
    assert all(s.kind == SpanKind.SERVER and s.parent is not None for s in spans)
    # probes are not traced: they would drown the spans that matter
    assert not [s.name for s in exporter.get_finished_spans() if "/health" in s.name]


async def test_a_running_service_has_the_gc_settings_and_gives_them_back(
    redis: object, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("CONCIERGE_GC_GEN0_THRESHOLD", "23456")
    get_settings.cache_clear()
    before = gc.get_threshold()
    async with running(build_app()) as client:
        assert (await client.get("/health")).status_code == 200
        assert gc.get_threshold()[0] == 23456
        assert gc.get_freeze_count() > 0, "start-up objects are not frozen"
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
