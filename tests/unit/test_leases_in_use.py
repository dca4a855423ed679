"""The process-local registry of runs in use (``runs.in_use``), which the presence audit checks Redis against."""

from __future__ import annotations

import gc
from typing import Any

from runs.in_use import LeasesInUse
from runs.leases import RunLease


def lease(thread_id: str, *, owner: str = "agent-1", fence: int = 1, held: bool = True) -> RunLease:
    store: Any = None  # the registry never touches the store
    return RunLease(store, thread_id, owner, fence, held=held)


def test_a_held_lease_is_in_use_until_lost_abandoned_or_collected() -> None:
    registry = LeasesInUse()
    kept, lost, abandoned, dropped = (lease(f"run-{n}") for n in range(4))
    ttl_only = lease("run-ttl", held=False)
    for each in (kept, lost, abandoned, dropped, ttl_only):
        registry.add(each)
    assert registry.held("agent-1") == {"run-0", "run-1", "run-2", "run-3"}, "a TTL lease is not in the set"
    assert registry.held("agent-2") == set()

    lost._mark_lost("released")
    abandoned.abandon()
    del dropped
    gc.collect()
    assert registry.held("agent-1") == {"run-0"}
    assert set(registry._leases["agent-1"]) == {"run-0", "run-2", "run-ttl"}, "lost and collected leases are forgotten"


def test_a_collected_lease_leaves_no_entry_behind_even_if_nobody_audits() -> None:
    registry = LeasesInUse()
    for n in range(100):
        registry.add(lease(f"run-{n}"))
    gc.collect()
    assert registry._leases["agent-1"] == {}


def test_a_newer_lease_replaces_an_older_one_and_its_collection_does_not_remove_it() -> None:
    registry = LeasesInUse()
    old = lease("run-1", fence=1)
    registry.add(old)
    new = lease("run-1", fence=2)
    registry.add(new)
    new.abandon()
    del old
    gc.collect()
    assert registry.held("agent-1") == set()
    new._abandoned = False
    assert registry.held("agent-1") == {"run-1"}


def test_a_create_or_acquire_on_its_way_counts_as_in_use() -> None:
    registry = LeasesInUse()
    with registry.expecting("agent-1", "run-1"):
        with registry.expecting("agent-1", "run-1"):
            assert registry.held("agent-1") == {"run-1"}
        assert registry.held("agent-1") == {"run-1"}
        assert registry.held("agent-2") == set()
    assert registry.held("agent-1") == set()
    assert not registry._expected
