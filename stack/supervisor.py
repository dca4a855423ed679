"""The supervisor behind ``concierge up``: runs every instance as a child process and keeps it running.

::

    lock <data dir>  ─▶  control socket  ─▶  fronts of scaled services  ─▶  own redis-server? (wait PING)
        ─▶  every instance at once
        ─▶  wait for each /health/ready  ─▶  "all services ready"  ─▶  supervise until Ctrl-C / SIGTERM / `down`
        ─▶  stop in reverse table order: SIGTERM, SIGKILL after the grace period  ─▶  redis last

Each child runs ``concierge serve <service> --port P`` in its own session (a kill reaches its whole process
group; a terminal's Ctrl-C reaches only the supervisor, which stops the children in order) and writes to its own
log file. A child that exits on its own after start-up is restarted after a backoff (``RestartPolicy``); one that
exits *during* start-up fails ``up``: a crash loop there is a configuration error to report, not to retry.
``kill``/``stop``/``start`` arrive on the control socket; ``stop`` and ``kill --no-restart`` hold an instance down
until ``start``. A scaled service's front (``stack.balancer``) sends new connections only to its replicas that are
up: ready once, and their process still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO

import httpx
from redis.asyncio import Redis

from infra.bookings import BookingStore
from infra.redis import create_redis
from infra.settings import get_settings
from stack.balancer import Balancer
from stack.console import render_stack
from stack.control import MAX_MESSAGE_BYTES, decode, encode
from stack.errors import ControlError, PortInUseError, StackAlreadyRunningError, StackError, StartupError
from stack.layout import Front, Instance, connect_host, select_instances
from stack.logstream import LogStreamer, last_line
from stack.redis_server import RedisPlan, redact, redis_reachable, redis_server_argv, redis_server_config
from stack.services import SERVICES, UnknownServiceError
from stack.state import InstanceState, RedisState, StackPaths, StackSecrets, StackState, write_secrets, write_state

__all__ = [
    "DEFAULT_GRACE_S",
    "DEFAULT_READY_TIMEOUT_S",
    "RestartPolicy",
    "Supervisor",
    "SupervisorConfig",
    "child_env",
    "describe_exit",
]

logger = logging.getLogger(__name__)

DEFAULT_GRACE_S = 20.0
"""SIGTERM → SIGKILL. A booking-agent drains its runs (up to 10 s) inside uvicorn's graceful shutdown."""
DEFAULT_READY_TIMEOUT_S = 60.0
REDIS_READY_TIMEOUT_S = 10.0
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 1.0
IN_FLIGHT_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff before restarting a crashed child: ``initial_s × factor^(n-1)``, capped, for the n-th crash in a
    row; a child that ran ``stable_after_s`` before crashing starts the count again."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 10.0
    stable_after_s: float = 30.0

    def delay(self, crashes_in_a_row: int) -> float:
        return min(self.max_s, self.initial_s * self.factor ** max(0, crashes_in_a_row - 1))

    def crashes_in_a_row(self, previous: int, ran_s: float) -> int:
        return 1 if ran_s >= self.stable_after_s else previous + 1


@dataclass(frozen=True)
class SupervisorConfig:
    paths: StackPaths
    instances: tuple[Instance, ...]
    redis: RedisPlan
    command: tuple[str, ...]
    """How to run ``concierge`` (``serve`` and its arguments are appended)."""
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    host: str = "127.0.0.1"
    grace_s: float = DEFAULT_GRACE_S
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    restart: RestartPolicy = RestartPolicy()
    echo_logs: bool = False
    """Foreground: stream every child's log lines to stdout, prefixed with its name."""
    checkpointer: str = ""
    secrets: StackSecrets = field(default_factory=StackSecrets.generate)
    """Every child's ``CONCIERGE_SERVICE_SECRET``, ``CONCIERGE_ADMIN_TOKEN`` and ``LLM_API_KEY``; kept in
    ``secrets.json`` (0600)."""
    fronts: tuple[Front, ...] = ()
    """One per scaled service (``layout.plan_fronts``): what its peers' ``*_URL`` name."""


