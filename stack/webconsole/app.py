"""The console's HTTP side: the page, one live overview stream, a booking's timeline, and the buttons' routes.

The browser only ever talks to the console (one origin, no CORS): the console reads the supervisor's state (under
``concierge up``) or probes the services' health routes (under compose), reads the recovery queue and DLQ from
Redis, and relays to booking-agent and the providers. While no booking-agent answers (killed, restarting), the
bookings list and a booking's timeline are read from Redis directly, so the page keeps telling the story of the
recovery that happens meanwhile. The admin token stays here; no route sends it to the page.
Every /api route needs a login (``stack.webconsole.sessions``): the operator's (a one-time link, the admin token)
relays with the admin token and is journaled; a person's relays with their own token, so the agents' 404s and
quotas are theirs, and the operator's routes answer 403.
Mutating routes take JSON only and refuse other origins, so a web page elsewhere cannot drive the stack through a
browser that has the console open; the origin they compare with is the request's ``Host``, which the shell's host
check has already made one of the console's own names (``docs/service-shell.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

import httpx
from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from sse_starlette import EventSourceResponse, ServerSentEvent

from domain.booking import MAX_NIGHTS, check_checkin
from identity.auth import admin_token, service_secret
from identity.people import PersonAuthError
from infra.bookings import BookingStore
from infra.clients import ProviderUnavailableError
from infra.error_table import answer_for, answer_response
from infra.journal import read_journal
from infra.service import STREAM_ID_PATTERN, create_service_app, error_body, get_redis
from infra.settings import Settings, get_settings
from recovery import DeadLetterQueue, RecoveryQueue
from stack.console import stack_paths
from stack.control import call, supervisor_running
from stack.errors import ConsoleForbiddenError, ConsoleRefusedError, StackError
from stack.login import LOGIN_PARAM, LoginTicketError
from stack.people import default_user, local_issuer
from stack.services import SERVICES
from stack.state import StackPaths, read_state
from stack.webconsole.chaos import ChaosRunner, add_chaos_routes
from stack.webconsole.demo import DemoRunner
from stack.webconsole.sessions import (
    SESSION_COOKIE,
    ConsoleGate,
    ConsoleUser,
    read_operator_journal,
    record_operator_action,
)

__all__ = ["FINAL_KINDS", "OVERVIEW_INTERVAL_S", "create_app"]

logger = logging.getLogger(__name__)

STATIC = FilePath(__file__).parent / "static"
OVERVIEW_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 1.0
RELAY_TIMEOUT_S = 10.0
RECONNECT_DELAY_S = 0.3
KEEPALIVE_S = 5.0
BOOKINGS_SHOWN = 25
FINAL_KINDS = frozenset({"confirmed", "failed", "cancelled"})
"""Journal kinds after which a booking's timeline has nothing more to say."""
PROVIDERS = ("hotel-api", "payment-api", "llm-api")
Provider = Literal["hotel-api", "payment-api", "llm-api"]
CONSOLE_HEADER = "X-Concierge-Console"
"""Sent by the page with every mutating request: a custom header makes a cross-origin browser request preflighted,
and the console answers no preflight."""
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BookingId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
ChatId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
ApprovalId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
MAX_CHAT_TEXT = 8 * 1024
"""concierge-agent's own bound on a message (bytes of UTF-8)."""
PAYMENT_TOKEN_PATTERN = r"^tok_[A-Za-z0-9_]+$"
CHATS_SHOWN = 25
MAX_CHAT_WAIT_S = 30.0
"""A journal entry id as booking-agent takes it in ``Last-Event-ID`` (``<ms>-<seq>``, or ``<ms>`` alone)."""
_OPEN_API = frozenset({"/api/login"})
"""The one /api route that answers without a login: logging in with a pasted token."""
_NO_STORE = {"Cache-Control": "no-store"}


# ----------------------------------------------------------------------------------------------------- who


async def _user(request: Request) -> ConsoleUser:
    """Async, as every dependency here: a sync one would run on FastAPI's thread pool for no reason."""
    user: ConsoleUser = request.state.user  # the middleware's: every /api route but the login has one
    return user


async def _operator(request: Request) -> ConsoleUser:
    user = await _user(request)
    if not user.operator:
        raise ConsoleForbiddenError(
            "the operator's only: log in with the link `concierge console-url` prints, or the admin token"
        )
    return user


User = Annotated[ConsoleUser, Depends(_user)]
"""Who is logged in: a person (their bookings and chats) or the operator."""
Operator = Annotated[ConsoleUser, Depends(_operator)]
"""The operator, else 403 ``forbidden``: faults, kill/stop/start, chaos, the demo, the operator journal."""


# ----------------------------------------------------------------------------------------------------- inputs


class LoginForm(BaseModel):
    """The login page's pasted token: a person's JWT or the admin token."""

    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=8192)


