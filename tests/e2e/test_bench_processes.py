"""The benches start their processes with the test harness: nothing runs the benches in CI, so these check that
what they start still starts (``python -m bench.<name>`` from the repository root)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench._stack import hop_pair
from tests.procs import serve_in_thread

pytestmark = pytest.mark.e2e


def test_hop_pair_serves_the_bench_apps_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the uvicorn processes import ``bench._stack`` from the repository root (``--app-dir``), not from the cwd
    monkeypatch.chdir(tmp_path)
    with hop_pair() as pair:
        assert httpx.get(f"{pair.backend}/pong").json() == {"pong": True}
        hop = httpx.get(f"{pair.front}/hop").json()
        assert hop["pong"] is True
        assert hop["hop_s"] > 0


def test_serve_in_thread_answers_synchronous_callers_and_stops() -> None:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    with serve_in_thread(Starlette(routes=[Route("/echo", echo)])) as url:
        assert httpx.get(f"{url}/echo").json() == {"path": "/echo"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/echo")
