"""Cascading timeout budget: one deadline per request, read anywhere, shrunk at every hop.

The deadline lives in a ``ContextVar`` so child asyncio tasks inherit it and no function signature has to carry
it. A service initialises it from the caller's ``X-Timeout-Budget`` header; every outbound call sends what is left
minus a safety margin (time for the answer to travel back), so a callee never works for a caller that gave up.

Outside any scope the default budget applies (30 s unless ``configure_budget`` says otherwise): fresh code paths
get a sane bound, never zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from resilience.errors import BudgetExhaustedError, InvalidBudgetHeaderError
from resilience.switches import Restore

BUDGET_HEADER = "X-Timeout-Budget"

_deadline: ContextVar[float | None] = ContextVar("concierge_budget_deadline", default=None)


@dataclass(frozen=True)
class BudgetDefaults:
    default: float = 30.0
    """Budget seen by code outside any scope."""
    margin: float = 0.05
    """Kept back from every outgoing budget for the reply's trip home."""
    minimum_call: float = 0.05
    """Below this, an outgoing call is not worth starting."""
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not (math.isfinite(self.default) and self.default > 0):
            raise ValueError(f"default budget must be a positive number of seconds, got {self.default!r}")
        if self.margin < 0 or self.minimum_call < 0:
            raise ValueError("budget margin and minimum_call must not be negative")


_defaults = BudgetDefaults()


def configure_budget(
    *,
    default: float | None = None,
    margin: float | None = None,
    minimum_call: float | None = None,
    clock: Callable[[], float] | None = None,
) -> Restore[BudgetDefaults]:
    """Replace the process-wide defaults (at start-up or in tests; never per request).

    In effect at once; leaving ``with configure_budget(...):`` (or ``.restore()``) puts the old ones back.
    """
    global _defaults
    old = _defaults
    _defaults = BudgetDefaults(
        default=old.default if default is None else default,
        margin=old.margin if margin is None else margin,
        minimum_call=old.minimum_call if minimum_call is None else minimum_call,
        clock=old.clock if clock is None else clock,
    )
    return Restore(old, restore_budget_defaults)


def restore_budget_defaults(defaults: BudgetDefaults) -> None:
    """Put ``defaults`` back (what leaving a ``configure_budget`` block does)."""
    global _defaults
    _defaults = defaults


def _check_seconds(seconds: float) -> float:
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        raise ValueError(f"budget must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"budget must be a positive, finite number of seconds, got {seconds!r}")
    return float(seconds)


def init_budget(seconds: float) -> None:
    """Start this context's budget (at a request edge, where the context is fresh)."""
    _deadline.set(_defaults.clock() + _check_seconds(seconds))


def default_budget() -> float:
    """The budget of code outside any scope: what a client without a budget waits (``configure_budget``)."""
    return _defaults.default


def current_deadline() -> float | None:
    """The absolute deadline on the budget clock, or ``None`` outside any scope."""
    return _deadline.get()


def remaining_budget() -> float:
    """Seconds left in this context's budget (the default when no budget was started); never negative."""
    deadline = _deadline.get()
    if deadline is None:
        return _defaults.default
    return max(0.0, deadline - _defaults.clock())


@contextmanager
def budget_scope(seconds: float) -> Iterator[float]:
    """Run a block under at most ``seconds``; an enclosing deadline that comes sooner still wins.

    Yields the seconds actually available. The previous deadline is restored on exit.
    """
    now = _defaults.clock()
    deadline = now + _check_seconds(seconds)
    enclosing = _deadline.get()
    if enclosing is not None:
        deadline = min(deadline, enclosing)
    token = _deadline.set(deadline)
    try:
        yield max(0.0, deadline - now)
    finally:
        _deadline.reset(token)


@contextmanager
def detached_budget(seconds: float) -> Iterator[float]:
    """Run a block under a fresh budget that ignores the enclosing deadline.

    For work that must finish even though the request that caused it ran out of time: compensating a half-done
    booking (cancelling a hold, refunding a charge) or resuming an accepted run after a crash. Use sparingly; the
    ordinary tool is ``budget_scope``.
    """
    seconds = _check_seconds(seconds)
    token = _deadline.set(_defaults.clock() + seconds)
    try:
        yield seconds
    finally:
        _deadline.reset(token)


def parse_budget_header(value: str | None, *, default: float, maximum: float) -> float:
    """Turn an ``X-Timeout-Budget`` value into seconds.

    Missing → ``default``; above ``maximum`` → ``maximum`` (a caller cannot make us work longer than we allow);
    anything that is not a positive finite number → ``InvalidBudgetHeaderError`` (a ``ValueError``; 400 at the edge).
    """
    if value is None or value.strip() == "":
        return min(default, maximum)
    try:
        seconds = float(value.strip())
    except ValueError:
        raise InvalidBudgetHeaderError(
            f"{BUDGET_HEADER} must be a number of seconds, got {value!r}", BUDGET_HEADER
        ) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidBudgetHeaderError(
            f"{BUDGET_HEADER} must be a positive, finite number of seconds, got {value!r}", BUDGET_HEADER
        )
    return min(seconds, maximum)


def outgoing_budget_seconds() -> float:
    """The budget to hand a downstream call: what is left minus the safety margin.

    Raises ``BudgetExhaustedError`` when that is too little to make the call at all.
    """
    seconds = remaining_budget() - _defaults.margin
    if seconds < _defaults.minimum_call:
        raise BudgetExhaustedError(
            f"timeout budget exhausted: {remaining_budget():.3f}s left, "
            f"{_defaults.margin + _defaults.minimum_call:.3f}s needed for a downstream call"
        )
    return seconds


def outgoing_budget_headers() -> dict[str, str]:
    """``{"X-Timeout-Budget": "<seconds>"}`` for a downstream call (see ``outgoing_budget_seconds``)."""
    return {BUDGET_HEADER: f"{outgoing_budget_seconds():.3f}"}
