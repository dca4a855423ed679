"""The password of the Redis ``concierge up`` starts itself: made once per data directory, rendered on a config line
nothing can be injected into, and found by every command through one resolver (``stack.target.stack_redis_url``).
No network; no process."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from stack.errors import StackError
from stack.layout import plan_instances
from stack.redis_server import (
    RedisPlan,
    check_redis_password,
    plan_redis,
    redact,
    redis_server_argv,
    redis_server_config,
    url_with_password,
)
from stack.state import RedisState, StackPaths, StackSecrets, StackState, read_secrets, write_secrets
from stack.supervisor import Supervisor, SupervisorConfig
from stack.target import stack_redis_url
from stack.up import _previous_secrets

PASSWORD = "Zq3_-aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789ab"


def _state(url: str, *, own: bool, port: int | None = 6390) -> StackState:
    return StackState(
        supervisor_pid=os.getpid(),
        phase="ready",
        started_at=0.0,
        socket="/nonexistent.sock",
        redis=RedisState(url=url, own=own, pid=None, port=port if own else None),
        checkpointer="sqlite x",
    )


def _unreachable_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------------------- the secrets file


def test_the_redis_password_is_made_once_per_data_directory_and_kept(tmp_path: Path) -> None:
    fresh = StackSecrets.generate()
    check_redis_password(fresh.redis_password)  # what is generated is what the config line accepts
    assert fresh.redis_password != StackSecrets.generate().redis_password
    kept = StackSecrets.from_env_or_new({}, previous=fresh)
    assert kept.redis_password == fresh.redis_password
    assert kept.service_secret != fresh.service_secret  # the other secrets stay as they were: new unless in the env
    assert PASSWORD not in repr(StackSecrets.from_env_or_new({}, previous=StackSecrets("s", "a", "k", PASSWORD)))
    assert "REDIS" not in " ".join(fresh.env())  # the services get it inside REDIS_URL only


def test_an_older_secrets_file_without_a_redis_password_still_reads_and_up_makes_one(tmp_path: Path) -> None:
    paths = StackPaths.at(tmp_path)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.secrets_file.write_text(json.dumps({"service_secret": "s" * 64, "admin_token": "a" * 32}))
    older = read_secrets(paths)
    assert older is not None and older.redis_password == ""  # its stack's Redis has none: nothing to send
    made = StackSecrets.from_env_or_new({}, previous=_previous_secrets(paths))
    assert made.redis_password
    write_secrets(paths, made)
    assert paths.secrets_file.stat().st_mode & 0o777 == 0o600
    again = read_secrets(paths)
    assert again is not None
    assert StackSecrets.from_env_or_new({}, previous=again).redis_password == made.redis_password


@pytest.mark.parametrize(
    "text", ["{not json", '["a"]', '{"service_secret": "s", "admin_token": "a", "redis_password": 5}']
)
def test_an_unreadable_secrets_file_is_one_line_for_a_command_and_replaced_by_up(tmp_path: Path, text: str) -> None:
    paths = StackPaths.at(tmp_path)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.secrets_file.write_text(text)
    with pytest.raises(StackError, match="unreadable") as refused:
        read_secrets(paths)
    assert "\n" not in str(refused.value)
    assert _previous_secrets(paths) is None


# ------------------------------------------------------------------------------------------- the config line


def test_the_password_goes_on_stdin_never_on_the_command_line(tmp_path: Path) -> None:
    argv = redis_server_argv("/usr/bin/redis-server", 6390, tmp_path)
    assert argv[1] == "-", "redis-server reads its config from stdin only with '-' first (or last)"
    assert "--requirepass" not in argv and PASSWORD not in " ".join(argv)
    assert argv[argv.index("--bind") : argv.index("--bind") + 2] == ["--bind", "127.0.0.1"]
    assert redis_server_config(PASSWORD) == f"requirepass {PASSWORD}\n".encode()
    assert redis_server_config("") == b""


@pytest.mark.parametrize(
    "bad",
    [
        f"{PASSWORD}\nrequirepass\n",  # a second setting
        f"{PASSWORD} x",  # a second argument
        f'"{PASSWORD}"',
        "short",
        f"{PASSWORD}\r",
        f"{PASSWORD}#",
        "é" * 20,
        "",
    ],
)
def test_a_password_a_config_line_could_be_split_on_is_refused_without_repeating_it(bad: str) -> None:
    with pytest.raises(StackError) as refused:
        redis_server_config(bad) if bad else check_redis_password(bad)
    message = str(refused.value)
    assert "\n" not in message and (not bad or bad not in message)
    assert "secrets.json" in message


def test_the_url_carries_the_password_and_redaction_hides_it() -> None:
    url = url_with_password("redis://127.0.0.1:6390/0", PASSWORD)
    assert url == f"redis://:{PASSWORD}@127.0.0.1:6390/0"
    assert url_with_password("redis://:***@127.0.0.1:6390/2", PASSWORD) == f"redis://:{PASSWORD}@127.0.0.1:6390/2"
    assert redact(url) == "redis://:***@127.0.0.1:6390/0"
    assert PASSWORD not in repr(RedisPlan(url=url, own=True, port=6390, password=PASSWORD))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server on PATH")
async def test_up_plans_its_own_server_with_the_password_and_leaves_the_configured_url_as_it_is() -> None:
    port = _unreachable_port()
    plan = await plan_redis(f"redis://127.0.0.1:{port}/3", PASSWORD)
    assert plan.own and plan.port == port and plan.password == PASSWORD
    assert plan.url == f"redis://:{PASSWORD}@127.0.0.1:{port}/3"
    plain = await plan_redis(f"redis://127.0.0.1:{_unreachable_port()}/0")
    assert plain.own and "@" not in plain.url and plain.password == ""
    with pytest.raises(StackError, match="unusable"):
        await plan_redis(f"redis://127.0.0.1:{_unreachable_port()}/0", "a b")


async def test_the_supervisor_hands_our_redis_server_its_password_on_stdin_and_the_services_in_redis_url(
    tmp_path: Path,
) -> None:
    plan = RedisPlan(
        url=f"redis://:{PASSWORD}@127.0.0.1:6390/0",
        own=True,
        executable="/usr/bin/redis-server",
        port=6390,
        password=PASSWORD,
    )
    stack_secrets = StackSecrets("s" * 64, "a" * 32, "k", PASSWORD)
    config = SupervisorConfig(
        paths=StackPaths.at(tmp_path),
        instances=plan_instances(),
        redis=plan,
        command=("concierge",),
        base_env={},
        secrets=stack_secrets,
    )
    supervisor = Supervisor(config)
    try:
        child = supervisor.redis_child
        assert child is not None and child.stdin == f"requirepass {PASSWORD}\n".encode()
        assert PASSWORD not in " ".join(child.argv)
        assert all(PASSWORD not in " ".join(c.argv) for c in supervisor.children)
        assert all(c.env["REDIS_URL"] == plan.url for c in supervisor.children)
        snapshot = json.dumps(supervisor.snapshot().to_json())
        assert PASSWORD not in snapshot and "redis://:***@127.0.0.1:6390/0" in snapshot
    finally:
        await supervisor._http.aclose()


# ------------------------------------------------------------------------------------------- the resolver


def test_a_command_gets_the_password_of_the_stacks_own_redis() -> None:
    state = _state("redis://:***@127.0.0.1:6390/0", own=True)
    stack_secrets = StackSecrets("s", "a", "k", PASSWORD)
    expected = f"redis://:{PASSWORD}@127.0.0.1:6390/0"
    assert stack_redis_url(state, stack_secrets, {}) == expected
    # REDIS_URL naming our server as the user configured it (up started it there): the password added too
    for configured in ("redis://127.0.0.1:6390/0", "redis://localhost:6390", "redis://127.0.0.1:6390/5"):
        assert stack_redis_url(state, stack_secrets, {"REDIS_URL": configured}) == expected, configured
    # another server, or credentials of the user's own: the environment stands
    for other in ("redis://127.0.0.1:6391/0", "redis://:pw@127.0.0.1:6390/0", "redis://10.0.0.5:6390/0"):
        assert stack_redis_url(state, stack_secrets, {"REDIS_URL": other}) is None, other
    assert stack_redis_url(state, stack_secrets, {"REDIS_URL": "redis://127.0.0.1:99999/0"}) is None


def test_a_stack_of_an_older_up_whose_redis_has_no_password_is_reached_as_recorded() -> None:
    state = _state("redis://127.0.0.1:6390/0", own=True)
    assert stack_redis_url(state, StackSecrets("s", "a"), {}) == "redis://127.0.0.1:6390/0"
    assert stack_redis_url(state, None, {}) == "redis://127.0.0.1:6390/0"


def test_the_users_own_redis_gets_no_password_added() -> None:
    external = _state("redis://127.0.0.1:6379/0", own=False)
    stack_secrets = StackSecrets("s", "a", "k", PASSWORD)
    assert stack_redis_url(external, stack_secrets, {}) == "redis://127.0.0.1:6379/0"
    assert stack_redis_url(external, stack_secrets, {"REDIS_URL": "redis://127.0.0.1:6379/0"}) is None
    # a password of the user's, recorded redacted: REDIS_URL must name it, as before
    redacted = _state("redis://:***@redis.internal:6379/0", own=False)
    assert stack_redis_url(redacted, stack_secrets, {}) is None
