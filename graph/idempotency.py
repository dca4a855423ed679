"""``idempotent_node``: at most one stored result per node, run and input, shared through Redis; and the fence.

Compose with tracing as::

    @traced_node("reserve")
    @idempotent_node(create_redis, "reserve", key_fields=["booking_id", "hotel_id"])
    async def reserve(state: BookingState, config: RunnableConfig) -> dict[str, Any]:
        ...  # send idempotency_key() as the provider's Idempotency-Key

Idempotency record (one Redis hash per node, thread and ``key_fields`` digest, so every script touches one key and
one Redis Cluster slot)::

    (absent)                          nobody ran it, or the owner failed and released, or its lease lapsed
    status=claimed owner=<token>      an owner is running the body; the key's TTL is the owner's lease
    status=done    result=<json>      finished; kept for IDEMPOTENCY_TTL_S

Lost claim (our lease lapsed while the body ran, e.g. the process was paused): on completion we never overwrite
another owner. If the other owner already finished, its stored result is returned (first stored result wins, every
caller sees the same answer; the provider deduplicated both attempts through the shared ``Idempotency-Key``). If it
is still running, ``ClaimLostError`` is raised and nothing is stored. If nobody took over, there is no other result
to protect, so ours is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import hashlib
import json
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from opentelemetry import trace
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from domain.booking import JournalKind
from graph.contract import F, NodeFn, check_node, thread_id_of
from graph.errors import ClaimLostError, IdempotencyStoreError, MissingThreadIdError, NodeResultError
from infra.journal import note
from infra.metrics import count_duplicate_prevented
from infra.redis import RedisClient, RedisScript, key, text
from infra.settings import get_settings
from process.tasks import stop_task
from resilience.budget import remaining_budget
from resilience.errors import BudgetExhaustedError

logger = logging.getLogger(__name__)

RedisProvider = RedisClient | Callable[[], RedisClient]
FenceCheck = Callable[[], Awaitable[None]]

ATTR_IDEMPOTENCY_OUTCOME = "idempotency.outcome"
ATTR_IDEMPOTENCY_KEY = "idempotency.key"


# ---------------------------------------------------------------------------------------------------------------
# idempotency key and fencing

_current_key: ContextVar[str | None] = ContextVar("concierge_idempotency_key", default=None)
_fence: ContextVar[FenceCheck | None] = ContextVar("concierge_fence_check", default=None)
_fence_number: ContextVar[int | None] = ContextVar("concierge_fence_number", default=None)


def idempotency_key() -> str:
    """Inside an idempotent node's body: the key to send a provider as ``Idempotency-Key``.

    Derived only from node name, thread id and the ``key_fields`` digest, so it is the same on every retry, after
    recovery and across process restarts.
    """
    value = _current_key.get()
    if value is None:
        raise RuntimeError(
            "idempotency_key() is only available while an @idempotent_node body runs; "
            "decorate the node with idempotent_node(...) or pass the key explicitly"
        )
    return value


@contextlib.contextmanager
def fence_scope(check: FenceCheck, fence: int | None = None) -> Iterator[None]:
    """Install ``check`` for idempotent nodes run inside this block (LangGraph tasks inherit the context).

    ``idempotent_node`` awaits it right before running a body, after it has claimed the node: a run owner that lost
    its run lease raises there and stops before its next side effect. ``fence`` (the run lease's) is written on the
    claims: a claim left by an owner with a lower fence was made by one the run was taken from, and is taken over at
    once instead of waited out (``IDEMPOTENCY_LEASE_S``). The previous check and fence are restored on exit.
    """
    token = _fence.set(check)
    number = _fence_number.set(fence)
    try:
        yield
    finally:
        _fence_number.reset(number)
        _fence.reset(token)


def _jsonable(value: object) -> object:
    # Hashing must not depend on how a value happens to be represented in state (model, dataclass, enum...).
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"cannot hash a {type(value).__name__} for an idempotency key")


def _field_values(state: Any, key_fields: Sequence[str]) -> dict[str, Any]:
    # A field absent from the state counts as None: LangGraph leaves unset TypedDict keys out of the state.
    if isinstance(state, Mapping):
        return {f: state.get(f) for f in key_fields}
    return {f: getattr(state, f, None) for f in key_fields}


def fields_digest(values: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``values`` (sorted keys, no whitespace): stable across processes."""
    try:
        canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)
    except ValueError as exc:  # NaN/inf or a circular value: refuse rather than hash something unstable
        raise TypeError(f"idempotency key fields are not canonical JSON: {exc}") from exc
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def derive_idempotency_key(name: str, thread_id: str, state: Any, key_fields: Sequence[str]) -> str:
    """The key ``idempotency_key()`` returns for node ``name`` in run ``thread_id`` with this state."""
    return f"{name}:{thread_id}:{fields_digest(_field_values(state, key_fields))}"


