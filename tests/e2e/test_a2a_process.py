"""An agent in its own uvicorn process: budget, trace context and cancellation cross a real process boundary.

In-process tests share globals with the server; here nothing is shared but the HTTP request, so whatever the
handler sees it learned from the headers.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider

from infra.a2a import AGENT_CARD_PATH, A2ASkillError, A2ATimeoutError
from infra.a2a.client import A2AClient
from infra.settings import get_settings
from resilience import budget_scope
from tests.conftest import free_port

pytestmark = pytest.mark.e2e

SECRET = "a2a-e2e-secret-" + "0123456789abcdef" * 2
ROOT = Path(__file__).resolve().parents[2]

AGENT = textwrap.dedent(
    """
    import asyncio, os, sys
    from pathlib import Path

    import uvicorn
    from fastapi import FastAPI
    from opentelemetry import trace

    from infra.a2a.server import Skill, mount_a2a
    from resilience import remaining_budget

    port, marker = int(sys.argv[1]), Path(sys.argv[2])

    async def whoami(data):
        span = trace.get_current_span().get_span_context()
        return {"pid": os.getpid(), "budget": remaining_budget(), "trace_id": f"{span.trace_id:032x}"}

    async def slow(data):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            marker.write_text("cancelled")
            raise
        marker.write_text("finished")
        return {}

    app = FastAPI(telemetry={"tracing": False})
    mount_a2a(
        app,
        name="e2e-agent",
        description="An agent in another process.",
        url=f"http://127.0.0.1:{port}",
        skills=[Skill("whoami", "Who am I", "What the handler saw.", whoami), Skill("slow", "Slow", "5 s.", slow)],
        bulkhead="e2e_agent",
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
    """
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    port = free_port()
    marker = tmp_path_factory.mktemp("a2a") / "slow-handler"
    env = {**os.environ, "CONCIERGE_SERVICE_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", AGENT, str(port), str(marker)], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}{AGENT_CARD_PATH}", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"agent process did not start (exit code {proc.poll()})")
            time.sleep(0.05)
        yield url, marker
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
async def client(monkeypatch: pytest.MonkeyPatch, agent: tuple[str, Path]) -> AsyncIterator[A2AClient]:
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", SECRET)
    get_settings.cache_clear()
    try:
        async with A2AClient(agent[0], audience="e2e-agent", issuer="booking-agent") as c:
            yield c
    finally:
        get_settings.cache_clear()


async def test_budget_and_trace_reach_a_handler_in_another_process(client: A2AClient) -> None:
    tracer = TracerProvider().get_tracer("e2e")
    with tracer.start_as_current_span("caller") as root, budget_scope(3.0):
        seen = await client.call("whoami", {})
    assert seen["pid"] != os.getpid()
    assert seen["trace_id"] == f"{root.get_span_context().trace_id:032x}"
    assert 2.0 < seen["budget"] < 3.0


async def test_the_remote_handler_stops_when_the_budget_ends(client: A2AClient, agent: tuple[str, Path]) -> None:
    marker = agent[1]
    with budget_scope(0.5), pytest.raises(A2ATimeoutError):  # a handler waited out would have answered
        await client.call("slow", {})
    # the handler's own budget ends a margin before ours: wait (generously, a loaded machine) for what it recorded,
    # read once written whole (the file exists a moment before its text is in it)
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline, "the handler recorded nothing"
        await asyncio.sleep(0.05)
    assert marker.read_text() == "cancelled"


async def test_an_unknown_skill_is_reported_across_processes(client: A2AClient) -> None:
    with pytest.raises(A2ASkillError) as info:
        await client.call("nope", {})
    assert info.value.code == "unknown_skill"