class BookForm(BaseModel):
    """The page's booking form; turned into booking-agent's POST /bookings body."""

    model_config = ConfigDict(extra="forbid")

    city: str = Field(min_length=1, max_length=64)
    checkin: date
    nights: int = Field(default=1, ge=1, le=MAX_NIGHTS)
    guests: int = Field(default=2, ge=1, le=10)
    card: str = Field(default="tok_visa", min_length=1, max_length=64, pattern=r"^tok_[A-Za-z0-9_]+$")

    @field_validator("checkin")
    @classmethod
    def _bookable(cls, value: date) -> date:
        return check_checkin(value, date.today())

    def body(self) -> dict[str, Any]:
        return {
            "city": self.city,
            "checkin": self.checkin.isoformat(),
            "checkout": (self.checkin + timedelta(days=self.nights)).isoformat(),
            "guests": self.guests,
            "payment_token": self.card,
        }


class ChatMessageForm(BaseModel):
    """The chat panel's message: concierge-agent's ``POST /chats/{id}/messages`` body, checked here first."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_CHAT_TEXT)
    payment_token: str | None = Field(default=None, max_length=64, pattern=PAYMENT_TOKEN_PATTERN)

    @field_validator("text")
    @classmethod
    def _said_something(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the message is empty")
        if len(value.encode()) > MAX_CHAT_TEXT:
            raise ValueError(f"at most {MAX_CHAT_TEXT} bytes")
        return value


class ApprovalForm(BaseModel):
    """The approve / refuse buttons: concierge-agent's approval body (a strict boolean: "yes" is not one)."""

    model_config = ConfigDict(extra="forbid")

    approve: StrictBool
    payment_token: str | None = Field(default=None, max_length=64, pattern=PAYMENT_TOKEN_PATTERN)


class FaultForm(BaseModel):
    """What the page may inject into a provider: the providers' own fault body, bounded the way ``concierge fault``
    bounds it."""

    model_config = ConfigDict(extra="forbid")

    latency_s: float = Field(default=0.0, ge=0, le=300, allow_inf_nan=False)
    error_rate: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    hang: bool = False

    def body(self, provider: str) -> dict[str, Any]:
        """The provider's PUT body; llm-api's for every model (its latency is the latency to the first token)."""
        if provider == "llm-api":
            return {"first_token_latency_s": self.latency_s, "error_rate": self.error_rate, "hang": self.hang}
        return self.model_dump()


# ----------------------------------------------------------------------------------------------------- the stack


@dataclass(frozen=True)
class Target:
    """One process to watch: from the supervisor's state, or the settings' URL of a service."""

    name: str
    service: str
    url: str
    ready_path: str
    state: str | None = None
    pid: int | None = None
    restarts: int | None = None
    started_at: float | None = None


class DemoForm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: Literal["on", "off"] = "on"


def _settings_urls(settings: Settings) -> dict[str, str]:
    return {
        "hotel-api": settings.hotel_api_url,
        "payment-api": settings.payment_api_url,
        "llm-api": settings.llm_api_url,
        "search-agent": settings.search_agent_url,
        "payment-agent": settings.payment_agent_url,
        "booking-agent": settings.booking_agent_url,
        "recovery-worker": settings.recovery_worker_url,
        "concierge-agent": settings.concierge_agent_url,
    }


def watched_targets(paths: StackPaths, settings: Settings) -> tuple[bool, list[Target]]:
    """``(supervised, targets)``: the supervisor's instances under ``concierge up``, else the settings' URLs."""
    state = read_state(paths) if supervisor_running(paths) else None
    if state is not None:
        return True, [
            Target(i.name, i.service, i.url, i.ready_path, i.status, i.pid, i.restarts, i.started_at)
            for i in state.instances
            if i.service != "console"
        ]
    urls = _settings_urls(settings)
    return False, [
        Target(name, name, urls[name].rstrip("/"), SERVICES[name].ready_path) for name in SERVICES if name in urls
    ]