# ---------------------------------------------------------------------------------------------------------------
# Redis scripts: every key via KEYS (one key, so one cluster slot); outcomes are short strings

# ARGV: owner token, lease_ms, run fence ('' = none). A claim made under a lower run fence belongs to an owner the
# run was taken from (fenced out of its next side effect): it is taken over, as if its lease had lapsed.
_CLAIM = RedisScript("""
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'result', 'fence')
local superseded = rec[1] == 'claimed' and ARGV[3] ~= '' and tonumber(rec[4] or '') ~= nil
  and tonumber(rec[4]) < tonumber(ARGV[3])
if not rec[1] or superseded then
  redis.call('HSET', KEYS[1], 'status', 'claimed', 'owner', ARGV[1], 'fence', ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {'claimed', ''}
end
if rec[1] == 'done' then
  return {'done', rec[3]}
end
return {'busy', tostring(redis.call('PTTL', KEYS[1])), rec[2] or ''}
""")

_RENEW = RedisScript("""
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if rec[1] == 'claimed' and rec[2] == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
""")

_COMPLETE = RedisScript("""
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner', 'result')
if rec[1] == 'done' then
  return {'done', rec[3]}
end
if rec[1] == 'claimed' and rec[2] ~= ARGV[1] then
  return {'taken', rec[2]}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'status', 'done', 'owner', ARGV[1], 'result', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'stored', ''}
""")

_RELEASE = RedisScript("""
local rec = redis.call('HMGET', KEYS[1], 'status', 'owner')
if rec[1] == 'claimed' and rec[2] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
""")


@functools.lru_cache(maxsize=1)
def _host() -> str:
    return socket.gethostname()


def _owner_token() -> str:
    # Unique per attempt; host and pid only help a human reading Redis. Never part of the provider key.
    return f"{get_settings().instance_id or _host()}:{os.getpid()}:{uuid.uuid4().hex}"


# Releases that must outlive a cancelled caller; referenced so they are not garbage-collected mid-flight.
_background: set[asyncio.Task[Any]] = set()


def _log_background_failure(task: asyncio.Task[Any]) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.warning("releasing an idempotency claim failed; it expires with its lease", exc_info=task.exception())


# ---------------------------------------------------------------------------------------------------------------
# idempotent_node


STOP_BACKGROUND_WAIT_S = 1.0


async def _stop_background(task: asyncio.Task[None], stop: asyncio.Event) -> None:
    """End a helper task (lease renewal) without ever hanging the node on it: its flag ends the loop at its next turn
    even if a library it awaits swallowed the cancellation (seen under load), and the wait is bounded."""
    await stop_task(task, within=STOP_BACKGROUND_WAIT_S, stop=stop)


