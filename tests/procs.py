"""Real service processes for tests: start, wait until ready, kill -9 or SIGTERM, and always clean up.

Typical fixture::

    @pytest.fixture
    def procs(tmp_path, redis_url, key_prefix):
        with Processes(tmp_path, env={"REDIS_URL": redis_url, "CONCIERGE_KEY_PREFIX": key_prefix}) as procs:
            yield procs

    def test_x(procs):
        hotel = procs.serve("hotel-api")              # concierge serve hotel-api --port <free>; waits for ready
        httpx.get(f"{hotel.url}/hotels?...", auth=ProviderAuth("hotel-api", secret))  # tests.stack
        hotel.kill()                                  # SIGKILL to its process group
        hotel = procs.serve("hotel-api", port=hotel.port)

Each process gets its own process group (so a kill reaches anything it started) and its own log file under the
given directory; readiness is ``GET <ready_path>`` answering 200, and a process that dies or never gets ready
fails the test with the tail of its log. Leaving the ``Processes`` block kills whatever is still running, and an
``atexit`` hook does the same if the test run itself is torn down.

``serve_in_process(app)`` is the in-process variant (uvicorn in the test's event loop) for integration tests
that need a real socket but not a separate process (client timeouts, disconnects); ``serve_in_thread(app)`` is the
same for synchronous code (uvicorn on a thread of its own).

The benches (``python -m bench.<name>``) start their processes with this module too.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import uvicorn

from infra.service.server import server_options

__all__ = [
    "Processes",
    "ServiceNotReadyError",
    "ServiceProcess",
    "concierge_command",
    "concierge_env",
    "free_port",
    "serve_in_process",
    "serve_in_thread",
    "uvicorn_command",
]

HOST = "127.0.0.1"
# Where ``tests`` (and ``bench``) are importable from: ``--app-dir`` of the uvicorn processes started here.
REPO_ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 40

_live: set[ServiceProcess] = set()


class ServiceNotReadyError(AssertionError):
    """The process exited or did not answer its readiness probe in time (message ends with its log tail)."""


_issued_ports: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, never the same twice in this test run.

    The OS may hand a just-closed ephemeral port out again at once, so several ports picked before any service binds
    them could collide; remembering what was issued rules that out.
    """
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in _issued_ports:
            _issued_ports.add(port)
            return port


def free_port_block(span: int) -> int:
    """A base port with ``span`` free ports from it (checked by binding each, as ``up`` does), below Linux's
    ephemeral range (32768 and up), where any process's outgoing connection could take one before a service binds.
    Each pytest-xdist worker draws from a slice of its own, so two workers' stacks never share a port."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    width = (32_768 - 20_000) // workers
    low = 20_000 + width * worker
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, low + width - span)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + span):
                sock = socket.socket()
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((HOST, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError(f"no block of {span} free ports found")


def stack_port_base(scale: Mapping[str, int] | None = None) -> int:
    """A ``--port-base`` for ``concierge up --scale ...``: a free block as wide as the stack it plans (the table's
    ports, the extra replicas after them, then the fronts), so no port ``up`` derives can be someone else's."""
    from stack.layout import DEFAULT_PORT_BASE, plan_fronts, plan_instances

    instances = plan_instances(scale=scale)
    ports = [i.port for i in instances] + [f.port for f in plan_fronts(instances)]
    return free_port_block(max(ports) - DEFAULT_PORT_BASE + 1)


def concierge_command() -> list[str]:
    """The ``concierge`` console script of this interpreter's environment (``python -m`` when not installed)."""
    script = Path(sys.executable).with_name("concierge")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stack.cli"]


_GENERATED_BY_UP = ("DATABASE_URL", "CONCIERGE_SERVICE_SECRET", "CONCIERGE_ADMIN_TOKEN", "CONCIERGE_ALLOWED_HOSTS")


def concierge_env(data_dir: Path, redis_url: str, *, prefix: str, **settings: str) -> dict[str, str]:
    """The environment of a ``concierge up`` a test runs: this process's, without what ``up`` generates or defaults
    (secrets, SQLite checkpoints) or a developer's allowed hosts, with this test's Redis, key prefix, data directory
    and ``settings``."""
    env = {key: value for key, value in os.environ.items() if key not in _GENERATED_BY_UP}
    return env | {
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": f"{prefix}-{uuid.uuid4().hex[:10]}",
        "CONCIERGE_DATA_DIR": str(data_dir),
        "PYTHONUNBUFFERED": "1",
        **settings,
    }


def uvicorn_command(app: str, *, factory: bool = False, access_log: bool = True) -> list[str]:
    """``python -m infra.service.server <module:app>`` on ``HOST`` (no port), ``app`` imported from the repository root.

    The server every service runs on, with its bounds (infra/service/server.py), as ``concierge serve`` starts it.
    """
    argv = [sys.executable, "-m", "infra.service.server", app, "--app-dir", str(REPO_ROOT), "--host", HOST]
    if factory:
        argv.append("--factory")
    if not access_log:
        argv.append("--no-access-log")
    return argv


