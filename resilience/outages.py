"""Waiting out an outage: accepted work pauses until the breaker in its way may let a probe through.

A request has a caller waiting on it, so it fails fast (the breaker's point). An accepted run has a budget of its
own instead (``runs.runner`` runs it inside ``wait_out_outages()``): a step that meets an open breaker, ours or a
peer's, raises ``OutageWaitError`` and the run pauses until the breaker's next probe, plus jitter so that the runs
waiting on one breaker do not all arrive at its single probe slot at once, then runs the step again. Only when the
pause does not fit what is left of the budget does the step take the outage as its answer. Outside the scope
(the HTTP door, a synchronous A2A request) nothing changes. docs/liveness.md says why and measures it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from resilience.budget import remaining_budget

__all__ = [
    "HALF_OPEN_WAIT_S",
    "MAX_UNKNOWN_WAIT_S",
    "PROBE_JITTER_S",
    "STEP_RESERVE_S",
    "outage_pause",
    "pause_fits",
    "wait_out_outages",
    "waits_out_outages",
]

PROBE_JITTER_S = 0.5
"""Up to this much is added to each pause, uniformly: spreads the runs waiting on one breaker over its probe."""
HALF_OPEN_WAIT_S = 0.25
"""The shortest pause: a breaker already probing (HALF_OPEN, its slots taken) answers within a call's time."""
MAX_UNKNOWN_WAIT_S = 4.0
"""The longest pause when nobody says how long the outage lasts (a peer down, our breaker still closed)."""
STEP_RESERVE_S = 1.0
"""What a step needs after the pause: a pause that leaves less than this of the budget is not taken."""

_waiting: ContextVar[bool] = ContextVar("concierge_wait_out_outages", default=False)
_promise: ContextVar[float | None] = ContextVar("concierge_outage_promise", default=None)


@contextmanager
def wait_out_outages(enabled: bool = True, *, until: float | None = None) -> Iterator[None]:
    """Inside: a step that meets an outage asks its run to pause (``OutageWaitError``) instead of failing.

    ``until`` (seconds since the epoch) is when the run promised its caller an end: no pause reaches past it, however
    much budget a resumed attempt has (each attempt's budget starts afresh, the promise does not).
    """
    tokens = _waiting.set(enabled), _promise.set(until)
    try:
        yield
    finally:
        _promise.reset(tokens[1])
        _waiting.reset(tokens[0])


def waits_out_outages() -> bool:
    """Whether the current work may pause for an outage (an accepted run) or must fail fast (a request)."""
    return _waiting.get()


def outage_pause(
    retry_after: float | None, pauses: int, rng: random.Random | None = None, *, jitter: bool = True
) -> float:
    """How long to pause before running the step again: until the breaker may admit a probe (``retry_after``), or
    a backoff doubling from ``HALF_OPEN_WAIT_S`` with the ``pauses`` already taken when nobody knows; plus jitter
    (``jitter=False``: the shortest such pause)."""
    if retry_after is None:
        base = min(HALF_OPEN_WAIT_S * 2 ** (pauses + 1), MAX_UNKNOWN_WAIT_S)
    else:
        base = max(retry_after, HALF_OPEN_WAIT_S)
    return base + ((rng or random).uniform(0.0, PROBE_JITTER_S) if jitter else 0.0)


def pause_fits(pause: float) -> bool:
    """Whether pausing ``pause`` seconds still leaves the step time to run within the current budget and before the
    run's promised end."""
    left = remaining_budget()
    until = _promise.get()
    if until is not None:
        left = min(left, until - time.time())
    return pause + STEP_RESERVE_S <= left
