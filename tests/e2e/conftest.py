from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack, fresh_database

# Short enough for a test to watch a breaker recover, long enough to observe it open.
E2E_ENV = {
    "CONCIERGE_CIRCUITS": '{"hotel_api": {"recovery_timeout": 2.0}, "payment_api": {"recovery_timeout": 2.0}}',
    "BOOKING_BUDGET_S": "20",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    """The five services as real processes on a Postgres checkpointer, shared by a module's tests."""
    tmp: Path = tmp_path_factory.mktemp("stack")
    with fresh_database() as database_url, Stack(tmp, redis_url, database_url=database_url, env=E2E_ENV) as stack:
        stack.start()
        yield stack


@pytest.fixture
def clean_faults(stack: Stack) -> Iterator[Stack]:
    yield stack
    for provider in ("hotel-api", "payment-api"):
        stack.fault(provider)
