"""Bulkhead: a fixed number of slots per compartment, and a hard bound on how long a slot is held.

Two different clocks, never mixed up:

- ``acquire_timeout`` bounds only the WAIT for a slot: none within it → ``BulkheadFullError``, fn never called;
  ``WITHIN_BUDGET`` (and any call inside ``wait_for_slots()``) waits as long as the budget lasts instead, then
  ``BudgetExhaustedError``;
- the EXECUTION is bounded by ``min(cfg.timeout, remaining_budget())``, computed per call (the shared config is
  never touched): past it fn is cancelled → ``BulkheadTimeoutError``. When the bulkhead's bound is the tighter one,
  fn runs inside a ``budget_scope`` of that bound, so what it calls downstream is told the real deadline.

A cancellation from outside (the caller gave up) propagates as ``CancelledError``; only the deadline we set becomes
``BulkheadTimeoutError``. The slot is released on every exit path.

The deadline cancels the calling task and is undone with ``Task.uncancel``, as ``asyncio.timeout`` does, but every
bounded call of a loop shares one timer (``_Watchdog``): a per-call timer handle costs more than everything else
on this path, which every outbound call takes (see ``bench/resilience_overhead.py``). ``run_within_budget`` is the
same bound without slots (a policy with no bulkhead).

Who may wait: a fast refusal is right for a request someone can send again, wrong for work already promised (an
accepted booking's run). ``wait_for_slots()`` marks a block (and the tasks it starts) as promised work: there a full
bulkhead delays a call within its budget, never fails it. The peer agents' inbound bulkheads wait ``WITHIN_BUDGET``
for everyone, because their callers are other agents' runs and the caller's budget is the one bound every caller
sends. ``try_hold`` takes a slot now or never and keeps it past one call: admission control for work that outlives
the request that brought it.

Slots come from ``anyio.CapacityLimiter`` (it reports borrowed/available tokens for ``/health/bulkheads``). Each call
borrows on behalf of its own token object, so one task may hold slots of nested calls. FIFO: a waiter is never
overtaken. Runs on asyncio.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Final, ParamSpec, TypedDict, TypeVar

import anyio
from anyio import WouldBlock

from resilience.budget import budget_scope, remaining_budget
from resilience.dependencies import LayerView
from resilience.errors import BudgetExhaustedError, BulkheadFullError, BulkheadTimeoutError
from resilience.events import BudgetExpired, BulkheadRejected, BulkheadTimedOut, emit

__all__ = [
    "BULKHEAD_CONFIGS",
    "DEFAULT_BULKHEAD_CONFIG",
    "WITHIN_BUDGET",
    "Bulkhead",
    "BulkheadConfig",
    "BulkheadRegistry",
    "BulkheadStats",
    "HeldSlot",
    "bulkhead_registry",
    "run_within_budget",
    "wait_for_slots",
]

P = ParamSpec("P")
T = TypeVar("T")

WITHIN_BUDGET: Final = math.inf
"""An ``acquire_timeout`` that waits for a slot as long as the caller's remaining budget lasts."""

_patient: ContextVar[bool] = ContextVar("concierge_bulkhead_patient", default=False)


@contextmanager
def wait_for_slots() -> Iterator[None]:
    """In this block (and the tasks started in it) a full bulkhead is waited out within the budget.

    For work that was promised (an accepted booking's run): our own capacity limits may delay it, never fail it.
    ``acquire_timeout`` is ignored here; the budget still bounds the wait (then ``BudgetExhaustedError``), and
    code outside the block keeps its fast refusal. Costs nothing while a slot is free.
    """
    token = _patient.set(True)
    try:
        yield
    finally:
        _patient.reset(token)


def _is_seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


@dataclass(frozen=True, slots=True)
class BulkheadConfig:
    max_concurrent: int
    """Slots: calls running at once."""
    timeout: float
    """Upper bound on one call's execution (the remaining budget may bound it further)."""
    acquire_timeout: float = 2.0
    """How long a call may wait for a slot; 0 means "only if one is free now", ``WITHIN_BUDGET`` "while the budget
    lasts"."""

    def __post_init__(self) -> None:
        n = self.max_concurrent
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_concurrent must be an integer >= 1, got {n!r}")
        if not _is_seconds(self.timeout) or self.timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if not _is_seconds(self.acquire_timeout) or self.acquire_timeout < 0:
            raise ValueError(f"acquire_timeout must be a non-negative number of seconds, got {self.acquire_timeout!r}")