class Watcher:
    """Builds the overview the page shows; one build a second at most, however many pages watch."""

    def __init__(self, http: httpx.AsyncClient, paths: StackPaths) -> None:
        self.http = http
        self.paths = paths
        self._lock = asyncio.Lock()
        self._latest: dict[str, Any] | None = None
        self._built_at = 0.0

    async def targets(self) -> tuple[bool, list[Target]]:
        return await asyncio.to_thread(watched_targets, self.paths, get_settings())

    async def booking_agents(self) -> list[str]:
        return await self.replicas("booking-agent")

    async def concierge_agents(self) -> list[str]:
        return await self.replicas("concierge-agent")

    async def replicas(self, service: str) -> list[str]:
        _, targets = await self.targets()
        return [t.url for t in targets if t.service == service]

    async def provider(self, name: str) -> str | None:
        _, targets = await self.targets()
        return next((t.url for t in targets if t.service == name), None)

    async def overview(self, redis: Any) -> dict[str, Any]:
        async with self._lock:
            if self._latest is None or time.monotonic() - self._built_at >= OVERVIEW_INTERVAL_S * 0.8:
                self._latest = await self._build(redis)
                self._built_at = time.monotonic()
            return self._latest

    async def overview_for(self, redis: Any, user: ConsoleUser) -> dict[str, Any]:
        """The operator's overview; a person's has the stack's health and their own bookings only (faults, the
        recovery queue and the DLQ are the operator's)."""
        shared = await self.overview(redis)
        if user.operator:
            return shared
        mine = await self._bookings(redis, await self.booking_agents(), user)
        hidden: dict[str, Any] = {
            "faults": dict.fromkeys(PROVIDERS),
            "queue": None,
            "dlq": [],
            "queue_error": "the operator's",
        }
        return {**shared, **hidden, **mine}

    async def _build(self, redis: Any) -> dict[str, Any]:
        supervised, targets = await self.targets()
        probes = await asyncio.gather(*(self._probe(t) for t in targets))
        faults, queue, bookings = await asyncio.gather(
            self._faults(targets),
            self._queue(redis),
            self._bookings(redis, [t.url for t in targets if t.service == "booking-agent"]),
        )
        services, circuits, bulkheads = [], [], []
        for target, (ready, detail, circuit_stats, bulkhead_stats) in zip(targets, probes, strict=True):
            services.append(
                {
                    "name": target.name,
                    "service": target.service,
                    "url": target.url,
                    "state": target.state or ("running" if ready is not None else "unreachable"),
                    "pid": target.pid,
                    "restarts": target.restarts,
                    "uptime_s": round(time.time() - target.started_at, 1) if target.started_at else None,
                    "ready": ready,
                    "detail": detail,
                }
            )
            circuits += [{"instance": target.name, "name": n, **s} for n, s in sorted(circuit_stats.items())]
            bulkheads += [{"instance": target.name, "name": n, **s} for n, s in sorted(bulkhead_stats.items())]
        return {
            "at": datetime.now(UTC).isoformat(),
            "supervised": supervised,
            "services": services,
            "circuits": circuits,
            "bulkheads": bulkheads,
            "faults": faults,
            **queue,
            **bookings,
        }

    async def _get_json(self, url: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.http.get(url, timeout=PROBE_TIMEOUT_S, **kwargs)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, None

    async def _probe(self, target: Target) -> tuple[bool | None, str | None, dict[str, Any], dict[str, Any]]:
        """``(ready, why not, circuits, bulkheads)``; ``ready`` is None when the process does not answer at all."""
        if target.state is not None and target.pid is None:
            return None, None, {}, {}  # stopped or between restarts: nothing to ask

        async def part(path: str) -> tuple[int, Any] | None:
            try:
                return await self._get_json(f"{target.url}{path}")
            except httpx.HTTPError:
                return None

        ready, circuits, bulkheads = await asyncio.gather(
            part(target.ready_path), part("/health/circuits"), part("/health/bulkheads")
        )
        if ready is None:
            return None, "no answer", {}, {}
        status, body = ready
        failing = body.get("failing") if isinstance(body, dict) else None
        detail = None if status == 200 else ", ".join(failing or []) or f"HTTP {status}"
        return (
            status == 200,
            detail,
            circuits[1] if circuits and isinstance(circuits[1], dict) else {},
            bulkheads[1] if bulkheads and isinstance(bulkheads[1], dict) else {},
        )

    async def _faults(self, targets: list[Target]) -> dict[str, Any]:
        token = admin_token(get_settings())
        found: dict[str, Any] = {}
        for name in PROVIDERS:
            url = next((t.url for t in targets if t.service == name), None)
            if url is None or token is None:
                found[name] = None
                continue
            try:
                status, body = await self._get_json(f"{url}/admin/faults", headers={"Authorization": f"Bearer {token}"})
            except httpx.HTTPError:
                status, body = 0, None
            found[name] = body if status == 200 else None
        return found

    async def _queue(self, redis: Any) -> dict[str, Any]:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S * 2):
                dlq = DeadLetterQueue(redis)
                stats = await RecoveryQueue(redis, dlq).stats()
                entries = await dlq.list()
        except Exception as exc:  # Redis down: say so on the page, keep streaming the rest
            return {"queue": None, "dlq": [], "queue_error": f"{type(exc).__name__}: {exc}"}
        dead = [
            {"thread_id": e.thread_id, "reason": e.reason, "error": e.error, "attempts": e.attempts} for e in entries
        ]
        return {"queue": stats, "dlq": dead[:BOOKINGS_SHOWN], "queue_error": None}

    async def _bookings(self, redis: Any, urls: list[str], user: ConsoleUser | None = None) -> dict[str, Any]:
        """Everyone's (the admin token), or ``user``'s own (their token; from Redis, their index)."""
        last = "no booking-agent"
        headers = user.relay() if user is not None else None
        for url in urls:
            try:
                status, body = await self._get_json(
                    f"{url}/bookings", params={"limit": BOOKINGS_SHOWN}, headers=headers
                )
            except httpx.HTTPError as exc:
                last = f"booking-agent unreachable ({type(exc).__name__})"
                continue
            if status == 200 and isinstance(body, dict):
                return {"bookings": body.get("bookings", []), "bookings_error": None}
            last = f"booking-agent answered HTTP {status}"
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S * 2):
                found, _ = await BookingStore(redis).page(
                    status=None,
                    limit=BOOKINGS_SHOWN,
                    cursor=None,
                    owner=None if user is None else user.who,
                    everyone=user is None or user.operator,
                )
        except Exception as exc:  # Redis down too: say both
            return {"bookings": None, "bookings_error": f"{last}; Redis: {type(exc).__name__}"}
        return {"bookings": found, "bookings_error": f"{last}: read from Redis"}


