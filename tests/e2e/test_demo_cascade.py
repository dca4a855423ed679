"""``concierge demo cascade`` on real processes: the story it tells, with the layers on and off.

A short booking budget and a search breaker that opens after 5 failures and probes after 3 s, so the whole story
(failures counted, open, slots freed, half-open, closed, goodput back) fits in a CI-sized run.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import concierge_command
from tests.stack import CORE, Stack, fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENV = {
    "BOOKING_BUDGET_S": "8",
    # a fixed door: the adaptive one probes its floor and, on a CPU-bound CI machine, settles below 4 runs, so the
    # clients' refusals (not the breaker) would decide the goodput after the fault (the overload demo's subject)
    "BOOKING_MAX_IN_FLIGHT": "20",
    "CONCIERGE_CIRCUITS": json.dumps({"search_agent": {"failure_threshold": 5, "recovery_timeout": 3.0}}),
}
# goodput "back" at half the calm's: a shared CI machine's CPU swings more than the demo's default 10% in a minute
DEMO = ("demo", "cascade", "--clients", "4", "--calm-s", "5", "--fault-s", "14", "--recover-s", "30")
DEMO += ("--back-at", "0.5")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("demo")
    with fresh_database() as database_url, Stack(tmp, redis_url, database_url=database_url, env=ENV) as stack:
        for service in CORE:  # together, each given room for a busy machine's imports
            stack.serve(service, wait=False)
        for service in CORE:
            stack.services[service].wait_ready(timeout=120)
        yield stack


def demo(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *DEMO, *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_with_the_layers_the_breaker_opens_frees_the_slots_probes_and_closes(stack: Stack) -> None:
    run = demo(stack)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    story = [
        "search-agent is slow now",
        "breaker counted",
        "breaker OPEN after",
        "slots freed: 0 searches in flight",
        "fault cleared",
        "breaker CLOSED again",
        "goodput back",
    ]
    positions = [out.find(line) for line in story]
    assert -1 not in positions, out
    assert positions == sorted(positions), out  # told in the order it happened
    # the probe that closed it came in half-open (earlier probes, while still slow, may have failed)
    assert -1 < out.rfind("breaker HALF-OPEN") < out.find("breaker CLOSED again"), out
    assert stack.admin("GET", "search-agent", "faults").json() == {"latency_s": 0.0, "hang": False}


def test_with_the_layers_off_nothing_opens_and_the_layers_come_back(stack: Stack) -> None:
    run = demo(stack, "--layers", "off")
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "layers switched off" in out and out.rstrip().endswith("layers back on"), out
    assert "breaker OPEN" not in out and "slots freed" not in out, out
    for service in ("booking-agent", "search-agent", "payment-agent"):
        assert stack.http.get(f"{stack.url(service)}/health").json()["vitals"]["layers"] == "on"
    assert stack.admin("GET", "search-agent", "faults").json() == {"latency_s": 0.0, "hang": False}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--clients", "0"), "--clients must be between 1 and 200, got 0"),
        (("--back-at", "2"), "--back-at must be between 0.1 and 1, got 2"),
        (("--back-at", "half"), "--back-at must be a number, got 'half'"),
    ],
)
def test_bad_options_are_one_line_usage_errors(stack: Stack, args: tuple[str, ...], said: str) -> None:
    run = subprocess.run(
        [*concierge_command(), "demo", "cascade", *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == f"concierge demo: {said}", run.stderr


def test_the_console_button_runs_the_demo_streams_it_and_stops_it(stack: Stack) -> None:
    import httpx

    from tests.procs import free_port

    stack.ports["console"] = free_port()
    stack.serve("console", wait=False).wait_ready(timeout=120)
    url = stack.url("console")
    headers = {"X-Concierge-Console": "1"}
    assert (
        stack.console.post(f"{url}/api/demo/cascade", json={"layers": "sideways"}, headers=headers).status_code == 422
    )
    started = stack.console.post(f"{url}/api/demo/cascade", json={"layers": "on"}, headers=headers, timeout=10)
    assert started.status_code == 202, started.text
    again = stack.console.post(f"{url}/api/demo/cascade", json={}, headers=headers, timeout=10)
    assert again.status_code >= 400 and "running already" in again.text
    lines: list[str] = []
    end: str | None = None
    with stack.console.stream("GET", f"{url}/api/demo/stream", timeout=httpx.Timeout(10, read=120)) as response:
        event = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:"):
                data = line.partition(":")[2].strip()
                if event == "end":
                    end = data
                    break
                lines.append(data)
                if "search-agent is slow now" in data:
                    assert stack.console.delete(f"{url}/api/demo", headers=headers, timeout=30).status_code == 200
            elif not line:
                event = None
    text = "\n".join(lines)
    assert text.startswith("demo cascade · layers on"), text
    assert end is not None and json.loads(end)["exit_code"] is not None, (end, text)
    # stopped mid-fault: the demo's own finally cleared it
    assert stack.admin("GET", "search-agent", "faults").json() == {"latency_s": 0.0, "hang": False}