class ServiceProcess:
    """One started process. ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        env: Mapping[str, str],
        log_path: Path,
        ready_path: str = "/health/ready",
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.env = dict(env)
        self.log_path = log_path
        self.ready_path = ready_path
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self._popen().pid

    @property
    def returncode(self) -> int | None:
        return self._popen().poll()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _popen(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._proc

    def start(self) -> Self:
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self)
        return self

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> Self:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=1.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    raise ServiceNotReadyError(
                        f"{self.name} exited with {self.returncode} before it was ready\n{self.log_tail()}"
                    )
                try:
                    response = client.get(f"{self.url}{self.ready_path}")
                    if response.status_code == 200:
                        return self
                    last = f"{response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(0.1)
        raise ServiceNotReadyError(f"{self.name} not ready after {timeout:.0f}s ({last})\n{self.log_tail()}")

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        """``kill -9`` the process group; returns once the process is gone."""
        if self._proc is None:
            return
        self._signal_group(signal.SIGKILL)
        self._proc.wait(timeout=STOP_TIMEOUT_S)
        _live.discard(self)

    def terminate(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait for a graceful exit; SIGKILL (and ``TimeoutError``) if it takes longer."""
        proc = self._popen()
        self._signal_group(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self.name} ignored SIGTERM for {timeout:.0f}s\n{self.log_tail()}") from None
        _live.discard(self)
        return code

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        tail = self.log_text().splitlines()[-lines:]
        return f"--- last {len(tail)} lines of {self.log_path} ---\n" + "\n".join(tail)


class Processes:
    """Starts services for one test and stops every one of them when the block ends, even on failure."""

    def __init__(self, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.started: list[ServiceProcess] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/health/ready",
        wait: bool = True,
        timeout: float = READY_TIMEOUT_S,
    ) -> ServiceProcess:
        """Start ``argv`` (which must listen on ``port``); wait for ``ready_path`` unless ``wait=False``."""
        log_path = self.log_dir / f"{name}-{len(self.started)}.log"
        proc = ServiceProcess(
            name, argv, port=port, env={**self.env, **(env or {})}, log_path=log_path, ready_path=ready_path
        )
        self.started.append(proc.start())
        return proc.wait_ready(timeout) if wait else proc

    def serve(
        self,
        service: str,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = READY_TIMEOUT_S,
    ) -> ServiceProcess:
        """``concierge serve <service> --port <port or a free one>``."""
        port = port or free_port()
        argv = [*concierge_command(), "serve", service, "--host", HOST, "--port", str(port)]
        return self.start(service, argv, port=port, env=env, wait=wait, timeout=timeout)

    def uvicorn(
        self,
        app: str,
        *,
        factory: bool = False,
        access_log: bool = True,
        name: str | None = None,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        ready_path: str = "/health/ready",
        wait: bool = True,
        timeout: float = READY_TIMEOUT_S,
    ) -> ServiceProcess:
        """``python -m infra.service.server <module:app> --port <port>`` for an app not in the service table.

        ``app`` is imported from the repository root (``--app-dir``), whatever the working directory:
        ``tests.some_module:app`` or ``bench._stack:hop_front_app`` (``factory=True``: a function returning the app).
        """
        port = port or free_port()
        argv = [*uvicorn_command(app, factory=factory, access_log=access_log), "--port", str(port)]
        return self.start(name or app, argv, port=port, env=env, ready_path=ready_path, wait=wait, timeout=timeout)

    def close(self) -> None:
        for proc in reversed(self.started):
            if proc.alive:
                proc.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_live):
        if proc.alive:
            proc.kill()


@contextlib.asynccontextmanager
async def serve_in_process(app: Any, *, port: int | None = None) -> AsyncIterator[str]:
    """Run an ASGI app under uvicorn in this event loop (lifespan on); yields its base URL."""
    # log_config=None: uvicorn leaves logging alone (its handlers would keep a stale captured stderr)
    config = uvicorn.Config(app, host=HOST, port=port or free_port(), log_config=None, **server_options())
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("uvicorn stopped before it started")
            await asyncio.sleep(0.01)
        yield f"http://{HOST}:{config.port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=STOP_TIMEOUT_S)
        except TimeoutError:
            server.force_exit = True
            await task


@contextlib.contextmanager
def serve_in_thread(app: Any, *, port: int | None = None, timeout: float = READY_TIMEOUT_S) -> Iterator[str]:
    """``serve_in_process`` for synchronous callers: uvicorn in a daemon thread with its own event loop."""
    config = uvicorn.Config(
        app, host=HOST, port=port or free_port(), log_config=None, access_log=False, **server_options()
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{config.port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn stopped before it started")
            if time.monotonic() > deadline:
                raise ServiceNotReadyError(f"uvicorn on port {config.port} not started after {timeout:.0f}s")
            time.sleep(0.01)
        yield f"http://{HOST}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=STOP_TIMEOUT_S)
