"""The A2A server side: ``mount_a2a`` serves an agent card and JSON-RPC skills on a FastAPI app.

The ``/a2a`` endpoint checks the service token (a JWT for this agent, signed with the deployment's secret:
``identity.auth``; 401 otherwise), starts the budget from ``X-Timeout-Budget`` and adopts the caller's ``traceparent``
before the SDK sees the request; a blocking ``SendMessage`` that starts a new task runs the skill inline, in the
request's own task. A skill that names its ``callers`` refuses everyone else (``forbidden``), by the token's
verified ``iss``. A message with no data part (text) gets a task waiting for input that names the skills; a skill
that raises ``SkillInputRequired`` gets a task waiting for the input it names. Why, and the wire format:
``docs/a2a.md``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from typing import Any

from a2a.auth.user import User
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import Event, EventQueue
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler, validate_request_params
from a2a.server.routes import add_a2a_routes_to_fastapi, create_agent_card_routes, create_jsonrpc_routes
from a2a.server.routes.common import DefaultServerCallContextBuilder
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
    SendMessageRequest,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT
from a2a.utils.task import apply_history_length, validate_history_length
from fastapi import FastAPI
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from domain.errors import ErrorCode
from identity.auth import InvalidServiceTokenError, MissingSecretError, ServiceClaims, TokenVerifier, service_secret
from infra.a2a.errors import SkillFailure, SkillInputRequired
from infra.a2a.wire import (
    A2A_PATH,
    AGENT_CARD_PATH,
    RESULT_ARTIFACT,
    data_part,
    error_payload,
    first_data,
    without_secrets,
)
from infra.error_table import answer_for, answer_response, error_body
from infra.settings import get_settings
from resilience import bulkhead_registry
from resilience.budget import BUDGET_HEADER, budget_scope, parse_budget_header, remaining_budget
from resilience.errors import (
    BudgetExhaustedError,
    InvalidBudgetHeaderError,
)

logger = logging.getLogger(__name__)
_tracer = trace.get_tracer("concierge.a2a")

# The SDK's in-memory store keeps every task forever; a long-lived agent only needs recent ones (callers read the
# result from the blocking reply). A task is saved terminal, or waiting for the data part a text message lacked: only
# one left waiting behind this many newer tasks is forgotten (its reply then finds no task).
_TASKS_KEPT = 1000
CARD_CACHE_CONTROL = "public, max-age=300"
"""The agent card changes with a deployment only: cached five minutes, then revalidated against its ``ETag``."""
INTERRUPTED_TASK_IDLE_S = 60.0
"""How long the SDK keeps the machinery of a task waiting for input; a later reply rebuilds it from the store."""


SkillHandler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


# The verified caller of the request being served (the token's ``iss``); tasks the SDK starts for it inherit it.
_caller: ContextVar[str | None] = ContextVar("a2a_caller", default=None)


_person: ContextVar[str | None] = ContextVar("a2a_person", default=None)


def current_person() -> str | None:
    """The person the verified caller acts for (its token's ``sub``, RFC 8693 ``act``), or ``None``."""
    return _person.get()


def current_caller() -> str | None:
    """The service calling the skill that is running now (verified), ``None`` outside a skill."""
    return _caller.get()


Progress = Callable[[dict[str, Any]], Awaitable[None]]
_progress: ContextVar[Progress | None] = ContextVar("a2a_progress", default=None)


def progress_wanted() -> bool:
    """Whether the skill running now has a listener for its progress (``message/stream``, a non-blocking send)."""
    return _progress.get() is not None


async def report_progress(data: dict[str, Any]) -> None:
    """Send ``data`` to the caller as a ``working`` status update (its message's data part); nothing without one."""
    progress = _progress.get()
    if progress is not None:
        await progress(data)


@dataclass(frozen=True)
class Skill:
    """One skill an agent offers: advertised on its card, served by ``handler(input) -> result``.

    Both ``input`` and the result are JSON-compatible dicts. ``inputs`` names the fields of ``input`` (``?``:
    optional), told to a client that sent text instead. ``callers`` names the services allowed to call it (by the
    verified ``iss`` of their token); ``None``: any service of the deployment. ``text``: the skill takes plain text
    (the concierge's conversation): a message with no data part runs it with ``{"text", "context_id"}``, and its
    result's ``text`` (if any) is also answered as a text part. At most one skill of an agent takes text.
    """

    id: str
    name: str
    description: str
    handler: SkillHandler
    tags: tuple[str, ...] = ()
    callers: Collection[str] | None = None
    inputs: tuple[str, ...] = ()
    text: bool = False

    def __post_init__(self) -> None:
        if self.callers is not None:
            object.__setattr__(self, "callers", frozenset(self.callers))


_CLAIMS_SCOPE_KEY = "concierge.a2a.claims"
"""Where the guard leaves a request's verified claims for the call-context builder (the ASGI scope)."""


@dataclass(frozen=True)
class _TaskOwner(User):
    """Whom a task belongs to: the verified caller and the person it acts for. The SDK's task store keys every task
    by ``user_name``, so ``GetTask``/``ListTasks`` for one person never find another's, nor another service's."""

    claims: ServiceClaims

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        person = self.claims.person
        return f"{self.claims.issuer}:person:{person}" if person is not None else f"{self.claims.issuer}:self"


class _OwnerContextBuilder(DefaultServerCallContextBuilder):
    def build_user(self, request: Request) -> User:
        claims = request.scope.get(_CLAIMS_SCOPE_KEY)
        if not isinstance(claims, ServiceClaims):  # the guard runs first on every route: a request without is a bug
            raise RuntimeError("an A2A request reached the SDK without verified claims")
        return _TaskOwner(claims)


class _RecentTaskStore(TaskStore):
    """The SDK's ``InMemoryTaskStore`` (tasks kept per ``_TaskOwner``), forgetting the oldest tasks beyond
    ``capacity``, and keeping no secret a request carried (``without_secrets``: a card's token is used, never stored
    in a task's history)."""

    def __init__(self, capacity: int = _TASKS_KEPT) -> None:
        self._inner = InMemoryTaskStore()
        self._capacity = capacity
        self._order: OrderedDict[tuple[str, str], ServerCallContext] = OrderedDict()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self._inner.save(without_secrets(task), context)
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
    """Runs one skill per request and answers with a single ``Task``: terminal, or waiting for the data part a
    text-only message lacked."""

    def __init__(self, agent: str, skills: Mapping[str, Skill], bulkhead: str) -> None:
        self._agent = agent
        self._skills = skills
        self._bulkhead = bulkhead

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        current = context.current_task
        task_id = current.id if current else context.task_id or uuid.uuid4().hex
        context_id = current.context_id if current else context.context_id or uuid.uuid4().hex
        updater = TaskUpdater(event_queue, task_id, context_id)
        # A non-blocking caller gets its answer from the first task event: say at once that the work has started.
        if current is None:
            # The SDK takes a Task only as the first event, and keeps its history as given: start it with the request.
            history = [context.message] if context.message is not None else []
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=_now_status(TaskState.TASK_STATE_WORKING),
                    history=history,
                )
            )
        else:
            # a reply to a task waiting for input: the SDK appends it to the task's history with this update
            await updater.update_status(TaskState.TASK_STATE_WORKING)

        async def progress(data: dict[str, Any]) -> None:
            # a text skill's words (the concierge's tokens) go as text too, for a client that reads only text
            said = data.get("text")
            parts = [Part(text=said), data_part(data)] if isinstance(said, str) and said else [data_part(data)]
            message = updater.new_agent_message(parts)
            await updater.update_status(TaskState.TASK_STATE_WORKING, message)

        # a skill that has progress to tell (``report_progress``) streams it as working updates on this path
        token = _progress.set(progress)
        try:
            outcome = await self.run_task(context.message, task_id, context_id)
        finally:
            _progress.reset(token)
        for artifact in outcome.artifacts:
            await updater.add_artifact(list(artifact.parts), artifact_id=artifact.artifact_id, name=artifact.name)
        status = outcome.status
        await updater.update_status(status.state, status.message if status.HasField("message") else None)

    async def run_task(self, message: Message | None, task_id: str, context_id: str) -> Task:
        """The skill named in ``message``, run to its ``Task`` (never raising): completed or failed; waiting for
        input when the message has no data part at all (text from a client that does not know our wire format)."""
        texter = next((s for s in self._skills.values() if s.text), None)
        if message is None or not any(part.HasField("data") for part in message.parts):
            if texter is None or message is None or not any(part.text for part in message.parts):
                return _agent_task(task_id, context_id, TaskState.TASK_STATE_INPUT_REQUIRED, self._data_wanted())
            said = "\n".join(part.text for part in message.parts if part.text)
            message = Message(
                role=message.role,
                message_id=message.message_id,
                parts=[data_part({"skill": texter.id, "input": {"text": said, "context_id": context_id}})],
            )
        elif texter is not None:
            request = first_data(message.parts)
            if (
                isinstance(request, dict)
                and request.get("skill") == texter.id
                and isinstance(request.get("input"), dict)
            ):
                request["input"].setdefault("context_id", context_id)
                message = Message(role=message.role, message_id=message.message_id, parts=[data_part(request)])
        try:
            result = await self._run(message)
            if texter is not None and isinstance(result.get("text"), str):
                return _completed_task(task_id, context_id, result, text=result["text"])
            return _completed_task(task_id, context_id, result)
        except asyncio.CancelledError:
            raise
        except SkillInputRequired as wanted:  # the skill needs more before it acts: the task waits for it
            parts = [Part(text=wanted.message), data_part(wanted.data)]
            return _agent_task(task_id, context_id, TaskState.TASK_STATE_INPUT_REQUIRED, parts)
        except Exception as exc:
            return _agent_task(task_id, context_id, TaskState.TASK_STATE_FAILED, [data_part(self._describe(exc))])

    def _data_wanted(self) -> list[Part]:
        """What a text message gets back: the data part to send instead, in words and as data, every skill named
        with its input."""
        skills = [
            {
                "id": s.id,
                "name": s.name,
                "description": s.description,
                "input": {
                    "required": [field for field in s.inputs if not field.endswith("?")],
                    "optional": [field.removesuffix("?") for field in s.inputs if field.endswith("?")],
                },
            }
            for s in self._skills.values()
        ]
        listed = "; ".join(f"{s.id} ({', '.join(s.inputs) or 'no input'})" for s in self._skills.values())
        text = (
            f'{self._agent} takes a data part {{"skill": "<id>", "input": {{...}}}}, not text. Its skills, with the '
            f"fields of their input (? optional): {listed}. Send that data part in reply to this task, or in a new one."
        )
        # one-word keys: an A2A client may hold everything it reads to the protocol's camelCase
        return [Part(text=text), data_part({"expected": {"skill": "<skills[].id>", "input": {}}, "skills": skills})]

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        # Cancelling the producer cancels ``execute`` (and so the handler); the SDK then records CANCELED.
        return None

    def _parse(self, message: Message) -> tuple[Skill, dict[str, Any]]:
        request = first_data(message.parts)
        if not isinstance(request, dict) or not isinstance(request.get("skill"), str):
            raise SkillFailure("invalid_request", 'expected a data part {"skill": "<id>", "input": {...}}')
        skill = self._skills.get(request["skill"])
        if skill is None:
            raise SkillFailure(
                "unknown_skill", f"unknown skill {request['skill']!r}; this agent offers {sorted(self._skills)}"
            )
        payload = request.get("input", {})
        if not isinstance(payload, dict):
            raise SkillFailure("invalid_request", f"input of skill {skill.id!r} must be an object")
        return skill, payload

    async def _run(self, message: Message) -> dict[str, Any]:
        skill, payload = self._parse(message)
        caller = _caller.get()
        if skill.callers is not None and caller not in skill.callers:
            allowed = ", ".join(sorted(skill.callers)) or "no service"
            raise SkillFailure(
                ErrorCode.FORBIDDEN, f"{caller or 'this caller'} may not call {skill.id} (only {allowed})"
            )
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
        answer = answer_for(exc)
        if answer.code == ErrorCode.INTERNAL:
            logger.error("A2A skill failed with an unexpected error", exc_info=exc)
            return error_payload("unavailable", answer.code, f"internal error: {type(exc).__name__}: {exc}")
        if answer.code == ErrorCode.TIMEOUT:
            return error_payload("timeout", answer.code, answer.message)
        if answer.retryable:
            return error_payload("unavailable", answer.code, answer.message)
        data = getattr(exc, "data", None)
        return error_payload("business", answer.code, answer.message, data if isinstance(data, dict) else None)


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
        super().__init__(
            agent_executor=executor,
            task_store=task_store,
            agent_card=agent_card,
            interrupted_task_timeout=INTERRUPTED_TASK_IDLE_S,
        )
        self._skills = executor
        self._store = task_store

    @validate_request_params
    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Message | Task:
        config = params.configuration
        if params.message.task_id or config.return_immediately or config.HasField("task_push_notification_config"):
            await self._context_of_its_task(params.message, context)
            return await super().on_message_send(params, context)
        validate_history_length(config)
        task = await self._skills.run_task(
            params.message, uuid.uuid4().hex, params.message.context_id or uuid.uuid4().hex
        )
        # the history as the SDK's path keeps it: the request, then each message the agent's current one replaced
        request = task.history.add()
        request.CopyFrom(params.message)
        request.task_id, request.context_id = task.id, task.context_id
        await self._store.save(task, context)
        return apply_history_length(task, config)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event, None]:
        await self._context_of_its_task(params.message, context)
        async for event in super().on_message_send_stream(params, context):
            yield event

    async def _context_of_its_task(self, message: Message, context: ServerCallContext) -> None:
        """A message naming only its task belongs to that task's context (spec §3.4.3: the agent infers it); the
        SDK would give it a new one, which then contradicts its task."""
        if message.task_id and not message.context_id:
            task = await self._store.get(message.task_id, context)
            if task is not None:
                message.context_id = task.context_id


