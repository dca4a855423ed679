"""The timeout budget across real processes: a slow hotel-api cannot make a booking outlive BOOKING_BUDGET_S."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import Stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tight_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("tight")
    with Stack(tmp, redis_url, env={"BOOKING_BUDGET_S": "2"}) as stack:
        stack.start()
        yield stack


def test_slow_hotel_api_fails_the_booking_with_timeout_at_the_budget(tight_stack: Stack) -> None:
    stack = tight_stack
    stack.fault("hotel-api", latency_s=5.0)
    try:
        started = time.monotonic()
        booking = stack.wait(stack.book()["booking_id"])
        elapsed = time.monotonic() - started
    finally:
        stack.fault("hotel-api")

    assert booking["status"] == "failed"
    assert booking["error"]["code"] == "timeout"
    # each attempt takes a share of what is left (CALL_SHARES), the retries run until the next one cannot fit: the
    # booking spends most of its 2 s, never more: "timeout" (not the 5 s answer of hotel-api) says it stopped at it
    assert elapsed > 1.0, f"expected the booking to spend most of its 2 s, took {elapsed:.2f}s"

    time.sleep(0.3)
    search_node = [
        s
        for s in stack.spans("booking-agent")
        if s["name"] == "node search" and s["attributes"].get("langgraph.thread_id") == booking["booking_id"]
    ]
    assert search_node, "booking-agent traced its search node"
    started_with = search_node[0]["attributes"]["concierge.budget_remaining_s"]
    assert started_with <= 2.0
    received = [
        s["attributes"]["concierge.budget_remaining_s"]
        for s in stack.spans("search-agent")
        if s["name"] == "node validate" and s["trace_id"] == search_node[0]["trace_id"]
    ]
    assert received, "search-agent ran its graph inside the booking's trace"
    assert 0 < received[0] < started_with, "search-agent got less than booking-agent had"
