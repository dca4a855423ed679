"""concierge-agent's ``/mcp`` door: people only, as on the HTTP API, and the MCP SDK loaded with the first caller.

Every request shows a person's bearer JWT (``identity.people.PeopleGate``, docs/people.md) and is counted against
their ``PERSON_REQUESTS_PER_MIN``; without one the answer is 401 with ``WWW-Authenticate: Bearer
resource_metadata=".../.well-known/oauth-protected-resource"`` (RFC 9728), the document ``protected_resource``
serves: the issuer a host gets a token from, and the audience the token must name. The admin token is refused
(403): a tool call is always one person's. The SDK (``agents.concierge.mcp_server``) is imported, and its session
manager started, by the first request that passes, so the service starts without it (tests/unit/test_startup_imports).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Final

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from domain.errors import ErrorCode
from identity.people import InvalidPersonTokenError, PeopleGate, PersonAuthError, QuotaExceededError
from infra.error_table import answer_for, answer_response, error_body
from infra.quotas import PersonQuotas
from infra.settings import get_settings
from process.tasks import stop_task

__all__ = ["MCP_PATH", "METADATA_PATH", "PERSON_SCOPE_KEY", "McpEdge", "protected_resource"]

logger = logging.getLogger(__name__)

MCP_PATH: Final = "/mcp"
METADATA_PATH: Final = "/.well-known/oauth-protected-resource"
PERSON_SCOPE_KEY: Final = "concierge.person"
"""Where the edge leaves the caller's person in the ASGI scope, for the SDK's handlers (``ctx.request.scope``)."""


def _base(scope: Scope) -> str:
    """The URL the caller reached us by (its ``Host`` passed the host check: it is one of ours)."""
    return str(Request(scope).base_url).rstrip("/")


def protected_resource(base: str) -> dict[str, Any]:
    """RFC 9728 protected resource metadata of ``<base>/mcp``: who issues the tokens it takes, and for what audience."""
    settings = get_settings()
    issuers = [settings.auth_issuer] if settings.auth == "on" and settings.auth_issuer else []
    return {
        "resource": f"{base}{MCP_PATH}",
        "authorization_servers": issuers,
        "bearer_methods_supported": ["header"],
        "resource_name": "concierge",
        "audience": settings.auth_audience,
        "resource_documentation": "docs/mcp.md",
    }


async def _send(send: Send, status: int, body: object, headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw += [(name.lower().encode(), value.encode("latin-1")) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


class McpEdge:
    """The ASGI app at ``/mcp``: who is calling, their quota, then the SDK's streamable HTTP transport."""

    def __init__(self, app_state: Any) -> None:
        self._state = app_state
        self._transport: Any = None
        self._lock = asyncio.Lock()
        self._stopped = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            person = await self._person(scope)
        except PersonAuthError as exc:
            status, body, headers = answer_response(answer_for(exc))
            if status == 401:
                error = ' error="invalid_token",' if isinstance(exc, InvalidPersonTokenError) else ""
                metadata = f"{_base(scope)}{METADATA_PATH}"
                headers["WWW-Authenticate"] = f'Bearer{error} resource_metadata="{metadata}"'
            await _send(send, status, body, headers)
            return
        except QuotaExceededError as exc:
            status, body, headers = answer_response(answer_for(exc))
            await _send(send, status, body, headers)
            return
        if person is None:
            message = "MCP tools act for one person: call with a person's token, not the admin token"
            await _send(send, 403, error_body(ErrorCode.FORBIDDEN, message), {})
            return
        scope[PERSON_SCOPE_KEY] = person
        transport = await self._started()
        await transport(scope, receive, send)

    async def _person(self, scope: Scope) -> str | None:
        """The caller's person (their request counted), ``None`` for the operator; auth off: ``anonymous``."""
        gate: PeopleGate = self._state.people
        authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        caller = await gate.caller(authorization)
        if not gate.enabled:
            return caller.person  # identities off (tests): everyone is the same nobody, with no quota
        if caller.operator:
            return None
        quotas: PersonQuotas = self._state.quotas
        await quotas.count_request(caller.person)
        return caller.person

    async def _started(self) -> Any:
        """The SDK's transport, built and its session manager started by the first caller (once)."""
        if self._transport is not None:
            return self._transport
        async with self._lock:
            if self._transport is None:
                from agents.concierge.mcp_server import build_transport

                transport, manager = build_transport(lambda: self._state.concierge)
                ready = asyncio.Event()
                self._runner = asyncio.create_task(self._run(manager, ready), name="mcp-session-manager")
                await ready.wait()
                self._transport = transport
        return self._transport

    async def _run(self, manager: Any, ready: asyncio.Event) -> None:
        """The session manager's life: its task group lives in this one task, from the first caller to shutdown."""
        try:
            async with manager.run():
                ready.set()
                await self._stopped.wait()
        finally:
            ready.set()

    async def aclose(self) -> None:
        """Shutdown: the handshake-era sessions end (their pending approvals stay: the console, the CLI decide)."""
        if self._runner is not None:
            await stop_task(self._runner, stop=self._stopped, within=2.0, what="the MCP session manager")
        self._transport, self._runner, self._stopped = None, None, asyncio.Event()
