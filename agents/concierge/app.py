"""concierge-agent: a conversation that books hotels, every side effect once (port 8003, docs/concierge.md).

``POST /chats`` opens a chat; ``POST /chats/{id}/messages`` makes a turn durable (a run of graph ``concierge``,
thread id = chat id, in the run store) and answers **202**; the turn runs in a background task (the tool-calling
graph of ``agents.concierge.graph``), any replica serving any chat. ``book_hotel`` parks the turn at its approval (not failed,
not an orphan: ``runs.leases.RunStatus.PARKED``); ``POST /chats/{id}/approvals/{approval_id}`` records the decision
and takes the run up in one Redis script (the first decision wins: two racing approvals book once) before its 202,
then resumes it with ``Command(resume=...)``. An approval past ``APPROVAL_TTL_S`` is decided ``expired`` by the
approval sweeper every replica runs (``APPROVAL_SWEEP_INTERVAL_S``), never by a read: ``GET /chats/{id}`` (``?wait=``
long-polls) shows the chat, ``GET /chats`` lists them newest first, ``GET /chats/{id}/events`` serves the chat's
journal as JSON or live SSE with ``Last-Event-ID`` resume, and none of them calls the model. The A2A skill
``concierge`` takes a plain text message and streams the answer; a decision over A2A names its ``approval_id``.

With presence on (``PRESENCE_ENABLED``) a kill -9 of this process loses its named Redis connection and the recovery
worker resumes its turns at once from their checkpoints; on SIGTERM the turns in hand are handed back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request, Response
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from sse_starlette import ServerSentEvent
from starlette.routing import Route

from agents.concierge.approved_call import APPROVED_CALL_GRAPH, build_approved_call_graph
from agents.concierge.context import ConciergeDeps, open_concierge_deps
from agents.concierge.graph import CONCIERGE_GRAPH, build_concierge_graph, turn_is_final
from agents.concierge.mcp_edge import MCP_PATH, METADATA_PATH, McpEdge, protected_resource
from agents.concierge.prompts import system_prompt
from agents.concierge.state import turn_input
from agents.concierge.tools import offer_for
from domain import currency_code, hotel_named
from domain.chat import (
    ApprovalExpiredError,
    ApprovalPendingError,
    ChatEventKind,
    ChatStatus,
    TurnInProgressError,
    TurnOutcome,
    check_text,
)
from domain.errors import ErrorCode
from identity.people import Caller, IdempotencyKeyReusedError, person_key
from infra.a2a.errors import SkillFailure, SkillInputRequired
from infra.a2a.server import Skill, current_person, mount_a2a, progress_wanted, report_progress
from infra.a2a.wire import A2A_PATH
from infra.chats import FeedHub
from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.error_table import is_outage
from infra.llm import ChatModel
from infra.quotas import Release
from infra.service import STREAM_ID_PATTERN, create_service_app, journal_response, shutting_down_event
from infra.service.openapi import answers, detail, document_service_token, error, validation_error
from infra.service.people import PEOPLE_ANSWERS, Who, open_stream
from infra.settings import get_settings
from process.tasks import stop_task
from recovery.queue import DeadLetterQueue, QueueGuard
from resilience import remaining_budget
from runs.api import RUN_VIEW_STATE, RunView, runs_router
from runs.host import RunHost, hosted_instance
from runs.leases import RunLease, RunRecord, RunStatus, RunStore
from runs.runner import RunInput
from runs.versions import graph_fingerprint

logger = logging.getLogger(__name__)

SERVICE: Final = "concierge-agent"
MAX_WAIT_S: Final = 60.0
DRAIN_S: Final = 10.0
WAIT_POLL_S: Final = 0.05
"""How often a long-poll looks at the turn (any replica, or the recovery worker, may be running it)."""
PARK_WAIT_S: Final = 10.0
"""The longest an approval waits for its run to park (the approval is announced just before)."""
PAYMENT_TOKEN_PATTERN: Final = r"^tok_[A-Za-z0-9_]+$"
CHAT_ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
APPROVAL_ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
SWEEP_BATCH: Final = 100
"""How many ended waits one sweep reads at a time."""
SWEEP_PAGES: Final = 10
"""At most this many batches per sweep: a page that leaves its entries in the index is never read in a loop."""
EXPIRED: Final = {"approve": False, "expired": True}
"""The answer an approval gets once ``APPROVAL_TTL_S`` has passed: the model is told, nothing is booked."""


# ------------------------------------------------------------------------------------------------- bodies


class MessageRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="What the person says (at most 8 KB of UTF-8).")
    payment_token: str | None = Field(
        None, min_length=5, max_length=128, pattern=PAYMENT_TOKEN_PATTERN, description="Kept apart, never shown."
    )

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        return check_text(value)


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    approve: StrictBool
    payment_token: str | None = Field(None, min_length=5, max_length=128, pattern=PAYMENT_TOKEN_PATTERN)


class Created(BaseModel):
    chat_id: str
    status: ChatStatus


class TurnAccepted(BaseModel):
    chat_id: str
    turn_id: str
    status: ChatStatus


class ApprovalAccepted(BaseModel):
    chat_id: str
    approval_id: str
    approve: bool
    status: ChatStatus


# ------------------------------------------------------------------------------------------------- service


def _status_of(record: RunRecord | None) -> ChatStatus:
    if record is None or record.is_final:
        return ChatStatus.IDLE
    if record.status is RunStatus.PARKED:
        return ChatStatus.AWAITING_APPROVAL
    return ChatStatus.RUNNING


class ConciergeService:
    """The agent's state: stores, graph, and the turns it runs in this process."""

    def __init__(
        self,
        deps: ConciergeDeps,
        graph: Any,
        runs: RunStore,
        guard: QueueGuard,
        instance: str,
        calls: Any = None,
    ) -> None:
        self.deps = deps
        self.graph = graph
        self.version = None if graph is None else graph_fingerprint(graph)
        """What every turn this process begins records: the shape it runs on (``runs.versions``)."""
        self.calls = calls
        """The graph of an MCP host's approved calls (``agents.concierge.approved_call``), parked like a turn."""
        self.calls_version = None if calls is None else graph_fingerprint(calls)
        self.runs = runs
        self.guard = guard
        self.instance = instance
        self.hub = FeedHub(deps.feed)
        """Live readers of the chats' journals (one Redis connection per followed chat)."""
        self.host = RunHost(guard.safe_enqueue, what=SERVICE, drain_s=DRAIN_S)
        """Where its turns execute (``runs.host``)."""

    async def create_chat(self, owner: str | None, *, capped: bool = True) -> str:
        """A new chat of ``owner``'s; a person's (``capped``) are at most ``PERSON_MAX_CHATS`` at once (429)."""
        chat_id = uuid.uuid4().hex
        cap = get_settings().person_max_chats if capped else None
        await self.deps.chats.create(chat_id, owner, max_chats=cap)
        return chat_id

    async def known(self, chat_id: str, who: Caller) -> None:
        """404 unless the chat exists and is the caller's: another person's answers exactly as an unknown one."""
        exists, owner = await self.deps.chats.owner(chat_id)
        if not exists or not who.may_see(owner):
            raise HTTPException(status_code=404, detail=f"no chat {chat_id}")

    async def post_message(
        self, chat_id: str, text: str, payment_token: str | None, client_key: str | None
    ) -> tuple[str, ChatStatus]:
        if client_key is not None:
            digest = hashlib.sha256(text.encode()).hexdigest()[:32]
            if not await self.deps.chats.claim_message_key(chat_id, client_key, digest):
                raise IdempotencyKeyReusedError(
                    "Idempotency-Key: this key was already used in this chat with a different text"
                )
        # the shared model rate limit: a turn that could not get a model call within its budget is refused at the
        # door (429 overloaded, Retry-After) before anything is recorded
        check_capacity = getattr(self.deps.model, "check_capacity", None)
        if check_capacity is not None:
            await check_capacity(get_settings().concierge_turn_budget_s)
        turn_id = uuid.uuid4().hex
        run_input = turn_input(chat_id, turn_id, text)
        begun = await self.runs.begin(
            chat_id,
            CONCIERGE_GRAPH,
            run_input,
            self.instance,
            turn=turn_id,
            client_key=_bound_key(client_key, text),
            version=self.version,
        )
        if begun.repeat is not None:
            return begun.repeat, _status_of(await self.runs.get(chat_id))
        if begun.busy is RunStatus.PARKED:
            raise ApprovalPendingError(f"chat {chat_id} waits for the approval of a booking: decide it first")
        if begun.lease is None:
            raise TurnInProgressError(f"chat {chat_id} has a turn running: wait for it (GET /chats/{chat_id}?wait=)")
        lease = begun.lease
        try:
            if payment_token is not None:
                await self.deps.chats.put_token(chat_id, payment_token)
            await self.deps.chats.append_message(chat_id, {"role": "user", "content": text, "turn_id": turn_id})
        except BaseException:
            lease.abandon()  # recorded: the presence audit (or its lease) hands it to recovery
            raise
        self.start(lease, run_input)
        return turn_id, ChatStatus.RUNNING

    async def decide(
        self, chat_id: str, approval_id: str, approve: bool, payment_token: str | None
    ) -> tuple[bool, ChatStatus]:
        """Record the decision (the first one stands) and resume the turn; ``ApprovalExpiredError`` past its TTL."""
        record = await self.runs.get(chat_id)
        if (
            payment_token is not None
            and record is not None
            and record.status is RunStatus.PARKED
            and record.waiting_until is not None
            and time.time() <= record.waiting_until
            and _waiting_id(record) == approval_id
        ):
            await self.deps.chats.put_token(chat_id, payment_token)  # the approval's token wins
        decision = await self.runs.decide(chat_id, approval_id, {"approve": approve}, EXPIRED, self.instance)
        if decision is None and await self._requested(chat_id, approval_id):
            decision = await self._decide_once_parked(chat_id, approval_id, approve, payment_token)
        if decision is None:
            raise HTTPException(status_code=404, detail=f"no approval {approval_id} in chat {chat_id}")
        if decision.lease is not None:
            await self._note_decision(chat_id, approval_id, decision.answer)
            self.start(decision.lease, Command(resume=decision.answer), graph=await self._graph_of(chat_id))
        if decision.expired:
            raise ApprovalExpiredError(f"approval {approval_id} expired (APPROVAL_TTL_S): nothing was booked")
        return bool(decision.answer.get("approve")), _status_of(await self.runs.get(chat_id))

    async def _graph_of(self, chat_id: str) -> str:
        """The graph the chat's run is of: a turn (``concierge``), or an MCP host's approved call."""
        record = await self.runs.get(chat_id)
        return record.graph if record is not None else CONCIERGE_GRAPH

    async def _requested(self, chat_id: str, approval_id: str) -> bool:
        """Whether the chat's journal asked for this approval (it is announced a moment before its run parks)."""
        return any(
            entry.get("kind") == ChatEventKind.APPROVAL_REQUESTED
            and (entry.get("approval") or {}).get("approval_id") == approval_id
            for entry in await self.deps.feed.read(chat_id)
        )

    async def _decide_once_parked(
        self, chat_id: str, approval_id: str, approve: bool, payment_token: str | None
    ) -> Any:
        """A person who answers the ``approval_requested`` event at once may beat the run to its park: wait for it,
        within the request's budget, rather than answer 404 for an approval the chat just showed."""
        deadline = time.monotonic() + min(remaining_budget(), PARK_WAIT_S)
        while time.monotonic() < deadline:
            await asyncio.sleep(WAIT_POLL_S)
            record = await self.runs.get(chat_id)
            if record is None or record.status not in (RunStatus.RUNNING, RunStatus.PARKED):
                return None
            if record.status is RunStatus.PARKED and _waiting_id(record) == approval_id:
                if payment_token is not None:
                    await self.deps.chats.put_token(chat_id, payment_token)  # the approval's token wins
                return await self.runs.decide(chat_id, approval_id, {"approve": approve}, EXPIRED, self.instance)
        return None

    async def _note_decision(self, chat_id: str, approval_id: str, answer: dict[str, Any]) -> None:
        record = await self.runs.get(chat_id)
        await self.deps.feed.emit(
            chat_id,
            ChatEventKind.APPROVAL_DECIDED,
            once=f"decided:{approval_id}",
            approval_id=approval_id,
            approve=bool(answer.get("approve")),
            expired=bool(answer.get("expired")),
            turn_id=record.turn if record is not None else None,
        )

    async def sweep_once(self) -> list[str]:
        """Decide ``expired`` every approval whose TTL ran out (the turn then ends, telling the model); the chats
        this call decided. Every replica sweeps: ``RunStore.decide``'s one script lets the first decision win, and
        the waiting index lists only parked runs, so a sweep reads nothing else."""
        expired: list[str] = []
        for _ in range(SWEEP_PAGES):
            if self.host.stopping.is_set():
                break
            due = await self.runs.due_waits(SWEEP_BATCH)
            for chat_id in due:
                if self.host.stopping.is_set():
                    break
                try:
                    if await self._expire(chat_id):
                        expired.append(chat_id)
                except Exception as exc:
                    if is_outage(exc):
                        raise
                    logger.exception("chat %s: could not expire its approval; the next sweep tries again", chat_id)
            if len(due) < SWEEP_BATCH:
                break
        return expired

    async def _expire(self, chat_id: str) -> bool:
        """Decide the chat's ended wait ``expired`` and resume its turn here; True when this call decided it."""
        record = await self.runs.get(chat_id)
        if record is None or record.status is not RunStatus.PARKED:
            await self.runs.forget_wait(chat_id)  # left by a run that ended another way
            return False
        if record.graph not in (CONCIERGE_GRAPH, APPROVED_CALL_GRAPH):
            return False  # the concierge's sweeper decides only its own waits
        approval_id = _waiting_id(record)
        decision = await self.runs.decide(chat_id, approval_id, EXPIRED, EXPIRED, self.instance)
        if decision is None or decision.lease is None:
            return False  # another replica (or the person) decided first
        await self._note_decision(chat_id, approval_id, decision.answer)
        self.start(decision.lease, Command(resume=decision.answer), graph=record.graph)
        return True

    async def sweep(self, interval: float) -> None:
        """The approval sweeper: ``sweep_once`` every ``interval`` until ``stopping``; an outage of the stores is one
        warning when it starts and one when it ends, a bug is logged, and the loop goes on either way."""
        down_since: float | None = None
        while not self.host.stopping.is_set():
            started = time.monotonic()
            try:
                await self.sweep_once()
            except Exception as exc:
                if not is_outage(exc):
                    logger.exception("approval sweep failed; retrying in %.2fs", interval)
                elif down_since is None:
                    down_since = started
                    logger.warning("approval sweeps paused: %s: %s", type(exc).__name__, exc)
            else:
                if down_since is not None:
                    logger.warning("approval sweeps resumed after %.1fs", started - down_since)
                    down_since = None
            if self.host.stopping.is_set():
                return
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def start(self, lease: RunLease, run_input: RunInput, *, graph: str = CONCIERGE_GRAPH) -> None:
        """Run a turn (or, ``graph`` = ``approved_call``, an MCP host's call) here, within a turn's budget."""
        budget_s = get_settings().concierge_turn_budget_s
        runs = self.calls if graph == APPROVED_CALL_GRAPH else self.graph
        self.host.start(runs, lease, run_input, budget_s=budget_s, is_final=turn_is_final, name="turn")

    async def view(self, chat_id: str, wait_s: float = 0.0, who: Caller | None = None) -> dict[str, Any]:
        """The chat as ``GET /chats/{id}`` shows it (404 when there is none, or it is not ``who``'s)."""
        chat = await self.deps.chats.get(chat_id)
        if chat is None or (who is not None and not who.may_see(chat.get("owner"))):
            raise HTTPException(status_code=404, detail=f"no chat {chat_id}")
        # reading decides nothing: an approval past its TTL shows as it stands until the sweeper decides it
        record = await self.runs.get(chat_id)
        deadline = time.monotonic() + wait_s
        # a stopping process answers what it knows at once (docs/liveness.md): the client asks a replica again
        while (
            _status_of(record) is ChatStatus.RUNNING and time.monotonic() < deadline and not self.host.stopping.is_set()
        ):
            await asyncio.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
            record = await self.runs.get(chat_id)
        chat = await self.deps.chats.get(chat_id) or chat
        return _chat_view(chat, record)

    async def drain(self) -> None:
        """SIGTERM: cancel each turn's current step and hand the turns to recovery, then return."""
        await self.host.drain()