def _now_status(state: TaskState, message: Message | None = None) -> TaskStatus:
    status = TaskStatus(state=state, message=message)
    status.timestamp.FromDatetime(datetime.now(UTC))
    return status


def _completed_task(task_id: str, context_id: str, result: dict[str, Any], *, text: str | None = None) -> Task:
    parts = [data_part(result)] if text is None else [Part(text=text), data_part(result)]
    artifact = Artifact(artifact_id=uuid.uuid4().hex, name=RESULT_ARTIFACT, parts=parts)
    return Task(
        id=task_id, context_id=context_id, status=_now_status(TaskState.TASK_STATE_COMPLETED), artifacts=[artifact]
    )


def _agent_task(task_id: str, context_id: str, state: TaskState, parts: Sequence[Part]) -> Task:
    """A task in ``state`` whose status carries the agent's message (why it failed, what it needs)."""
    message = Message(
        role=Role.ROLE_AGENT,
        message_id=uuid.uuid4().hex,
        task_id=task_id,
        context_id=context_id,
        parts=list(parts),
    )
    return Task(id=task_id, context_id=context_id, status=_now_status(state, message))


def _agent_card(
    name: str, description: str, url: str, skills: Sequence[Skill], version: str, streaming: bool = False
) -> AgentCard:
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
        capabilities=AgentCapabilities(streaming=streaming, push_notifications=False),
        security_schemes={
            "bearer": SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer",
                    bearer_format="JWT",
                    description="Authorization: Bearer <JWT, HS256 with the deployment's secret; iss: the calling "
                    "service, aud: this agent, exp: at most a few minutes ahead>",
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
                input_modes=["text/plain", *json_mode] if s.text else json_mode,
                output_modes=["text/plain", *json_mode] if s.text else json_mode,
            )
            for s in skills
        ],
    )


