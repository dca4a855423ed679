"""The adaptive door's limit, driven sample by sample on a fake clock: it grows while latency stays near the best
seen, shrinks when latency rises, stays within its floor and ceiling, and learns nothing from work never started."""

from __future__ import annotations

import pytest

from resilience import AdaptiveDoor, AdaptiveLimitConfig, Bulkhead, BulkheadConfig, FixedDoor, GradientLimit

CFG = AdaptiveLimitConfig(min_limit=2, initial_limit=8, max_limit=40, window=10)
NO_PROBE = AdaptiveLimitConfig(min_limit=2, initial_limit=8, max_limit=40, window=10, probe_every=10_000)


def feed(limit: GradientLimit, latency_s: float, windows: int, *, in_flight: int | None = None) -> None:
    """``windows`` full windows of samples at ``latency_s``, the door as busy as its limit (unless told)."""
    for _ in range(windows * limit.cfg.window):
        limit.sample(latency_s, limit.limit if in_flight is None else in_flight)


def test_the_limit_grows_while_latency_stays_at_its_best() -> None:
    limit = GradientLimit(CFG)
    feed(limit, 0.2, 1)
    grown = [limit.limit]
    for _ in range(5):
        feed(limit, 0.2, 2)
        grown.append(limit.limit)
    assert grown == sorted(grown) and grown[-1] > grown[0] > CFG.initial_limit - 1


def test_the_limit_shrinks_when_latency_rises_and_recovers_when_it_falls() -> None:
    limit = GradientLimit(CFG)
    feed(limit, 0.2, 30)
    high = limit.limit
    feed(limit, 0.8, 10)  # 4x the baseline: the gradient is at its floor of 0.5
    low = limit.limit
    assert low < high / 2
    assert limit.baseline == pytest.approx(0.2), "the reference is the best window, not the slow ones"
    feed(limit, 0.2, 10)
    assert limit.limit > low


def test_latency_within_tolerance_is_not_a_queue() -> None:
    limit = GradientLimit(CFG)
    feed(limit, 0.2, 2)
    before = limit.limit
    feed(limit, 0.2 * CFG.tolerance, 2)  # slower, but within tolerance: still grows
    assert limit.limit > before


def test_the_limit_stays_between_its_floor_and_ceiling() -> None:
    limit = GradientLimit(NO_PROBE)
    feed(limit, 0.1, 200)
    assert limit.limit == NO_PROBE.max_limit
    feed(limit, 10.0, 200)
    assert limit.limit == NO_PROBE.min_limit, "without a probe, the baseline of the quiet minute stands"


def test_an_idle_door_does_not_grow() -> None:
    # one booking at a time says nothing about what more at once would cost
    limit = GradientLimit(CFG)
    feed(limit, 0.2, 20, in_flight=1)
    assert limit.limit == CFG.initial_limit


def test_a_probe_at_the_floor_measures_the_baseline_afresh() -> None:
    # the machine's neighbours got busy: every run takes 1 s now, however few run at once. Judged against the old
    # 0.1 s the door shrinks to its floor; the next probe measures the no-queue latency as it is now, and the door
    # grows again
    cfg = AdaptiveLimitConfig(min_limit=2, initial_limit=8, max_limit=40, window=10, probe_every=20, probe_samples=5)
    limit = GradientLimit(cfg)
    feed(limit, 0.1, 5)
    feed(limit, 1.0, 14)
    assert limit.limit == cfg.min_limit and not limit.probing
    feed(limit, 1.0, 1)  # the 20th window: a probe is due
    assert limit.probing and limit.limit == cfg.min_limit
    for _ in range(cfg.probe_samples):
        limit.sample(1.0, cfg.min_limit + 5)  # admitted before the probe: not a no-queue sample
    assert limit.probing
    for _ in range(cfg.probe_samples):
        limit.sample(1.0, cfg.min_limit)
    assert not limit.probing and limit.baseline == pytest.approx(1.0)
    feed(limit, 1.0, 10)
    assert limit.limit > cfg.min_limit * 2


async def test_the_door_samples_each_slot_on_its_clock_and_refuses_past_its_limit() -> None:
    now = [0.0]
    bulkhead = Bulkhead("runs", BulkheadConfig(max_concurrent=40, timeout=60.0, acquire_timeout=0))
    door = AdaptiveDoor(
        bulkhead,
        AdaptiveLimitConfig(min_limit=1, initial_limit=2, max_limit=40, window=2, smoothing=1.0),
        clock=lambda: now[0],
    )
    first, second = door.try_hold(), door.try_hold()
    assert first is not None and second is not None
    assert door.full() and door.try_hold() is None
    assert bulkhead.stats()["rejected"] == 1, "the door's refusals are the bulkhead's"
    now[0] = 0.5
    first.release()
    first.release()  # idempotent: one sample
    second.release()
    assert door.stats()["rtt_s"] == pytest.approx(0.5) and door.in_use == 0
    assert door.limit > 2, "both slots were in use at good latency: the door grows"


async def test_a_discarded_slot_teaches_the_door_nothing() -> None:
    now = [0.0]
    bulkhead = Bulkhead("runs", BulkheadConfig(max_concurrent=40, timeout=60.0, acquire_timeout=0))
    door = AdaptiveDoor(
        bulkhead, AdaptiveLimitConfig(min_limit=1, initial_limit=2, max_limit=40, window=1), clock=lambda: now[0]
    )
    slot = door.try_hold()
    assert slot is not None
    slot.discard()
    slot.release()
    assert door.stats()["rtt_s"] is None and door.in_use == 0


async def test_the_fixed_door_is_the_bulkheads_size() -> None:
    bulkhead = Bulkhead("runs", BulkheadConfig(max_concurrent=2, timeout=60.0, acquire_timeout=0))
    door = FixedDoor(bulkhead)
    held = [door.try_hold(), door.try_hold()]
    assert all(held) and door.full() and door.try_hold() is None
    assert door.stats()["door"] == "fixed" and door.stats()["limit"] == 2


async def test_nonsense_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="min_limit"):
        AdaptiveLimitConfig(min_limit=10, initial_limit=5, max_limit=40)
    with pytest.raises(ValueError, match="tolerance"):
        AdaptiveLimitConfig(tolerance=0.5)
    with pytest.raises(ValueError, match="probe_every"):
        AdaptiveLimitConfig(probe_every=0)
    small = Bulkhead("runs", BulkheadConfig(max_concurrent=4, timeout=60.0, acquire_timeout=0))
    with pytest.raises(ValueError, match="max_limit"):
        AdaptiveDoor(small, AdaptiveLimitConfig(max_limit=40))
