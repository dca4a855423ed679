"""A step's outage, waited out: inside a run that may wait, a dependency that is down pauses the run instead of
answering it (``OutageWaitError``, ``runs.runner``); every graph's steps decide it here, the same way."""

from __future__ import annotations

from typing import Final

from domain.errors import ErrorCode
from infra.error_table import answer_for, is_outage
from resilience import OutageWaitError, circuit_registry, outage_pause, pause_fits, waits_out_outages

__all__ = ["WAITED_OUT", "raise_if_waited_out"]

WAITED_OUT: Final = frozenset(
    {ErrorCode.PROVIDER_UNAVAILABLE, ErrorCode.UNAVAILABLE, ErrorCode.BULKHEAD_FULL, ErrorCode.OVERLOADED}
)
"""The answers that mean "down or full for now", not "no": an open breaker, a 503, a full bulkhead, admission's 429
(each refused before anything was recorded, or deduplicated by its idempotency key when sent again)."""


def raise_if_waited_out(exc: BaseException, dependency: str) -> None:
    """``OutageWaitError`` when ``exc`` is ``dependency`` being down, the run may wait and the pause fits its budget;
    otherwise returns, and ``exc`` is the step's answer."""
    if answer_for(exc).code not in WAITED_OUT or not is_outage(exc) or not waits_out_outages():
        return
    retry_after = _next_probe(exc, dependency)
    if pause_fits(outage_pause(retry_after, 0, jitter=False)):
        raise OutageWaitError(dependency, retry_after, answer_for(exc).message) from exc


def _next_probe(exc: BaseException, dependency: str) -> float | None:
    """When the breaker in the way may let a probe through: the refusal's own figure (ours, or a peer's in its skill
    error's data), else our breaker's if it opened meanwhile; ``None`` when nobody knows."""
    wait = getattr(exc, "retry_after", None)
    if wait is None:
        data = getattr(exc, "data", None)
        wait = data.get("retry_after") if isinstance(data, dict) else None
    if isinstance(wait, int | float) and not isinstance(wait, bool):
        return float(wait)
    if dependency in circuit_registry:
        breaker = circuit_registry.get(dependency)
        if breaker.seconds_until_retry() > 0:
            return breaker.seconds_until_retry()
    return None
