"""Circuit breaker: stop calling a dependency that keeps failing, then probe it carefully.

::

    CLOSED ──failure_threshold consecutive failures──▶ OPEN ──open duration elapsed──▶ HALF_OPEN
      ▲                                                 ▲                                  │
      └────────success_threshold probe successes────────┼──────────────────────────────────┤
                                                        └──any probe failure (duration ×2)─┘

- The open duration starts at ``initial_recovery_timeout`` and doubles with each failed probe, up to
  ``recovery_timeout``; closing resets it. A short outage is noticed within seconds, a long one costs one probe per
  ``recovery_timeout`` (docs/liveness.md measures the choice). ``seconds_until_retry()`` says when a probe may go.

- OPEN refuses every call with ``CircuitOpenError`` without calling it.
- HALF_OPEN admits at most ``half_open_max_calls`` probes at a time; everyone else is refused at once.
- Only failures count: business errors (``NonRetryableError``, the breaker's ``ignored_exceptions``, and whatever a
  caller declares non-retryable for one call), exceptions outside ``expected_exception`` and cancellation are
  neutral: they neither count as failures nor reset the count.

State lives in plain attributes changed by synchronous code between awaits. On one event loop that is atomic, so
there is no lock, and nothing is held while the call runs. A breaker is not thread-safe: use it from its loop.

Every admitted call carries a ticket (the breaker's epoch, bumped on every transition). An outcome whose ticket is
stale (the breaker changed state while the call ran) is ignored, so a slow call admitted while CLOSED cannot close a
breaker that has since opened, nor can a probe of an old HALF_OPEN period release a slot of the current one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import ParamSpec, TypedDict, TypeVar

from resilience.dependencies import LayerView
from resilience.errors import CircuitOpenError, NonRetryableError
from resilience.events import CircuitRejected, CircuitTransition, emit

__all__ = [
    "CIRCUIT_CONFIGS",
    "CircuitBreaker",
    "CircuitBreakerConfig",
    "CircuitBreakerRegistry",
    "CircuitState",
    "CircuitStats",
    "circuit_registry",
]

P = ParamSpec("P")
T = TypeVar("T")

ExceptionTypes = type[BaseException] | tuple[type[BaseException], ...]


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


_CLOSED = CircuitState.CLOSED
_OPEN = CircuitState.OPEN
_HALF_OPEN = CircuitState.HALF_OPEN


def _check_count(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{field} must be an integer >= 1, got {value!r}")


def _check_exception_types(field: str, value: object) -> None:
    types = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ValueError(f"{field} must be an exception class or a tuple of them, got {value!r}")


@dataclass(frozen=True, slots=True)
class CircuitBreakerConfig:
    failure_threshold: int = 5
    """Consecutive failures (in CLOSED) that open the breaker."""
    success_threshold: int = 2
    """Probe successes (in HALF_OPEN) that close it again."""
    recovery_timeout: float = 30.0
    """Seconds in OPEN before probing, at most: the open duration grows to this."""
    initial_recovery_timeout: float | None = None
    """The first open duration, doubled after each failed probe up to ``recovery_timeout``; ``None``: fixed."""
    half_open_max_calls: int = 1
    """Probes allowed in flight at once while HALF_OPEN."""
    expected_exception: ExceptionTypes = Exception
    """What counts as a failure (minus business errors and cancellation)."""

    def __post_init__(self) -> None:
        _check_count("failure_threshold", self.failure_threshold)
        _check_count("success_threshold", self.success_threshold)
        _check_count("half_open_max_calls", self.half_open_max_calls)
        timeout = self.recovery_timeout
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or math.isnan(timeout) or timeout < 0:
            raise ValueError(f"recovery_timeout must be a non-negative number of seconds, got {timeout!r}")
        first = self.initial_recovery_timeout
        if first is not None and (
            not isinstance(first, int | float) or isinstance(first, bool) or math.isnan(first) or first < 0
        ):
            raise ValueError(f"initial_recovery_timeout must be a non-negative number of seconds, got {first!r}")
        _check_exception_types("expected_exception", self.expected_exception)


CIRCUIT_CONFIGS: Mapping[str, CircuitBreakerConfig] = LayerView(lambda row: row.breaker)
"""The breakers' configs: the installed dependency table's ``breaker`` column (``resilience.dependencies``)."""


class CircuitStats(TypedDict):
    state: str
    failures: int
    """Failures counted since the breaker was created (or reset)."""
    consecutive_failures: int
    short_circuits: int
    """Calls refused without being made."""
    calls: int
    """Calls admitted."""
    probes_in_flight: int
    seconds_until_retry: float
    open_for_s: float
    """The open duration now: what the next opening (or the current one) lasts before a probe."""


class CircuitBreaker:
    """One breaker per dependency; share it (see ``circuit_registry``) so every caller feeds the same counts.

    ``await cb.call(fn, *args, **kwargs)`` is the usual entry point. Layers that compose the breaker with others
    (``with_retry``, ``ResiliencePolicy``) use ``check``/``admit``/``record_success``/``record_exception`` to avoid
    an extra coroutine per attempt: every ``admit()`` must be followed by exactly one ``record_*`` with its ticket.
    """

    __slots__ = (
        "_calls",
        "_cfg",
        "_clock",
        "_consecutive_failures",
        "_epoch",
        "_expected",
        "_failures",
        "_max_probes",
        "_name",
        "_neutral",
        "_open_for",
        "_opened_at",
        "_probe_successes",
        "_probes",
        "_recovery_timeout",
        "_rejected_half_open",
        "_rejected_open",
        "_short_circuits",
        "_state",
    )

    def __init__(
        self,
        name: str,
        cfg: CircuitBreakerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        ignored_exceptions: tuple[type[BaseException], ...] = (),
    ) -> None:
        _check_exception_types("ignored_exceptions", ignored_exceptions)
        self._name = name
        self._clock = clock
        # Cancellation is the caller giving up, and business errors prove the dependency answered: neither is
        # evidence that it is unhealthy.
        self._neutral: tuple[type[BaseException], ...] = (
            asyncio.CancelledError,
            NonRetryableError,
            *ignored_exceptions,
        )
        self._rejected_open = CircuitRejected(name, _OPEN)
        self._rejected_half_open = CircuitRejected(name, _HALF_OPEN)
        self._epoch = 0
        self._apply(cfg or CircuitBreakerConfig())

    def _apply(self, cfg: CircuitBreakerConfig) -> None:
        self._cfg = cfg
        # copied out of the config: the hot path reads slots, not a dataclass chain
        self._expected = cfg.expected_exception
        self._recovery_timeout = float(cfg.recovery_timeout)
        self._open_for = self._first_open_duration()
        self._max_probes = cfg.half_open_max_calls
        self._state = _CLOSED
        self._consecutive_failures = 0
        self._probe_successes = 0
        self._probes = 0
        self._opened_at = 0.0
        self._failures = 0
        self._short_circuits = 0
        self._calls = 0

    def reset(self, cfg: CircuitBreakerConfig | None = None) -> None:
        """Back to CLOSED with zeroed counters, optionally with a new config (a start-up/test operation).

        Calls in flight keep running; their outcomes are ignored (their tickets are stale).
        """
        self._apply(cfg or self._cfg)
        self._epoch += 1

    @property
    def name(self) -> str:
        return self._name

    @property
    def cfg(self) -> CircuitBreakerConfig:
        return self._cfg

    @property
    def state(self) -> CircuitState:
        """The stored state. An OPEN breaker whose recovery timeout has elapsed moves to HALF_OPEN on the next call."""
        return self._state

    def _first_open_duration(self) -> float:
        first = self._cfg.initial_recovery_timeout
        return self._recovery_timeout if first is None else min(float(first), self._recovery_timeout)

    @property
    def open_duration(self) -> float:
        """How long the breaker stays OPEN before a probe: now if OPEN, else the next time it opens."""
        return self._open_for

    def seconds_until_retry(self) -> float:
        """When a probe may go: seconds left of the open duration (0 unless OPEN). What a waiting run sleeps for."""
        if self._state is not _OPEN:
            return 0.0
        return max(0.0, self._open_for - (self._clock() - self._opened_at))

    def check(self) -> None:
        """Raise ``CircuitOpenError`` if a call would be refused right now; admits nothing.

        The cheap first gate of a policy: refuse before taking a bulkhead slot.
        """
        state = self._state
        if state is _CLOSED:
            return
        # The refusals are inlined (no helper call) because a refusal is the one thing an OPEN breaker does at load.
        if state is _OPEN:
            waited = self._clock() - self._opened_at
            if waited < self._open_for:
                self._short_circuits += 1
                emit(self._rejected_open)
                raise CircuitOpenError(self._name, self._open_for - waited)
        elif self._probes >= self._max_probes:
            self._short_circuits += 1
            emit(self._rejected_half_open)
            raise CircuitOpenError(self._name, 0.0)

    def admit(self) -> int:
        """Admit one call or raise ``CircuitOpenError``; returns the ticket to hand to ``record_*``."""
        state = self._state
        if state is not _CLOSED:
            if state is _OPEN:
                waited = self._clock() - self._opened_at
                if waited < self._open_for:
                    self._short_circuits += 1
                    emit(self._rejected_open)
                    raise CircuitOpenError(self._name, self._open_for - waited)
                self._transition(_HALF_OPEN)
            if self._probes >= self._max_probes:
                self._short_circuits += 1
                emit(self._rejected_half_open)
                raise CircuitOpenError(self._name, 0.0)
            self._probes += 1
        self._calls += 1
        return self._epoch

    def record_success(self, ticket: int) -> None:
        if ticket != self._epoch:
            return
        if self._state is _CLOSED:
            self._consecutive_failures = 0
            return
        self._probes -= 1
        self._probe_successes += 1
        if self._probe_successes >= self._cfg.success_threshold:
            self._transition(_CLOSED)

    def record_exception(self, exc: BaseException, ticket: int, ignored: ExceptionTypes = ()) -> None:
        """Account for a call that raised ``exc``; ``ignored`` adds exception types that are neutral for this call."""
        if ticket != self._epoch:
            return
        failed = isinstance(exc, self._expected) and not isinstance(exc, self._neutral) and not isinstance(exc, ignored)
        if self._state is _HALF_OPEN:
            self._probes -= 1
            if failed:
                self._failures += 1
                self._transition(_OPEN)
            return
        if failed:
            self._failures += 1
            self._consecutive_failures += 1
            if self._consecutive_failures >= self._cfg.failure_threshold:
                self._transition(_OPEN)

    async def call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``await fn(*args, **kwargs)`` through the breaker."""
        ticket = self.admit()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self.record_exception(exc, ticket)
            raise
        self.record_success(ticket)
        return result

    def stats(self) -> CircuitStats:
        return {
            "state": self._state.value,
            "failures": self._failures,
            "consecutive_failures": self._consecutive_failures,
            "short_circuits": self._short_circuits,
            "calls": self._calls,
            "probes_in_flight": self._probes,
            "seconds_until_retry": self.seconds_until_retry(),
            "open_for_s": self._open_for,
        }

    def _transition(self, new: CircuitState) -> None:
        old = self._state
        self._state = new
        self._epoch += 1
        self._consecutive_failures = 0
        self._probe_successes = 0
        self._probes = 0
        if new is _OPEN:
            if old is _HALF_OPEN:  # a failed probe: the outage goes on, wait longer before the next one
                self._open_for = min(self._open_for * 2, self._recovery_timeout)
            self._opened_at = self._clock()
        elif new is _CLOSED:
            self._open_for = self._first_open_duration()
        emit(CircuitTransition(self._name, old, new))

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self._name!r} {self._state.value}>"