def _bound_key(client_key: str | None, text: str) -> str | None:
    """The run store's client key: the client's ``Idempotency-Key`` with the message's digest (a key reused with
    another text does not find the first turn)."""
    if client_key is None:
        return None
    return f"{client_key}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _waiting_id(record: RunRecord) -> str:
    return str((record.waiting or {}).get("waiting_id") or "")


def _chat_view(chat: dict[str, Any], record: RunRecord | None) -> dict[str, Any]:
    status = _status_of(record)
    last_turn = chat.get("last_turn")
    pending = None
    if status is ChatStatus.AWAITING_APPROVAL and record is not None and record.waiting is not None:
        pending = record.waiting.get("approval")
    if record is not None and status is not ChatStatus.IDLE and (last_turn or {}).get("turn_id") != record.turn:
        # the turn in progress (or parked): its outcome is not known yet
        outcome = TurnOutcome.AWAITING_APPROVAL if status is ChatStatus.AWAITING_APPROVAL else None
        last_turn = {"turn_id": record.turn, "outcome": outcome, "error": None, "usage": None}
    return {
        "chat_id": chat["chat_id"],
        "status": status,
        "messages": chat["messages"],
        "pending_approval": pending,
        "bookings": chat["bookings"],
        "last_turn": last_turn,
        "usage": chat.get("usage"),
        "created_at": chat["created_at"],
    }