@dataclasses.dataclass(frozen=True)
class _Idempotent:
    redis: RedisProvider
    name: str
    key_fields: tuple[str, ...]
    lease_s: float | None
    ttl_s: float | None
    poll_interval_s: float
    max_poll_interval_s: float
    sleep: Callable[[float], Awaitable[None]]
    clock: Callable[[], float]

    def client(self) -> RedisClient:
        if isinstance(self.redis, Redis | RedisCluster):
            return self.redis
        return self.redis()

    async def run(self, fn: NodeFn, state: Any, config: RunnableConfig) -> dict[str, Any]:
        thread_id = thread_id_of(config)
        if thread_id is None:
            raise MissingThreadIdError(self.name)
        stable_key = derive_idempotency_key(self.name, thread_id, state, self.key_fields)
        record = key("idem", stable_key)
        settings = get_settings()
        lease_s = self.lease_s if self.lease_s is not None else settings.idempotency_lease_s
        ttl_s = self.ttl_s if self.ttl_s is not None else float(settings.idempotency_ttl_s)
        client = self.client()
        token = _owner_token()
        span = trace.get_current_span()
        span.set_attribute(ATTR_IDEMPOTENCY_KEY, stable_key)

        stored, waited = await self._claim_or_wait(client, record, token, max(1, math.ceil(lease_s * 1000)))
        if stored is not None:
            span.set_attribute(ATTR_IDEMPOTENCY_OUTCOME, "waited" if waited else "replayed")
            # the node answered from its stored result: its side effect is not made again
            count_duplicate_prevented(f"node:{self.name}")
            note(
                JournalKind.CALL,
                dependency="idempotency-record",
                operation=self.name,
                outcome="stored",
                idempotency_key=stable_key,
                replayed=True,
            )
            return stored
        span.set_attribute(ATTR_IDEMPOTENCY_OUTCOME, "took_over" if waited else "executed")

        stop_renewing = asyncio.Event()
        renewer = asyncio.create_task(
            self._renew(client, record, token, lease_s, stop_renewing), name=f"idempotency-renew:{self.name}"
        )
        key_token = _current_key.set(stable_key)
        try:
            try:
                check = _fence.get()
                if check is not None:
                    await check()
                result = await fn(state, config=config)
                payload = self._encode(result)
            finally:
                _current_key.reset(key_token)
                await _stop_background(renewer, stop_renewing)
        except BaseException:
            await self._release(client, record, token)
            raise
        return await self._complete(client, record, token, payload, ttl_s, span)

    async def _claim_or_wait(
        self, client: RedisClient, record: str, token: str, lease_ms: int
    ) -> tuple[dict[str, Any] | None, bool]:
        """``(stored result, False)``, ``(None, False)`` when claimed at once, ``(x, True)`` after waiting."""
        # Outside any budget scope remaining_budget() is a constant, so the wait keeps its own deadline too.
        wait_deadline: float | None = None
        delay = self.poll_interval_s
        started = self.clock()
        while True:
            try:
                fence = _fence_number.get()
                reply = await _CLAIM(client, keys=[record], args=[token, lease_ms, "" if fence is None else fence])
            except RedisError as exc:
                raise IdempotencyStoreError(self.name, "claim") from exc
            outcome = text(reply[0])
            waited = wait_deadline is not None
            if outcome == "done":
                return json.loads(text(reply[1])), waited
            if outcome == "claimed":
                return None, waited
            if wait_deadline is None:
                wait_deadline = started + remaining_budget()
            remaining = min(remaining_budget(), wait_deadline - self.clock())
            if remaining <= 0:
                raise BudgetExhaustedError(
                    f"timeout budget exhausted after waiting {self.clock() - started:.3f}s for node {self.name!r}, "
                    f"claimed by {text(reply[2])!r}"
                )
            lease_left = max(int(text(reply[1])), 1) / 1000
            # No point sleeping past the owner's lease: if it died, we take over as soon as the claim lapses.
            await self.sleep(min(delay, remaining, lease_left))
            delay = min(delay * 2, self.max_poll_interval_s)

    async def _renew(self, client: RedisClient, record: str, token: str, lease_s: float, stop: asyncio.Event) -> None:
        lease_ms = max(1, math.ceil(lease_s * 1000))
        while not stop.is_set():
            await self.sleep(lease_s / 3)
            if stop.is_set():
                return
            try:
                renewed = await _RENEW(client, keys=[record], args=[token, lease_ms])
            except RedisError:
                # Transient: two more tries fit in the lease before it lapses.
                logger.warning("renewing the claim of node %r failed", self.name, exc_info=True)
                continue
            if not renewed:
                logger.warning("node %r lost its idempotency claim on %r while running", self.name, record)
                return

    def _encode(self, result: object) -> str:
        if not isinstance(result, dict):
            raise NodeResultError(self.name, f"got {type(result).__name__}")
        try:
            return json.dumps(result, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise NodeResultError(self.name, str(exc)) from exc

    async def _complete(
        self,
        client: RedisClient,
        record: str,
        token: str,
        payload: str,
        ttl_s: float,
        span: trace.Span,
    ) -> dict[str, Any]:
        try:
            reply = await _COMPLETE(client, keys=[record], args=[token, payload, max(1, math.ceil(ttl_s * 1000))])
        except RedisError as exc:
            # The side effect happened but is not recorded: the claim lapses and a retry re-runs the body with the
            # same provider Idempotency-Key, which the provider deduplicates.
            await self._release(client, record, token)
            raise IdempotencyStoreError(self.name, "complete") from exc
        outcome = text(reply[0])
        if outcome == "stored":
            # Hand back exactly what a replay will return (JSON turns tuples into lists, keys into str).
            return cast(dict[str, Any], json.loads(payload))
        if outcome == "done":
            logger.warning("node %r lost its claim on %r; returning the other owner's result", self.name, record)
            span.set_attribute(ATTR_IDEMPOTENCY_OUTCOME, "lost_claim_replayed")
            count_duplicate_prevented(f"node:{self.name}")
            return cast(dict[str, Any], json.loads(text(reply[1])))
        raise ClaimLostError(self.name, record, text(reply[1]))

    async def _release(self, client: RedisClient, record: str, token: str) -> None:
        # Shielded: a cancelled node must still free its claim, or a retry would wait a whole lease for nothing.
        task: asyncio.Task[Any] = asyncio.ensure_future(_RELEASE(client, keys=[record], args=[token]))
        _background.add(task)
        task.add_done_callback(_log_background_failure)
        with contextlib.suppress(RedisError):  # logged by the callback; the claim expires with its lease
            await asyncio.shield(task)


def idempotent_node(
    redis: RedisProvider,
    name: str,
    key_fields: Sequence[str],
    *,
    lease_s: float | None = None,
    ttl_s: float | None = None,
    poll_interval_s: float = 0.02,
    max_poll_interval_s: float = 0.25,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[F], F]:
    """Run an async node ``(state, config) -> dict`` at most once per (``name``, thread id, ``key_fields`` values).

    ``redis`` is a client or a zero-argument factory (called per execution, so graphs can be built first).
    ``lease_s`` / ``ttl_s`` default to ``IDEMPOTENCY_LEASE_S`` / ``IDEMPOTENCY_TTL_S`` read at call time.

    A stored result is returned without running the body. Otherwise the node claims the record (renewing its lease
    every ``lease_s / 3`` while the body runs) and stores the result on success, or releases the claim on failure
    or cancellation. A caller that finds a live claim polls (backoff from ``poll_interval_s`` to
    ``max_poll_interval_s``) until a result appears, the claim disappears (then it runs the body itself) or the
    timeout budget is spent (``BudgetExhaustedError``). See the module docstring for a claim lost while running.
    """
    if not key_fields:
        raise ValueError(f"idempotent node {name!r} needs at least one key field")
    if isinstance(key_fields, str):
        raise TypeError(f"key_fields of node {name!r} must be a sequence of field names, not a str")
    for label, value in (("lease_s", lease_s), ("ttl_s", ttl_s)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
    if not (0 < poll_interval_s <= max_poll_interval_s):
        raise ValueError("poll intervals must satisfy 0 < poll_interval_s <= max_poll_interval_s")
    spec = _Idempotent(
        redis=redis,
        name=name,
        key_fields=tuple(key_fields),
        lease_s=lease_s,
        ttl_s=ttl_s,
        poll_interval_s=poll_interval_s,
        max_poll_interval_s=max_poll_interval_s,
        sleep=sleep,
        clock=clock,
    )

    def decorate(fn: F) -> F:
        check_node(fn, "idempotent_node", name)

        @functools.wraps(fn)
        async def node(state: Any, config: RunnableConfig) -> dict[str, Any]:
            return await spec.run(fn, state, config)

        return cast(F, node)

    return decorate
