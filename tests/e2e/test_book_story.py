"""``concierge book`` tells the story while it happens, also while the booking-agent it follows is dead.

booking-agent is killed while the charge waits at payment-api and held down; the recovery worker resumes the run
and finishes it meanwhile. The terminal must show the owner lost, the resume and the outcome before booking-agent
is back (read from the journal in Redis), each line stamped with the entry's own time, not the time it was printed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.test_chaos import CHAOS_ENV
from tests.procs import concierge_command
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

READY_TIMEOUT_S = 120.0
CHARGE_IN_FLIGHT_S = 1.5
LINE = re.compile(r"^\s+\+(\d+\.\d\d) s\s+(.*)$")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("book-story")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=CHAOS_ENV) as stack:
        for service in (*CORE, "recovery-worker"):
            stack.serve(service, wait=False)
        for service in (*CORE, "recovery-worker"):
            stack.services[service].wait_ready(timeout=READY_TIMEOUT_S)
        yield stack


def reader(stream: object, lines: queue.Queue[tuple[float, str]]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put((time.time(), line))


def test_book_tells_the_recovery_while_booking_agent_is_down_with_each_entrys_own_time(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=3.0)
    checkin, _ = stay(days_ahead=260)
    booking = subprocess.Popen(
        [*concierge_command(), "book", "--city", "Porto", "--checkin", checkin, "--timeout", "90"],
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert booking.stdout is not None
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(target=reader, args=(booking.stdout, lines), daemon=True).start()
    seen: list[tuple[float, str]] = []

    def until(pattern: str, within: float) -> None:
        deadline = time.monotonic() + within
        while not any(pattern in line for _, line in seen):
            assert time.monotonic() < deadline, (pattern, "".join(line for _, line in seen))
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=max(0.01, deadline - time.monotonic())))

    try:
        until("paying", 60)
        time.sleep(CHARGE_IN_FLIGHT_S)
        stack.services["booking-agent"].kill()
        stack.fault("payment-api")
        until("  confirmed\n", 60)  # written by the recovery worker, read from Redis
        assert not stack.services["booking-agent"].alive
    finally:
        stack.fault("payment-api")
        stack.serve("booking-agent", wait=False).wait_ready(timeout=READY_TIMEOUT_S)
    rest, _ = booking.communicate(timeout=90)
    output = "".join(line for _, line in seen) + rest
    assert booking.returncode == 0, output
    assert "following the journal in Redis" in output, output
    stamped = {m.group(2): float(m.group(1)) for line in output.splitlines() if (m := LINE.match(line))}
    lost = next(k for k in stamped if "lost (presence gone)" in k)
    resumed = next(k for k in stamped if "resumed at charge" in k)
    assert stamped[lost] <= stamped[resumed], output
    for status in ("pending", "searching", "reserving", "paying", "confirmed"):
        assert f"s  {status}\n" in output, (status, output)
    # each line carries its entry's own time: the gaps between lines are the gaps between the journal's entries
    booking_id = output.split()[1].rstrip(":")
    journal = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events").json()["events"]
    at = {e["kind"]: datetime.fromisoformat(e["at"]).timestamp() for e in journal}
    assert abs((stamped[resumed] - stamped[lost]) - (at["resumed"] - at["owner_lost"])) < 0.02, output
    assert abs((stamped["confirmed"] - stamped["pending"]) - (at["confirmed"] - at["accepted"])) < 0.02, output
