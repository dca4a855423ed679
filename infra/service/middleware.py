"""The shell's ASGI edge, outer → inner: host check → request metrics → error boundary (500) → timeout budget → body
limit.

Pure ASGI rather than ``BaseHTTPMiddleware``: cheaper, and the budget ``ContextVar`` set here is visible to the
endpoint because everything runs in the request's own task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from domain.errors import ErrorCode
from identity.hosts import AllowedHosts, host_name
from infra.error_table import answer_for, answer_response, error_body
from infra.settings import Settings, get_settings
from resilience import (
    BUDGET_HEADER,
    budget_scope,
    parse_budget_header,
)

logger = logging.getLogger("infra.service")  # one logger for the whole shell

MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 32 * 1024
"""The request line and headers together; a browser's largest are a few KiB (cookies included)."""


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


async def _send_json(send: Send, status: int, body: object, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def deployment_hosts(settings: Settings) -> set[str]:
    """The hosts of every ``*_URL`` setting that is an HTTP URL: the names this deployment's services call each
    other by (``http://booking-agent:8000`` under compose), so a callee answers whatever name its callers use."""
    hosts: set[str] = set()
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        alias = field.validation_alias
        if isinstance(alias, str) and alias.endswith("_URL") and isinstance(value, str):
            parts = urlsplit(value)
            if parts.scheme in ("http", "https") and parts.hostname:
                hosts.add(parts.hostname)
    return hosts


_HOST_SHOWN = 100


def _cut(value: str) -> str:
    return value if len(value) <= _HOST_SHOWN else f"{value[:_HOST_SHOWN]}…"


_REFUSED_HOSTS_LOGGED = 1000
"""Distinct refused hosts logged one by one; beyond them one line says the rest are not (a flood stays one line)."""


class HostCheckMiddleware:
    """421 ``host_not_allowed`` for a request whose ``Host`` is not a name of this service, before anything else
    runs: the DNS-rebinding guard (``identity.hosts``). Each offending host is logged once, not once per request."""

    def __init__(self, app: ASGIApp, service_name: str) -> None:
        self.app = app
        self.service_name = service_name
        self._built_from: Settings | None = None
        self._allowed = AllowedHosts(frozenset())
        self._logged: set[str] = set()
        self._logging_stopped = False

    def allowed(self) -> AllowedHosts:
        """The names, rebuilt when the settings are (tests clear ``get_settings``' cache)."""
        settings = get_settings()
        if settings is not self._built_from:
            names = {self.service_name, *deployment_hosts(settings)}
            self._allowed = AllowedHosts.of(names, settings.allowed_hosts)
            self._built_from = settings
        return self._allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        host = hosts[0] if len(hosts) == 1 else None
        if len(hosts) <= 1 and self.allowed().allows(host):
            await self.app(scope, receive, send)
            return
        shown = ", ".join(repr(_cut(h)) for h in hosts)
        self._log_once(", ".join(host_name(h) or _cut(h) for h in hosts), shown)
        _http_metrics().refused_hosts.labels(self.service_name).inc()
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # the server answers the handshake 403
            return
        message = (
            f"{self.service_name} does not answer to Host {shown}: not one of its names "
            "(a deployment adds its own with CONCIERGE_ALLOWED_HOSTS)"
        )
        await _send_json(send, 421, error_body(ErrorCode.HOST_NOT_ALLOWED, message))

    def _log_once(self, key: str, shown: str) -> None:
        if key in self._logged or self._logging_stopped:
            return
        if len(self._logged) >= _REFUSED_HOSTS_LOGGED:
            self._logging_stopped = True
            logger.warning("more than %d hosts refused: further ones are not logged", _REFUSED_HOSTS_LOGGED)
            return
        self._logged.add(key)
        logger.warning(
            "refusing requests for Host %s: not a name of %s (if it is one of this deployment's, add it to "
            "CONCIERGE_ALLOWED_HOSTS); further requests for it are not logged",
            shown,
            self.service_name,
        )


class _BodyRefusedError(Exception):
    """Raised from ``receive`` to stop an app that is still reading a body we already refused."""


def _header_block_size(scope: Scope) -> int:
    """The request line and headers as they came, give or take the separators."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    return size + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))


class BodyLimitMiddleware:
    """What a request may send: headers up to ``MAX_HEADER_BYTES`` (431), a body up to ``max_bytes`` (413) that
    arrives within ``read_timeout_s`` of its headers (408, the connection closed).

    The server refuses a header block too large before buffering it (infra/service/server.py); this is the exact
    check, for one that arrived whole. A chunked body has no length up front, so its count is kept in ``receive``;
    once it passes the limit or its deadline, ``receive`` raises, whatever the app answers is dropped, and the
    refusal is sent instead.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, read_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _header_block_size(scope) > MAX_HEADER_BYTES:
            await _send_json(
                send,
                431,
                error_body(
                    ErrorCode.HEADERS_TOO_LARGE,
                    f"the request line and headers exceed {MAX_HEADER_BYTES} bytes",
                    limit=MAX_HEADER_BYTES,
                ),
                [(b"connection", b"close")],
            )
            return
        declared = _header(scope, b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _send_json(send, 400, error_body(ErrorCode.INVALID_HEADER, "Content-Length is not a number"))
                return
            if length > self.max_bytes:
                await self._refuse(send)
                return

        timeout_s = self.read_timeout_s if self.read_timeout_s is not None else get_settings().body_read_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout_s
        received = 0
        body_done = False
        refused: str | None = None  # "size" or "time"
        started = False

        async def bounded_receive() -> Message:
            nonlocal received, body_done, refused
            if body_done:
                return await receive()  # after the body: the wait for a disconnect has no deadline
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = "time"
                raise _BodyRefusedError from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_bytes:
                    refused = "size"
                    raise _BodyRefusedError
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused is not None and not started:
                return  # the app's answer to a body we refused
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, guarded_send)
        except Exception:
            if refused is None or started:
                raise
        if refused is not None and not started:
            if refused == "size":
                await self._refuse(send)
            else:
                await _send_json(
                    send,
                    408,
                    error_body(ErrorCode.REQUEST_TIMEOUT, f"the request body did not arrive within {timeout_s:g} s"),
                    [(b"connection", b"close")],
                )

    async def _refuse(self, send: Send) -> None:
        await _send_json(
            send,
            413,
            error_body(ErrorCode.BODY_TOO_LARGE, f"request body exceeds {self.max_bytes} bytes", limit=self.max_bytes),
        )


class BudgetMiddleware:
    """Starts the request's timeout budget from ``X-Timeout-Budget`` (400 when it is not a positive number).

    ``budget_scope`` rather than a bare ``init_budget``: the deadline is reset when the request ends, which
    matters when the app runs in the caller's task (in-process ASGI); there an enclosing deadline also wins.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        # a bad header raises InvalidBudgetHeaderError: the error boundary outside answers it (400 invalid_header)
        seconds = parse_budget_header(
            _header(scope, BUDGET_HEADER.lower().encode()),
            default=settings.default_budget_s,
            maximum=settings.max_budget_s,
        )
        with budget_scope(seconds):
            await self.app(scope, receive, send)


class ErrorBoundaryMiddleware:
    """Any exception no handler mapped: answered from the error table when it names an outage underneath
    (``dependency_unavailable``); otherwise traceback to the log and the span, ``{"error": {"code": "internal"}}``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            span = trace.get_current_span()
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            # a package's own error over a Redis or Postgres outage (``RunStoreError`` from a ConnectionError)
            answer = answer_for(exc)
            if answer.code == ErrorCode.INTERNAL:
                logger.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            else:
                logger.warning("%s %s: %s (%s)", scope.get("method"), scope.get("path"), answer.code, exc)
            if started:
                raise  # too late for a clean answer; the server drops the connection
            if answer.code == ErrorCode.INTERNAL:
                await _send_json(send, answer.status, error_body(ErrorCode.INTERNAL))
                return
            status, body, headers = answer_response(answer)
            await _send_json(send, status, body, [(k.lower().encode(), v.encode()) for k, v in headers.items()])


@dataclass(frozen=True)
class _HttpMetrics:
    requests: Counter
    duration: Histogram
    refused_hosts: Counter


@lru_cache(maxsize=1)
def _http_metrics() -> _HttpMetrics:
    return _HttpMetrics(
        requests=Counter(
            "concierge_http_requests",
            "HTTP requests answered, by route template and status.",
            ["service", "method", "route", "status"],
        ),
        duration=Histogram(
            "concierge_http_request_duration_seconds",
            "Time to answer an HTTP request, by route template.",
            ["service", "method", "route"],
        ),
        refused_hosts=Counter(
            "concierge_http_refused_host_requests",
            "Requests refused for a Host that is not a name of the service (421 host_not_allowed).",
            ["service"],
        ),
    )


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    template = getattr(route, "path_format", None) or getattr(route, "path", None)
    # The raw path would give every reservation id its own series.
    return str(template) if template else "<unmatched>"


class RequestMetricsMiddleware:
    """Counts requests and times them by route template (known once the router has run) and status."""

    def __init__(self, app: ASGIApp, service_name: str) -> None:
        self.app = app
        self.service_name = service_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        metrics = _http_metrics()
        status = 500
        start = time.perf_counter()

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = _route_template(scope)
            method = str(scope.get("method", ""))
            metrics.requests.labels(self.service_name, method, route, str(status)).inc()
            metrics.duration.labels(self.service_name, method, route).observe(time.perf_counter() - start)