# ------------------------------------------------------------------------------------------------- app


def _start_warm_up(deps: ConciergeDeps) -> asyncio.Task[bool] | None:
    """A local model warmed up in the background (LLM_WARMUP): the concierge's real prefix (system prompt and tools,
    what every turn starts with) so the server loads the model and caches it before the first person waits."""
    model = deps.model
    if not isinstance(model, ChatModel) or not get_settings().llm_warm_up:
        return None
    messages = [SystemMessage(content=system_prompt()), HumanMessage(content="Hello")]
    first = offer_for([], False, guided=get_settings().llm_guides_tools, first_call=True)
    return asyncio.create_task(model.warm_up(messages, first.tools, first.tool_choice), name="model-warm-up")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    redis = app.state.redis
    async with open_checkpointer() as saver, open_concierge_deps(redis) as deps, hosted_instance(SERVICE) as instance:
        app.state.checkpointer = saver
        graph = build_concierge_graph(deps, saver)
        guard = QueueGuard(redis, DeadLetterQueue(redis))
        calls = build_approved_call_graph(deps, saver)
        service = ConciergeService(deps, graph, RunStore(redis), guard, instance, calls)
        app.state.concierge = service

        async def chat_owner(record: RunRecord) -> str | None:
            return (await deps.chats.owner(record.thread_id))[1]  # a turn's thread is its chat

        setattr(app.state, RUN_VIEW_STATE, RunView(service.runs, {CONCIERGE_GRAPH: graph}, chat_owner))
        app.state.stopping.add(service.host.stopping.set)
        app.state.stopping.add(service.hub.wake)  # open streams end at once, with ``shutting_down``
        interval = settings.approval_sweep_interval_s
        sweeper = asyncio.create_task(service.sweep(interval), name="approval-sweeper")
        warm_up = _start_warm_up(deps)
        try:
            yield
        finally:
            if warm_up is not None:
                await stop_task(warm_up, within=1.0, what="the model warm-up")
            # no new turn from a sweep while the turns in hand are handed back
            within = min(interval, DRAIN_S) + 1.0
            await stop_task(sweeper, stop=service.host.stopping, within=within, what="the approval sweeper")
            await mcp_edge.aclose()  # its sessions end; the approvals they asked stay pending
            await service.drain()
            await service.hub.aclose()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready}, people=True)
