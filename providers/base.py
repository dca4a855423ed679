"""What the simulated providers share: the app factory, their error answers (shape: ``infra.clients.wire``) and
the guards in front of their routes.

``/admin`` (faults, ledgers, availability) changes or reveals state outside any booking, so it is the operator's
alone: ``Authorization: Bearer $CONCIERGE_ADMIN_TOKEN``, else 401; with no admin token configured the routes do not
exist (404, as for any unknown path). Every other route but the shell's own (health, metrics, OpenAPI) is business
(search, hold, charge, refund, look up) and wants the key of one of the provider's clients
(``identity.auth.provider_api_key_ok``), else 401: a real provider issues keys per client. Both guards sit in front of
routing, so no route (present or future) is reached, and no body parsed, before the credential is checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from domain.errors import ErrorCode
from identity.auth import admin_token, admin_token_ok, provider_api_key_ok
from infra.clients.wire import IDEMPOTENCY_HEADER, MAX_IDEMPOTENCY_KEY_LENGTH, REPLAYED_HEADER, provider_error
from infra.service import MAX_BODY_BYTES, create_service_app
from infra.service.openapi import Answer, detail, document
from infra.service.openapi import provider_error as provider_answer
from infra.settings import get_settings
from providers.faults import AnswerDelay, ClientGoneError, FaultInjector, Faults, InjectedFaultError, faults_router
from providers.idempotency import IdempotencyKeyReusedError, MissingIdempotencyKeyError

__all__ = [
    "ADMIN_PREFIX",
    "IDEMPOTENT_ANSWERS",
    "IDEMPOTENT_ROUTE",
    "REPLAYED",
    "AdminGuard",
    "ClientKeyGuard",
    "ProviderApiError",
    "create_provider_app",
    "send_json",
]

ADMIN_PREFIX = "/admin"

# ------------------------------------------------------------------- OpenAPI documentation (describes, changes nothing)

IDEMPOTENT_ROUTE: dict[str, Any] = {
    "parameters": [
        {
            "name": IDEMPOTENCY_HEADER,
            "in": "header",
            "required": True,
            "description": "Names this operation (providers/idempotency.py): the same key with the same request "
            "gets the first answer again, with another request 422 `idempotency_key_reused`.",
            "schema": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_IDEMPOTENCY_KEY_LENGTH,
                "pattern": r"^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$",
            },
        }
    ]
}
"""``openapi_extra`` of a route that depends on ``require_idempotency_key`` (it reads the header itself)."""
REPLAYED: dict[str, Any] = {
    REPLAYED_HEADER: {
        "description": "`true` when this is the recorded answer of an earlier request with the same key.",
        "required": False,
        "schema": {"type": "string", "const": "true"},
    }
}
IDEMPOTENT_ANSWERS: tuple[Answer, ...] = (
    provider_answer(
        400,
        "missing_idempotency_key",
        description=f"No `{IDEMPOTENCY_HEADER}`, or not 1-{MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters.",
    ),
    provider_answer(
        422, "idempotency_key_reused", description="The key was first used for a different request; use a new key."
    ),
)
_INJECTED_FAULT = provider_answer(
    503, "injected_fault", description="A fault injected with `PUT /admin/faults` (`error_rate`); no `Retry-After`."
)
_ADMIN_SCHEMES = {
    "adminToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "`CONCIERGE_ADMIN_TOKEN`: without one configured, the `/admin` routes do not exist (404).",
    }
}
_CLIENT_KEY_SCHEMES = {
    "clientKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "The calling client's key: `HOTEL_API_KEY` / `PAYMENT_API_KEY`, or the one its deployment "
        "derives for it from `CONCIERGE_SERVICE_SECRET` (identity/auth.py `provider_api_key`).",
    }
}
_CLIENT_KEY_ANSWER = provider_answer(
    401,
    ErrorCode.UNAUTHORIZED,
    description="No `Authorization: Bearer <key>` of one of this provider's clients (`WWW-Authenticate: Bearer`), "
    'or a key it did not issue (`Bearer error="invalid_token"`).',
    headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string"}}},
)
_ADMIN_ANSWERS = (
    provider_answer(
        401,
        "unauthorized",
        description="No `Authorization: Bearer $CONCIERGE_ADMIN_TOKEN`.",
        headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string", "const": "Bearer"}}},
    ),
    detail(404, description="No admin token is configured: the `/admin` routes do not exist."),
)


# Not sent to anyone: the client is gone. Logged and counted under the nginx convention.
_CLIENT_CLOSED_REQUEST = 499


class ProviderApiError(Exception):
    """Raised by a provider route to answer ``status`` with ``{"error": code, ...}``."""

    def __init__(self, status_code: int, code: str, message: str | None = None, **extra: Any) -> None:
        super().__init__(message or code)
        self.status_code = status_code
        self.body = provider_error(code, message, **extra)


async def send_json(send: Send, status: int, body: object, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """A JSON answer straight from ASGI (what a guard in front of routing sends)."""
    payload = json.dumps(body).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*start_headers, *headers]})
    await send({"type": "http.response.body", "body": payload})


def _authorization(scope: Scope) -> str | None:
    return next((bytes(v).decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), None)


def _is_admin(path: str) -> bool:
    return path == ADMIN_PREFIX or path.startswith(f"{ADMIN_PREFIX}/")


class AdminGuard:
    """Pure ASGI: ``/admin`` and below need the admin token (see the module docstring); the rest passes through.

    The token is read from the settings on every request (cached; a test changing it clears the cache).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_admin(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        expected = admin_token(get_settings())
        if expected is None:
            await send_json(send, 404, {"detail": "Not Found"}, [])  # what an unknown path answers
            return
        if not admin_token_ok(_authorization(scope), expected):
            body = provider_error(
                ErrorCode.UNAUTHORIZED, "admin routes need Authorization: Bearer $CONCIERGE_ADMIN_TOKEN"
            )
            await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class ClientKeyGuard:
    """Pure ASGI: every path but ``open_paths`` (the shell's) and ``/admin`` needs one of ``provider``'s client keys.

    Unknown paths too: without a key nobody learns which routes exist. The keys are read from the settings on every
    request (cached), like the admin token; the presented key is never repeated (log, body).
    """

    def __init__(self, app: ASGIApp, *, provider: str, open_paths: frozenset[str]) -> None:
        self.app = app
        self.provider = provider
        self.open_paths = open_paths
        variable = f"{provider.replace('-', '_').upper()}_KEY"
        self._refusal = provider_error(
            ErrorCode.UNAUTHORIZED,
            f"{provider} wants Authorization: Bearer <key> of one of its clients ({variable}, or the key derived "
            "from CONCIERGE_SERVICE_SECRET for the client)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or path in self.open_paths or _is_admin(path):
            await self.app(scope, receive, send)
            return
        header = _authorization(scope)
        if provider_api_key_ok(self.provider, header, get_settings()):
            await self.app(scope, receive, send)
            return
        challenge = b"Bearer" if header is None else b'Bearer error="invalid_token"'
        await send_json(send, 401, self._refusal, [(b"www-authenticate", challenge)])


def create_provider_app(
    name: str,
    business: APIRouter,
    admin: APIRouter,
    *,
    own_faults: bool = False,
    faults_model: type[Faults] = Faults,
    max_body_bytes: int = MAX_BODY_BYTES,
    client_keys: bool = False,
) -> FastAPI:
    """The service shell plus: faults on every ``business`` route, ``/admin/faults``, the error answers and the
    admin guard; with ``client_keys``, the client-key guard on every route but the shell's and ``/admin``.

    ``own_faults``: the provider injects faults of its own kind (llm-api: per model, answered in OpenAI's shapes)
    and ``admin`` serves its ``/admin/faults``; the injector and the router of ``faults.py`` are left out.
    ``faults_model``: the provider's faults when it takes more than ``Faults`` (hotel-api's ``HotelFaults``).
    """
    app = create_service_app(
        name, description=f"Simulated third-party {name} (state in Redis).", max_body_bytes=max_body_bytes
    )
    shell_paths = frozenset(str(getattr(route, "path", "")) for route in app.routes)

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
    if own_faults:
        app.include_router(business)
        app.include_router(admin)
    else:
        app.include_router(business, dependencies=[Depends(FaultInjector(name, model=faults_model))])
        app.include_router(admin)
        app.include_router(faults_router(name, faults_model))
        app.add_middleware(AnswerDelay, provider=name)  # inside the guards: only a business answer is delayed
        for route in business.routes:
            document(app, path=getattr(route, "path", ""), answers=[_INJECTED_FAULT])
    app.add_middleware(AdminGuard)
    if client_keys:
        app.add_middleware(ClientKeyGuard, provider=name, open_paths=shell_paths)
        for route in business.routes:
            document(
                app,
                path=getattr(route, "path", ""),
                answers=[_CLIENT_KEY_ANSWER],
                security=[{"clientKey": []}],
                security_schemes=_CLIENT_KEY_SCHEMES,
            )
    document(
        app, prefix=ADMIN_PREFIX, answers=_ADMIN_ANSWERS, security=[{"adminToken": []}], security_schemes=_ADMIN_SCHEMES
    )
    return app
