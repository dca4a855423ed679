"""``concierge up``: the whole stack as supervised local processes, in the foreground or ``--detach``-ed.

    concierge up [--detach] [--scale NAME=N]... [--port-base N] [--port NAME=PORT]... [--grace S] [--timeout S]

Before anything starts, in this order and each in well under a second or two: a service secret taken from the
environment is usable, the data directory is free (no live supervisor), the planned ports are free, Redis is found
(``redis_server.plan_redis``). Any of them failing is
one line and exit 1, with nothing left running. ``--detach`` forks the same supervisor into the background
(new session, output in ``<data dir>/logs/supervisor.log``) and returns once it reports every service ready.

The stack's secrets (``CONCIERGE_SERVICE_SECRET``, ``CONCIERGE_ADMIN_TOKEN``, ``LLM_API_KEY``) come from the
environment when set there and are generated otherwise; the supervisor hands them to every service and keeps them
in ``<data dir>/secrets.json`` (0600) for the commands that need them. The Redis ``up`` starts itself requires a
password made once per data directory and kept there too: the services find it in their ``REDIS_URL``, the
commands through ``stack.target``; no command line, log or ``stack.json`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence

from identity.auth import MissingSecretError, service_secret
from infra.settings import get_settings
from stack.console import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    Subparsers,
    one_line_errors,
    render_stack,
    stack_paths,
)
from stack.control import supervisor_running
from stack.errors import PortInUseError, StackAlreadyRunningError, StackError, StartupError
from stack.layout import Front, Instance, parse_assignments, plan_fronts, plan_instances
from stack.logstream import last_line
from stack.people import local_issuer
from stack.redis_server import plan_redis, redact
from stack.state import StackPaths, StackSecrets, is_stack_process, pid_alive, read_secrets, read_state
from stack.supervisor import DEFAULT_GRACE_S, DEFAULT_READY_TIMEOUT_S, Supervisor, SupervisorConfig

__all__ = ["READY_PHRASE", "concierge_command", "register_up"]

READY_PHRASE = "all services ready"
_POLL_S = 0.1


def concierge_command() -> tuple[str, ...]:
    """This interpreter running the CLI module: right venv, no dependence on PATH."""
    return (sys.executable, "-m", "stack.cli")


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value!r}")
    return seconds


def register_up(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start the whole stack as supervised local processes",
        description=(
            "Start hotel-api, payment-api, llm-api, search-agent, payment-agent, booking-agent, recovery-worker and "
            "the web console (plus redis-server when REDIS_URL does not answer), wait until each is ready, then "
            "stream their logs until Ctrl-C. Crashed services are restarted after a short backoff."
        ),
    )
    parser.add_argument("-d", "--detach", action="store_true", help="run in the background; return once ready")
    parser.add_argument("--scale", action="append", default=[], metavar="NAME=N", help="replicas of a service")
    parser.add_argument("--port-base", type=int, default=None, metavar="N", help="shift every port (default 8000)")
    parser.add_argument("--port", action="append", default=[], metavar="NAME=PORT", help="one service's port")
    parser.add_argument(
        "--with",
        action="append",
        default=[],
        dest="with_services",
        metavar="NAME",
        help="also run this optional service of the table (an example: restaurant-agent, docs/new-agent.md); the "
        "recovery worker then resumes its graphs too",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface the services bind (default 127.0.0.1); from elsewhere they answer by IP address, or by the "
        "names in CONCIERGE_ALLOWED_HOSTS",
    )
    parser.add_argument(
        "--grace", type=_seconds, default=DEFAULT_GRACE_S, metavar="S", help="SIGTERM → SIGKILL (default 20)"
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_READY_TIMEOUT_S,
        metavar="S",
        help="how long start-up may take (default 60)",
    )
    parser.set_defaults(handler=_up, _daemon=False)


@one_line_errors("up")
def _up(args: argparse.Namespace) -> int:
    paths = stack_paths()
    instances = plan_instances(
        scale=parse_assignments(args.scale, option="--scale"),
        port_base=args.port_base,
        ports=parse_assignments(args.port, option="--port"),
        with_services=args.with_services,
    )
    _check_secret()
    if supervisor_running(paths):
        state = read_state(paths)
        pid = state.supervisor_pid if state else "?"
        raise StackAlreadyRunningError(
            f"a stack is already running from {paths.root} (supervisor pid {pid}); `concierge down` first"
        )
    fronts = plan_fronts(instances)
    _check_leftovers(paths)
    _check_ports(instances, fronts, args.host)
    if args.detach:
        return _detach(args, paths)
    config = asyncio.run(_config(args, paths, instances, fronts, echo_logs=not args._daemon))
    if not args._daemon:
        print(f"concierge: starting {len(instances)} services from {paths.root} (Ctrl-C stops them)", flush=True)
    code = asyncio.run(Supervisor(config).run())
    state = read_state(paths)
    if code == EXIT_FAILURE and state is not None and state.error:
        raise StartupError(state.error)  # the reason, once more, where a failed command says it
    return code


async def _config(
    args: argparse.Namespace,
    paths: StackPaths,
    instances: tuple[Instance, ...],
    fronts: tuple[Front, ...],
    *,
    echo_logs: bool,
) -> SupervisorConfig:
    settings = get_settings()
    stack_secrets = StackSecrets.from_env_or_new(os.environ, previous=_previous_secrets(paths))
    redis = await plan_redis(settings.redis_url, stack_secrets.redis_password)
    if settings.database_url:
        checkpointer = f"postgres {redact(settings.database_url)}"
    else:
        checkpointer = f"sqlite {paths.root / 'checkpoints.sqlite'}"
    return SupervisorConfig(
        paths=paths,
        instances=instances,
        redis=redis,
        command=concierge_command(),
        base_env=_with_durable_agents(_with_people(dict(os.environ)), instances),
        host=args.host,
        grace_s=args.grace,
        ready_timeout_s=args.timeout,
        echo_logs=echo_logs,
        checkpointer=checkpointer,
        secrets=stack_secrets,
        fronts=fronts,
    )


def _previous_secrets(paths: StackPaths) -> StackSecrets | None:
    """This data directory's secrets, for the Redis password made once here; an unreadable file is replaced."""
    try:
        return read_secrets(paths)
    except StackError:
        return None