app.include_router(runs_router())


mcp_edge = McpEdge(app.state)
"""``/mcp``: the concierge's tools for any MCP host, people only (docs/mcp.md)."""
app.router.routes.append(Route(MCP_PATH, mcp_edge, methods=["GET", "POST", "DELETE"], include_in_schema=False))


@app.get(METADATA_PATH)
@app.get(f"{METADATA_PATH}{MCP_PATH}")
async def mcp_protected_resource(request: Request) -> dict[str, Any]:
    """RFC 9728 metadata of `/mcp`: the issuer a person gets a token from and the audience it must name."""
    return protected_resource(str(request.base_url).rstrip("/"))


def _service() -> ConciergeService:
    service: ConciergeService = app.state.concierge
    if service.host.stopping.is_set():
        raise HTTPException(status_code=503, detail=f"{SERVICE} is shutting down", headers={"Retry-After": "1"})
    return service


ChatId = Annotated[str, Path(pattern=CHAT_ID_PATTERN)]
ApprovalId = Annotated[str, Path(pattern=APPROVAL_ID_PATTERN)]
_NO_CHAT = detail(404, description="No chat with this id.")


@app.post("/chats", status_code=201, response_model=Created, responses=answers(*PEOPLE_ANSWERS))
async def create_chat(response: Response, who: Who) -> Created:
    """A new chat of the caller's: only they (and the operator) see it."""
    chat_id = await _service().create_chat(who.person, capped=not who.operator)
    response.headers["Location"] = f"/chats/{chat_id}"
    return Created(chat_id=chat_id, status=ChatStatus.IDLE)


