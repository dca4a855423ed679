"""``concierge up`` on a redis-server of its own (``REDIS_URL`` answers nowhere): that Redis requires the password
``up`` keeps in ``secrets.json``, which no command line, log, or ``stack.json`` shows, and every operator command
still finds it (issue 42: nobody in where they don't belong, even from the same machine).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import AuthenticationError

from stack.services import SERVICES
from stack.state import StackPaths, StackState, pid_alive, read_secrets, read_state
from tests.procs import concierge_command, concierge_env, free_port

pytestmark = pytest.mark.e2e

SETTINGS = {"RUN_LEASE_TTL": "1", "ORPHAN_SCAN_INTERVAL": "0.2", "BOOKING_BUDGET_S": "30"}


def concierge(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def port_flags() -> list[str]:
    flags: list[str] = []
    for name in SERVICES:
        flags += ["--port", f"{name}={free_port()}"]
    return flags


@pytest.fixture
def own_redis_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    # a Redis URL nobody answers on: `up` starts its own redis-server there, with its append-only file
    env = concierge_env(tmp_path / "data", f"redis://127.0.0.1:{free_port()}/0", prefix="own", **SETTINGS)
    env.pop("CONCIERGE_AUTH", None)  # identities on, as `up` runs them by default
    yield env
    state = read_state(StackPaths.at(tmp_path / "data"))
    if state is not None and any(pid_alive(pid) for pid in state.pids()):
        concierge(env, "down", timeout=120)


def every_cmdline() -> dict[int, bytes]:
    """The command line of every process this machine shows us (what any local user can read too)."""
    lines: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile, or not ours to read
    return lines


def assert_nowhere_shown(password: str, paths: StackPaths, *outputs: str) -> None:
    secret = password.encode()
    shown = [pid for pid, line in every_cmdline().items() if secret in line]
    assert shown == [], f"the Redis password is on the command line of pids {shown}"
    assert password not in paths.state_file.read_text(encoding="utf-8")
    leaking = [str(p) for p in paths.logs.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert leaking == [], leaking
    for output in outputs:
        assert password not in output


def wait_for_new_redis(paths: StackPaths, old_pid: int, within_s: float) -> StackState:
    deadline = time.monotonic() + within_s
    while True:
        state = read_state(paths)
        if state is not None and state.redis.pid not in (None, old_pid):
            return state
        assert time.monotonic() < deadline, f"redis-server was not started again after pid {old_pid} was killed"
        time.sleep(0.2)


def ping_until_answered(url: str, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            assert time.monotonic() < deadline, "redis-server never answered again"
            time.sleep(0.2)
        finally:
            client.close()


def test_up_on_its_own_redis_requires_the_password_no_one_else_can_read(
    own_redis_env: dict[str, str], tmp_path: Path
) -> None:
    env = own_redis_env
    paths = StackPaths.at(tmp_path / "data")
    # a loaded machine (several engineers on two cores) starts nine services in minutes, not seconds
    up = concierge(env, "up", "--detach", "--timeout", "240", *port_flags(), timeout=330)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    state = read_state(paths)
    stack_secrets = read_secrets(paths)
    assert state is not None and state.redis.own and state.redis.pid is not None and state.redis.port is not None
    assert stack_secrets is not None and len(stack_secrets.redis_password) >= 32
    password, port = stack_secrets.redis_password, state.redis.port
    assert paths.secrets_file.stat().st_mode & 0o777 == 0o600
    assert state.redis.url == f"redis://:***@127.0.0.1:{port}/0"  # redacted, and says a password is needed

    # anyone on this machine without the password: refused
    plain = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=5, socket_timeout=5)
    with pytest.raises(AuthenticationError):
        plain.ping()
    with pytest.raises(AuthenticationError):
        plain.set("quota", "mine")
    plain.close()
    owner = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=5, decode_responses=True)
    assert owner.config_get("bind")["bind"] == "127.0.0.1" and owner.config_get("appendonly")["appendonly"] == "yes"
    owner.close()

    # the operator's commands, with REDIS_URL as `up` was given it (our server is there now) and without it
    checkin = (dt.date.today() + dt.timedelta(days=40)).isoformat()
    booked = concierge(env, "book", "--city", "Lisbon", "--checkin", checkin, "--nights", "1", "--guests", "1")
    assert booked.returncode == 0, booked.stdout + booked.stderr
    assert booked.stdout.strip().splitlines()[-1].startswith("confirmed:"), booked.stdout
    outputs = [up.stdout, up.stderr, booked.stdout, booked.stderr]
    bare = {k: v for k, v in env.items() if k not in ("REDIS_URL", "CONCIERGE_KEY_PREFIX")}
    for shell in (env, bare):
        status = concierge(shell, "status", "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["bookings_in_flight"] == 0, report  # the supervisor reads our Redis with the password
        assert report["redis"]["url"] == state.redis.url
        table = concierge(shell, "status")
        assert table.returncode == 0 and f"redis://:***@127.0.0.1:{port}/0" in table.stdout, table.stderr
        audit = concierge(shell, "verify")
        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert "0 disagreement(s)" in audit.stdout
        listed = concierge(shell, "dlq", "list", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
        for args in (("recovery", "status"), ("runs",)):
            done = concierge(shell, *args)
            assert done.returncode == 0, f"{args}: {done.stderr}"
            outputs += [done.stdout, done.stderr]
        outputs += [status.stdout, table.stdout, audit.stdout, audit.stderr, listed.stdout, listed.stderr]
    assert_nowhere_shown(password, paths, *outputs)

    # killed, our redis-server comes back from its append-only file, with the password again
    os.killpg(state.redis.pid, signal.SIGKILL)
    again = wait_for_new_redis(paths, state.redis.pid, within_s=60)
    assert ping_until_answered(f"redis://:{password}@127.0.0.1:{port}/0", within_s=60)
    with pytest.raises(AuthenticationError):
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).ping()
    assert again.redis.pid is not None
    assert_nowhere_shown(password, paths)

    down = concierge(env, "down", timeout=120)
    assert down.returncode == 0, down.stderr
    after = read_state(paths)
    assert after is not None and not any(pid_alive(pid) for pid in after.pids())

    # the next `up` in this data directory keeps the password it made
    up_again = concierge(env, "up", "--detach", "--timeout", "240", *port_flags(), timeout=330)
    try:
        assert up_again.returncode == 0, up_again.stdout + up_again.stderr
        kept = read_secrets(paths)
        assert kept is not None and kept.redis_password == password
    finally:
        concierge(env, "down", timeout=120)