# ----------------------------------------------------------------------------------------------------- relays


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(error_body(code, message), status_code=status)


def _field_error(where: str, name: str, message: str) -> HTTPException:
    """FastAPI's own 422 shape (``detail[].loc`` names the field), for a check a type annotation cannot make."""
    return HTTPException(status_code=422, detail=[{"loc": [where, name], "msg": message, "type": "value_error"}])


def _relayed(response: httpx.Response) -> Response:
    """booking-agent's or a provider's answer, passed on as it is (status, JSON body, ``Retry-After``)."""
    headers = {"Retry-After": response.headers["Retry-After"]} if "Retry-After" in response.headers else None
    return Response(response.content, status_code=response.status_code, media_type="application/json", headers=headers)


async def _to_booking_agent(
    watcher: Watcher, send: Callable[[httpx.AsyncClient, str], Awaitable[httpx.Response]]
) -> Response:
    return await _to_replicas(watcher, "booking-agent", send)


async def _to_replicas(
    watcher: Watcher, service: str, send: Callable[[httpx.AsyncClient, str], Awaitable[httpx.Response]]
) -> Response:
    """Try each replica of ``service`` in turn; a replica that is down (killed, restarting) is skipped."""
    last = f"no {service} in the stack"
    for url in await watcher.replicas(service):
        try:
            return _relayed(await send(watcher.http, url))
        except httpx.HTTPError as exc:
            last = f"{service} at {url} unreachable ({type(exc).__name__})"
    raise ProviderUnavailableError(last, provider=service)


def _sse_event(lines: list[str]) -> tuple[str | None, str | None, str]:
    """One upstream event's ``(id, event, data)`` from its lines (the SSE field rules; comments dropped)."""
    event_id: str | None = None
    event: str | None = None
    data: list[str] = []
    for line in lines:
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            event_id = value
        elif name == "event":
            event = value
        elif name == "data":
            data.append(value)
    return event_id, event, "\n".join(data)


class _UnknownStream(Exception):
    """The replica answered 404: there is no such journal to follow."""