def _with_people(env: dict[str, str]) -> dict[str, str]:
    """The services trust this machine's local issuer (made once, in the data directory), unless the environment
    names an issuer of its own (a real OIDC provider) or turns people off (``CONCIERGE_AUTH=off``, passed through)."""
    if env.get("CONCIERGE_AUTH") == "off" or env.get("CONCIERGE_AUTH_ISSUER"):
        return env
    issuer = local_issuer(create=True)
    assert issuer is not None
    return env | {
        "CONCIERGE_AUTH_ISSUER": issuer.issuer,
        "CONCIERGE_AUTH_JWKS_FILE": str(issuer.jwks_path.resolve()),
    }


def _with_durable_agents(env: dict[str, str], instances: Sequence[Instance]) -> dict[str, str]:
    """An optional durable service's package added to ``DURABLE_AGENTS``, so the recovery worker resumes its runs."""
    packages = list(get_settings().durable_agents)
    for instance in instances:
        if instance.spec.optional and instance.spec.durable and instance.spec.package not in packages:
            packages.append(instance.spec.package)
    if packages != list(get_settings().durable_agents):
        env["DURABLE_AGENTS"] = ",".join(packages)
    return env


def _check_leftovers(paths: StackPaths) -> None:
    """Children of a supervisor that was killed -9 still hold their ports; `down` knows them by the snapshot."""
    state = read_state(paths)
    if state is None:
        return
    alive = [pid for pid in state.pids() if pid != state.supervisor_pid and is_stack_process(pid)]
    if alive:
        raise StackAlreadyRunningError(
            f"processes of a previous stack in {paths.root} still run (pids {', '.join(map(str, alive))}); "
            "`concierge down` cleans them up"
        )


def _check_ports(instances: Sequence[Instance], fronts: Sequence[Front], host: str) -> None:
    wanted = [(i.port, i.name) for i in instances] + [(f.port, f"the front of {f.service}") for f in fronts]
    for port, name in wanted:
        with socket.socket() as sock:
            # as uvicorn binds: a port in TIME_WAIT from a previous run is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise PortInUseError(
                    f"port {port} ({name}) is not available on {host}: {exc.strerror}; "
                    "stop what uses it or choose other ports with --port-base / --port"
                ) from None


def _check_secret() -> None:
    """A secret taken from the environment must be usable: one line now, not a failure in every service's log."""
    if os.environ.get("CONCIERGE_SERVICE_SECRET"):
        try:
            service_secret(get_settings())
        except MissingSecretError as exc:
            raise StartupError(f"{exc}; or unset it and `up` generates one") from None


def _fork_supervisor(args: argparse.Namespace, paths: StackPaths) -> int:
    """The supervisor forked from this process, whose modules are already imported (a second interpreter would start
    and import them again: half a second), in a session of its own with its output in ``supervisor.log``. Returns
    its pid here; the child never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = EXIT_FAILURE
    try:
        os.setsid()
        with open(os.devnull, "rb") as null, paths.supervisor_log.open("ab") as log:
            os.dup2(null.fileno(), 0)
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        code = _up(argparse.Namespace(**{**vars(args), "detach": False, "_daemon": True}))
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_code(pid: int) -> int | None:
    """The forked supervisor's exit code once it has exited, else None."""
    done, status = os.waitpid(pid, os.WNOHANG)
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def _detach(args: argparse.Namespace, paths: StackPaths) -> int:
    # Find Redis here too, so a missing one is reported on this terminal, at once, not in a log file.
    asyncio.run(plan_redis(get_settings().redis_url))
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.state_file.unlink(missing_ok=True)  # stale: no supervisor is running
    daemon = _fork_supervisor(args, paths)
    deadline = time.monotonic() + args.timeout + 15  # plus Redis start and the supervisor's own
    try:
        while True:
            state = read_state(paths)
            if state is not None and state.supervisor_pid == daemon:
                if state.phase == "ready":
                    stack_secrets = read_secrets(paths)
                    print(render_stack(state, stack_secrets.service_secret if stack_secrets else None))
                    print(
                        f"{READY_PHRASE} in {state.ready_after_s or 0:.1f}s (supervisor pid {daemon}; `concierge down` stops it)"
                    )
                    return EXIT_OK  # the daemon outlives us on purpose
                if state.phase == "failed":
                    # it stops what it started on its own; return only once it has
                    _wait_exit(daemon, args.grace + 30)
                    raise StartupError(state.error or "start-up failed")
            code = _exit_code(daemon)
            if code is not None:
                raise StartupError(
                    f"the supervisor exited with {code}: {last_line(paths.supervisor_log) or 'no output'}"
                )
            if time.monotonic() > deadline:
                _stop_daemon(daemon)
                raise StartupError(f"no answer from the supervisor in time; see {paths.supervisor_log}")
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        _stop_daemon(daemon)
        return EXIT_INTERRUPTED


def _wait_exit(pid: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while _exit_code(pid) is None and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _stop_daemon(pid: int) -> None:
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