BULKHEAD_CONFIGS: Mapping[str, BulkheadConfig] = LayerView(lambda row: row.inbound)
"""The services' inbound bulkheads: the installed dependency table's ``inbound`` column."""

DEFAULT_BULKHEAD_CONFIG = BulkheadConfig(max_concurrent=10, timeout=30.0)


class _Watchdog:
    """Cancels the overdue bounded calls of one event loop with a single timer, instead of one timer per call.

    Registering a call is a dict insert and finishing it a dict delete. The timer is armed at the earliest deadline
    registered since it last fired; when it fires it cancels what is overdue and re-arms for the earliest deadline
    still in flight. Only a call whose deadline precedes the armed timer re-arms it, which is rare: later calls
    mostly have later deadlines. Lives on (and only ever runs on) its loop's thread.
    """

    __slots__ = ("_handle", "_when", "calls", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: dict[_BoundedCall, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._when = math.inf

    def add(self, call: _BoundedCall) -> None:
        self.calls[call] = None
        if call.deadline < self._when:
            self._arm(call.deadline)

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._when = when
        self._handle = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._when = math.inf
        now = self.loop.time()
        calls = self.calls
        overdue = [call for call in calls if call.deadline <= now]
        for call in overdue:
            del calls[call]
            call.expire()
        if calls:
            self._arm(min(call.deadline for call in calls))


class _PerThread(threading.local):
    watchdog: _Watchdog | None = None


_per_thread = _PerThread()


def _watchdog_for(loop: asyncio.AbstractEventLoop) -> _Watchdog:
    # One slot per thread: a thread runs one loop at a time, so this hits on every call but the first of a loop.
    watchdog = _per_thread.watchdog
    if watchdog is None or watchdog.loop is not loop:
        watchdog = _per_thread.watchdog = _Watchdog(loop)
    return watchdog


class _BoundedCall:
    """One call under a deadline: the limiter's borrower token and the watchdog's entry.

    On expiry the watchdog cancels the calling task; ``finish`` withdraws that request with ``Task.uncancel`` and
    says whether the cancellation was ours alone, exactly as ``asyncio.timeout`` decides between ``TimeoutError``
    and a cancellation from outside.
    """

    __slots__ = ("_cancelling", "_task", "_watchdog", "deadline", "expired")

    def start(self, seconds: float) -> None:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a bounded call must run inside an asyncio task")
        loop = task.get_loop()
        self._task = task
        # cancellations already requested before we started are not ours to swallow
        self._cancelling = task.cancelling()
        self.expired = False
        self.deadline = loop.time() + seconds
        watchdog = self._watchdog = _watchdog_for(loop)
        watchdog.add(self)

    def expire(self) -> None:
        self.expired = True
        self._task.cancel("resilience: deadline reached")

    def finish(self) -> bool:
        """Leave the bounded region. True when our deadline cancelled the call and nobody else is cancelling it.

        Call exactly once per ``start``.
        """
        if not self.expired:
            self._watchdog.calls.pop(self, None)
            return False
        return self._task.uncancel() <= self._cancelling


class BulkheadStats(TypedDict):
    available: int
    in_use: int
    max: int
    waiting: int
    rejected: int
    """Calls refused for want of a slot."""
    timed_out: int
    """Calls cancelled at the execution bound."""


class HeldSlot:
    """A slot taken by ``Bulkhead.try_hold``, kept until ``release()`` (idempotent), whatever reset the bulkhead."""

    __slots__ = ("_limiter", "_released")

    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        self._limiter = limiter
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter.release_on_behalf_of(self)


class Bulkhead:
    __slots__ = ("_cfg", "_limiter", "_name", "_rejected", "_timed_out")

    def __init__(self, name: str, cfg: BulkheadConfig) -> None:
        self._name = name
        self._cfg = cfg
        self._limiter = anyio.CapacityLimiter(cfg.max_concurrent)
        self._rejected = 0
        self._timed_out = 0

    def reset(self, cfg: BulkheadConfig | None = None) -> None:
        """New slots (and optionally a new config) with zeroed counters: a start-up/test operation.

        Calls in flight finish on, and give their slot back to, the old limiter.
        """
        self._cfg = cfg or self._cfg
        self._limiter = anyio.CapacityLimiter(self._cfg.max_concurrent)
        self._rejected = 0
        self._timed_out = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def cfg(self) -> BulkheadConfig:
        return self._cfg

    @property
    def available_slots(self) -> int:
        return int(self._limiter.available_tokens)

    @property
    def in_use(self) -> int:
        return int(self._limiter.borrowed_tokens)

    def stats(self) -> BulkheadStats:
        limiter = self._limiter
        return {
            "available": int(limiter.available_tokens),
            "in_use": int(limiter.borrowed_tokens),
            "max": self._cfg.max_concurrent,
            "waiting": limiter.statistics().tasks_waiting,
            "rejected": self._rejected,
            "timed_out": self._timed_out,
        }

    def try_hold(self, *, limit: int | None = None) -> HeldSlot | None:
        """A slot now or ``None``, held until its ``release()``: admission for work that outlives one call.

        Never waits and bounds nothing (``run`` bounds a call; held work bounds itself). A refusal counts in
        ``rejected`` but emits no event: a door turning a burst away would log a warning per request. ``limit``
        refuses once that many slots are in use, fewer than the bulkhead has (an adaptive door's current size).
        """
        if limit is not None and self._limiter.borrowed_tokens >= limit:
            self._rejected += 1
            return None
        slot = HeldSlot(self._limiter)
        try:
            self._limiter.acquire_on_behalf_of_nowait(slot)
        except WouldBlock:
            self._rejected += 1
            return None
        return slot

    def count_refusal(self) -> None:
        """Count a refusal decided before ``try_hold`` was asked (a door shedding before it reads a request)."""
        self._rejected += 1

    async def run(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` in a slot, bounded by min(timeout, remaining budget)."""
        cfg = self._cfg
        limiter = self._limiter
        budget = remaining_budget()
        if budget <= 0.0:
            raise BudgetExhaustedError(f"bulkhead {self._name!r}: the timeout budget is spent; call not started")
        call = _BoundedCall()
        try:
            limiter.acquire_on_behalf_of_nowait(call)
        except WouldBlock:
            await self._wait_for_slot(limiter, call, cfg, budget)
            budget = remaining_budget()
        try:
            if budget <= 0.0:
                raise BudgetExhaustedError(f"bulkhead {self._name!r}: the timeout budget ran out waiting for a slot")
            bound = cfg.timeout if cfg.timeout < budget else budget
            call.start(bound)
            try:
                if bound < budget:
                    with budget_scope(bound):
                        result = await fn(*args, **kwargs)
                else:
                    result = await fn(*args, **kwargs)
            except BaseException as exc:
                if call.finish() and isinstance(exc, asyncio.CancelledError):
                    self._timed_out += 1
                    emit(BulkheadTimedOut(self._name, bound))
                    raise BulkheadTimeoutError(self._name, bound) from exc
                raise
            call.finish()
            return result
        finally:
            limiter.release_on_behalf_of(call)

    async def _wait_for_slot(
        self, limiter: anyio.CapacityLimiter, call: _BoundedCall, cfg: BulkheadConfig, budget: float
    ) -> None:
        # Waiting longer than the budget is pointless: the call could not finish anyway.
        limit = WITHIN_BUDGET if _patient.get() else cfg.acquire_timeout
        wait = limit if limit < budget else budget
        loop = asyncio.get_running_loop()
        started = loop.time()
        if wait > 0:
            scope = asyncio.timeout(wait)
            try:
                async with scope:
                    await limiter.acquire_on_behalf_of(call)
                return
            except TimeoutError:
                if not scope.expired():
                    raise
        waited = loop.time() - started
        self._rejected += 1
        emit(BulkheadRejected(self._name, cfg.max_concurrent, waited))
        if wait < limit:
            raise BudgetExhaustedError(
                f"bulkhead {self._name!r}: the timeout budget ran out after {waited:.3f}s waiting for a slot"
            )
        raise BulkheadFullError(self._name, cfg.max_concurrent, waited)

    def __repr__(self) -> str:
        return f"<Bulkhead {self._name!r} {self.in_use}/{self._cfg.max_concurrent}>"


async def run_within_budget(name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``await fn(*args, **kwargs)``, cancelled when the remaining budget runs out (→ ``BudgetExhaustedError``)."""
    budget = remaining_budget()
    if budget <= 0.0:
        raise BudgetExhaustedError(f"{name}: the timeout budget is spent; call not started")
    call = _BoundedCall()
    call.start(budget)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        if call.finish() and isinstance(exc, asyncio.CancelledError):
            emit(BudgetExpired(name, budget))
            raise BudgetExhaustedError(f"{name}: the timeout budget ({budget:.3f}s) ran out; call cancelled") from exc
        raise
    call.finish()
    return result


class BulkheadRegistry:
    """One bulkhead per name for the whole process (what ``/health/bulkheads`` reports)."""

    def __init__(self, defaults: Mapping[str, BulkheadConfig] = BULKHEAD_CONFIGS) -> None:
        self._defaults = defaults
        self._bulkheads: dict[str, Bulkhead] = {}
        self._configured: dict[str, BulkheadConfig] = {}
        self.generation = 0
        """Bumped by ``clear()``: whoever caches bulkheads (``policy_for``) knows to look them up again."""

    def get(self, name: str, cfg: BulkheadConfig | None = None) -> Bulkhead:
        """The bulkhead for ``name``, created on first use.

        Its config is, in order: ``configure``'s, ``cfg``, ``BULKHEAD_CONFIGS[name]``, ``DEFAULT_BULKHEAD_CONFIG``.
        ``cfg`` is ignored once the bulkhead exists.
        """
        bulkhead = self._bulkheads.get(name)
        if bulkhead is None:
            bulkhead = self._bulkheads[name] = Bulkhead(name, self._config_for(name, cfg))
        return bulkhead

    def configure(
        self,
        name: str,
        cfg: BulkheadConfig | None = None,
        /,
        *,
        max_concurrent: int | None = None,
        timeout: float | None = None,
        acquire_timeout: float | None = None,
    ) -> Bulkhead:
        """Set ``name``'s config at START-UP (or in a test), as a whole ``cfg`` and/or single fields.

        Fields not given keep their current value (the existing bulkhead's, else the one ``get`` would use). An
        existing bulkhead is reset in place (new slots, zeroed counters), so every holder sees the change; that is
        why this is not a runtime knob.
        """
        base = cfg or self._config_for(name, None)
        config = replace(
            base,
            max_concurrent=base.max_concurrent if max_concurrent is None else max_concurrent,
            timeout=base.timeout if timeout is None else timeout,
            acquire_timeout=base.acquire_timeout if acquire_timeout is None else acquire_timeout,
        )
        self._configured[name] = config
        bulkhead = self._bulkheads.get(name)
        if bulkhead is None:
            return self.get(name)
        bulkhead.reset(config)
        return bulkhead

    def _config_for(self, name: str, cfg: BulkheadConfig | None) -> BulkheadConfig:
        existing = self._bulkheads.get(name)
        if existing is not None:
            return existing.cfg
        return self._configured.get(name) or cfg or self._defaults.get(name) or DEFAULT_BULKHEAD_CONFIG

    def stats(self) -> dict[str, BulkheadStats]:
        return {name: bulkhead.stats() for name, bulkhead in self._bulkheads.items()}

    def names(self) -> list[str]:
        return list(self._bulkheads)

    def clear(self) -> None:
        """Forget every bulkhead and ``configure`` override (tests)."""
        self._bulkheads.clear()
        self._configured.clear()
        self.generation += 1

    def __contains__(self, name: object) -> bool:
        return name in self._bulkheads


bulkhead_registry = BulkheadRegistry()
