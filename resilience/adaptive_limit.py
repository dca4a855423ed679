"""Adaptive concurrency limit: a door whose size follows the latency of the work it lets in (gradient, as Netflix's
concurrency-limits ``GradientLimit`` and Envoy's adaptive concurrency filter do).

Ours, not a library's: no maintained Python port exists (the PyPI candidates are single 0.1 releases), and the
algorithm is forty lines. ``docs/overload.md`` explains it and the bench that measured it (``bench/overload.py``).

Each held slot's release is a latency sample (from ``try_hold`` to ``release``, on an injectable clock; the caller
``discard``s work that says nothing about the queue). Every ``window`` samples the limit moves by the gradient
``tolerance × baseline / rtt`` (clamped to [0.5, 1]): latency within tolerance of the baseline keeps the gradient
at 1 and the limit grows by ``√limit``, latency above it shrinks the limit in proportion, so latency settles near
``tolerance`` × the no-queue latency. That baseline is
measured afresh every ``probe_every`` windows with the door held at its floor (as Envoy's adaptive concurrency
measures its minRTT): on a machine whose neighbours got busy every run is slower, queue or not, and a baseline
from a quiet minute would shrink the door to its floor for a queue that is not there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from resilience.bulkhead import Bulkhead, HeldSlot

__all__ = ["AdaptiveDoor", "AdaptiveLimitConfig", "DoorStats", "FixedDoor", "GradientLimit", "TimedSlot"]


@dataclass(frozen=True, slots=True)
class AdaptiveLimitConfig:
    min_limit: int = 2
    """The floor: never fewer slots than this, however slow the work gets; also the limit while probing."""
    max_limit: int = 40
    """The ceiling: what the resources behind the door can hold at all (connections, bulkheads)."""
    initial_limit: int = 20
    """Where a fresh limiter starts, with no latency measured yet (Netflix's Gradient2 default)."""
    tolerance: float = 1.5
    """Latency up to ``tolerance`` × the baseline counts as unqueued (the gradient stays 1)."""
    smoothing: float = 0.3
    """How far one update moves the limit toward its new value."""
    window: int = 5
    """Samples per update: one slow run is noise, a window's mean is a signal (and a short window a quick one)."""
    probe_every: int = 40
    """Updates (windows) between two measurements of the baseline with the door held at ``min_limit`` (Envoy's
    minRTT interval, counted in work rather than time: an idle door has nothing to probe, and a probe's cost stays a
    fixed share of the work, ``probe_samples`` of ``probe_every × window``)."""
    probe_samples: int = 5
    """Runs admitted during a probe whose mean latency becomes the new baseline."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"need 1 <= min_limit <= initial_limit <= max_limit, got {self.min_limit}, {self.initial_limit}, "
                f"{self.max_limit}"
            )
        if not self.tolerance >= 1.0 or not 0.0 < self.smoothing <= 1.0 or self.window < 1 or self.probe_samples < 1:
            raise ValueError("need tolerance >= 1, 0 < smoothing <= 1, window >= 1, probe_samples >= 1")
        if self.probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {self.probe_every!r}")


class GradientLimit:
    """The algorithm alone: feed it latency samples, how many were in flight and the time, read ``limit``."""

    __slots__ = (
        "_cfg",
        "_estimate",
        "_max_in_flight",
        "_probe",
        "_samples",
        "_since_probe",
        "_sum",
        "baseline",
        "rtt",
    )

    def __init__(self, cfg: AdaptiveLimitConfig) -> None:
        self._cfg = cfg
        self._estimate = float(cfg.initial_limit)
        self._samples = 0
        self._sum = 0.0
        self._max_in_flight = 0
        self._since_probe = 0
        self._probe: list[float] | None = None
        """While probing: the latencies of the runs admitted at the floor so far."""
        self.baseline: float | None = None
        """The no-queue reference (seconds): the last probe's mean latency, or a lower window mean since."""
        self.rtt: float | None = None
        """The last window's mean latency (seconds)."""

    @property
    def cfg(self) -> AdaptiveLimitConfig:
        return self._cfg

    @property
    def limit(self) -> int:
        return self._cfg.min_limit if self._probe is not None else int(self._estimate)

    @property
    def probing(self) -> bool:
        return self._probe is not None

    def sample(self, latency_s: float, in_flight: int) -> None:
        """One finished unit of work: it took ``latency_s``, and ``in_flight`` were running when it started (itself
        included)."""
        latency_s = max(latency_s, 0.0)
        if self._probe is not None:
            self._probing(latency_s, in_flight)
            return
        self._samples += 1
        self._sum += latency_s
        self._max_in_flight = max(self._max_in_flight, in_flight)
        if self._samples >= self._cfg.window:
            rtt, busiest = self._sum / self._samples, self._max_in_flight
            self._samples, self._sum, self._max_in_flight = 0, 0.0, 0
            self._update(rtt, busiest)
            self._since_probe += 1
            if self._since_probe >= self._cfg.probe_every:
                self._probe = []  # hold the door at the floor until enough runs admitted there have ended

    def _probing(self, latency_s: float, in_flight: int) -> None:
        # only runs admitted at the floor count: those admitted before the probe queued behind the old limit
        if self._probe is None or in_flight > self._cfg.min_limit:
            return
        self._probe.append(latency_s)
        if len(self._probe) >= self._cfg.probe_samples:
            self.baseline = sum(self._probe) / len(self._probe)
            self._probe = None
            self._since_probe = 0

    def _update(self, rtt: float, in_flight: int) -> None:
        cfg = self._cfg
        self.rtt = rtt
        if rtt <= 0.0:
            return
        if self.baseline is None or rtt < self.baseline:
            self.baseline = rtt
        gradient = min(1.0, max(0.5, cfg.tolerance * self.baseline / rtt))
        estimate = self._estimate
        if gradient >= 1.0 and in_flight < estimate / 2:
            return  # the door was not the bound: growing it would say nothing about what more load costs
        # room for a queue of √limit while latency is good; in proportion to the excess when it is not (adding the
        # queue there too, as concurrency-limits does, would pin the limit at 4 however slow the work gets)
        target = estimate + math.sqrt(estimate) if gradient >= 1.0 else estimate * gradient
        estimate = (1.0 - cfg.smoothing) * estimate + cfg.smoothing * target
        self._estimate = min(float(cfg.max_limit), max(float(cfg.min_limit), estimate))


class DoorStats(TypedDict):
    door: str
    """``adaptive`` or ``fixed``."""
    limit: int
    in_use: int
    min: int
    max: int
    baseline_s: float | None
    rtt_s: float | None
    probing: bool
    """Held at its floor a moment to measure the no-queue latency afresh."""


class TimedSlot:
    """A held slot that reports how long it was held when released (idempotent); ``discard`` gives it back
    unmeasured (work that never started: a sample of it would teach the limit a latency nobody had)."""

    __slots__ = ("_door", "_in_flight", "_slot", "_started")

    def __init__(self, door: FixedDoor, slot: HeldSlot, started: float, in_flight: int) -> None:
        self._door = door
        self._slot = slot
        self._started = started
        self._in_flight = in_flight

    def release(self) -> None:
        if not self._slot.released:
            self._slot.release()
            self._door._finished(self._started, self._in_flight)

    def discard(self) -> None:
        self._slot.release()


class FixedDoor:
    """Admission by ``bulkhead``'s own size: ``try_hold`` is a slot now or ``None`` (``BOOKING_MAX_IN_FLIGHT``)."""

    kind = "fixed"
    __slots__ = ("_bulkhead", "_clock")

    def __init__(self, bulkhead: Bulkhead, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._bulkhead = bulkhead
        self._clock = clock

    @property
    def limit(self) -> int:
        return self._bulkhead.cfg.max_concurrent

    @property
    def in_use(self) -> int:
        return self._bulkhead.in_use

    def full(self) -> bool:
        """A peek, no slot taken: whether ``try_hold`` would refuse now."""
        return self._bulkhead.in_use >= self.limit

    def try_hold(self) -> TimedSlot | None:
        slot = self._bulkhead.try_hold(limit=self.limit)
        if slot is None:
            return None
        return TimedSlot(self, slot, self._clock(), self._bulkhead.in_use)

    def _finished(self, started: float, in_flight: int) -> None:
        """A slot held since ``started`` was released (the fixed door learns nothing from it)."""

    def stats(self) -> DoorStats:
        return {
            "door": self.kind,
            "limit": self.limit,
            "in_use": self._bulkhead.in_use,
            "min": self.limit,
            "max": self.limit,
            "baseline_s": None,
            "rtt_s": None,
            "probing": False,
        }


class AdaptiveDoor(FixedDoor):
    """Admission by a ``GradientLimit``: a slot's release is the latency sample that resizes the door.

    The slots are ``bulkhead``'s (sized ``max_limit``), so ``/health/bulkheads`` and its refusal count still tell
    the truth; the limit only refuses earlier. Runs on one event loop (no locking).
    """

    kind = "adaptive"
    __slots__ = ("_gradient",)

    def __init__(
        self, bulkhead: Bulkhead, cfg: AdaptiveLimitConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if bulkhead.cfg.max_concurrent < cfg.max_limit:
            raise ValueError(f"bulkhead {bulkhead.name!r} has fewer slots than max_limit ({cfg.max_limit})")
        super().__init__(bulkhead, clock=clock)
        self._gradient = GradientLimit(cfg)

    @property
    def limit(self) -> int:
        return self._gradient.limit

    def _finished(self, started: float, in_flight: int) -> None:
        self._gradient.sample(self._clock() - started, in_flight)

    def stats(self) -> DoorStats:
        cfg = self._gradient.cfg
        return {
            "door": self.kind,
            "limit": self.limit,
            "in_use": self._bulkhead.in_use,
            "min": cfg.min_limit,
            "max": cfg.max_limit,
            "baseline_s": self._gradient.baseline,
            "rtt_s": self._gradient.rtt,
            "probing": self._gradient.probing,
        }
