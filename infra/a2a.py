"""A thin adapter over a2a-sdk 1.3: one call to mount an agent, one client per peer.

Server: ``mount_a2a(app, ...)`` serves the agent card at ``/.well-known/agent-card.json`` (public) and A2A
JSON-RPC at ``/a2a`` (``Authorization: Bearer $CONCIERGE_SERVICE_TOKEN`` required, else 401). Before the SDK sees
a request, the ``/a2a`` endpoint checks the token (constant time), starts the budget from ``X-Timeout-Budget``
(400 when invalid, capped at ``CONCIERGE_MAX_BUDGET_S``) and adopts the caller's ``traceparent`` when no
instrumentation did. A blocking ``SendMessage`` that starts a new task (what ``A2AClient`` sends) runs the skill
inline, in the request's own task (``_SkillRequestHandler``: the SDK's producer/consumer machinery costs more than
the call itself); every other request goes through the SDK's handler, which runs the ``AgentExecutor`` in its own
asyncio task but copies the caller's ``contextvars`` when the request is enqueued (``ActiveTask.enqueue_request``).
Either way the budget and the trace context set here reach the skill handler. The handler runs inside the agent's
bulkhead and under ``asyncio.timeout(remaining budget)``: when the budget ends it is cancelled, not left running
for a caller that gave up.

Wire format (JSON-RPC ``SendMessage``, blocking): the request message carries one data part
``{"skill": "<id>", "input": {...}}``. Every call ends in one ``Task``:

- ``completed``: one artifact named ``result`` whose data part is the handler's dict;
- ``failed``: ``status.message`` has a data part ``{"error": {"kind", "code", "message"[, "data"]}}`` where
  ``kind`` tells the client how to raise (``business`` / ``unavailable`` / ``timeout``).

``google.protobuf.Value`` stores every number as a double, so whole numbers come back as floats; both sides turn
whole floats (up to 2**53) back into ``int``, so ``{"amount_cents": 1200}`` round-trips as an int (and ``2.0``
arrives as ``2``: equal in Python and JSON).

Errors (converted at this boundary; library errors never leak)::

    Exception
     ├── A2AError                       a call to another agent produced no result: .code, .message
     │    ├── A2AUnavailableError       transport error, 5xx, remote bulkhead full/timeout, remote circuit open,
     │    │    │                        remote crash (code ``internal``): retryable, counts against breakers
     │    │    └── A2ATimeoutError      the budget ran out (before sending, while waiting, or on the remote side);
     │    │                             also a ``BudgetExhaustedError`` so the booking flow answers ``timeout``
     │    ├── A2AUnauthorizedError      401/403: our token was refused (also ``NonRetryableError``)
     │    ├── A2AProtocolError          the peer refused the request as malformed (other 4xx, JSON-RPC client
     │    │                             errors, unknown task state); also ``NonRetryableError``
     │    └── A2ASkillError             the remote skill failed with a business error (``payment_declined``,
     │                                  ``unknown_skill``, ``invalid_request``): .code, .message, .data;
     │                                  also ``NonRetryableError``
     └── resilience.errors.NonRetryableError

A handler signals a business error by raising a ``NonRetryableError`` with a ``code`` attribute (and optionally
``data``, a dict); any other exception becomes ``internal`` (retryable: an unexpected crash may be transient and
side effects are guarded by idempotency keys). A ``ResilienceError`` raised inside the handler (its own
dependency's breaker or bulkhead) becomes ``unavailable``; a ``BudgetExhaustedError`` becomes ``timeout``.

Client: ``A2AClient(base_url)`` keeps one pooled ``infra.http.create_http_client(base_url, with_token=True)``
(budget, ``traceparent`` and token headers on every request) under the SDK's ``JsonRpcTransport``; the whole call
is bounded by the remaining budget too.
"""

from __future__ import annotations

import os

# The SDK wraps its internal plumbing (event queues, dispatch) in ~15 spans per call; with a real tracer provider
# that almost doubles the cost of a call and buries the spans that matter (ours: ``a2a.call``, ``a2a.skill``).
# Set OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=true to get them back. Set before the imports: the SDK reads it once.
os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

import asyncio
import hmac
import json
import logging
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NoReturn, Self

import httpx
from a2a.client.errors import A2AClientError, A2AClientTimeoutError
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler, validate_request_params
from a2a.server.routes import add_a2a_routes_to_fastapi, create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    SendMessageConfiguration,
    SendMessageRequest,
    SendMessageResponse,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_CURRENT, VERSION_HEADER
