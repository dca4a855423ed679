"""Where a running stack keeps its state (``CONCIERGE_DATA_DIR``) and the snapshot the supervisor writes there.

::

    <data dir>/stack.json          the snapshot below, replaced atomically on every change (mode 0600)
    <data dir>/secrets.json        the stack's secrets (``StackSecrets``: service secret, admin token, model API key,
                                   the password of the Redis ``up`` starts itself), mode 0600
    <data dir>/supervisor.lock     flock'ed by the live supervisor: two ``up`` never share a data directory
    <data dir>/supervisor.sock     the control socket (``kill``, ``stop``, ``status``, ``down``...)
    <data dir>/logs/<name>.log     one log per instance (restarts append), supervisor.log for the supervisor
    <data dir>/redis/              the append-only file of the Redis ``up`` started itself, if it did
    <data dir>/checkpoints.sqlite  the SQLite checkpointer (when DATABASE_URL is unset)

The snapshot is for people and for commands that must work when the supervisor is gone (``down`` sweeping
leftovers, ``book`` finding the booking-agent); live questions go to the control socket. The secrets are kept
apart from it, so no command that shows the snapshot can show them; ``fault`` reads the admin token there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stack.errors import StackError

__all__ = [
    "InstanceState",
    "RedisState",
    "StackPaths",
    "StackSecrets",
    "StackState",
    "is_stack_process",
    "pid_alive",
    "read_secrets",
    "read_state",
    "write_secrets",
    "write_state",
]

# sun_path is 108 bytes on Linux and 104 on macOS; leave room for the terminating NUL.
_MAX_SOCKET_PATH = 100


@dataclass(frozen=True)
class StackPaths:
    root: Path

    @classmethod
    def at(cls, data_dir: Path | str) -> StackPaths:
        return cls(Path(data_dir).expanduser().resolve())

    @property
    def state_file(self) -> Path:
        return self.root / "stack.json"

    @property
    def secrets_file(self) -> Path:
        return self.root / "secrets.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "supervisor.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def supervisor_log(self) -> Path:
        return self.logs / "supervisor.log"

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def socket(self) -> Path:
        path = self.root / "supervisor.sock"
        if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
            return path
        # A deep data directory cannot hold a Unix socket; one per data directory in the temp dir instead.
        digest = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"concierge-{digest}.sock"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name.replace(':', '-')}.log"


@dataclass(frozen=True)
class InstanceState:
    name: str
    service: str
    replica: int
    port: int
    url: str
    health_path: str
    ready_path: str
    status: str
    """``starting`` · ``up`` · ``backoff`` (crashed, restart pending) · ``stopped`` (on request) · ``exited``."""
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None
    """Wall-clock start of the current process."""
    last_exit: int | None = None
    """Return code of the previous process (negative: killed by that signal)."""


@dataclass(frozen=True)
class RedisState:
    url: str
    """Redacted: no password."""
    own: bool
    pid: int | None = None
    port: int | None = None
    directory: str | None = None


@dataclass(frozen=True)
class StackState:
    supervisor_pid: int
    phase: str
    """``starting`` · ``ready`` · ``stopping`` · ``stopped`` · ``failed``."""
    started_at: float
    socket: str
    redis: RedisState
    checkpointer: str
    instances: tuple[InstanceState, ...] = ()
    error: str | None = None
    ready_after_s: float | None = None
    data_dir: str = ""
    key_prefix: str = ""
    """``CONCIERGE_KEY_PREFIX`` of every service in the stack: what commands need to find its keys in Redis."""
    fronts: dict[str, str] = field(default_factory=dict)
    """Service → the URL of its front, for each scaled service (``stack.balancer``)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackState:
        values = dict(data)
        values["redis"] = RedisState(**values["redis"])
        values["instances"] = tuple(InstanceState(**item) for item in values.get("instances", ()))
        return cls(**values)

    def pids(self) -> list[int]:
        """Every process the snapshot names: instances, the own Redis, the supervisor last."""
        pids = [i.pid for i in self.instances if i.pid is not None]
        if self.redis.pid is not None:
            pids.append(self.redis.pid)
        pids.append(self.supervisor_pid)
        return pids