@app.post(
    "/chats/{chat_id}/messages",
    status_code=202,
    response_model=TurnAccepted,
    responses=answers(
        _NO_CHAT,
        validation_error("`text` is empty or over 8 KB, or `payment_token` is malformed."),
        error(
            409,
            "turn_in_progress",
            "approval_pending",
            description="A turn runs (`turn_in_progress`) or an approval waits (`approval_pending`).",
        ),
        error(
            422,
            ErrorCode.IDEMPOTENCY_KEY_REUSED,
            description="This chat had this `Idempotency-Key` before with another text.",
        ),
        *PEOPLE_ANSWERS,
    ),
)
async def post_message(
    chat_id: ChatId,
    body: MessageRequest,
    who: Who,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=200)] = None,
) -> TurnAccepted:
    service = _service()
    await service.known(chat_id, who)
    if service.deps.quotas is not None and not who.operator:
        await service.deps.quotas.check_tokens(who.person)  # spent today: 429 now, nothing recorded
    turn_id, status = await service.post_message(chat_id, body.text, body.payment_token, idempotency_key)
    return TurnAccepted(chat_id=chat_id, turn_id=turn_id, status=status)


@app.get("/chats/{chat_id}", responses=answers(_NO_CHAT, *PEOPLE_ANSWERS))
async def get_chat(
    chat_id: ChatId, who: Who, wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False)] = 0.0
) -> dict[str, Any]:
    """The chat; with `wait`, once its turn is not `running` any more (or the wait is over)."""
    service: ConciergeService = app.state.concierge
    return await service.view(chat_id, wait, who)