from a2a.utils.errors import A2AError as SdkA2AError
from a2a.utils.errors import InternalError as SdkInternalError
from a2a.utils.errors import InvalidAgentResponseError as SdkInvalidAgentResponseError
from a2a.utils.task import apply_history_length, validate_history_length
from fastapi import FastAPI
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infra.http import create_http_client
from infra.settings import get_settings
from resilience import bulkhead_registry
from resilience.budget import BUDGET_HEADER, budget_scope, parse_budget_header, remaining_budget
from resilience.errors import (
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    NonRetryableError,
    ResilienceError,
)

__all__ = [
    "A2A_PATH",
    "AGENT_CARD_PATH",
    "A2AClient",
    "A2AError",
    "A2AProtocolError",
    "A2ASkillError",
    "A2ATimeoutError",
    "A2AUnauthorizedError",
    "A2AUnavailableError",
    "Skill",
    "SkillHandler",
    "mount_a2a",
    "token_ok",
]

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer("concierge.a2a")

A2A_PATH = "/a2a"
AGENT_CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH
RESULT_ARTIFACT = "result"

# The SDK's in-memory store keeps every task forever; a long-lived agent only needs recent ones (callers read the
# result from the blocking reply). Our tasks are saved once, already terminal, so eviction never hits a live task.
_TASKS_KEPT = 1000
# A bulkhead timeout this close to the deadline was the budget running out, not the bulkhead's own limit.
_BUDGET_SPENT_EPSILON_S = 0.005
_MAX_EXACT_INT = 2**53


# --------------------------------------------------------------------------------------------------- errors


class A2AError(Exception):
    """A call to another agent produced no result."""

    default_code = "a2a_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code


class A2AUnavailableError(A2AError):
    """The peer could not be reached or could not do the work now; retryable, counts against breakers."""

    default_code = "unavailable"


class A2ATimeoutError(A2AUnavailableError, BudgetExhaustedError):
    """The timeout budget ran out before the peer answered (or the peer ran out of it)."""

    default_code = "budget_exhausted"


