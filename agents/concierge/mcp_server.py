"""The concierge's tools over MCP (the official SDK's low-level server), from the same records the graph uses.

``tools/list`` is ``agents.concierge.tools.TOOL_RECORDS`` (name, description, the arguments' schema, the result's);
``tools/call`` validates the arguments like a request body (a bad one is a tool error naming the field, never a
500), runs a read for the caller's person, and asks for approval before a booking or a cancel: on 2026-07-28 an
``InputRequiredResult`` whose elicitation names the exact terms and whose ``request_state`` names the approval the
server keeps (``agents.concierge.calls``), sealed under a key every replica derives from the deployment's secret
and bound to the tool, its arguments, the person and ``APPROVAL_TTL_S``; on a handshake-era session the same
question as the session's elicitation. The host's answer is a decision like a click in the console: the first
stands, and the booking is made once whichever replica, restarted process or retry brings it.
Imported by ``agents.concierge.mcp_edge`` with the first caller, never at start.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

import mcp_types as types
from fastapi import HTTPException
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agents.concierge import calls
from agents.concierge.mcp_edge import PERSON_SCOPE_KEY
from agents.concierge.state import Approval
from agents.concierge.tools import TOOL_RECORDS, TOOLS_BY_NAME, Tool
from domain.approvals import describe_approval
from domain.chat import ApprovalExpiredError, InvalidToolCallError
from domain.errors import ErrorCode
from infra.error_table import answer_for
from infra.settings import get_settings
from resilience import budget_scope

if TYPE_CHECKING:
    from agents.concierge.app import ConciergeService

__all__ = ["APPROVAL_KEY", "build_server", "build_transport"]

logger = logging.getLogger(__name__)

SERVER_NAME: Final = "concierge-agent"
APPROVAL_KEY: Final = "approval"
"""The key of the one input request an approval asks (``input_requests`` / ``input_responses``)."""
CONSENT_SCHEMA: Final[dict[str, Any]] = {"type": "object", "properties": {}}
"""Nothing to fill in: the person accepts, declines or cancels the terms the message names."""
MAX_SESSIONS: Final = 1000
"""Handshake-era sessions one process keeps at once (each idle one ends after ``SESSION_IDLE_S``)."""
SESSION_IDLE_S: Final = 600.0


Services = Callable[[], "ConciergeService"]


def _person(ctx: Any) -> str:
    """The caller's person, as the edge found it (``mcp_edge``): never anything the client sent in the call."""
    request = getattr(ctx, "request", None)
    person = request.scope.get(PERSON_SCOPE_KEY) if request is not None else None
    if not isinstance(person, str):
        raise RuntimeError("an MCP request reached the tools without passing the edge")
    return person


def _principal(ctx: Any) -> str | None:
    """The request state's owner: sealed for one person, refused for every other."""
    request = getattr(ctx, "request", None)
    person = request.scope.get(PERSON_SCOPE_KEY) if request is not None else None
    return person if isinstance(person, str) else None


def _state_key() -> bytes:
    """The request-state key: the same on every replica and after every restart (derived from the deployment's
    secret), never the secret itself."""
    secret = get_settings().service_secret
    assert secret is not None  # the service shell does not start without one
    return hmac.new(secret.get_secret_value().encode(), b"concierge-agent/mcp/request-state", hashlib.sha256).digest()


def _annotations(tool: Tool) -> types.ToolAnnotations:
    approval = tool.approval
    return types.ToolAnnotations(
        read_only_hint=approval is None,
        destructive_hint=approval is not None and approval.action == "cancel",
        idempotent_hint=approval is None,
        open_world_hint=True,
    )


def _listed(tool: Tool) -> types.Tool:
    return types.Tool(
        name=tool.name,
        description=tool.description,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        annotations=_annotations(tool),
    )


def _result(content: dict[str, Any]) -> types.CallToolResult:
    text = json.dumps(content, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=content)


def _error(message: str, code: str = ErrorCode.INVALID_REQUEST, **details: Any) -> types.CallToolResult:
    """A tool error the host's model reads (``is_error``): the code, and a sentence naming the field."""
    content = {"error": {"code": str(code), "message": message, **details}}
    text = json.dumps(content, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=content, is_error=True)


def _refused(exc: HTTPException) -> types.CallToolResult:
    """A route's own refusal reached through a tool: an unknown booking is ``not_found``, the rest ``refused``."""
    return _error(str(exc.detail), ErrorCode.NOT_FOUND if exc.status_code == 404 else "refused")


def _asking(asked: calls.Asked) -> types.InputRequiredResult:
    """The 2026-07-28 question: the terms in words, and the state naming the approval the server keeps."""
    question = types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=_question(asked), requested_schema=CONSENT_SCHEMA)
    )
    state = json.dumps({"chat_id": asked.chat_id, "approval_id": asked.approval["approval_id"]})
    return types.InputRequiredResult(input_requests={APPROVAL_KEY: question}, request_state=state)


def _expiry(asked: calls.Asked) -> float:
    """When the approval expires, seconds since the epoch (``expires_at`` is ISO 8601, ``Z``)."""
    return datetime.fromisoformat(asked.approval["expires_at"].replace("Z", "+00:00")).timestamp()


def _question(asked: calls.Asked) -> str:
    return f"Approve this? {describe_approval(asked.approval)}. Nothing happens unless you accept."


def _awaiting(asked: calls.Asked, why: str) -> types.CallToolResult:
    """No answer on this connection: the approval stays pending where the person can decide it."""
    chat_id = asked.chat_id
    return _result(
        {
            "status": "awaiting_approval",
            "approval": dict(asked.approval),
            "chat_id": chat_id,
            "message": f"{why}: decide it in the console or with `concierge chat --chat {chat_id}` before "
            f"{asked.approval['expires_at']}; nothing happens until then",
        }
    )


