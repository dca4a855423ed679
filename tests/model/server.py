"""llama.cpp's server for the real-model test and bench: ``scripts/model_server.py serve`` on a free port, waited
for until ``/health`` answers, stopped at the end; or a server already up (its URL given)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.procs import free_port

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "model_server.py"
UNAVAILABLE = 3
"""``model_server.py fetch``'s exit code when a registry or the sha256 did not answer."""
START_S = 900.0
"""Loading and warming 491 MB on two busy cores."""


def alias(url: str) -> str:
    """The name the server answers to (model_server.py's alias): what ``LLM_MODEL`` says."""
    return str(httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"])


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def model_server(log: Path, given: str | None = None, start_s: float = START_S) -> Iterator[tuple[str, str]]:
    """(base URL, alias) of ``given``, or of a server started here (its output in ``log``) and stopped at the end;
    ``RuntimeError`` with the log's tail when it dies or does not answer within ``start_s``."""
    if given:
        url = given.rstrip("/")
        yield url, alias(url)
        return
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "serve", "--port", str(port)], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_s
        while not ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the model server at {url} did not start: {log.read_text()[-3000:]}")
            time.sleep(1)
        yield url, alias(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