class A2AUnauthorizedError(A2AError, NonRetryableError):
    """The peer refused our service token (401/403). Retrying with the same token cannot help."""

    default_code = "unauthorized"

    def __init__(self, message: str, *, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class A2AProtocolError(A2AError, NonRetryableError):
    """The peer refused the request as malformed, or answered outside the protocol we speak."""

    default_code = "protocol_error"


class A2ASkillError(A2AError, NonRetryableError):
    """The remote skill failed with a business error; ``code`` says which (e.g. ``payment_declined``)."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.data = data


# ------------------------------------------------------------------------------------------------ wire format


def _data_part(payload: dict[str, Any]) -> Part:
    return Part(data=ParseDict(payload, struct_pb2.Value()))


def _restore_ints(value: Any) -> Any:
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _MAX_EXACT_INT:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _restore_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_ints(v) for v in value]
    return value


def _first_data(parts: Sequence[Part]) -> Any:
    for part in parts:
        if part.HasField("data"):
            return _restore_ints(MessageToDict(part.data))
    return None


def _error_payload(kind: str, code: str, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"kind": kind, "code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"error": error}


# ------------------------------------------------------------------------------------------------------ server

SkillHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Skill:
    """One skill an agent offers: advertised on its card, served by ``handler(input) -> result``.

    Both ``input`` and the result are JSON-compatible dicts.
    """

    id: str
    name: str
    description: str
    handler: SkillHandler
    tags: tuple[str, ...] = ()


class _RequestError(NonRetryableError):
    """The request names no skill we have, or carries no usable input."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _RecentTaskStore(TaskStore):
    """The SDK's ``InMemoryTaskStore``, forgetting the oldest tasks beyond ``capacity``."""

    def __init__(self, capacity: int = _TASKS_KEPT) -> None:
        self._inner = InMemoryTaskStore()
        self._capacity = capacity
        self._order: OrderedDict[tuple[str, str], ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self._inner.save(task, context)
        entry = (resolve_user_scope(context), task.id)
        if entry in self._order:
            return
        self._order[entry] = context
        while len(self._order) > self._capacity:
            (_, old_id), old_context = self._order.popitem(last=False)
            await self._inner.delete(old_id, old_context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self._inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self._inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._order.pop((resolve_user_scope(context), task_id), None)
        await self._inner.delete(task_id, context)


class _SkillExecutor(AgentExecutor):
    """Runs one skill per request and answers with a single terminal ``Task``."""

    def __init__(self, skills: Mapping[str, Skill], bulkhead: str) -> None:
        self._skills = skills
        self._bulkhead = bulkhead

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or uuid.uuid4().hex
        context_id = context.context_id or uuid.uuid4().hex
        # A non-blocking caller gets its answer from the first task event: say at once that the work has started.
        # The SDK takes a Task only as the first event; the outcome follows as update events.
        await event_queue.enqueue_event(
            Task(id=task_id, context_id=context_id, status=_now_status(TaskState.TASK_STATE_WORKING))
        )
        outcome = await self.run_task(context.message, task_id, context_id)
        updater = TaskUpdater(event_queue, task_id, context_id)
        for artifact in outcome.artifacts:
            await updater.add_artifact(list(artifact.parts), artifact_id=artifact.artifact_id, name=artifact.name)
        status = outcome.status
        await updater.update_status(status.state, status.message if status.HasField("message") else None)

    async def run_task(self, message: Message | None, task_id: str, context_id: str) -> Task:
        """The skill named in ``message``, run to its terminal ``Task`` (completed or failed, never raising)."""
        try:
            result = await self._run(message)
            return _completed_task(task_id, context_id, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _failed_task(task_id, context_id, self._describe(exc))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        # Cancelling the producer cancels ``execute`` (and so the handler); the SDK then records CANCELED.
        return None

    def _parse(self, message: Message | None) -> tuple[Skill, dict[str, Any]]:
        request = _first_data(message.parts) if message is not None else None
        if not isinstance(request, dict) or not isinstance(request.get("skill"), str):
            raise _RequestError("invalid_request", 'expected a data part {"skill": "<id>", "input": {...}}')
        skill = self._skills.get(request["skill"])
        if skill is None:
            raise _RequestError(
                "unknown_skill", f"unknown skill {request['skill']!r}; this agent offers {sorted(self._skills)}"
            )
        payload = request.get("input", {})
        if not isinstance(payload, dict):
            raise _RequestError("invalid_request", f"input of skill {skill.id!r} must be an object")
        return skill, payload

    async def _run(self, message: Message | None) -> dict[str, Any]:
        skill, payload = self._parse(message)
        remaining = remaining_budget()
        with _tracer.start_as_current_span(
            f"a2a.skill {skill.id}", attributes={"a2a.skill": skill.id, "concierge.budget_s": remaining}
        ):
            if remaining <= 0:
                raise BudgetExhaustedError(f"no budget left to run skill {skill.id!r}")
            # The bulkhead also bounds the call by the budget; this scope makes the guarantee ours to keep.
            scope = asyncio.timeout(remaining)
            try:
                async with scope:
                    result = await bulkhead_registry.get(self._bulkhead).run(skill.handler, payload)
            except TimeoutError as exc:
                if not scope.expired():
                    raise
                raise BudgetExhaustedError(f"skill {skill.id!r} ran out of its {remaining:.3f}s budget") from exc
        if not isinstance(result, dict):
            raise TypeError(f"skill {skill.id!r} returned {type(result).__name__}, expected a dict")
        return result

    def _describe(self, exc: Exception) -> dict[str, Any]:
        if isinstance(exc, NonRetryableError):
            code = getattr(exc, "code", None)
            data = getattr(exc, "data", None)
            return _error_payload(
                "business",
                code if isinstance(code, str) and code else "rejected",
                getattr(exc, "message", None) or str(exc) or type(exc).__name__,
                data if isinstance(data, dict) else None,
            )
        if isinstance(exc, BudgetExhaustedError) or (
            isinstance(exc, BulkheadTimeoutError) and remaining_budget() <= _BUDGET_SPENT_EPSILON_S
        ):
            return _error_payload("timeout", "budget_exhausted", str(exc))
        if isinstance(exc, ResilienceError | A2AUnavailableError):
            return _error_payload("unavailable", _resilience_code(exc), str(exc))
        logger.error("A2A skill failed with an unexpected error", exc_info=exc)
        return _error_payload("unavailable", "internal", f"internal error: {type(exc).__name__}: {exc}")


class _SkillRequestHandler(DefaultRequestHandler):
    """The SDK's request handler, serving the one request our agents exchange without its task machinery.

    A blocking ``SendMessage`` that starts a new task (every call ``A2AClient`` makes) runs the skill right here, in
    the request's own asyncio task, and answers with the terminal ``Task``, which is also saved so ``GetTask``
    finds it. The SDK's generic path would run the executor in a producer task, pass its events through queues to a
    consumer task and aggregate them: about 5 ms of CPU per call on these machines for the same single event
    (measured: ``bench/a2a_overhead.py``). Everything else (non-blocking sends, messages continuing a task, push
    configuration, streaming, get/list/cancel) goes to the SDK unchanged. The SDK still parses, validates and
    routes the JSON-RPC request and serialises the reply.

    A task served inline cannot be cancelled with ``CancelTask`` (it is not in the SDK's registry): like the rest
    of the call, it ends when its budget does.
    """

    def __init__(self, executor: _SkillExecutor, task_store: TaskStore, agent_card: AgentCard) -> None:
        super().__init__(agent_executor=executor, task_store=task_store, agent_card=agent_card)
        self._skills = executor
        self._store = task_store

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        config = params.configuration
        if params.message.task_id or config.return_immediately or config.HasField("task_push_notification_config"):
            return await super().on_message_send(params, context)
        validate_history_length(config)
        task = await self._skills.run_task(
            params.message, uuid.uuid4().hex, params.message.context_id or uuid.uuid4().hex
        )
        await self._store.save(task, context)
        return apply_history_length(task, config)


def _resilience_code(exc: Exception) -> str:
    if isinstance(exc, CircuitOpenError):
        return "circuit_open"
    if isinstance(exc, BulkheadFullError):
        return "bulkhead_full"
    if isinstance(exc, BulkheadTimeoutError):
        return "bulkhead_timeout"
    if isinstance(exc, A2AError):
        return exc.code
    return "unavailable"


def _now_status(state: TaskState, message: Message | None = None) -> TaskStatus:
    status = TaskStatus(state=state, message=message)
    status.timestamp.FromDatetime(datetime.now(UTC))
    return status


def _completed_task(task_id: str, context_id: str, result: dict[str, Any]) -> Task:
    artifact = Artifact(artifact_id=uuid.uuid4().hex, name=RESULT_ARTIFACT, parts=[_data_part(result)])
    return Task(
        id=task_id, context_id=context_id, status=_now_status(TaskState.TASK_STATE_COMPLETED), artifacts=[artifact]
    )


def _failed_task(task_id: str, context_id: str, error: dict[str, Any]) -> Task:
    message = Message(
        role=Role.ROLE_AGENT,
        message_id=uuid.uuid4().hex,
        task_id=task_id,
        context_id=context_id,
        parts=[_data_part(error)],
    )
    return Task(id=task_id, context_id=context_id, status=_now_status(TaskState.TASK_STATE_FAILED, message))


def _agent_card(name: str, description: str, url: str, skills: Sequence[Skill], version: str) -> AgentCard:
    json_mode = ["application/json"]
    return AgentCard(
        name=name,
        description=description,
        version=version,
        supported_interfaces=[
            AgentInterface(
                url=f"{url.rstrip('/')}{A2A_PATH}",
                protocol_binding="JSONRPC",
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=AgentCapabilities(streaming=False, push_notifications=False),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="Authorization: Bearer <CONCIERGE_SERVICE_TOKEN>"
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=json_mode,
        default_output_modes=json_mode,
        skills=[
            AgentSkill(
                id=s.id,
                name=s.name,
                description=s.description,
                # the spec requires at least one tag
                tags=list(s.tags) or [s.id],
                input_modes=json_mode,
                output_modes=json_mode,
            )
            for s in skills
        ],
    )


def _error_response(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def token_ok(header: str | None) -> bool:
    """``Authorization`` holds ``Bearer $CONCIERGE_SERVICE_TOKEN`` (constant-time comparison)."""
    scheme, _, credentials = (header or "").partition(" ")
    expected = get_settings().service_token.encode()
    # compare even when the scheme is wrong, so timing says nothing about which part failed
    same = hmac.compare_digest(credentials.strip().encode("latin-1", "replace"), expected)
    return same and scheme.lower() == "bearer"


def _guarded(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Token, budget and trace context around the SDK's JSON-RPC endpoint."""

    async def a2a_endpoint(request: Request) -> Response:
        if not token_ok(request.headers.get("authorization")):
            return _error_response(
                401, "unauthorized", "a valid service token is required", {"WWW-Authenticate": "Bearer"}
            )
        settings = get_settings()
        try:
            seconds = parse_budget_header(
                request.headers.get(BUDGET_HEADER), default=settings.default_budget_s, maximum=settings.max_budget_s
            )
        except ValueError as exc:
            return _error_response(400, "invalid_budget", str(exc))
        # An instrumented app already made a server span under the caller's trace; otherwise adopt it here.
        token = None
        if not trace.get_current_span().get_span_context().is_valid:
            token = otel_context.attach(propagate.extract(request.headers))
        try:
            with budget_scope(seconds):
                return await endpoint(request)
        finally:
            if token is not None:
                otel_context.detach(token)

    return a2a_endpoint


def _close_on_shutdown(app: FastAPI, handler: DefaultRequestHandler) -> None:
    original = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(asgi_app: Any) -> AsyncIterator[Any]:
        async with original(asgi_app) as state:
            try:
                yield state
            finally:
                # drain the SDK's producer/consumer tasks so shutdown leaves nothing pending
                await handler.aclose()

    app.router.lifespan_context = lifespan


def mount_a2a(
    app: FastAPI,
    *,
    name: str,
    description: str,
    url: str,
    skills: Sequence[Skill],
    bulkhead: str,
    version: str = "0.1.0",
    inline_send: bool = True,
) -> None:
    """Serve ``skills`` over A2A on ``app``: card at ``AGENT_CARD_PATH`` (public), JSON-RPC at ``A2A_PATH``.

    ``url`` is the agent's public base URL (advertised on the card); ``bulkhead`` names the
    ``resilience.bulkhead_registry`` entry every handler runs in. ``inline_send=False`` sends every request through
    the SDK's generic ``DefaultRequestHandler`` (what ``bench/a2a_overhead.py`` compares against).
    """
    by_id = {s.id: s for s in skills}
    if not by_id:
        raise ValueError("an A2A agent needs at least one skill")
    if len(by_id) != len(skills):
        raise ValueError(f"duplicate skill ids in {[s.id for s in skills]}")
    card = _agent_card(name, description, url, skills, version)
    executor = _SkillExecutor(by_id, bulkhead)
    handler = (
        _SkillRequestHandler(executor, _RecentTaskStore(), card)
        if inline_send
        else DefaultRequestHandler(agent_executor=executor, task_store=_RecentTaskStore(), agent_card=card)
    )
    rpc_routes = [
        Route(route.path, endpoint=_guarded(route.endpoint), methods=["POST"])
        for route in create_jsonrpc_routes(handler, rpc_url=A2A_PATH)
        if isinstance(route, Route)
    ]
    add_a2a_routes_to_fastapi(
        app, agent_card_routes=create_agent_card_routes(card, card_url=AGENT_CARD_PATH), jsonrpc_routes=rpc_routes
    )
    _close_on_shutdown(app, handler)


# ------------------------------------------------------------------------------------------------------ client


class A2AClient:
    """Calls one peer agent's skills. One instance per peer, shared by all requests (it pools connections)."""

    def __init__(self, base_url: str, *, http: httpx.AsyncClient | None = None) -> None:
        self._base_url = base_url.rstrip("/")
        self._owns_http = http is None
        self._http = http if http is not None else create_http_client(self._base_url, with_token=True)
        self._http.headers.setdefault(VERSION_HEADER, PROTOCOL_VERSION_CURRENT)
        # Talking to the transport directly skips a card fetch per peer and the client's interceptor chain;
        # the endpoint path is fixed by our contract, not discovered.
        self._transport = JsonRpcTransport(
            self._http, AgentCard(name=self._base_url), f"{self._base_url}{A2A_PATH}", is_shared_httpx=True
        )
        self._configuration = SendMessageConfiguration(history_length=0)

    @property
    def base_url(self) -> str:
        return self._base_url

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        """Run ``skill`` on the peer with ``data`` as its input; the result dict, or an ``A2AError``."""
        request = SendMessageRequest(
            message=Message(
                role=Role.ROLE_USER,
                message_id=uuid.uuid4().hex,
                parts=[_data_part({"skill": skill, "input": data})],
            ),
            configuration=self._configuration,
        )
        with _tracer.start_as_current_span(
            f"a2a.call {skill}",
            kind=trace.SpanKind.CLIENT,
            attributes={"a2a.skill": skill, "a2a.peer": self._base_url},
        ):
            response = await self._send(skill, request)
            return _result_of(skill, response)

    async def _send(self, skill: str, request: SendMessageRequest) -> SendMessageResponse:
        # httpx's timeout is per phase (connect, write, read); this bounds the whole call by the budget.
        scope = asyncio.timeout(remaining_budget())
        try:
            async with scope:
                return await self._transport.send_message(request)
        except TimeoutError as exc:
            if isinstance(exc, BudgetExhaustedError) or scope.expired():
                raise A2ATimeoutError(f"{skill} on {self._base_url}: {exc or 'budget exhausted'}") from exc
            raise A2AUnavailableError(f"{skill} on {self._base_url}: {exc!r}") from exc
        except A2AClientTimeoutError as exc:
            raise A2ATimeoutError(f"{skill} on {self._base_url}: no answer within the budget") from exc
        except SdkA2AError as exc:
            _raise_transport_error(f"{skill} on {self._base_url}", exc)
        except httpx.HTTPError as exc:
            raise A2AUnavailableError(f"{skill} on {self._base_url}: {exc!r}") from exc

    async def agent_card(self) -> dict[str, Any]:
        """The peer's agent card as served (JSON)."""
        where = f"agent card of {self._base_url}"
        try:
            response = await self._http.get(f"{self._base_url}{AGENT_CARD_PATH}")
            response.raise_for_status()
            card = response.json()
        except BudgetExhaustedError as exc:
            raise A2ATimeoutError(f"{where}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise A2ATimeoutError(f"{where}: no answer within the budget") from exc
        except httpx.HTTPStatusError as exc:
            _raise_for_status(where, exc.response, exc)
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise A2AUnavailableError(f"{where}: {exc!r}") from exc
        if not isinstance(card, dict):
            raise A2AProtocolError(f"{where}: expected a JSON object")
        return card

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _raise_for_status(where: str, response: httpx.Response, cause: BaseException) -> NoReturn:
    status = response.status_code
    detail = _error_detail(response)
    if status in (401, 403):
        raise A2AUnauthorizedError(f"{where}: HTTP {status}: {detail}", status_code=status) from cause
    if status == 429 or status >= 500:
        raise A2AUnavailableError(f"{where}: HTTP {status}: {detail}", code=f"http_{status}") from cause
    raise A2AProtocolError(f"{where}: HTTP {status}: {detail}", code=f"http_{status}") from cause


def _error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, httpx.ResponseNotRead):
        return response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(body)[:200]


def _raise_transport_error(where: str, exc: SdkA2AError) -> NoReturn:
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        _raise_for_status(where, cause.response, exc)
    if isinstance(exc, A2AClientError | SdkInternalError | SdkInvalidAgentResponseError):
        # connection refused/reset, unreadable or non-JSON-RPC replies, a crash inside the peer's A2A stack
        raise A2AUnavailableError(f"{where}: {exc}") from exc
    raise A2AProtocolError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _result_of(skill: str, response: SendMessageResponse) -> dict[str, Any]:
    if response.HasField("message"):
        parts: Sequence[Part] = response.message.parts
        result = _first_data(parts)
    elif response.HasField("task"):
        task = response.task
        state = task.status.state
        if state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED):
            _raise_remote(skill, _first_data(task.status.message.parts))
        if state == TaskState.TASK_STATE_CANCELED:
            raise A2AUnavailableError(f"{skill}: the peer canceled the task", code="canceled")
        if state != TaskState.TASK_STATE_COMPLETED:
            raise A2AProtocolError(f"{skill}: task ended in unexpected state {TaskState.Name(state)}")
        result = next((r for a in task.artifacts if isinstance(r := _first_data(a.parts), dict)), None)
    else:
        raise A2AProtocolError(f"{skill}: the reply holds neither a task nor a message")
    if not isinstance(result, dict):
        raise A2AProtocolError(f"{skill}: the reply has no data part with a result object")
    return result


def _raise_remote(skill: str, payload: Any) -> NoReturn:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        raise A2AUnavailableError(f"{skill}: the peer failed without saying why", code="internal")
    code = str(error.get("code") or "internal")
    message = str(error.get("message") or code)
    kind = error.get("kind")
    if kind == "business":
        data = error.get("data")
        raise A2ASkillError(code, message, data if isinstance(data, dict) else None)
    if kind == "timeout":
        raise A2ATimeoutError(f"{skill}: {message}", code=code)
    raise A2AUnavailableError(f"{skill}: {message}", code=code)