def build_server(services: Services) -> Server[Any]:
    """The low-level server: the tool records listed, each call answered (``_call``)."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_listed(tool) for tool in TOOL_RECORDS])

    async def call_tool(
        ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        settings = get_settings()
        with budget_scope(settings.default_budget_s + settings.mcp_wait_s):
            try:
                return await _call(services(), ctx, params)
            except InvalidToolCallError as exc:
                return _error(str(exc), exc.code, **exc.details)
            except ApprovalExpiredError as exc:
                return _error(str(exc), "approval_expired")
            except HTTPException as exc:
                return _refused(exc)
            except Exception as exc:
                answer = answer_for(exc)  # a person's quota too: 429 quota_exceeded, its retry_after
                if answer.code == ErrorCode.INTERNAL:
                    logger.exception("MCP call %s failed", params.name)
                    return _error("the call could not be completed; nothing more was done", ErrorCode.INTERNAL)
                wait = (
                    {"retry_after": round(answer.wait_s)}
                    if answer.retry_after is not None and answer.wait_s is not None
                    else {}
                )
                return _error(answer.message, answer.code, **wait)

    server: Server[Any] = Server(
        SERVER_NAME,
        version="1",
        instructions="Hotel bookings for the person whose token calls: search, then book (the person approves the "
        "exact terms first), read and cancel their own bookings.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda name: TOOLS_BY_NAME[name].input_schema if name in TOOLS_BY_NAME else None,
    )
    security = RequestStateSecurity(keys=[_state_key()], ttl=get_settings().approval_ttl_s, bind_principal=_principal)
    server.middleware.append(RequestStateBoundary(security, default_audience=SERVER_NAME))
    return server


async def _call(
    service: ConciergeService, ctx: Any, params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    person = _person(ctx)
    tool = TOOLS_BY_NAME.get(params.name)
    if tool is None:
        return _error(f"unknown tool {params.name!r}; the tools are {', '.join(TOOLS_BY_NAME)}")
    args = tool.validate(params.arguments or {})
    if tool.approval is None:
        return _result(await calls.read(service, person, tool, args))

    async def progress(step: float, words: str) -> None:
        await ctx.session.report_progress(step, None, words)

    if params.request_state is not None:  # the retry: the state the boundary unsealed, then checked again here
        try:
            named = json.loads(params.request_state)
            chat_id, approval_id = str(named["chat_id"]), str(named["approval_id"])
        except (ValueError, KeyError, TypeError):
            return _error("request_state: not one this server gave out; nothing decided", "approval_refused")
        record = await calls.pending_of(service, person, chat_id, approval_id, tool, args)
        answer = (params.input_responses or {}).get(APPROVAL_KEY)
        if not isinstance(answer, types.ElicitResult):  # no answer yet: the same question again
            approval = (record.input.get("pending") or {}).get("approval") or {}
            return _asking(calls.Asked(chat_id, cast("Approval", approval)))
        return await _decided(service, chat_id, approval_id, answer.action == "accept", progress)
    asked = await calls.ask(service, person, tool, args)
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return _asking(asked)
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return _awaiting(asked, "this client cannot ask you (no elicitation)")
    asked_at = time.time()
    try:  # the person has until the approval expires; the sweeper decides it then, whatever this session does
        async with asyncio.timeout(max(0.0, _expiry(asked) - asked_at)):
            elicited = await ctx.session.elicit_form(_question(asked), CONSENT_SCHEMA)
    except Exception as exc:  # no answer on this session: the approval stays pending, decidable elsewhere
        logger.info("MCP elicitation in %s not answered after %.1fs: %s", asked.chat_id, time.time() - asked_at, exc)
        return _awaiting(asked, "the question could not be put to you on this connection")
    approve = elicited.action == "accept"
    return await _decided(service, asked.chat_id, asked.approval["approval_id"], approve, progress)


async def _decided(
    service: ConciergeService, chat_id: str, approval_id: str, approve: bool, progress: calls.Progress
) -> types.CallToolResult:
    """The decision recorded (the first one stands) and the call's outcome waited for within ``MCP_WAIT_S``."""
    await service.decide(chat_id, approval_id, approve, None)
    outcome = await calls.wait_outcome(service, chat_id, progress)
    return _result(outcome.result)


def build_transport(services: Services) -> tuple[Any, StreamableHTTPSessionManager]:
    """The ASGI transport at ``/mcp`` and its session manager (started by the edge). 2026-07-28 requests carry
    everything in each request: any replica answers them. Handshake-era sessions live in the process that opened
    them (bounded, idle ones closed); an approval asked on one outlives it. The shell checks ``Host`` and bounds
    the body already, so the SDK's own DNS-rebinding check is off (it knows none of the deployment's names)."""
    manager = StreamableHTTPSessionManager(
        app=build_server(services),
        json_response=False,
        stateless=False,
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=SESSION_IDLE_S,
        max_sessions=MAX_SESSIONS,
    )
    transport = StreamableHTTPASGIApp(manager)

    async def owned(scope: Any, receive: Any, send: Any) -> None:
        # a handshake-era session answers only the person who opened it (the SDK compares ``scope["user"]``)
        person = str(scope[PERSON_SCOPE_KEY])
        token = AccessToken(token="", client_id=person, scopes=[], subject=person)  # nothing of the real token
        scope["user"] = AuthenticatedUser(token)
        await transport(scope, receive, send)

    return owned, manager