class _Refused(Exception):
    """The replica refused the stream with a 429 (the person's ``PERSON_MAX_STREAMS``): relayed as it is."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


async def _replica_entries(
    http: httpx.AsyncClient, urls: list[str], path: str, last_id: str | None, auth: dict[str, str]
) -> AsyncGenerator[tuple[str | None, str], None]:
    """One pass over the replicas: the entries ``(id, data)`` of the SSE at ``path`` after ``last_id``, moving on
    from ``Last-Event-ID`` to the next replica when one goes away mid-stream (killed, restarting); first
    ``(None, "")`` once a replica has answered 200. A 404 raises ``_UnknownStream``, a 429 ``_Refused``. Returns once
    no replica serves the stream any more. ``auth``: a person's own ``Authorization`` (empty: the operator's)."""
    for url in urls:
        headers = {"Accept": "text/event-stream", **auth}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        try:
            async with http.stream(
                "GET", f"{url}{path}", headers=headers, timeout=httpx.Timeout(10, read=None)
            ) as response:
                if response.status_code == 404:
                    raise _UnknownStream(path)
                if response.status_code == 429:
                    await response.aread()
                    raise _Refused(_relayed(response))
                if response.status_code != 200:
                    continue
                yield None, ""
                lines: list[str] = []
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
                        continue
                    event_id, _, data = _sse_event(lines)
                    lines = []
                    if data:
                        last_id = event_id or last_id
                        yield event_id, data
        except httpx.HTTPError:
            continue  # the replica went away mid-stream: the next one, or this one again once it is back


async def follow_timeline(
    http: httpx.AsyncClient,
    redis: Any,
    agents: Callable[[], Awaitable[list[str]]],
    booking_id: str,
    last_id: str | None,
    user: ConsoleUser,
) -> AsyncGenerator[ServerSentEvent, None]:
    """A booking's journal from booking-agent's SSE, as one unbroken stream for the page: when booking-agent goes
    away mid-stream, reconnect with ``Last-Event-ID``, and meanwhile read what the others write (the recovery
    worker's resume...) from the journal in Redis, until the final entry. A person reads only their own booking's
    (booking-agent's 404 for another's; in Redis, its owner checked)."""
    end = ServerSentEvent(data=json.dumps({"booking_id": booking_id}), event="end")
    unknown = ServerSentEvent(data=json.dumps({"booking_id": booking_id}), event="unknown")
    owner_checked = user.operator
    while True:
        entries = _replica_entries(http, await agents(), f"/bookings/{booking_id}/events", last_id, user.relay())
        try:
            async with contextlib.aclosing(entries):
                async for event_id, data in entries:
                    if not data:
                        yield ServerSentEvent(comment="following")
                        continue
                    last_id = event_id or last_id
                    yield ServerSentEvent(data=data, id=event_id)
                    if _is_final(data):
                        yield end
                        return
        except _UnknownStream:
            yield unknown
            return
        # no booking-agent answers: what was written meanwhile, straight from the journal (a person's own only)
        if not owner_checked:
            try:
                async with asyncio.timeout(PROBE_TIMEOUT_S * 2):
                    _, owner = await BookingStore(redis).owner(booking_id)
            except Exception:  # Redis down too: keep trying booking-agent
                owner = None
            else:
                if owner != user.who:
                    yield unknown
                    return
                owner_checked = True
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S * 2):
                journal = await read_journal(redis, booking_id, after=last_id, count=100)
        except Exception:  # Redis down too: keep trying both
            journal = []
        for entry in journal:
            last_id = str(entry["id"])
            data = json.dumps(entry, separators=(",", ":"))
            yield ServerSentEvent(data=data, id=last_id)
            if _is_final(data):
                yield end
                return
        if not journal:
            yield ServerSentEvent(comment="no booking-agent answers; following the journal in Redis")
        await asyncio.sleep(RECONNECT_DELAY_S)


async def follow_chat(
    http: httpx.AsyncClient,
    agents: Callable[[], Awaitable[list[str]]],
    chat_id: str,
    last_id: str | None,
    user: ConsoleUser,
) -> AsyncGenerator[ServerSentEvent, None]:
    """A chat's journal from concierge-agent's SSE as one unbroken stream for the page, for as long as the page
    reads: a replica that goes away mid-turn is replaced by the next one from ``Last-Event-ID``, so the page sees
    the peer's resume without a gap or a repeat."""
    while True:
        entries = _replica_entries(http, await agents(), f"/chats/{chat_id}/events", last_id, user.relay())
        try:
            async with contextlib.aclosing(entries):
                async for event_id, data in entries:
                    if not data:
                        yield ServerSentEvent(comment="following")
                        continue
                    last_id = event_id or last_id
                    yield ServerSentEvent(data=data, id=event_id)
        except _UnknownStream:
            yield ServerSentEvent(data=json.dumps({"chat_id": chat_id}), event="unknown")
            return
        yield ServerSentEvent(comment="no concierge-agent answers; trying again")
        await asyncio.sleep(RECONNECT_DELAY_S)


async def _stream_unless_refused(events: AsyncGenerator[ServerSentEvent, None]) -> Response:
    """The relayed stream, or the replica's 429 as the answer itself (before any 200: the page sees the person's
    stream cap as it would at booking-agent); a refusal on a later reconnect ends the stream with ``refused``."""
    try:
        first = await anext(events)
    except _Refused as exc:
        await events.aclose()
        return exc.response
    except StopAsyncIteration:
        first = None

    async def relayed() -> AsyncIterator[ServerSentEvent]:
        if first is None:
            return
        yield first
        try:
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
        except _Refused as exc:
            yield ServerSentEvent(data=bytes(exc.response.body).decode(), event="refused")

    return EventSourceResponse(relayed(), ping=KEEPALIVE_S, send_timeout=10)


def _is_final(data: str) -> bool:
    try:
        entry = json.loads(data)
    except ValueError:
        return False
    return isinstance(entry, dict) and entry.get("kind") in FINAL_KINDS


# ----------------------------------------------------------------------------------------------------- the app


def create_app(paths: StackPaths | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the console relays with the admin token for the operator, and with a person's own token for them; what the
        # operator books and says, it does as the local user (`me`, or $CONCIERGE_USER) when the machine has its issuer
        settings = get_settings()
        app.state.issuer = local_issuer()
        token = admin_token(get_settings())
        app.state.gate = ConsoleGate.from_settings(settings, service_secret(settings), token)
        operator = {"Authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(timeout=RELAY_TIMEOUT_S, headers=operator) as http:
            app.state.watcher = Watcher(http, paths or stack_paths())
            app.state.chaos = ChaosRunner()
            app.state.demo = DemoRunner()
            try:
                yield
            finally:
                try:
                    await app.state.demo.aclose()
                finally:
                    await app.state.chaos.close()

    app = create_service_app(
        "console",
        lifespan=lifespan,
        description="The concierge web console: the stack live, and buttons to drive it. Every /api route needs a "
        "login: the session cookie of a one-time link (`concierge console-url`) or a pasted token, or a bearer.",
    )

    def gate_of(request: Request) -> ConsoleGate:
        gate: ConsoleGate = request.app.state.gate
        return gate

    @app.middleware("http")
    async def logged_in_and_same_origin(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        path = request.url.path
        if not path.startswith("/api/"):
            return await call_next(request)
        user: ConsoleUser | None = None
        if path not in _OPEN_API:
            try:
                user = await gate_of(request).user(
                    await get_redis(request), request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE)
                )
            except Exception as exc:  # no login (401), a token refused (401), Redis down (503): nothing done
                return _answer(exc)
            request.state.user = user
        if request.method not in _SAFE_METHODS:
            origin = request.headers.get("origin")
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            if request.headers.get(CONSOLE_HEADER) != "1" or (origin is not None and origin != own):
                return _error(403, "forbidden", f"{CONSOLE_HEADER}: the console's buttons are for its own page only")
        response = await call_next(request)
        if user is not None and user.operator and request.method not in _SAFE_METHODS:
            route = request.scope.get("route")
            params = {k: v for k, v in (request.scope.get("path_params") or {}).items() if isinstance(v, str)}
            await record_operator_action(
                await get_redis(request),
                user,
                getattr(route, "name", None) or path,
                method=request.method,
                path=path,
                status=response.status_code,
                **params,
            )
        return response

    def watcher_of(request: Request) -> Watcher:
        watcher: Watcher = request.app.state.watcher
        return watcher

    def login_page(why: str | None, status_code: int = 200) -> HTMLResponse:
        text = (STATIC / "login.html").read_text(encoding="utf-8")
        if why:
            text = text.replace("<!--why-->", html.escape(why))
        return HTMLResponse(text, status_code=status_code, headers=_NO_STORE)

    @app.get("/", include_in_schema=False, response_model=None)
    async def page(
        request: Request, login: Annotated[str | None, Query(alias=LOGIN_PARAM, max_length=200)] = None
    ) -> Response:
        """The console for whoever is logged in, else the login page; ``?login=`` opens a session (once) and
        comes back here without it in the address."""
        gate, redis = gate_of(request), await get_redis(request)
        if login is not None:
            try:
                cookie, ttl = await gate.open_login(redis, login)
            except LoginTicketError as exc:
                return login_page(f"{exc}. Run `concierge console-url` for a new link, or paste a token.", 401)
            user = await gate.user(redis, None, cookie)
            await record_operator_action(redis, user, "login", method="GET", path="/", status=303)
            redirect = RedirectResponse("/", status_code=303, headers=_NO_STORE)
            _set_session(redirect, request, cookie, ttl)
            return redirect
        try:
            await gate.user(redis, request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE))
        except PersonAuthError:
            return login_page(None)
        return FileResponse(STATIC / "index.html", media_type="text/html", headers=_NO_STORE)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # ------------------------------------------------------------------- who is logged in

    @app.post("/api/login", tags=["console"])
    async def log_in(request: Request, form: LoginForm) -> Response:
        """A session for a pasted token: a person's (their bookings and chats) or the admin token (the operator)."""
        gate, redis = gate_of(request), await get_redis(request)
        user = await gate.bearer(f"Bearer {form.token}")
        cookie = await gate.open_session(redis, user)
        session = await gate.user(redis, None, cookie)
        if user.operator:
            await record_operator_action(redis, session, "login", method="POST", path="/api/login", status=200)
        answer = JSONResponse(user.public(), headers=_NO_STORE)
        _set_session(answer, request, cookie, gate.session_ttl_s)
        return answer

    @app.post("/api/logout", tags=["console"])
    async def log_out(request: Request) -> Response:
        cookie = request.cookies.get(SESSION_COOKIE)
        if cookie:
            await gate_of(request).close_session(await get_redis(request), cookie)
        answer = JSONResponse({"logged_out": True})
        answer.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return answer

    @app.get("/api/session", tags=["console"])
    async def session(user: User) -> dict[str, Any]:
        """Who the page is for: the person's name, or the operator."""
        return user.public()

    @app.get("/api/operator-journal", tags=["console"])
    async def operator_journal(
        request: Request,
        _: Operator,
        after: Annotated[str | None, Query(pattern=STREAM_ID_PATTERN)] = None,
        count: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        """Every operator action (who, how logged in, what, the answer), oldest first after ``after``."""
        return {"entries": await read_operator_journal(await get_redis(request), after=after, count=count)}

    # ------------------------------------------------------------------- the overview and the bookings

    @app.get("/api/overview", tags=["console"])
    async def overview(request: Request, user: User) -> dict[str, Any]:
        return await watcher_of(request).overview_for(await get_redis(request), user)

    @app.get("/api/stream", tags=["console"], response_class=EventSourceResponse)
    async def stream(request: Request, user: User) -> EventSourceResponse:
        watcher = watcher_of(request)
        redis = await get_redis(request)

        stopping = request.app.state.stopping

        async def events() -> AsyncIterator[ServerSentEvent]:
            # ends the moment the console is told to stop: the page reconnects to the restarted one
            while not stopping.is_set():
                yield ServerSentEvent(data=json.dumps(await watcher.overview_for(redis, user)), event="overview")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(OVERVIEW_INTERVAL_S):
                        await stopping.wait()

        # send_timeout: a page that stops reading is dropped instead of piling up snapshots here
        return EventSourceResponse(events(), ping=KEEPALIVE_S, send_timeout=10)

    @app.get("/api/bookings/{booking_id}/events", tags=["console"], response_class=EventSourceResponse)
    async def timeline(
        request: Request,
        user: User,
        booking_id: BookingId,
        last_id: Annotated[str | None, Header(alias="Last-Event-ID", pattern=STREAM_ID_PATTERN)] = None,
    ) -> Response:
        watcher = watcher_of(request)
        redis = await get_redis(request)
        return await _stream_unless_refused(
            follow_timeline(watcher.http, redis, watcher.booking_agents, booking_id, last_id, user)
        )

    def acting(request: Request, user: ConsoleUser, headers: dict[str, str] | None = None) -> dict[str, str]:
        """A person acts with their own token; the operator books and converses as the local user."""
        return user.relay(headers) if not user.operator else as_person(request, headers)

    @app.post("/api/bookings", tags=["console"])
    async def book(request: Request, user: User, form: BookForm) -> Response:
        body = form.body()
        key = f"console-{uuid.uuid4().hex}"  # the same key on every replica tried: one booking however it goes
        headers = acting(request, user, {"Idempotency-Key": key})

        async def send(http: httpx.AsyncClient, url: str) -> httpx.Response:
            return await http.post(f"{url}/bookings", json=body, headers=headers)

        return await _to_booking_agent(watcher_of(request), send)

    @app.post("/api/bookings/{booking_id}/cancel", tags=["console"])
    async def cancel(request: Request, user: User, booking_id: BookingId) -> Response:
        async def send(http: httpx.AsyncClient, url: str) -> httpx.Response:
            return await http.post(f"{url}/bookings/{booking_id}/cancel", headers=user.relay())

        return await _to_booking_agent(watcher_of(request), send)

    # ------------------------------------------------------------------- the chat panel: concierge-agent, relayed

    def as_person(request: Request, headers: dict[str, str] | None = None) -> dict[str, str]:
        """``headers`` with the local user's token (none without a local issuer: the operator's then acts)."""
        issuer = request.app.state.issuer
        if issuer is None:
            return dict(headers or {})
        return {**(headers or {}), "Authorization": f"Bearer {issuer.mint(default_user(), ttl_s=300)}"}

    async def to_concierge(request: Request, method: str, path: str, **kwargs: Any) -> Response:
        async def send(http: httpx.AsyncClient, url: str) -> httpx.Response:
            return await http.request(method, f"{url}{path}", **kwargs)

        return await _to_replicas(watcher_of(request), "concierge-agent", send)

    @app.get("/api/chats", tags=["console"])
    async def chats(request: Request, user: User) -> Response:
        return await to_concierge(request, "GET", "/chats", params={"limit": CHATS_SHOWN}, headers=user.relay())

    @app.post("/api/chats", tags=["console"])
    async def new_chat(request: Request, user: User) -> Response:
        headers = acting(request, user, {"Idempotency-Key": f"console-{uuid.uuid4().hex}"})
        return await to_concierge(request, "POST", "/chats", headers=headers)

    @app.get("/api/chats/{chat_id}", tags=["console"])
    async def chat(
        request: Request, user: User, chat_id: ChatId, wait: Annotated[float, Query(ge=0, le=MAX_CHAT_WAIT_S)] = 0.0
    ) -> Response:
        """The chat; with ``wait``, once its turn is not ``running`` (the panel enables an approval's buttons then)."""
        params = {"wait": wait} if wait else None
        return await to_concierge(
            request, "GET", f"/chats/{chat_id}", params=params, timeout=RELAY_TIMEOUT_S + wait, headers=user.relay()
        )

    @app.post("/api/chats/{chat_id}/messages", tags=["console"])
    async def say(request: Request, user: User, chat_id: ChatId, form: ChatMessageForm) -> Response:
        # one key for every replica tried: a POST whose answer was lost is the same turn, not a second one
        key = f"console-{uuid.uuid4().hex}"
        body = form.model_dump(exclude_none=True)
        return await to_concierge(
            request,
            "POST",
            f"/chats/{chat_id}/messages",
            json=body,
            headers=acting(request, user, {"Idempotency-Key": key}),
        )

    @app.post("/api/chats/{chat_id}/approvals/{approval_id}", tags=["console"])
    async def decide(
        request: Request, user: User, chat_id: ChatId, approval_id: ApprovalId, form: ApprovalForm
    ) -> Response:
        body = form.model_dump(exclude_none=True)
        path = f"/chats/{chat_id}/approvals/{approval_id}"
        return await to_concierge(request, "POST", path, json=body, headers=acting(request, user))

    @app.get("/api/chats/{chat_id}/events", tags=["console"], response_class=EventSourceResponse)
    async def chat_events(
        request: Request,
        user: User,
        chat_id: ChatId,
        last_id: Annotated[str | None, Header(alias="Last-Event-ID", pattern=STREAM_ID_PATTERN)] = None,
    ) -> Response:
        watcher = watcher_of(request)
        return await _stream_unless_refused(follow_chat(watcher.http, watcher.concierge_agents, chat_id, last_id, user))

    # ------------------------------------------------------------------- the operator's: faults, demo, services

    @app.put("/api/faults/{provider}", tags=["console"])
    async def inject(request: Request, _: Operator, provider: Provider, form: FaultForm) -> Response:
        return await _admin_faults(watcher_of(request), provider, "PUT", form.body(provider))

    @app.delete("/api/faults/{provider}", tags=["console"])
    async def clear(request: Request, _: Operator, provider: Provider) -> Response:
        return await _admin_faults(watcher_of(request), provider, "DELETE", None)

    @app.post("/api/demo/cascade", tags=["console"], status_code=202)
    async def start_demo(request: Request, _: Operator, form: DemoForm) -> dict[str, Any]:
        """``concierge demo cascade`` for the page; refused while one runs. Its lines: ``GET /api/demo/stream``."""
        runner: DemoRunner = request.app.state.demo
        if runner.running:
            raise ConsoleRefusedError("a cascade demo is running already; stop it first")
        state = await runner.start(form.layers)
        return {"running": True, "layers": state.layers}

    @app.delete("/api/demo", tags=["console"])
    async def stop_demo(request: Request, _: Operator) -> dict[str, Any]:
        runner: DemoRunner = request.app.state.demo
        await runner.stop()
        current = runner.current
        return {"running": False, "exit_code": None if current is None else current.exit_code}

    @app.get("/api/demo/stream", tags=["console"], response_class=EventSourceResponse)
    async def demo_stream(request: Request, _: Operator) -> EventSourceResponse:
        """The demo's narration, one event per line (from its first), then ``end`` with its exit code."""
        runner: DemoRunner = request.app.state.demo
        state = runner.current

        async def events() -> AsyncIterator[ServerSentEvent]:
            if state is None:
                yield ServerSentEvent(data=json.dumps({"exit_code": None}), event="end")
                return
            async for line in runner.follow(state):
                yield ServerSentEvent(data=line)
            yield ServerSentEvent(data=json.dumps({"exit_code": state.exit_code}), event="end")

        return EventSourceResponse(events(), ping=KEEPALIVE_S)

    @app.post("/api/services/{target}/{op}", tags=["console"])
    async def control(request: Request, _: Operator, target: str, op: Literal["kill", "stop", "start"]) -> Response:
        service = target.partition(":")[0]
        if service not in SERVICES:
            raise _field_error("path", "target", f"unknown service {service!r}; valid names: {', '.join(SERVICES)}")
        if service == "console":
            raise _field_error("path", "target", "the console does not stop itself; use `concierge stop console`")
        watcher = watcher_of(request)
        if not supervisor_running(watcher.paths):
            raise ConsoleForbiddenError("no supervisor: kill/stop/start work under `concierge up` only")
        try:
            answer = await call(watcher.paths, op, target=target, answer_within_s=120)
        except StackError as exc:  # the supervisor's own one line: an unknown replica, a stack still starting...
            raise ConsoleRefusedError(str(exc)) from exc
        answer.pop("ok", None)
        return JSONResponse(answer)

    add_chaos_routes(app, dependencies=[Depends(_operator)])
    return app


def _set_session(response: Response, request: Request, cookie: str, ttl_s: float) -> None:
    """The session cookie: HttpOnly (no script reads it), SameSite=Strict (no other site's request carries it)."""
    response.set_cookie(
        SESSION_COOKIE,
        cookie,
        max_age=max(1, int(ttl_s)),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def _answer(exc: BaseException) -> JSONResponse:
    """The error table's answer, for what the middleware refuses before any route runs."""
    status, body, headers = answer_response(answer_for(exc))
    return JSONResponse(body, status_code=status, headers=headers)


async def _admin_faults(watcher: Watcher, provider: str, method: str, body: dict[str, Any] | None) -> Response:
    token = admin_token(get_settings())
    if token is None:
        raise ConsoleForbiddenError("CONCIERGE_ADMIN_TOKEN is not set: the providers' fault routes are off")
    url = await watcher.provider(provider)
    if url is None:
        raise ConsoleRefusedError(f"{provider} is not part of the running stack")
    try:
        response = await watcher.http.request(
            method, f"{url}/admin/faults", json=body, headers={"Authorization": f"Bearer {token}"}
        )
    except httpx.HTTPError as exc:
        raise ProviderUnavailableError(f"{provider} unreachable ({type(exc).__name__})", provider=provider) from exc
    if response.status_code == 204:
        return Response(status_code=204)
    return _relayed(response)


app = create_app()