def _encode_cursor(score: float) -> str:
    return base64.urlsafe_b64encode(repr(score).encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> float:
    try:
        value = float(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode())
    except (ValueError, UnicodeDecodeError):
        value = math.nan
    if not math.isfinite(value):
        raise HTTPException(
            status_code=422,
            detail=[{"loc": ["query", "cursor"], "msg": "not a cursor this API gave out", "type": "value_error"}],
        )
    return value


@app.get("/chats", responses=answers(validation_error("`cursor` is not one this API gave out."), *PEOPLE_ANSWERS))
async def list_chats(
    who: Who,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> dict[str, Any]:
    """The caller's chats (the operator's: everyone's) newest first, a page at a time; it only reads (an approval
    past its TTL is the sweeper's to decide)."""
    service: ConciergeService = app.state.concierge
    before = _decode_cursor(cursor) if cursor is not None else None
    rows = await service.deps.chats.page(limit, before, owner=who.person, everyone=who.operator)
    chats = []
    for chat_id, created in rows:
        chats.append({"chat_id": chat_id, "created_at": created, "status": _status_of(await service.runs.get(chat_id))})
    next_cursor = _encode_cursor(rows[-1][1]) if len(rows) == limit else None
    return {"chats": chats, "next_cursor": next_cursor}


@app.post(
    "/chats/{chat_id}/approvals/{approval_id}",
    status_code=202,
    response_model=ApprovalAccepted,
    responses=answers(
        detail(404, description="No such chat (or another person's), or no such approval in it."),
        validation_error("`approve` is not a boolean, or `payment_token` is malformed."),
        error(409, "approval_expired", description="The approval is older than `APPROVAL_TTL_S`: nothing was booked."),
        *PEOPLE_ANSWERS,
    ),
)
async def decide_approval(
    chat_id: ChatId, approval_id: ApprovalId, body: ApprovalRequest, who: Who
) -> ApprovalAccepted:
    """The decision is durable before this answers; a repeat gets the first decision back. Only the chat's owner
    (or the operator) decides."""
    service = _service()
    await service.known(chat_id, who)
    approve, status = await service.decide(chat_id, approval_id, body.approve, body.payment_token)
    return ApprovalAccepted(chat_id=chat_id, approval_id=approval_id, approve=approve, status=status)


@app.get(
    "/chats/{chat_id}/events",
    responses={
        200: {
            "description": "The chat's journal, oldest first. With `Accept: text/event-stream`: Server-Sent Events, "
            "live (`id:` the entry id: send it back as `Last-Event-ID` to resume on any replica).",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **answers(_NO_CHAT, validation_error("`Last-Event-ID` is not an entry id."), *PEOPLE_ANSWERS),
    },
)
async def chat_events(
    request: Request,
    chat_id: ChatId,
    who: Who,
    last_event_id: Annotated[str, Header(alias="Last-Event-ID", pattern=STREAM_ID_PATTERN)] = "",
) -> Any:
    service: ConciergeService = app.state.concierge
    await service.known(chat_id, who)
    if "text/event-stream" not in request.headers.get("accept", ""):
        return {"chat_id": chat_id, "events": await service.deps.feed.read(chat_id, after=last_event_id or None)}
    release = await open_stream(request, who)
    return journal_response(_follow(service, request, chat_id, last_event_id or None, release))


async def _follow(
    service: ConciergeService, request: Request, chat_id: str, after: str | None, release: Release
) -> AsyncIterator[ServerSentEvent]:
    try:
        async with contextlib.aclosing(service.hub.follow(chat_id, after)) as entries:
            async for entry in entries:
                if not entry:
                    if service.host.stopping.is_set():  # the rest from a replica, or after the restart
                        yield shutting_down_event(SERVICE)
                        return
                    if await request.is_disconnected():
                        return
                    continue
                yield ServerSentEvent(
                    data=json.dumps(entry, separators=(",", ":")), id=entry["id"], event=entry["kind"]
                )
    finally:
        await release()


# ------------------------------------------------------------------------------------------------- A2A


def a2a_chat_id(context_id: str, person: str | None = None) -> str:
    """The chat of one A2A conversation (its ``contextId``) of one person: two people's equal contexts are two chats."""
    scope = context_id if person is None else f"{person_key(person)}:{context_id}"
    return "a2a-" + hashlib.sha256(scope.encode()).hexdigest()[:32]


async def concierge_skill(data: dict[str, Any]) -> dict[str, Any]:
    """A2A: one turn of the conversation of this ``contextId``; the model's text streams as it comes
    (``message/stream``), then the chat's answer: text, or the approval it waits for (decide it with
    ``{"approve": true|false, "approval_id", "payment_token"?}`` in the same context)."""
    service = _service()
    context_id = str(data.get("context_id") or uuid.uuid4().hex)
    person = current_person()  # the person the calling service acts for (its token's sub): the chat is theirs
    if person is None and get_settings().auth == "on":
        raise SkillFailure(
            ErrorCode.UNAUTHENTICATED,
            "the concierge talks for a person: call it with a service token naming them (sub, and act = the caller)",
        )
    chat_id = a2a_chat_id(context_id, person)
    if not await service.deps.chats.exists(chat_id):
        cap = get_settings().person_max_chats if person is not None else None  # the person's cap, over A2A too
        await service.deps.chats.create(chat_id, person, max_chats=cap)
    approve = data.get("approve")
    token = data.get("payment_token") if isinstance(data.get("payment_token"), str) else None
    if isinstance(approve, bool):
        request = ApprovalRequest.model_validate({"approve": approve, "payment_token": token})
        turn_id = await _decide_named(service, chat_id, data.get("approval_id"), request)
    else:
        body = MessageRequest.model_validate({"text": data.get("text"), "payment_token": token})
        turn_id, _ = await service.post_message(chat_id, body.text, body.payment_token, None)
    after = None
    if progress_wanted():
        events = await service.deps.feed.read(chat_id)
        after = events[-1]["id"] if events else None
    streaming = asyncio.create_task(_stream_tokens(service, chat_id, turn_id, after)) if progress_wanted() else None
    try:
        view = await service.view(chat_id, max(0.0, remaining_budget() - 0.2))
    finally:
        if streaming is not None:
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming
    return _skill_answer(chat_id, turn_id, view)


def _skill_answer(chat_id: str, turn_id: str, view: dict[str, Any]) -> dict[str, Any]:
    """What the skill answers: the turn's text, or the approval the chat waits for."""
    answer = next((m["content"] for m in reversed(view["messages"]) if m["role"] == "assistant"), None)
    return {
        "chat_id": chat_id,
        "turn_id": turn_id,
        "status": view["status"],
        "answer": answer if (view["last_turn"] or {}).get("outcome") == TurnOutcome.ANSWERED else None,
        "pending_approval": view["pending_approval"],
        "last_turn": view["last_turn"],
        "text": answer,
    }


async def _decide_named(service: ConciergeService, chat_id: str, approval_id: Any, request: ApprovalRequest) -> str:
    """A decision over A2A applies only to the approval it names: one that names none, or another than the pending
    one (a late "yes" to an earlier offer), decides nothing and is answered ``input-required`` with the pending
    approval, as the skill shows it. The turn it resumes."""
    view = await service.view(chat_id)  # reads only: no wait, no decision
    pending = view["pending_approval"] or {}
    turn_id = str((view["last_turn"] or {}).get("turn_id") or "")
    if pending and approval_id != pending.get("approval_id"):
        why = "the decision named no approval" if approval_id is None else f"approval {approval_id} is not pending"
        raise SkillInputRequired(_decide_this(pending, why), _skill_answer(chat_id, turn_id, view))
    if not isinstance(approval_id, str) or not re.fullmatch(APPROVAL_ID_PATTERN, approval_id):
        raise SkillFailure(
            ErrorCode.INVALID_REQUEST, "approval_id: a decision names the approval it decides (none is pending)"
        )
    try:
        await service.decide(chat_id, approval_id, request.approve, request.payment_token)
    except HTTPException as exc:
        if exc.status_code != 404:
            raise
        raise SkillFailure(ErrorCode.NOT_FOUND, f"no approval {approval_id} in this conversation") from None
    return turn_id


def _decide_this(approval: dict[str, Any], why: str) -> str:
    """The words of an ``input-required`` answer: why nothing was decided, and what to send for the pending one."""
    return (
        f"Nothing was decided: {why}. Approval {approval.get('approval_id')} ({approval.get('action', 'book')}) "
        f"waits: {approval.get('checkin')} to {approval.get('checkout')}, {approval.get('guests')} guest(s), "
        f"{approval.get('total_price')} {currency_code(approval.get('currency'))}, until {approval.get('expires_at')}; "
        f"{hotel_named(approval.get('hotel_id'), approval.get('hotel_name'))}. Decide it with "
        f'{{"approve": true|false, "approval_id": "{approval.get("approval_id")}"}}.'
    )


async def _stream_tokens(service: ConciergeService, chat_id: str, turn_id: str, after: str | None) -> None:
    async for entry in service.hub.follow(chat_id, after):
        if entry.get("kind") == ChatEventKind.TOKEN and entry.get("turn_id") == turn_id:
            await report_progress(
                {"text": entry.get("text", ""), "call": entry.get("call"), "fence": entry.get("fence")}
            )
        elif entry.get("kind") == ChatEventKind.MODEL_SWITCHED and entry.get("turn_id") == turn_id:
            # what this call streamed so far is not the answer: the next attempt's tokens replace it
            await report_progress(
                {"discard": {"call": entry.get("call"), "attempt": entry.get("attempt")}, "reason": entry.get("reason")}
            )
        elif entry.get("kind") in (ChatEventKind.TURN_FINISHED, ChatEventKind.APPROVAL_REQUESTED):
            return


mount_a2a(
    app,
    name=SERVICE,
    description="A concierge you talk to: it searches, books (after your approval) and cancels hotels.",
    url=get_settings().concierge_agent_url,
    skills=[
        Skill(
            id="concierge",
            name="Concierge",
            description="Talk about a stay in plain text; a booking waits for {approve, approval_id, payment_token?}.",
            handler=concierge_skill,
            tags=("hotels", "chat"),
            inputs=("text", "payment_token?", "approve?", "approval_id?"),
            text=True,
        )
    ],
    bulkhead="concierge_agent",
    streaming=True,
)
document_service_token(app, A2A_PATH)
