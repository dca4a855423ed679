"""Shared fixtures: real Redis, real Postgres, isolated key prefixes and settings.

Redis: ``REDIS_URL`` when set, otherwise a private ``redis-server`` on a free port for the session.
Postgres: a fresh database per test on ``TEST_DATABASE_URL`` (default: the local server), dropped afterwards.
Stacks: ``shared_stack(services, env)`` is one running stack per worker for every module that asks for the same one.
Under ``CI=true`` a missing Redis or Postgres fails the test; locally it skips with the reason.
``settings_env`` also gives a service started in process (or by ``tests.procs``) the test deployment's secrets:
``TEST_SERVICE_SECRET`` and ``TEST_ADMIN_TOKEN``.

People: the suite runs with ``CONCIERGE_AUTH=off`` unless a test turns it on (``tests.people``: a local issuer, two
people and an outsider), so every service and ``concierge up`` a test starts takes requests as ``anonymous``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING

import pytest

from infra.dependencies import install as install_dependencies
from infra.settings import get_settings
from tests.procs import free_port

if TYPE_CHECKING:
    from tests.stack import SharedStacks, Stack

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
os.environ.setdefault("CONCIERGE_AUTH", "off")
TEST_SERVICE_SECRET = "test-service-secret-" + "0123456789abcdef" * 2
TEST_ADMIN_TOKEN = "test-admin-token"
install_dependencies()  # what a service's lifespan does: tests call policy_for outside one


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``make test``'s workers (``-n 4 --dist loadgroup``) a file's tests stay on one worker: its module-scoped
    stack starts once, and its tests run in their written order. A module marked ``xdist_group`` joins that group
    instead (the modules sharing a ``shared_stack``).

    xdist 3.8 tells its scheduler an item's group by appending ``@<group>`` to ``item._nodeid``, which pytest 9 no
    longer reads (the node id is ``item._id``): without the id set here every test is scheduled on its own."""
    from _pytest.nodeid import NodeId

    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        mark = item.get_closest_marker("xdist_group")
        assert mark is not None
        suffix = f"@{mark.args[0]}"
        if getattr(config.option, "loadgroup", False) and not item.nodeid.endswith(suffix):
            item._id = NodeId.parse(item.nodeid + suffix)


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"required service unavailable in CI: {reason}")
    pytest.skip(reason)


def start_redis_server(
    port: int | None = None, *, appendonly: bool = False, workdir: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A private redis-server (tests that kill Redis use this); returns the process and its URL.

    ``appendonly``: every write is fsynced to the AOF before it is acknowledged, so a ``kill -9`` loses nothing
    acknowledged; restart on the same ``port`` and ``workdir`` to get the data back.
    """
    exe = shutil.which("redis-server")
    if exe is None:
        unavailable("redis-server is not on PATH")
    port = port or free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="concierge-redis-")
    proc = subprocess.Popen(
        [
            exe or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if appendonly else "no",
            "--appendfsync",
            "always",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    unavailable(f"redis-server did not start on port {port}")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    proc, url = start_redis_server()
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def key_prefix() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> Iterator[pytest.MonkeyPatch]:
    """Point ``get_settings()`` at the test Redis, a unique prefix and the test secrets; extend with
    ``settings_env.setenv``."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CONCIERGE_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", TEST_SERVICE_SECRET)
    monkeypatch.setenv("CONCIERGE_ADMIN_TOKEN", TEST_ADMIN_TOKEN)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


@pytest.fixture
async def redis(settings_env: pytest.MonkeyPatch, redis_url: str, key_prefix: str) -> AsyncIterator[object]:
    """An asyncio client on the test Redis; every key under this test's prefix is deleted afterwards."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from infra.redis import create_redis

    client = create_redis(redis_url)
    try:
        await client.ping()
    except RedisConnectionError as exc:
        await client.aclose()
        unavailable(f"Redis at {redis_url} is unreachable: {exc}")
    try:
        yield client
    finally:
        keys = [k async for k in client.scan_iter(match=f"{key_prefix}*", count=500)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty database; dropped after the test."""
    import psycopg

    from tests.stack import TEST_DATABASE_URL, fresh_database

    try:
        psycopg.connect(TEST_DATABASE_URL, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        unavailable(f"Postgres at {TEST_DATABASE_URL} is unreachable: {exc}")
    with fresh_database(name_prefix="concierge_test") as url:
        yield url


SHARED_STACK_START_S = 180.0
"""How long each service of a shared stack may take to be ready (importing LangGraph on a busy machine is slow)."""


@pytest.fixture(scope="session")
def shared_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[SharedStacks]:
    """``shared_stack(services, env)``: a stack of ``services`` with ``env`` on its own fresh database, started on
    first use and stopped when the worker's session ends. A stack costs 15-20 s to start: modules whose tests touch
    only their own bookings and chats, and leave no fault, script or dead process behind, share one instead of
    starting their own. Such modules also share an ``xdist_group`` marker (``shared-stack-<name>``), so one worker
    runs them all and starts the stack once."""
    from tests.stack import Stack, fresh_database

    stacks: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], Stack] = {}
    with contextlib.ExitStack() as running:

        def get(services: tuple[str, ...], env: Mapping[str, str]) -> Stack:
            key = (services, tuple(sorted(env.items())))
            if key not in stacks:
                tmp = tmp_path_factory.mktemp("shared-stack")
                database = running.enter_context(fresh_database())
                stack = running.enter_context(Stack(tmp, redis_url, database_url=database, env=env))
                for proc in [stack.serve(service, wait=False) for service in services]:
                    proc.wait_ready(SHARED_STACK_START_S)
                stacks[key] = stack
            return stacks[key]

        yield get
