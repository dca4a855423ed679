"""What both simulated providers share: the app factory and their error answers (shape: ``infra.clients.wire``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from infra.clients.wire import provider_error
from infra.service import create_service_app
from providers.faults import ClientGoneError, FaultInjector, InjectedFaultError, faults_router
from providers.idempotency import IdempotencyKeyReusedError, MissingIdempotencyKeyError

__all__ = ["ProviderApiError", "create_provider_app"]


# Not sent to anyone: the client is gone. Logged and counted under the nginx convention.
_CLIENT_CLOSED_REQUEST = 499


class ProviderApiError(Exception):
    """Raised by a provider route to answer ``status`` with ``{"error": code, ...}``."""

    def __init__(self, status_code: int, code: str, message: str | None = None, **extra: Any) -> None:
        super().__init__(message or code)
        self.status_code = status_code
        self.body = provider_error(code, message, **extra)


def create_provider_app(name: str, business: APIRouter, admin: APIRouter) -> FastAPI:
    """The service shell plus: faults on every ``business`` route, ``/admin/faults``, and the error answers."""
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
    return app