def describe_exit(code: int | None) -> str:
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def child_env(config: SupervisorConfig) -> dict[str, str]:
    """What every child sees: the caller's environment, with the stack's Redis, data dir, secrets and peer URLs."""
    env = dict(config.base_env)
    env.update(config.secrets.env())
    # One id per process is minted at spawn: replicas sharing an id would share lease ownership.
    env.pop("CONCIERGE_INSTANCE_ID", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["REDIS_URL"] = config.redis.url
    env["CONCIERGE_DATA_DIR"] = str(config.paths.root)
    host = connect_host(config.host)
    for spec in SERVICES.values():
        front = next((f for f in config.fronts if f.service == spec.name), None)
        first = next((i for i in config.instances if i.service == spec.name), None)
        if front is not None:
            env[spec.url_env] = front.url(host)
        elif first is not None:
            env[spec.url_env] = first.url(host)
    return env


class _Child:
    """One supervised process slot and the incarnations it goes through."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        probe: Callable[[], Awaitable[bool]],
        instance: Instance | None = None,
        url: str = "",
        stdin: bytes | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.stdin = stdin
        """Written to each process's stdin, then closed (our redis-server's config: what no argv may show)."""
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.probe = probe
        self.instance = instance
        self.proc: asyncio.subprocess.Process | None = None
        self.status = "starting"
        self.restarts = 0
        self.crashes = 0
        self.held = False
        self.started_at: float | None = None
        self.started_mono = 0.0
        self.last_exit: int | None = None
        self.ready = asyncio.Event()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.returncode is None else None

    def state(self) -> InstanceState:
        assert self.instance is not None
        instance = self.instance
        return InstanceState(
            name=self.name,
            service=instance.service,
            replica=instance.replica,
            port=instance.port,
            url=self.url,
            health_path=instance.spec.health_path,
            ready_path=instance.spec.ready_path,
            status=self.status,
            pid=self.pid,
            restarts=self.restarts,
            started_at=self.started_at if self.pid is not None else None,
            last_exit=self.last_exit,
        )


async def _hand_over(stdin: asyncio.StreamWriter, data: bytes) -> None:
    """``data`` to a new child's stdin, then EOF; a child that died first is the supervision loop's to report."""
    with contextlib.suppress(ConnectionError):
        stdin.write(data)
        await stdin.drain()
    stdin.close()
    with contextlib.suppress(ConnectionError):
        await stdin.wait_closed()


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class Supervisor:
    """Run with ``await Supervisor(config).run()``; returns the process exit code."""

    def __init__(self, config: SupervisorConfig, *, out: TextIO | None = None) -> None:
        self.config = config
        self.paths = config.paths
        self._out = out or sys.stdout
        self._phase = "starting"
        self._error: str | None = None
        self._started_at = time.time()
        self._started_mono = time.monotonic()
        self._ready_after: float | None = None
        self._stopping = False
        self._closing = False
        self._force = False
        self._stop_requested = asyncio.Event()
        self._dirty = asyncio.Event()
        self._startup_failure: asyncio.Future[str] | None = None
        self._http = httpx.AsyncClient(timeout=PROBE_TIMEOUT_S)
        self._redis_client: Redis | None = None
        env = child_env(config)
        self.children = [self._service_child(instance, env) for instance in config.instances]
        self.redis_child = self._redis_child(env) if config.redis.own else None
        self.balancers = [
            Balancer(front, config.host, connect_host(config.host), self._ports_up(front.service))
            for front in config.fronts
        ]
        self._streamer = (
            LogStreamer([(c.name, c.log_path) for c in self._all_children()], out=self._out)
            if config.echo_logs
            else None
        )

    # ------------------------------------------------------------------------------------------- construction

    def _service_child(self, instance: Instance, env: Mapping[str, str]) -> _Child:
        argv = [*self.config.command, "serve", instance.service, "--host", self.config.host]
        argv += ["--port", str(instance.port)]
        base = instance.url(connect_host(self.config.host))
        url = f"{base}{instance.spec.ready_path}"

        async def ready() -> bool:
            try:
                return (await self._http.get(url)).status_code == 200
            except httpx.HTTPError:
                return False

        return _Child(instance.name, argv, env, self.paths.log_file(instance.name), ready, instance, base)

    def _redis_child(self, env: Mapping[str, str]) -> _Child:
        plan = self.config.redis
        assert plan.executable is not None and plan.port is not None
        argv = redis_server_argv(plan.executable, plan.port, self.paths.redis_dir)
        config = redis_server_config(plan.password)

        async def ready() -> bool:
            return await redis_reachable(plan.url, within_s=PROBE_TIMEOUT_S)

        return _Child("redis", argv, env, self.paths.log_file("redis"), ready, stdin=config)

    def _ports_up(self, service: str) -> Callable[[], list[int]]:
        """The ports of ``service``'s replicas that are up now (what its front hands connections to)."""
        replicas = [(c, c.instance) for c in self.children if c.instance is not None and c.instance.service == service]

        def ports() -> list[int]:
            return [instance.port for child, instance in replicas if child.status == "up" and child.pid is not None]

        return ports

    def _all_children(self) -> list[_Child]:
        return ([self.redis_child] if self.redis_child else []) + self.children

    # ------------------------------------------------------------------------------------------- state

    def snapshot(self) -> StackState:
        plan = self.config.redis
        redis = RedisState(
            url=redact(plan.url),
            own=plan.own,
            pid=self.redis_child.pid if self.redis_child else None,
            port=plan.port,
            directory=str(self.paths.redis_dir) if plan.own else None,
        )
        return StackState(
            supervisor_pid=os.getpid(),
            phase=self._phase,
            started_at=self._started_at,
            socket=str(self.paths.socket),
            redis=redis,
            checkpointer=self.config.checkpointer,
            instances=tuple(c.state() for c in self.children),
            error=self._error,
            ready_after_s=self._ready_after,
            data_dir=str(self.paths.root),
            key_prefix=self.config.base_env.get("CONCIERGE_KEY_PREFIX") or get_settings().key_prefix,
            fronts={f.service: f.url(connect_host(self.config.host)) for f in self.config.fronts},
        )

    def _changed(self) -> None:
        self._dirty.set()

    async def _write_states(self) -> None:
        """One writer, so snapshots land in order; ends after writing the last one once ``_closing`` is set."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await asyncio.to_thread(write_state, self.paths, self.snapshot())
            except OSError:
                # a full or read-only disk must not stop the supervision; the next change tries again
                logger.exception("could not write %s", self.paths.state_file)
            if self._closing and not self._dirty.is_set():
                return

    async def _last_state(self, writer: asyncio.Task[None]) -> None:
        """The final snapshot, written after every earlier one (a cancelled thread write could land later)."""
        self._closing = True
        self._dirty.set()
        try:
            await asyncio.wait_for(asyncio.shield(writer), 10)
        except Exception:
            # the writer failed or hangs (a full disk?): a direct write is the best left to do
            logger.exception("state writer failed; writing the last snapshot directly")
            write_state(self.paths, self.snapshot())

    def _say(self, message: str) -> None:
        if self._streamer is not None:
            self._streamer.pump()  # what the children said before this event comes first
        stamp = time.strftime("%H:%M:%S")
        self._out.write(f"{stamp} concierge: {message}\n")
        self._out.flush()

    # ------------------------------------------------------------------------------------------- main

    async def run(self) -> int:
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        lock = self._lock()
        writer = asyncio.create_task(self._write_states(), name="state-writer")
        background: list[asyncio.Task[None]] = []
        server: asyncio.Server | None = None
        try:
            write_secrets(self.paths, self.config.secrets)  # before any child: `fault` may ask as soon as one is up
            self._install_signal_handlers()
            server = await self._serve_control()
            for balancer in self.balancers:
                try:
                    await balancer.start()
                except OSError as exc:
                    raise PortInUseError(
                        f"port {balancer.front.port} (the front of {balancer.front.service}) is not available: "
                        f"{exc.strerror}; choose other ports with --port-base / --port"
                    ) from None
            if self._streamer is not None:
                background.append(asyncio.create_task(self._streamer.run(), name="log-streamer"))
            self._changed()
            try:
                return await self._start_and_supervise()
            except asyncio.CancelledError:
                # whoever ran us gave up: leave no process behind, quickly, then let the cancellation through
                self._force = True
                await self._shutdown("stopped")
                raise
        finally:
            self._remove_signal_handlers()
            if server is not None:
                server.close()
            with contextlib.suppress(FileNotFoundError):
                self.paths.socket.unlink()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for balancer in self.balancers:
                await balancer.close()
            await self._last_state(writer)
            await self._http.aclose()
            if self._redis_client is not None:
                await self._redis_client.aclose()
            lock.close()

    async def _start_and_supervise(self) -> int:
        starting = asyncio.create_task(self._start_all(), name="start-all")
        stop = asyncio.create_task(self._stop_requested.wait(), name="stop-requested")
        try:
            await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            await asyncio.gather(stop, return_exceptions=True)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            self._say("interrupted during start-up; stopping")
            await self._shutdown("stopped")
            return 130
        try:
            starting.result()
        except StackError as exc:
            self._error = str(exc)
            self._say(f"start-up failed: {exc}")
            await self._shutdown("failed")
            return 1
        self._ready_after = round(time.monotonic() - self._started_mono, 2)
        self._phase = "ready"
        self._changed()
        if self._streamer is not None:
            self._streamer.pump()  # the services' start-up lines above the table, not under it
            self._out.write(render_stack(self.snapshot(), self.config.secrets.service_secret) + "\n")
        self._say(f"all services ready in {self._ready_after:.1f}s")
        await self._stop_requested.wait()
        await self._shutdown("stopped")
        return 0

    def _lock(self) -> IO[bytes]:
        handle = self.paths.lock_file.open("ab")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise StackAlreadyRunningError(
                f"a stack is already running from {self.paths.root}; `concierge down` first"
            ) from None
        return handle

    async def _serve_control(self) -> asyncio.Server:
        path = self.paths.socket
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a supervisor that died; we hold the lock, so it is not in use
        old_umask = os.umask(0o177)
        try:
            return await asyncio.start_unix_server(self._handle_control, path=str(path), limit=MAX_MESSAGE_BYTES)
        finally:
            os.umask(old_umask)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _remove_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        if self._stop_requested.is_set():
            # a second Ctrl-C: no more patience
            self._say(f"{signal.Signals(signum).name} again: killing everything now")
            self._force = True
            for child in self._all_children():
                if child.pid is not None:
                    _signal_group(child.pid, signal.SIGKILL)
            return
        self._say(f"{signal.Signals(signum).name}: stopping (again to kill at once)")
        self._stop_requested.set()

    # ------------------------------------------------------------------------------------------- start-up

    async def _start_all(self) -> None:
        loop = asyncio.get_running_loop()
        self._startup_failure = loop.create_future()
        if self.redis_child is not None:
            self.paths.redis_dir.mkdir(parents=True, exist_ok=True)
            self._say(
                f"starting redis-server on port {self.config.redis.port} (append-only file in {self.paths.redis_dir})"
            )
            await self._wait_ready([self.redis_child], REDIS_READY_TIMEOUT_S)
        for child in self.children:
            self._launch(child)
        await self._wait_ready(self.children, self.config.ready_timeout_s)
        self._startup_failure = None

    def _launch(self, child: _Child) -> None:
        child.task = asyncio.create_task(self._supervise(child), name=f"supervise:{child.name}")

    async def _wait_ready(self, children: Sequence[_Child], limit_s: float) -> None:
        for child in children:
            if child.task is None:
                self._launch(child)
        assert self._startup_failure is not None

        async def every_one_ready() -> None:
            for child in children:
                await child.ready.wait()

        all_ready = asyncio.create_task(every_one_ready(), name="wait-ready")
        failure = self._startup_failure
        waiting: set[asyncio.Future[Any]] = {all_ready, failure}
        try:
            done, _ = await asyncio.wait(waiting, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # a plain task, cancelled and awaited: nothing is left for the garbage collector to complain about
            all_ready.cancel()
            await asyncio.gather(all_ready, return_exceptions=True)
        if failure in done:
            raise StartupError(failure.result())
        if all_ready not in done:
            late = [c for c in children if not c.ready.is_set()]
            raise StartupError(
                f"not ready after {limit_s:g}s: " + "; ".join(f"{c.name} (see {c.log_path})" for c in late)
            )

    # ------------------------------------------------------------------------------------------- supervision

    async def _spawn(self, child: _Child) -> asyncio.subprocess.Process:
        env = dict(child.env)
        if child.instance is not None:
            env["CONCIERGE_INSTANCE_ID"] = f"{child.name}-{secrets.token_hex(3)}"
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        with child.log_path.open("ab") as log:
            log.write(f"$ {' '.join(child.argv)}\n".encode())
            log.flush()
            proc = await asyncio.create_subprocess_exec(
                *child.argv,
                env=env,
                stdin=subprocess.DEVNULL if child.stdin is None else subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        child.proc = proc  # first: a cancellation during the hand-over must not leave a process nobody knows
        if proc.stdin is not None:
            await _hand_over(proc.stdin, child.stdin or b"")
        child.started_at = time.time()
        child.started_mono = time.monotonic()
        child.status = "starting"
        child.ready.clear()
        self._changed()
        self._say(f"{child.name} started (pid {proc.pid})")
        return proc

    async def _watch_ready(self, child: _Child, proc: asyncio.subprocess.Process) -> None:
        while proc.returncode is None:
            if await child.probe():
                if proc.returncode is None:
                    child.status = "up"
                    child.ready.set()
                    self._changed()
                    if self._phase == "ready":
                        self._say(f"{child.name} ready again (pid {proc.pid})")
                return
            await asyncio.sleep(PROBE_INTERVAL_S)

    async def _supervise(self, child: _Child) -> None:
        """Keep ``child`` running until the stack stops; the only place a child's process is spawned or reaped."""
        while not self._stopping:
            if child.held:
                child.status = "stopped"
                self._changed()
                await child.wake.wait()
                child.wake.clear()
                continue
            try:
                proc = await self._spawn(child)
            except OSError as exc:
                self._say(f"{child.name} could not start: {exc}")
                self._startup_failed(child, f"{child.name} could not start: {exc}")
                child.status = "exited"
                self._changed()
                return
            watcher = asyncio.create_task(self._watch_ready(child, proc), name=f"ready:{child.name}")
            try:
                if self._stopping or child.held:
                    # a stop arrived while the process was being created
                    await self._terminate(proc, child.name)
                code = await proc.wait()
            finally:
                watcher.cancel()
                # gather, not a suppressed await: a cancellation of this task itself must get through
                await asyncio.gather(watcher, return_exceptions=True)
            ran = time.monotonic() - child.started_mono
            child.last_exit = code
            child.ready.clear()
            if self._stopping or child.held:
                child.status = "stopped"
                self._changed()
                self._say(f"{child.name} stopped ({describe_exit(code)})")
                continue
            if self._startup_failure is not None:
                child.status = "exited"
                self._changed()
                self._startup_failed(child, f"{child.name} exited with {describe_exit(code)} before it was ready")
                return
            child.crashes = self.config.restart.crashes_in_a_row(child.crashes, ran)
            delay = self.config.restart.delay(child.crashes)
            child.restarts += 1
            child.status = "backoff"
            self._changed()
            self._say(f"{child.name} exited with {describe_exit(code)}; restarting in {delay:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wake.wait(), delay)
            child.wake.clear()
        child.status = "stopped"
        self._changed()

    def _startup_failed(self, child: _Child, message: str) -> None:
        hint = last_line(child.log_path)
        detail = f" (last log line: {hint})" if hint else ""
        if self._startup_failure is not None and not self._startup_failure.done():
            self._startup_failure.set_result(f"{message}{detail}; see {child.log_path}")

    async def _terminate(self, proc: asyncio.subprocess.Process, name: str) -> int:
        """SIGTERM the process group, SIGKILL after the grace period (at once after a second Ctrl-C)."""
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGKILL if self._force else signal.SIGTERM)
        try:
            async with asyncio.timeout(self.config.grace_s):
                return await proc.wait()
        except TimeoutError:
            self._say(f"{name} ignored SIGTERM for {self.config.grace_s:g}s; killing it")
            _signal_group(proc.pid, signal.SIGKILL)
            return await proc.wait()

    async def _stop_child(self, child: _Child, signum: int) -> int | None:
        """Hold ``child`` down and end its current process; returns the pid that was ended."""
        child.held = True
        proc = child.proc
        child.wake.set()
        if proc is None or proc.returncode is not None:
            return None
        if signum == signal.SIGKILL:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        else:
            await self._terminate(proc, child.name)
        return proc.pid

    async def _shutdown(self, phase: str) -> None:
        self._phase = "stopping"
        self._stopping = True
        self._changed()
        # dependants first: the booking-agent hands its runs to the queue while its peers still answer
        for child in reversed(self._all_children()):
            await self._stop_child(child, signal.SIGTERM)
        tasks = [c.task for c in self._all_children() if c.task is not None]
        if tasks:
            # every process is gone: let each loop record its child's exit before anything is cancelled
            _, late = await asyncio.wait(tasks, timeout=5)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._phase = phase
        self._changed()
        if phase == "stopped":
            self._say("all services stopped")

    # ------------------------------------------------------------------------------------------- control

    async def _handle_control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                answer = await self._answer(decode(line))
            except (StackError, UnknownServiceError) as exc:
                answer = {"ok": False, "error": str(exc)}
            except Exception as exc:  # one bad request must not take the supervisor down
                logger.exception("control request failed")
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write(encode(answer))
            await writer.drain()
        except (ConnectionError, OSError, ValueError):
            pass  # the client went away; nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "phase": self._phase}
        if op == "status":
            in_flight, in_flight_error, waiting = await self._in_flight()
            return {
                "ok": True,
                "state": self.snapshot().to_json(),
                "in_flight": in_flight,
                "in_flight_error": in_flight_error,
                "waiting": waiting,
            }
        if op == "down":
            self._stop_requested.set()
            return {"ok": True, "pid": os.getpid()}
        if op in ("kill", "stop", "start", "restart"):
            if self._phase != "ready":
                raise ControlError(f"the stack is {self._phase}; try again once it is ready")
            target = str(request.get("target", ""))
            children = self._targets(target)
            if op == "start":
                return {"ok": True, "started": await self._start_children(children)}
            if op == "restart":
                return {"ok": True, "restarted": [await self._restart_child(c) for c in children]}
            if op == "kill" and request.get("restart", True):
                return {"ok": True, "killed": [await self._kill_and_restart(c) for c in children]}
            signum = signal.SIGKILL if op == "kill" else signal.SIGTERM
            ended = [{"name": c.name, "pid": await self._stop_child(c, signum)} for c in children]
            return {"ok": True, "killed" if op == "kill" else "stopped": ended}
        raise ControlError(f"unknown request {op!r}")

    def _targets(self, target: str) -> list[_Child]:
        chosen = {i.name for i in select_instances(self.config.instances, target)}
        return [c for c in self.children if c.name in chosen]

    async def _kill_and_restart(self, child: _Child) -> dict[str, Any]:
        """SIGKILL as a crash would: the supervision loop sees it die and restarts it after the backoff."""
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return {"name": child.name, "pid": None}
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        return {"name": child.name, "pid": proc.pid}

    async def _restart_child(self, child: _Child) -> dict[str, Any]:
        """SIGTERM (its runs handed off as on any stop), then a new process on today's checkout, waited for ready.

        Done here, not by the client's stop then start: a client that goes away between the two leaves no service down.
        """
        was = await self._stop_child(child, signal.SIGTERM)
        (started,) = await self._start_children([child])
        return {**started, "was": was}

    async def _start_children(self, children: Sequence[_Child]) -> list[dict[str, Any]]:
        for child in children:
            child.held = False
            child.wake.set()  # skips a pending backoff too
        waits = [asyncio.wait_for(c.ready.wait(), self.config.ready_timeout_s) for c in children]
        results = await asyncio.gather(*waits, return_exceptions=True)
        return [
            {"name": c.name, "pid": c.pid, "ready": not isinstance(r, BaseException)}
            for c, r in zip(children, results, strict=True)
        ]

    async def _in_flight(self) -> tuple[int | None, str | None, list[str]]:
        """Bookings in flight, or why unknown; and a line per graph version runs wait for (``stack.runs``)."""
        from stack.runs import awaiting_runs, version_summary, waiting_lines  # only once someone asks

        if self._redis_client is None:
            self._redis_client = create_redis(self.config.redis.url, socket_connect_timeout=IN_FLIGHT_TIMEOUT_S)
        try:
            async with asyncio.timeout(IN_FLIGHT_TIMEOUT_S):
                in_flight = await BookingStore(self._redis_client).in_flight()
                waiting = waiting_lines(version_summary(await awaiting_runs(self._redis_client)))
                return in_flight, None, waiting
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}", []
