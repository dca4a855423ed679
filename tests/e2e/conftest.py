from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stack import CORE, SharedStacks, Stack

# Short enough for a test to watch a breaker recover, long enough to observe it open.
E2E_ENV = {
    "CONCIERGE_CIRCUITS": '{"hotel_api": {"recovery_timeout": 2.0}, "payment_api": {"recovery_timeout": 2.0}}',
    "BOOKING_BUDGET_S": "20",
}
SHARED_CORE = pytest.mark.xdist_group("shared-stack-core")
"""The mark of every module using ``stack``: they run on one worker, which starts the stack once."""


@pytest.fixture(scope="module")
def stack(shared_stack: SharedStacks) -> Stack:
    """The five services as real processes on a Postgres checkpointer, shared by the modules marked ``SHARED_CORE``
    (their tests book and read only their own bookings, and clear the faults they set)."""
    return shared_stack(CORE, E2E_ENV)


@pytest.fixture
def clean_faults(stack: Stack) -> Iterator[Stack]:
    yield stack
    for provider in ("hotel-api", "payment-api"):
        stack.fault(provider)