def _error_response(code: ErrorCode, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=code.http_status, headers=headers)


_verifiers: dict[str, TokenVerifier] = {}


def authenticate(header: str | None, audience: str) -> ServiceClaims:
    """The verified claims of the service token in ``Authorization``, for the agent ``audience``.

    ``InvalidServiceTokenError`` when there is none, or it is not a current token of this deployment for
    ``audience`` (and when this process has no usable secret: then nothing is accepted).
    """
    try:
        secret = service_secret(get_settings())
    except MissingSecretError as exc:
        raise InvalidServiceTokenError(f"this agent has no usable secret: {exc}") from None
    verifier = _verifiers.get(audience)
    if verifier is None:
        verifier = _verifiers[audience] = TokenVerifier(audience)
    return verifier.verify(header, secret)


def token_ok(header: str | None, audience: str) -> bool:
    """``Authorization`` holds a valid service token for the agent ``audience`` (see ``authenticate``)."""
    try:
        authenticate(header, audience)
    except InvalidServiceTokenError:
        return False
    return True


def _guarded(
    endpoint: Callable[[Request], Awaitable[Response]], audience: str
) -> Callable[[Request], Awaitable[Response]]:
    """Token, budget and trace context around the SDK's JSON-RPC endpoint of the agent ``audience``."""

    async def a2a_endpoint(request: Request) -> Response:
        try:
            claims = authenticate(request.headers.get("authorization"), audience)
        except InvalidServiceTokenError as exc:
            logger.info("A2A call to %s refused: %s", audience, exc.reason)
            return _error_response(
                ErrorCode.UNAUTHORIZED, "a valid service token is required", {"WWW-Authenticate": "Bearer"}
            )
        settings = get_settings()
        try:
            seconds = parse_budget_header(
                request.headers.get(BUDGET_HEADER), default=settings.default_budget_s, maximum=settings.max_budget_s
            )
        except InvalidBudgetHeaderError as exc:  # on an app without the shell's edge, which answers it first
            status, body, headers = answer_response(answer_for(exc))
            return JSONResponse(body, status_code=status, headers=headers)
        # An instrumented app already made a server span under the caller's trace; otherwise adopt it here.
        token = None
        if not trace.get_current_span().get_span_context().is_valid:
            token = otel_context.attach(propagate.extract(request.headers))
        request.scope[_CLAIMS_SCOPE_KEY] = claims
        caller = _caller.set(claims.issuer)
        person = _person.set(claims.person)
        try:
            with budget_scope(seconds):
                return await endpoint(request)
        finally:
            _caller.reset(caller)
            _person.reset(person)
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
    streaming: bool = False,
) -> None:
    """Serve ``skills`` over A2A on ``app``: card at ``AGENT_CARD_PATH`` (public), JSON-RPC at ``A2A_PATH``.

    ``name`` is the agent's service name: the ``aud`` its callers' tokens must carry. ``url`` is the agent's public
    base URL (advertised on the card); ``bulkhead`` names the ``resilience.bulkhead_registry`` entry every handler
    runs in. ``inline_send=False`` sends every request through the SDK's generic ``DefaultRequestHandler`` (what
    ``bench/a2a_overhead.py`` compares against). ``streaming``: the card says so, and ``message/stream`` carries
    each ``report_progress`` of a skill as a ``working`` status update before the result.
    """
    by_id = {s.id: s for s in skills}
    if not by_id:
        raise ValueError("an A2A agent needs at least one skill")
    if len(by_id) != len(skills):
        raise ValueError(f"duplicate skill ids in {[s.id for s in skills]}")
    card = _agent_card(name, description, url, skills, version, streaming)
    executor = _SkillExecutor(name, by_id, bulkhead)
    handler = (
        _SkillRequestHandler(executor, _RecentTaskStore(), card)
        if inline_send
        else DefaultRequestHandler(
            agent_executor=executor,
            task_store=_RecentTaskStore(),
            agent_card=card,
            interrupted_task_timeout=INTERRUPTED_TASK_IDLE_S,
        )
    )
    rpc_routes = [
        Route(route.path, endpoint=_guarded(route.endpoint, name), methods=["POST"])
        for route in create_jsonrpc_routes(handler, rpc_url=A2A_PATH, context_builder=_OwnerContextBuilder())
        if isinstance(route, Route)
    ]
    add_a2a_routes_to_fastapi(app, agent_card_routes=_card_routes(card), jsonrpc_routes=rpc_routes)
    # A client that joins "/" to the card's URL (httpx's base_url does, and so does the A2A TCK) posts to "/a2a/";
    # Starlette would redirect it (307, empty body), which no JSON-RPC client follows. Same endpoint, not documented.
    app.router.routes.extend(Route(f"{r.path}/", endpoint=r.endpoint, methods=["POST"]) for r in rpc_routes)
    _close_on_shutdown(app, handler)


def _card_routes(card: AgentCard) -> list[Route]:
    """The SDK's card route (``ETag``, 304 on ``If-None-Match``) with ``Cache-Control`` (spec §8.6.1) and
    ``Last-Modified``: when this process built the card, which does not change while it runs."""
    built = formatdate(time.time(), usegmt=True)

    def with_last_modified(
        endpoint: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def agent_card(request: Request) -> Response:
            response = await endpoint(request)
            response.headers["Last-Modified"] = built
            return response

        return agent_card

    routes = create_agent_card_routes(card, card_url=AGENT_CARD_PATH, cache_control=CARD_CACHE_CONTROL)
    return [
        Route(r.path, endpoint=with_last_modified(r.endpoint), methods=["GET"]) for r in routes if isinstance(r, Route)
    ]