class CircuitBreakerRegistry:
    """One breaker per name for the whole process, so ``/health/circuits`` shows the breakers calls go through."""

    def __init__(
        self,
        defaults: Mapping[str, CircuitBreakerConfig] = CIRCUIT_CONFIGS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._defaults = defaults
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._configured: dict[str, CircuitBreakerConfig] = {}
        self.generation = 0
        """Bumped by ``clear()``: whoever caches breakers (``policy_for``) knows to look them up again."""

    def get(self, name: str, cfg: CircuitBreakerConfig | None = None) -> CircuitBreaker:
        """The breaker for ``name``, created on first use.

        Its config is, in order: ``configure``'s, ``cfg``, ``CIRCUIT_CONFIGS[name]``, the default. ``cfg`` is ignored
        once the breaker exists (the first caller wins; use ``configure`` to change it).
        """
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = self._breakers[name] = CircuitBreaker(name, self._config_for(name, cfg), clock=self._clock)
        return breaker

    def configure(
        self,
        name: str,
        cfg: CircuitBreakerConfig | None = None,
        /,
        *,
        failure_threshold: int | None = None,
        success_threshold: int | None = None,
        recovery_timeout: float | None = None,
        half_open_max_calls: int | None = None,
        initial_recovery_timeout: float | None = None,
    ) -> CircuitBreaker:
        """Set ``name``'s config at START-UP (e.g. a short recovery timeout for an end-to-end test).

        Give a whole ``cfg`` and/or single fields; fields not given keep their current value (the existing breaker's,
        else the one ``get`` would use). An existing breaker is reset in place (CLOSED, counters zeroed) so every
        holder, ``policy_for``'s included, sees the new config. That discards what the breaker knew, which is why
        this is a start-up operation and not a runtime knob.
        """
        base = cfg or self._config_for(name, None)
        config = replace(
            base,
            failure_threshold=base.failure_threshold if failure_threshold is None else failure_threshold,
            success_threshold=base.success_threshold if success_threshold is None else success_threshold,
            recovery_timeout=base.recovery_timeout if recovery_timeout is None else recovery_timeout,
            half_open_max_calls=base.half_open_max_calls if half_open_max_calls is None else half_open_max_calls,
            initial_recovery_timeout=(
                base.initial_recovery_timeout if initial_recovery_timeout is None else initial_recovery_timeout
            ),
        )
        self._configured[name] = config
        breaker = self._breakers.get(name)
        if breaker is None:
            return self.get(name)
        breaker.reset(config)
        return breaker

    def _config_for(self, name: str, cfg: CircuitBreakerConfig | None) -> CircuitBreakerConfig:
        existing = self._breakers.get(name)
        if existing is not None:
            return existing.cfg
        return self._configured.get(name) or cfg or self._defaults.get(name) or CircuitBreakerConfig()

    def stats(self) -> dict[str, CircuitStats]:
        return {name: breaker.stats() for name, breaker in self._breakers.items()}

    def names(self) -> list[str]:
        return list(self._breakers)

    def clear(self) -> None:
        """Forget every breaker and ``configure`` override (tests)."""
        self._breakers.clear()
        self._configured.clear()
        self.generation += 1

    def __contains__(self, name: object) -> bool:
        return name in self._breakers


circuit_registry = CircuitBreakerRegistry()