@dataclass(frozen=True)
class StackSecrets:
    """What ``up`` hands every service it runs: ``CONCIERGE_SERVICE_SECRET``, ``CONCIERGE_ADMIN_TOKEN`` and
    ``LLM_API_KEY`` (the key llm-api takes and the concierge sends), and the password of its own Redis.

    Taken from the environment when set there (an operator's choice), generated otherwise: a stack never runs on a
    value anyone else knows. ``llm_api_key`` is empty in a file written before it existed: the services then derive
    one (``identity.auth.llm_api_key``). ``redis_password`` is made once per data directory (``up`` keeps the one it
    finds here); empty in an older file, whose stack's Redis has none, until the next ``up`` makes one.
    """

    service_secret: str
    admin_token: str
    llm_api_key: str = ""
    redis_password: str = ""

    @classmethod
    def generate(cls) -> StackSecrets:
        return cls(
            service_secret=secrets.token_hex(32),
            admin_token=secrets.token_urlsafe(32),
            llm_api_key=f"sk-stack-{secrets.token_urlsafe(32)}",
            redis_password=secrets.token_urlsafe(32),
        )

    @classmethod
    def from_env_or_new(cls, env: Mapping[str, str], previous: StackSecrets | None = None) -> StackSecrets:
        """The environment's secrets, else new ones; the Redis password of ``previous`` (this data directory's) kept."""
        new = cls.generate()
        return cls(
            service_secret=env.get("CONCIERGE_SERVICE_SECRET") or new.service_secret,
            admin_token=env.get("CONCIERGE_ADMIN_TOKEN") or new.admin_token,
            llm_api_key=env.get("LLM_API_KEY") or new.llm_api_key,
            redis_password=(previous.redis_password if previous is not None else "") or new.redis_password,
        )

    def env(self) -> dict[str, str]:
        """The service-facing secrets; the Redis password reaches a service inside its ``REDIS_URL`` only."""
        env = {"CONCIERGE_SERVICE_SECRET": self.service_secret, "CONCIERGE_ADMIN_TOKEN": self.admin_token}
        if self.llm_api_key:
            env["LLM_API_KEY"] = self.llm_api_key
        return env

    def __repr__(self) -> str:
        return "StackSecrets(<redacted>)"


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text`` in a file only its owner can read (0600 from the start)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an old temporary file of ours keeps its mode through O_CREAT
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            fd = -1
            handle.write(text)
    finally:
        if fd != -1:
            os.close(fd)
    os.replace(tmp, path)


def write_state(paths: StackPaths, state: StackState) -> None:
    """Replace the snapshot atomically: a reader sees the old one or the new one, never half of either."""
    _write_private(paths.state_file, json.dumps(state.to_json(), indent=2))


def write_secrets(paths: StackPaths, stack_secrets: StackSecrets) -> None:
    """Keep the running stack's secrets for the commands that need them (``fault``), readable by the owner only."""
    _write_private(paths.secrets_file, json.dumps(asdict(stack_secrets), indent=2))


def read_secrets(paths: StackPaths) -> StackSecrets | None:
    """The secrets of the stack last started here, or None when there are none (an older file: no Redis password)."""
    try:
        raw = paths.secrets_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        values = json.loads(raw)
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            raise ValueError("expected an object of strings")
        return StackSecrets(**values)
    except (ValueError, TypeError) as exc:
        raise StackError(f"{paths.secrets_file} is unreadable ({exc}); `concierge up` writes a new one") from exc


def read_state(paths: StackPaths) -> StackState | None:
    """The last snapshot, or None when no stack ever ran here."""
    try:
        raw = paths.state_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return StackState.from_json(json.loads(raw))
    except (ValueError, TypeError, KeyError) as exc:
        raise StackError(f"{paths.state_file} is unreadable ({exc}); remove it if no stack is running") from exc


def pid_alive(pid: int) -> bool:
    """True when ``pid`` runs and is not a zombie (an orphan nobody reaped yet is gone for our purposes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the state letter follows the parenthesised command name, which may itself contain spaces
        return stat.rpartition(")")[2].split()[0] != "Z"
    return True


# What the command line of a process of ours contains: the CLI (`concierge serve`, the supervisor) or our Redis.
_MARKERS = ("stack.", "concierge", "redis-server")


def is_stack_process(pid: int) -> bool:
    """``pid`` runs and still looks like a process of a stack, not an unrelated process that got a recycled pid."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs (macOS): trust the snapshot
    except OSError:
        return False
    return any(marker in cmdline for marker in _MARKERS)
