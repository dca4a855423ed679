"""Real processes for a bench: the five services on free ports, and a bare FastAPI→FastAPI pair as a baseline.

    with ServiceStack(redis_url=..., admin_database_url=...) as stack:   # fresh database, unique key prefix
        stack.url("booking-agent"); stack.pids()                         # base URL; pid of every service
    with hop_pair() as hop:                                              # GET {hop.front}/hop makes one hop
        ...

Leaving either block kills every process it started (SIGTERM, then SIGKILL to the process group), drops the
database, deletes the Redis keys under the prefix and removes the log directory. Nothing here is imported by the
test suite, and nothing from ``tests/`` is imported here: a bench must not depend on test helpers.

The two ``hop_*_app`` factories are what ``hop_pair`` serves (``uvicorn --factory _stack:hop_front_app``); they
are as small as a FastAPI app gets, so a request to the front costs the framework and the loopback, nothing else.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import httpx

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "CORE_SERVICES",
    "DEFAULT_ADMIN_DATABASE_URL",
    "HOST",
    "BenchProcess",
    "BenchStackError",
    "HopPair",
    "ServiceStack",
    "cpu_seconds",
    "free_port",
    "fresh_database",
    "hop_backend_app",
    "hop_front_app",
    "hop_pair",
    "machine_cpu_seconds",
    "rss_kib",
]

HOST = "127.0.0.1"
DEFAULT_ADMIN_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CORE_SERVICES = ("hotel-api", "payment-api", "search-agent", "payment-agent", "booking-agent")
READY_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 10.0
HOP_TARGET_ENV = "BENCH_HOP_TARGET"
_BENCH_DIR = Path(__file__).resolve().parent


class BenchStackError(RuntimeError):
    """A bench process exited or never got ready (the message ends with the tail of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchStackError(f"process {pid} has no VmRSS (a zombie?)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (``/proc/<pid>/stat``, children not included)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        # the command name (field 2) may hold spaces; the fields after its closing parenthesis do not
        fields = stat.read().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all CPUs (``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def _concierge_command() -> list[str]:
    script = Path(sys.executable).with_name("concierge")
    return [str(script)] if script.exists() else [sys.executable, "-m", "infra.stack.cli"]


class BenchProcess:
    """One started process in its own process group, logging to its own file."""

    def __init__(self, name: str, argv: Sequence[str], *, port: int, env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.env = dict(env)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise BenchStackError(f"{self.name} was never started")
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self, path: str, timeout: float = READY_TIMEOUT_S) -> Self:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    raise BenchStackError(f"{self.name} exited before it was ready\n{self.log_tail()}")
                try:
                    response = client.get(f"{self.url}{path}")
                    if response.status_code == 200:
                        return self
                    last = f"{response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.1)
        raise BenchStackError(f"{self.name} not ready after {timeout:.0f}s ({last})\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it if it is still there after ``STOP_TIMEOUT_S``."""
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=STOP_TIMEOUT_S)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return f"(no log at {self.log_path})"
        tail = text.splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.name} ---\n" + "\n".join(tail)


@contextlib.contextmanager
def fresh_database(admin_url: str = DEFAULT_ADMIN_DATABASE_URL) -> Iterator[str]:
    """A new, empty database on the server of ``admin_url``; dropped (connections forced out) afterwards."""
    import psycopg

    name = f"concierge_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _delete_prefixed_keys(redis_url: str, prefix: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        deleted = 0
        batch: list[bytes] = []
        for name in client.scan_iter(match=f"{prefix}:*", count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                deleted += int(client.unlink(*batch))
                batch.clear()
        if batch:
            deleted += int(client.unlink(*batch))
        return deleted
    finally:
        client.close()


class ServiceStack:
    """The five services as real ``concierge serve`` processes on one fresh database and one key prefix."""

    def __init__(
        self,
        *,
        redis_url: str,
        admin_database_url: str = DEFAULT_ADMIN_DATABASE_URL,
        services: Sequence[str] = CORE_SERVICES,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.admin_database_url = admin_database_url
        self.services = tuple(services)
        self.prefix = f"bench-{uuid.uuid4().hex[:10]}"
        self.token = secrets.token_hex(16)
        self.ports = {name: free_port() for name in self.services}
        self.workdir = Path(tempfile.mkdtemp(prefix="concierge-bench-"))
        self.extra_env = dict(env or {})
        self.database_url = ""
        self.processes: dict[str, BenchProcess] = {}
        self._exit = contextlib.ExitStack()

    def url(self, service: str) -> str:
        return f"http://{HOST}:{self.ports[service]}"

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.processes.items()}

    def _env(self) -> dict[str, str]:
        from infra.stack.services import SERVICES

        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "REDIS_URL": self.redis_url,
            "DATABASE_URL": self.database_url,
            "CONCIERGE_KEY_PREFIX": self.prefix,
            "CONCIERGE_SERVICE_TOKEN": self.token,
            "CONCIERGE_DATA_DIR": str(self.workdir / "data"),
            **{SERVICES[name].url_env: self.url(name) for name in self.services},
            **self.extra_env,
        }

    def start(self) -> Self:
        try:
            self.database_url = self._exit.enter_context(fresh_database(self.admin_database_url))
            env = self._env()
            for name in self.services:
                argv = [*_concierge_command(), "serve", name, "--host", HOST, "--port", str(self.ports[name])]
                proc = BenchProcess(name, argv, port=self.ports[name], env=env, log_path=self.workdir / f"{name}.log")
                self.processes[name] = proc.start()
                # dependencies first: an agent's readiness does not probe its peers, but its first request will
                proc.wait_ready("/health/ready")
        except BaseException:
            self.close()
            raise
        return self

    def log_tails(self) -> str:
        return "\n".join(proc.log_tail() for proc in self.processes.values())

    def close(self) -> None:
        try:
            for proc in reversed(list(self.processes.values())):
                proc.stop()
        finally:
            try:
                self._exit.close()  # drops the database once nothing is connected to it
            finally:
                with contextlib.suppress(Exception):
                    _delete_prefixed_keys(self.redis_url, self.prefix)
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --------------------------------------------------------------------------------------------- bare hop baseline


def hop_backend_app() -> FastAPI:
    """Answers ``GET /pong`` with a small JSON body."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/pong")
    async def pong() -> dict[str, bool]:
        return {"pong": True}

    return app


def hop_front_app() -> FastAPI:
    """``GET /hop`` calls the backend (``$BENCH_HOP_TARGET``) once over a pooled httpx client."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    target = os.environ[HOP_TARGET_ENV]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with httpx.AsyncClient(base_url=target) as client:
            app.state.client = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/hop")
    async def hop() -> Any:
        response = await app.state.client.get("/pong")
        response.raise_for_status()
        return response.json()

    return app


@dataclass(frozen=True)
class HopPair:
    front: str
    """``GET {front}/hop`` makes one hop to the backend."""
    backend: str
    """``GET {backend}/pong`` answers directly (no hop)."""
    pids: tuple[int, int]
    """(front, backend)"""


@contextlib.contextmanager
def hop_pair() -> Iterator[HopPair]:
    """Two uvicorn processes, front → backend; yields their base URLs. Both stopped on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="concierge-bench-hop-"))
    backend_port, front_port = free_port(), free_port()
    env = {**os.environ, HOP_TARGET_ENV: f"http://{HOST}:{backend_port}"}

    def uvicorn(factory: str, port: int) -> list[str]:
        # the same server stack as the services (uvicorn's defaults pick uvloop and httptools when installed)
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            f"_stack:{factory}",
            "--app-dir",
            str(_BENCH_DIR),
            "--host",
            HOST,
            "--port",
            str(port),
            "--lifespan",
            "on",
        ]

    started: list[BenchProcess] = []
    try:
        for name, factory, port in (
            ("hop-backend", "hop_backend_app", backend_port),
            ("hop-front", "hop_front_app", front_port),
        ):
            proc = BenchProcess(name, uvicorn(factory, port), port=port, env=env, log_path=workdir / f"{name}.log")
            started.append(proc.start())
            proc.wait_ready("/health")
        yield HopPair(front=started[1].url, backend=started[0].url, pids=(started[1].pid, started[0].pid))
    finally:
        for proc in reversed(started):
            proc.stop()
        shutil.rmtree(workdir, ignore_errors=True)
