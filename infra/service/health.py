"""The shell's health routes: /health · /health/ready · /health/bulkheads · /health/circuits · /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from infra.service.state import ServiceInfo, get_redis
from resilience import (
    bulkhead_registry,
    circuit_registry,
)

ReadyCheck = Callable[[], Awaitable[object]]
READY_CHECK_TIMEOUT_S = 1.0

_READY_BODY = {
    "type": "object",
    "required": ["status", "service", "checks", "failing"],
    "properties": {
        "status": {"type": "string", "enum": ["ready", "not_ready"]},
        "service": {"type": "string"},
        "checks": {"type": "object", "additionalProperties": {"type": "string"}},
        "failing": {"type": "array", "items": {"type": "string"}},
    },
}
# documentation only (infra.service.openapi adds the shell's answers to these)
_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Every check passed.", "content": {"application/json": {"schema": _READY_BODY}}},
    503: {
        "description": "At least one check failed or timed out (`failing` names them); no `Retry-After`.",
        "content": {"application/json": {"schema": _READY_BODY}},
    },
}
_METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


async def _run_check(name: str, check: ReadyCheck, limit_s: float) -> tuple[str, str | None]:
    """``(name, None)`` when ready, else ``(name, reason)``. A check returning ``False`` is not ready."""
    try:
        async with asyncio.timeout(limit_s):
            result = await check()
    except TimeoutError:
        return name, f"timed out after {limit_s:g}s"
    except Exception as exc:
        return name, f"{type(exc).__name__}: {exc}"
    if result is False:
        return name, "reported not ready"
    return name, None


def install_health_routes(app: FastAPI, checks: Mapping[str, ReadyCheck], ready_timeout: float) -> None:
    @app.get("/health", tags=["health"])
    async def health(request: Request) -> dict[str, Any]:
        info: ServiceInfo = request.app.state.service
        return {
            "status": "ok",
            "service": info.name,
            "instance_id": info.instance_id,
            "uptime_s": round(time.monotonic() - info.started_at, 3),
            **({"vitals": vitals.snapshot()} if (vitals := getattr(request.app.state, "vitals", None)) else {}),
        }

    @app.get("/health/ready", tags=["health"], responses=_READY_RESPONSES)
    async def ready(request: Request) -> JSONResponse:
        redis = await get_redis(request)
        all_checks: dict[str, ReadyCheck] = {"redis": redis.ping, **checks}
        results = await asyncio.gather(*(_run_check(name, fn, ready_timeout) for name, fn in all_checks.items()))
        failing = {name: reason for name, reason in results if reason is not None}
        body = {
            "status": "not_ready" if failing else "ready",
            "service": request.app.state.service.name,
            "checks": {name: ("ok" if reason is None else reason) for name, reason in results},
            "failing": sorted(failing),
        }
        return JSONResponse(body, status_code=503 if failing else 200)

    @app.get("/health/bulkheads", tags=["health"])
    async def bulkheads() -> dict[str, Any]:
        return dict(bulkhead_registry.stats())

    @app.get("/health/circuits", tags=["health"])
    async def circuits() -> dict[str, Any]:
        return dict(circuit_registry.stats())

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse, responses=_METRICS_RESPONSES)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
