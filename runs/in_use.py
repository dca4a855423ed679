"""The runs this process is working on right now: what its presence audit (``runs.audit``) checks Redis against.

With presence a run is held by its process, not by a lease that runs out, so a run the process stopped working on
without releasing it (the release met a Redis outage, or the work never started) would stay held while the process
lives. Redis cannot tell such a run from one in progress; only the process can, and this registry is how it knows.

A run counts as in use from the moment a create or an acquire for it is sent (``expecting``: the script may have
run before its reply arrives) until its lease object

- is lost (released, finished, taken over: ``RunLease.lost``),
- is abandoned (``RunLease.abandon``: a release that failed, or work that never started), or
- is garbage-collected (dropped without either: held by a weak reference only).

A later successful fenced write through an abandoned lease (a holder that carries on with it) makes it count again.
Process-local and cheap: no Redis, and the audit reads it once per ``PRESENCE_AUDIT_INTERVAL``.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runs.leases import RunLease

__all__ = ["LeasesInUse", "leases_in_use"]


class LeasesInUse:
    """Owner → thread id → the newest lease object taken for it here (weakly), plus creates/acquires in flight."""

    def __init__(self) -> None:
        self._leases: dict[str, dict[str, weakref.ref[RunLease]]] = {}
        self._expected: Counter[tuple[str, str]] = Counter()

    @contextmanager
    def expecting(self, owner: str, thread_id: str) -> Iterator[None]:
        """Count ``thread_id`` as in use while a create or acquire for it is on its way (and its lease not yet
        registered): an audit between the script and its reply must not take the run back."""
        entry = (owner, thread_id)
        self._expected[entry] += 1
        try:
            yield
        finally:
            self._expected[entry] -= 1
            if self._expected[entry] <= 0:
                del self._expected[entry]

    def add(self, lease: RunLease) -> None:
        """Register a lease just taken (it replaces an older lease object of the same run and owner)."""
        leases = self._leases.setdefault(lease.owner, {})
        thread_id = lease.thread_id

        def forget(ref: weakref.ref[RunLease]) -> None:
            # collected: its entry goes too, so a process that never audits (presence off) does not pile them up
            if leases.get(thread_id) is ref:
                del leases[thread_id]

        leases[thread_id] = weakref.ref(lease, forget)

    def held(self, owner: str) -> set[str]:
        """The runs ``owner`` holds by its presence and this process works on (plus those being created or
        acquired). Forgets leases that are no longer in use."""
        leases = self._leases.get(owner, {})
        in_use: set[str] = set()
        for thread_id, ref in list(leases.items()):
            lease = ref()
            if lease is None or lease.lost:
                if leases.get(thread_id) is ref:
                    del leases[thread_id]
            elif lease.held and lease.in_use:
                in_use.add(thread_id)
        in_use.update(thread_id for who, thread_id in self._expected if who == owner)
        return in_use


leases_in_use = LeasesInUse()
"""The process's registry: every ``RunStore`` registers its leases here unless given another (tests simulating
several processes in one)."""
