"""What both simulated providers share: the app factory, their error answers (shape: ``infra.clients.wire``) and
the guard of their ``/admin`` routes.

``/admin`` (faults, ledgers, availability) changes or reveals state outside any booking, so it is the operator's
alone: ``Authorization: Bearer $CONCIERGE_ADMIN_TOKEN``, else 401; with no admin token configured the routes do not
exist (404, as for any unknown path). The guard sits in front of routing, so no admin route (present or future)
is reached, and no body parsed, before the token is checked.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from infra.auth import admin_token, admin_token_ok
from infra.clients.wire import provider_error
from infra.service import create_service_app
from providers.faults import ClientGoneError, FaultInjector, InjectedFaultError, faults_router
from providers.idempotency import IdempotencyKeyReusedError, MissingIdempotencyKeyError

__all__ = ["ADMIN_PREFIX", "AdminGuard", "ProviderApiError", "create_provider_app"]

ADMIN_PREFIX = "/admin"


# Not sent to anyone: the client is gone. Logged and counted under the nginx convention.
_CLIENT_CLOSED_REQUEST = 499


class ProviderApiError(Exception):
    """Raised by a provider route to answer ``status`` with ``{"error": code, ...}``."""

    def __init__(self, status_code: int, code: str, message: str | None = None, **extra: Any) -> None:
        super().__init__(message or code)
        self.status_code = status_code
        self.body = provider_error(code, message, **extra)


async def _send_json(send: Send, status: int, body: object, headers: list[tuple[bytes, bytes]]) -> None:
    payload = json.dumps(body).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start_headers + headers})
    await send({"type": "http.response.body", "body": payload})


class AdminGuard:
    """Pure ASGI: ``/admin`` and below need the admin token (see the module docstring); the rest passes through.

    The token is read from the settings on every request (cached; a test changing it clears the cache).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not (path == ADMIN_PREFIX or path.startswith(f"{ADMIN_PREFIX}/")):
            await self.app(scope, receive, send)
            return
        expected = admin_token()
        if expected is None:
            await _send_json(send, 404, {"detail": "Not Found"}, [])  # what an unknown path answers
            return
        header = next((bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if not admin_token_ok(header, expected):
            body = provider_error("unauthorized", "admin routes need Authorization: Bearer $CONCIERGE_ADMIN_TOKEN")
            await _send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


def create_provider_app(name: str, business: APIRouter, admin: APIRouter) -> FastAPI:
    """The service shell plus: faults on every ``business`` route, ``/admin/faults``, the error answers and the
    admin guard."""
    app = create_service_app(name, description=f"Simulated third-party {name} (state in Redis).")

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProviderApiError)
        return JSONResponse(exc.body, status_code=exc.status_code)

    async def injected(request: Request, exc: Exception) -> Response:
        return JSONResponse(provider_error("injected_fault", str(exc)), status_code=503)

    async def client_gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=_CLIENT_CLOSED_REQUEST)

    async def missing_key(request: Request, exc: Exception) -> Response:
        return JSONResponse(provider_error("missing_idempotency_key", str(exc)), status_code=400)

    async def key_reused(request: Request, exc: Exception) -> Response:
        return JSONResponse(provider_error("idempotency_key_reused", str(exc)), status_code=422)

    app.add_exception_handler(ProviderApiError, api_error)
    app.add_exception_handler(InjectedFaultError, injected)
    app.add_exception_handler(ClientGoneError, client_gone)
    app.add_exception_handler(MissingIdempotencyKeyError, missing_key)
    app.add_exception_handler(IdempotencyKeyReusedError, key_reused)
    app.include_router(business, dependencies=[Depends(FaultInjector(name))])
    app.include_router(admin)
    app.include_router(faults_router(name))
    app.add_middleware(AdminGuard)
    return app
