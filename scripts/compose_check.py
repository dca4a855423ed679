"""``make compose-check``: the stack of docker-compose.yml, run in containers, does what the README says it does.

Steps (any failure fails the check with its reason; the stack is torn down whatever happens):

1. images: stand-ins for the registry images this machine cannot pull, built from Debian packages (a debootstrap
   rootfs, then one Containerfile each under scripts/standins/) and cached as images labelled with the digest of
   what they are built from; then the project's image from the unchanged Dockerfile, with the Python stand-in
   passed as its PYTHON_IMAGE build argument.
2. up: the unchanged docker-compose.yml plus scripts/compose.check.yml (stand-in images, host networking, tracing
   behind a profile) in a network namespace made for the run, with freshly generated secrets; each container is
   started only once its ``depends_on`` conditions hold (``service_healthy``: a probe of its healthcheck passed),
   which is then checked against the containers' own start times.
3. configuration: every variable the compose file gives the application is one it reads (a misspelt name would
   fall back to a default without a word).
   People: the one-shot ``issuer`` service made the local issuer into its volume and exited 0 before booking-agent
   and concierge-agent started; a person's token comes from ``concierge token --user compose-check`` in
   booking-agent's container, and every request to /bookings below sends it. Without a token: 401
   ``unauthenticated`` with ``WWW-Authenticate: Bearer``; another person's token: 404 for this person's booking.
4. kill: a booking held in ``paying``; ``kill -s KILL`` of booking-agent's PID 1 from the host; ``restart:
   unless-stopped`` brings the container back, the booking ends ``confirmed``, the ledgers hold one reservation
   and one charge for it, and the recovery worker counts one recovery.
5. stop: another booking in ``paying``; ``stop booking-agent`` (SIGTERM, ``stop_grace_period``): it exits 0 within
   its grace period, hands the run off (its log says so, the run's fence is 2), the recovery worker confirms the
   booking before the run's lease could have expired, and the container stays stopped (then is started again).
6. the CLI in a container: ``concierge book`` and ``concierge dlq list`` in recovery-worker, as the image's
   non-root user (exit 0, confirmed exactly once, nothing dead-lettered); every booking's checkpoints are in
   Postgres (DATABASE_URL), not in a container's SQLite file.
   A conversation: ``concierge ask "..." --approve`` in concierge-agent's container (the model is llm-api, reached
   through the compose file's LLM_BASE_URL): exit 0, one booking, confirmed exactly once.
7. down: containers, volumes and networks (``down -v``, then anything left with the project's label), the network
   namespace; on success, on failure and on Ctrl-C alike.

With podman (the default, what CI has): as root, podman 4.3 + podman-compose, runc, cgroupfs and no default
ulimits (a containers.conf the script writes). Podman runs healthchecks from systemd timers, and there is no
systemd here; podman-compose ignores ``service_healthy`` before podman 4.6. So this script does both jobs: it runs
each container's healthcheck every ``interval`` (``podman healthcheck run``, which keeps podman's health status,
start period and retries) and starts each service once its dependencies' conditions hold.

With Docker (``--engine docker``): the official images are pulled, the stack runs on Docker's own networks with
Jaeger, ``docker compose up --wait`` gates the start order itself, and ``kill -s KILL`` needs the engine's
processes on this host (not Docker Desktop's VM).

    .venv/bin/python scripts/compose_check.py [--engine podman|docker] [--compose-file FILE] [--rebuild-standins]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stack.services import DEPLOYED

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "scripts" / "standins"
OVERRIDE = REPO / "scripts" / "compose.check.yml"
PROJECT = "concierge-check"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "concierge-compose-check"
PROJECT_IMAGE = "concierge:local"  # docker-compose.yml's image for the application services

# the Debian the stand-ins are made of
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_IMAGE = "localhost/concierge-standin/debian:bookworm"
# what the base image is made of; change BASE_RECIPE with the steps of Podman._base_image, and the cache follows
BASE_RECIPE = {"suite": SUITE, "mirror": MIRROR, "variant": "minbase", "include": ["ca-certificates"], "steps": 1}
STANDIN_LABEL = "concierge.standin.key"

# Settings for this run (docker-compose.yml reads them from the environment): a lease long enough that a handoff is
# told apart from an expiry, still short enough that the kill -9 recovery is quick.
RUN_LEASE_TTL_S = 30.0
# payment-api's injected latency holds a booking in "paying" long enough to hit it there; `compose stop` takes a
# second or two to start before its SIGTERM lands (over 8 s on a machine loaded by other work: seen once), and the
# drain waits up to 10 s for the step, then cancels it: either way the run is handed off, so a long hold costs the
# stop nothing
PAYMENT_LATENCY_S = 4.0
STOP_PAYMENT_LATENCY_S = 15.0
# "paying" is recorded just before the call that reaches payment-api: this long after it, the charge is being held
# there when the kill or the SIGTERM lands (killed: payment-api sees its caller leave and drops the charge, which
# the recovery makes again, once; stopped: the charge completes within the drain's 10 s, or the drain cancels it
# and payment-api drops it, and the run is handed off)
IN_FLIGHT_S = 1.0
STARTUP_TIMEOUT_S = 240.0
BOOKING_TIMEOUT_S = 90.0
PERSON = "compose-check"  # whose bookings the check makes over HTTP (a token from the stack's own issuer)
ANOTHER_PERSON = "someone-else"
ISSUER_SERVICE = "issuer"  # docker-compose.yml's one-shot: the local people's issuer into the volume `issuer`
APP_SERVICES = tuple(DEPLOYED)  # docker-compose.yml's `concierge serve` services: the table's deployed rows
URLS = {
    "booking-agent": "http://127.0.0.1:8000",
    "concierge-agent": "http://127.0.0.1:8003",
    "hotel-api": "http://127.0.0.1:8010",
    "payment-api": "http://127.0.0.1:8011",
    "recovery-worker": "http://127.0.0.1:8020",
}
CONTAINERS_CONF = """\
# written by scripts/compose_check.py: what podman needs on this kind of machine (no systemd, cgroup v1)
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"[compose-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run(
    command: Sequence[str | Path],
    *,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = 600,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = [str(part) for part in command]
    try:
        done = subprocess.run(
            argv,
            capture_output=capture,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            input=input,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckFailed(f"{' '.join(argv[:4])}... took more than {timeout:.0f}s") from exc
    if check and done.returncode != 0:
        output = ((done.stdout or "") + (done.stderr or "")).strip()
        raise CheckFailed(f"{' '.join(argv)} exited {done.returncode}:\n{output[-4000:]}")
    return done


def parse_time(value: str) -> float:
    """An engine's RFC 3339 timestamp (nanoseconds, Z or an offset) as a POSIX time."""
    value = value.strip().replace("Z", "+00:00")
    if "." in value:
        head, rest = value.split(".", 1)
        digits = "".join(c for c in rest if c.isdigit())
        value = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    return dt.datetime.fromisoformat(value).timestamp()


def digest(*parts: bytes | str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
        hasher.update(b"\0")
    return hasher.hexdigest()[:24]


# --------------------------------------------------------------------------------------------------- HTTP


def http(method: str, url: str, *, body: Any = None, token: str | None = None, timeout: float = 10) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    if token:
        request.add_header("authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def http_answer(method: str, url: str, *, token: str | None = None, timeout: float = 10) -> tuple[int, Any, Any]:
    """``(status, headers, body)`` of a request whatever its status (``http`` raises on 4xx/5xx)."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method=method, headers=_auth(token)), timeout=timeout
        ) as r:
            raw = r.read()
            return r.status, r.headers, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, exc.headers, json.loads(raw) if raw else None


def _auth(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def http_retrying(method: str, url: str, deadline: float, **kwargs: Any) -> Any:
    """``http``, retried while the service is down (connection refused, reset, 502-504) until ``deadline``."""
    while True:
        try:
            return http(method, url, **kwargs)
        except urllib.error.HTTPError as exc:
            if exc.code not in (502, 503, 504) or time.monotonic() > deadline:
                raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------------- engines


@dataclass
class Container:
    name: str
    service: str


@dataclass
class Engine:
    """What the check needs from a container engine and its compose; ``Podman`` and ``Docker`` below."""

    compose_file: Path
    env: dict[str, str]
    workdir: Path
    compose_files: list[Path] = field(default_factory=list)

    name = "engine"

    def prepare(self, rebuild_standins: bool) -> None:
        raise NotImplementedError

    def enter(self) -> None:
        """Move this process where the stack will run (podman: the run's network namespace)."""

    def leave(self) -> None:
        """Undo ``enter``'s lasting effects (podman: delete the namespace)."""

    def compose(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        done = self.compose("config")
        loaded = yaml.safe_load(done.stdout)
        if not isinstance(loaded, dict):
            raise CheckFailed(f"compose config printed no mapping:\n{done.stdout[:2000]}")
        return loaded

    def up(self, config: dict[str, Any]) -> dict[str, float]:
        """Start the stack; every service up and healthy when it returns. Returns the time each service was first
        seen healthy (where the engine tells), for the start-order check."""
        raise NotImplementedError

    def containers(self) -> dict[str, Container]:
        raise NotImplementedError

    def inspect(self, service: str) -> dict[str, Any]:
        name = self.containers()[service].name
        done = self.cli("inspect", name)
        loaded = json.loads(done.stdout)
        return dict(loaded[0])

    def exec(self, service: str, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cli("exec", self.containers()[service].name, *command, check=check)

    def logs(self, service: str, tail: int | None = None) -> str:
        name = self.containers()[service].name
        args = ["logs", *(["--tail", str(tail)] if tail else []), name]
        done = self.cli(*args, check=False)
        return (done.stdout or "") + (done.stderr or "")

    def health(self, service: str) -> str:
        state = self.inspect(service)["State"]
        return str((state.get("Health") or {}).get("Status") or "none")

    def down(self) -> None:
        raise NotImplementedError


class Podman(Engine):
    name = "podman"

    def __init__(self, compose_file: Path, env: dict[str, str], workdir: Path) -> None:
        super().__init__(compose_file, env, workdir, [compose_file, OVERRIDE])
        self.netns = f"{PROJECT}-{os.getpid()}"
        self.netns_made = False
        self.prober: HealthProber | None = None
        self._containers: dict[str, Container] = {}
        conf = workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        os.environ["CONTAINERS_CONF"] = str(conf)
        self.podman_compose = self._find_podman_compose()

    @staticmethod
    def _find_podman_compose() -> str:
        beside = Path(sys.executable).parent / "podman-compose"
        found = str(beside) if beside.exists() else shutil.which("podman-compose")
        if not found:
            raise CheckFailed("podman-compose not found (it is in requirements-dev.lock: make install)")
        return found

    # ---------------------------------------------------------------------------------------------- images

    def prepare(self, rebuild_standins: bool) -> None:
        if os.geteuid() != 0:
            raise CheckFailed("the podman check runs as root (debootstrap, network namespaces, rootful podman)")
        for tool in ("podman", "runc", "debootstrap", "ip", "tar"):
            if not shutil.which(tool):
                raise CheckFailed(
                    f"{tool} not found: apt-get install -y podman runc debootstrap (scripts/install-podman.sh)"
                )
        version = self.cli("version", "--format", "{{.Client.Version}}").stdout.strip()
        log(f"podman {version}, {Path(self.podman_compose).name} {self._podman_compose_version()}")
        self._cleanup_leftovers()
        base_key = self._base_image(rebuild_standins)
        python = ""
        for containerfile in sorted(STANDINS.glob("*.Containerfile")):
            image = self._standin(containerfile, base_key, rebuild_standins)
            if containerfile.stem == "python":
                python = image
        if not python:
            raise CheckFailed(f"no python stand-in in {STANDINS}")
        self._build_project_image(python)

    def _podman_compose_version(self) -> str:
        done = run([self.podman_compose, "--version"], check=False)
        lines = (done.stdout or "").strip().splitlines()
        return lines[0].removeprefix("podman-compose version ") if lines else "?"

    def _image_id(self, image: str) -> str | None:
        done = self.cli("image", "inspect", "--format", "{{.Id}}", image, check=False)
        if done.returncode != 0:
            return None
        return done.stdout.strip() or None

    def _drop_replaced(self, old_id: str | None, image: str) -> None:
        """The image a rebuild replaced, now untagged: removed (best effort; the build cache keeps its layers)."""
        if old_id and old_id != self._image_id(image):
            self.cli("rmi", old_id, check=False)

    def _label(self, image: str) -> str | None:
        done = self.cli("image", "inspect", "--format", "{{json .Labels}}", image, check=False)
        if done.returncode != 0:
            return None
        labels = json.loads(done.stdout or "null") or {}
        return labels.get(STANDIN_LABEL)

    def _local_cas(self) -> list[Path]:
        """The certificate authorities this machine added to Debian's (/usr/local/share/ca-certificates): the
        stand-ins trust them too, as anything built on this machine must (pip inside the build goes through them)."""
        folder = Path("/usr/local/share/ca-certificates")
        return sorted(p for p in folder.rglob("*.crt") if p.is_file()) if folder.exists() else []

    def _base_image(self, rebuild: bool) -> str:
        cas = self._local_cas()
        key = digest(json.dumps(BASE_RECIPE, sort_keys=True), *(p.read_bytes() for p in cas))
        if not rebuild and self._label(BASE_IMAGE) == key:
            log(f"stand-in base {BASE_IMAGE}: cached ({key})")
            return key
        log(f"stand-in base {BASE_IMAGE}: debootstrap {SUITE} (minbase)...")
        started = time.monotonic()
        replaced = self._image_id(BASE_IMAGE)
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
            root = Path(tmp) / "root"
            try:
                run(
                    ["debootstrap", "--variant=minbase", "--include=ca-certificates", SUITE, root, MIRROR],
                    timeout=1200,
                )
            finally:
                self._unmount_under(root)
            (root / "usr/sbin/policy-rc.d").write_text(
                "#!/bin/sh\n# no services start inside an image build\nexit 101\n"
            )
            (root / "usr/sbin/policy-rc.d").chmod(0o755)
            (root / "etc/apt/sources.list").write_text(
                f"deb {MIRROR} {SUITE} main\n"
                f"deb {MIRROR} {SUITE}-updates main\n"
                f"deb {MIRROR.replace('/debian', '/debian-security')} {SUITE}-security main\n"
            )
            (root / "etc/apt/apt.conf.d/90standin").write_text(
                'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
            )
            local = root / "usr/local/share/ca-certificates"
            local.mkdir(parents=True, exist_ok=True)
            for index, ca in enumerate(cas):
                shutil.copyfile(ca, local / f"host-{index}-{ca.name}")
            run(["chroot", root, "update-ca-certificates", "--fresh"])
            run(["chroot", root, "apt-get", "clean"])
            shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
            (root / "var/lib/apt/lists/partial").mkdir(parents=True)
            tar = subprocess.Popen(
                ["tar", "-C", root, "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*", "-c", "."],
                stdout=subprocess.PIPE,
            )
            try:
                imported = subprocess.run(
                    [
                        "podman", "import",
                        "--change", f"LABEL {STANDIN_LABEL}={key}",
                        "--change", "ENV DEBIAN_FRONTEND=noninteractive",
                        "--change", 'CMD ["bash"]',
                        "-", BASE_IMAGE,
                    ],
                    stdin=tar.stdout,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )  # fmt: skip
            finally:
                assert tar.stdout is not None
                tar.stdout.close()
                tar.wait()
            if imported.returncode != 0 or tar.returncode != 0:
                raise CheckFailed(f"podman import of the stand-in base failed:\n{imported.stderr[-2000:]}")
        self._drop_replaced(replaced, BASE_IMAGE)
        log(f"stand-in base {BASE_IMAGE}: built in {time.monotonic() - started:.0f}s ({key})")
        return key

    @staticmethod
    def _unmount_under(root: Path) -> None:
        """debootstrap may leave /proc (and more) mounted in the rootfs; unmount deepest first."""
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)

    def _standin(self, containerfile: Path, base_key: str, rebuild: bool) -> str:
        """Build (or reuse) the stand-in a Containerfile describes; its first line names the image it is tagged."""
        tag = self._standin_tag(containerfile)
        context = sorted(p for p in STANDINS.iterdir() if p.name.startswith(containerfile.stem))
        key = digest(base_key, *(p.name + "\0" + p.read_text() for p in context))
        if not rebuild and self._label(tag) == key:
            log(f"stand-in {tag}: cached ({key})")
            return tag
        log(f"stand-in {tag}: building from {containerfile.relative_to(REPO)}...")
        started = time.monotonic()
        replaced = self._image_id(tag)
        self.cli(
            "build", "--format", "docker", "--network", "host",
            "--build-arg", f"BASE={BASE_IMAGE}", "--label", f"{STANDIN_LABEL}={key}",
            "-f", str(containerfile), "-t", tag, str(STANDINS),
            timeout=1800,
        )  # fmt: skip
        self._drop_replaced(replaced, tag)
        log(f"stand-in {tag}: built in {time.monotonic() - started:.0f}s ({key})")
        return tag

    @staticmethod
    def _standin_tag(containerfile: Path) -> str:
        for line in containerfile.read_text().splitlines():
            if line.startswith("# image: "):
                return line.removeprefix("# image: ").strip()
        raise CheckFailed(f"{containerfile}: no '# image: <tag>' line")

    def _build_project_image(self, python_image: str) -> None:
        log(f"project image {PROJECT_IMAGE}: podman build (Dockerfile, PYTHON_IMAGE={python_image})...")
        started = time.monotonic()
        replaced = self._image_id(PROJECT_IMAGE)
        self.cli(
            # docker format: the OCI one would drop the Dockerfile's HEALTHCHECK, as Docker does not
            "build", "--format", "docker", "--network", "host",
            "--build-arg", f"PYTHON_IMAGE={python_image}", "-t", PROJECT_IMAGE,
            "-f", str(REPO / "Dockerfile"), str(REPO),
            timeout=1800,
        )  # fmt: skip
        self._drop_replaced(replaced, PROJECT_IMAGE)
        log(f"project image {PROJECT_IMAGE}: built in {time.monotonic() - started:.0f}s")

    # ---------------------------------------------------------------------------------------------- network

    def enter(self) -> None:
        run(["ip", "netns", "add", self.netns])
        self.netns_made = True
        run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        # setns applies to the calling thread, and so to every thread and process it starts afterwards: nothing
        # else runs yet. The stack's 127.0.0.1 is then this namespace's, free of anything else on the machine.
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                raise CheckFailed(f"setns into {self.netns}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)
        log(f"network namespace {self.netns}: the stack's 127.0.0.1 is its own")

    def leave(self) -> None:
        if self.netns_made:
            run(["ip", "netns", "del", self.netns], check=False)

    def _cleanup_leftovers(self) -> None:
        """A run killed before its teardown leaves containers, volumes and a namespace: remove them first."""
        self._remove_project_objects()
        for line in run(["ip", "netns", "list"], check=False).stdout.splitlines():
            name = line.split()[0] if line.strip() else ""
            pid = name.removeprefix(f"{PROJECT}-")
            if name.startswith(f"{PROJECT}-") and pid.isdigit() and not Path(f"/proc/{pid}").exists():
                run(["ip", "netns", "del", name], check=False)

    def _remove_project_objects(self) -> None:
        label = f"label=io.podman.compose.project={PROJECT}"
        ids = self.cli("ps", "-aq", "--filter", label, check=False).stdout.split()
        if ids:
            self.cli("rm", "-f", "-t", "0", *ids, check=False, timeout=120)
        for kind in ("volume", "network"):
            names = self.cli(kind, "ls", "-q", "--filter", label, check=False).stdout.split()
            if names:
                self.cli(kind, "rm", "-f", *names, check=False)
        pods = self.cli("pod", "ls", "-q", "--filter", f"name=pod_{PROJECT}", check=False).stdout.split()
        if pods:
            self.cli("pod", "rm", "-f", *pods, check=False)

    # ---------------------------------------------------------------------------------------------- compose

    def compose(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = [arg for path in self.compose_files for arg in ("-f", str(path))]
        return run([self.podman_compose, "-p", PROJECT, *files, *args], check=check, env=self.env, timeout=timeout)

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run(["podman", *args], check=check, timeout=timeout)

    def containers(self) -> dict[str, Container]:
        if self._containers:
            return self._containers
        done = self.cli("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "json")
        found: dict[str, Container] = {}
        for item in json.loads(done.stdout or "[]"):
            service = (item.get("Labels") or {}).get("com.docker.compose.service")
            if service:
                found[service] = Container(item["Names"][0], service)
        return found

    def remember_containers(self) -> dict[str, Container]:
        """Read the project's containers once they are all created (names do not change while the stack runs)."""
        self._containers = {}
        self._containers = self.containers()
        return self._containers

    def up(self, config: dict[str, Any]) -> dict[str, float]:
        services: dict[str, Any] = config["services"]
        # --no-deps: no `podman create --requires` for depends_on (this check gates each start itself, as Docker
        # does). With it, podman's restart policy would not restart booking-agent after the kill while its one-shot
        # dependency `issuer` is exited, and every start would run the one-shot again.
        self.compose("up", "--no-start", "--no-deps", timeout=600)
        containers = self.remember_containers()
        missing = set(services) - set(containers)
        if missing:
            raise CheckFailed(f"podman-compose created no container for {sorted(missing)}")
        self.prober = HealthProber(self, {name: services[name].get("healthcheck") for name in services})
        self.prober.start()
        failures: list[str] = []

        def start_when_ready(service: str) -> None:
            try:
                for dependency, rule in (services[service].get("depends_on") or {}).items():
                    if dependency not in services:
                        log(
                            f"{service}: depends on {dependency}, whose profile is not enabled: skipped, as "
                            "podman-compose does (Docker Compose wants `required: false` for that)"
                        )
                        continue
                    self._wait_condition(service, dependency, rule.get("condition", "service_started"))
                self.cli("start", containers[service].name)
                log(f"{service}: started")
            except CheckFailed as exc:
                failures.append(str(exc))

        threads = [threading.Thread(target=start_when_ready, args=(name,), daemon=True) for name in services]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if failures:
            raise CheckFailed("the stack did not come up:\n" + "\n".join(failures))
        if any(thread.is_alive() for thread in threads):
            raise CheckFailed(f"the stack did not come up within {STARTUP_TIMEOUT_S:.0f}s")
        for service in services:
            if service in self.prober.intervals:  # a healthcheck that is not disabled (the one-shot issuer's is)
                self._wait_condition("the check", service, "service_healthy")
        return dict(self.prober.first_healthy)

    def _wait_condition(self, waiter: str, dependency: str, condition: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            info = self.inspect(dependency)
            state = info["State"]
            status = (state.get("Health") or {}).get("Status")
            if condition == "service_started" and state.get("Running"):
                return
            if condition == "service_healthy" and state.get("Running") and status == "healthy":
                return
            restarts = int(info.get("RestartCount") or 0)
            if restarts >= 3:
                raise CheckFailed(
                    f"{waiter} waits for {dependency} ({condition}), which keeps exiting ({restarts} restarts); "
                    f"its log:\n{self.logs(dependency, tail=30)}"
                )
            if condition == "service_healthy" and status == "unhealthy":
                said = self.prober.last_output.get(dependency, "?") if self.prober else "?"
                raise CheckFailed(
                    f"{waiter} waits for {dependency} to be healthy, and it is unhealthy; its last probe (podman "
                    f"healthcheck run): {said}; {self._run_healthcheck_by_hand(dependency)}\n"
                    f"{dependency}'s log:\n{self.logs(dependency, tail=30)}"
                )
            if condition == "service_completed_successfully" and state.get("Status") == "exited":
                if state.get("ExitCode") == 0:
                    return
                raise CheckFailed(f"{dependency} exited {state.get('ExitCode')}; {waiter} needs it to succeed")
            time.sleep(1.0)
        raise CheckFailed(
            f"{waiter} waited {STARTUP_TIMEOUT_S:.0f}s for {dependency} ({condition}); its log:\n"
            f"{self.logs(dependency, tail=30)}"
        )

    def _run_healthcheck_by_hand(self, service: str) -> str:
        """Podman records no output for a probe that could not even start: run the test with exec to say why."""
        test = self.prober.tests.get(service) if self.prober else None
        if not isinstance(test, list) or not test or test[0] not in ("CMD", "CMD-SHELL"):
            return f"healthcheck test {test!r}"
        argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", " ".join(test[1:])]
        done = self.exec(service, *argv, check=False)
        said = (done.stdout + done.stderr).strip()[-500:]
        return f"the test {argv} run with exec: exit {done.returncode}: {said or '(nothing)'}"

    def down(self) -> None:
        if self.prober is not None:
            self.prober.stop()
        done = self.compose("down", "-v", "-t", "10", check=False, timeout=300)
        if done.returncode != 0:
            log(f"podman-compose down exited {done.returncode}; removing what is left by label")
        self._remove_project_objects()
        left = self.cli("ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}", check=False)
        volumes = self.cli("volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}", check=False)
        if left.stdout.strip() or volumes.stdout.strip():
            raise CheckFailed(f"teardown left containers {left.stdout.split()} and volumes {volumes.stdout.split()}")
        log("down: no container, volume or network of the project is left")


class HealthProber:
    """Runs each container's healthcheck every ``interval``, as systemd's timers would for podman elsewhere (and
    dockerd does for Docker): ``podman healthcheck run`` probes and keeps podman's own health status (start period,
    retries, FailingStreak). Records when each service first turned healthy."""

    def __init__(self, engine: Podman, checks: dict[str, dict[str, Any] | None]) -> None:
        self.engine = engine
        self.intervals = {
            name: seconds(check.get("interval", "30s"))
            for name, check in checks.items()
            if check and not check.get("disable") and check.get("test") not in (["NONE"], "NONE")
        }
        self.tests = {name: check["test"] for name, check in checks.items() if check and name in self.intervals}
        self.first_healthy: dict[str, float] = {}
        self.last_output: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-prober", daemon=True)
        self._due: dict[str, tuple[str, float]] = {}  # service -> (StartedAt it was scheduled for, next probe)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self._tick()
            except Exception as exc:  # never let the prober die silently: the check would just hang
                log(f"health prober: {exc!r}")

    def _tick(self) -> None:
        done = self.engine.cli(
            "ps", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "json", check=False
        )
        now = time.time()
        for item in json.loads(done.stdout or "[]"):
            service = (item.get("Labels") or {}).get("com.docker.compose.service")
            if service not in self.intervals or item.get("State") != "running":
                continue
            started = str(item.get("StartedAt"))
            scheduled_for, due = self._due.get(service, ("", 0.0))
            if scheduled_for != started:  # (re)started: first probe one interval after the start, as Docker does
                self._due[service] = (started, now + self.intervals[service])
                continue
            if now < due:
                continue
            self._due[service] = (started, now + self.intervals[service])
            probe = self.engine.cli("healthcheck", "run", item["Names"][0], check=False, timeout=120)
            said = "\n".join(
                line for line in (probe.stdout + probe.stderr).splitlines() if "systemd" not in line and line.strip()
            )
            self.last_output[service] = f"exit {probe.returncode}: {said or '(nothing)'}"
            if probe.returncode == 0 and service not in self.first_healthy:
                self.first_healthy[service] = time.time()


def seconds(duration: str | int | float) -> float:
    if isinstance(duration, int | float):
        return float(duration)
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    total, number = 0.0, ""
    index = 0
    while index < len(duration):
        char = duration[index]
        if char.isdigit() or char == ".":
            number += char
            index += 1
            continue
        unit = next(u for u in ("us", "ms", "s", "m", "h") if duration.startswith(u, index))
        total += float(number) * units[unit]
        number, index = "", index + len(unit)
    return total


class Docker(Engine):
    name = "docker"

    def __init__(self, compose_file: Path, env: dict[str, str], workdir: Path) -> None:
        super().__init__(compose_file, env, workdir, [compose_file])

    def prepare(self, rebuild_standins: bool) -> None:
        if not shutil.which("docker"):
            raise CheckFailed("docker not found")
        log("docker: official images from the registry; the project's image from the Dockerfile as it is")
        self.compose("down", "-v", "--remove-orphans", check=False)
        self.compose("build", timeout=1800)

    def compose(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = [arg for path in self.compose_files for arg in ("-f", str(path))]
        return run(["docker", "compose", "-p", PROJECT, *files, *args], check=check, env=self.env, timeout=timeout)

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run(["docker", *args], check=check, timeout=timeout)

    def containers(self) -> dict[str, Container]:
        done = self.compose("ps", "-a", "--format", "json")
        text = done.stdout.strip()
        # one object per line (Compose 2.21 and later) or one array (before)
        items = json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
        return {item["Service"]: Container(item["Name"], item["Service"]) for item in items}

    def up(self, config: dict[str, Any]) -> dict[str, float]:
        self.compose(
            "up", "-d", "--wait", "--wait-timeout", str(int(STARTUP_TIMEOUT_S)), timeout=STARTUP_TIMEOUT_S + 60
        )
        first: dict[str, float] = {}
        for service in config["services"]:
            entries = (self.inspect(service)["State"].get("Health") or {}).get("Log") or []
            passed = [parse_time(e["End"]) for e in entries if e.get("ExitCode") == 0]
            if passed and len(entries) < 5:  # Docker keeps the last 5 probes: the first pass is known only until then
                first[service] = min(passed)
        return first

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "10", check=False, timeout=300)
        left = self.compose("ps", "-aq", check=False).stdout.split()
        if left:
            raise CheckFailed(f"teardown left containers {left}")
        log("down: no container, volume or network of the project is left")


# --------------------------------------------------------------------------------------------------- the check


@dataclass
class Check:
    engine: Engine
    admin_token: str
    timings: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    booked: list[str] = field(default_factory=list)
    token: str | None = None  # PERSON's bearer token, once the stack is up

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        log(f"--- {name}")
        yield
        self.timings[name] = time.monotonic() - started
        log(f"--- {name}: ok ({self.timings[name]:.1f}s)")

    # ------------------------------------------------------------------------------------------------- up

    def up(self) -> None:
        self.config = self.engine.config()
        services = self.config["services"]
        expected = {"redis", "postgres", ISSUER_SERVICE, *APP_SERVICES}
        if set(services) != expected and not (isinstance(self.engine, Docker) and set(services) >= expected):
            raise CheckFailed(f"compose config has services {sorted(services)}, expected {sorted(expected)}")
        first_healthy = self.engine.up(self.config)
        self.check_start_order(first_healthy)

    def check_start_order(self, first_healthy: dict[str, float]) -> None:
        """``service_healthy`` gated the start: each container started after each such dependency's first passing
        probe (times from the engine: StartedAt; the first probe that passed); ``service_completed_successfully``
        after the one-shot's FinishedAt."""
        checked = completed = 0
        for service, spec in self.config["services"].items():
            started = parse_time(self.engine.inspect(service)["State"]["StartedAt"])
            for dependency, rule in (spec.get("depends_on") or {}).items():
                if rule.get("condition") == "service_completed_successfully" and dependency in self.config["services"]:
                    finished = parse_time(self.engine.inspect(dependency)["State"]["FinishedAt"])
                    if started < finished:
                        raise CheckFailed(
                            f"{service} started {finished - started:.1f}s before {dependency} finished: "
                            "service_completed_successfully did not gate the start"
                        )
                    completed += 1
                    continue
                if rule.get("condition") != "service_healthy" or dependency not in first_healthy:
                    continue
                if started < first_healthy[dependency]:
                    raise CheckFailed(
                        f"{service} started {first_healthy[dependency] - started:.1f}s before {dependency} was "
                        "healthy: service_healthy did not gate the start"
                    )
                checked += 1
        if checked == 0:
            raise CheckFailed("no service_healthy dependency could be checked")
        log(
            f"start order: {checked} service_healthy dependencies started after their dependency's first healthy "
            f"probe, {completed} service_completed_successfully ones after it exited"
        )

    # ------------------------------------------------------------------------------------------------- helpers

    def url(self, service: str) -> str:
        return URLS[service]

    def fault(self, provider: str, **fault: float) -> None:
        url = f"{self.url(provider)}/admin/faults"
        if fault:
            http("PUT", url, body=fault, token=self.admin_token)
        else:
            http("DELETE", url, token=self.admin_token)

    def book(self, days_ahead: int) -> str:
        checkin = dt.date.today() + dt.timedelta(days=days_ahead)
        body = {
            "city": "Lisbon",
            "checkin": checkin.isoformat(),
            "checkout": (checkin + dt.timedelta(days=2)).isoformat(),
            "guests": 2,
            "payment_token": "tok_visa",
        }
        accepted = http("POST", f"{self.url('booking-agent')}/bookings", body=body, token=self.token)
        booking_id = str(accepted["booking_id"])
        self.booked.append(booking_id)
        log(f"booked {booking_id} ({accepted['status']})")
        return booking_id

    def wait_status(self, booking_id: str, wanted: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        status = "?"
        while time.monotonic() < deadline:
            status = http("GET", f"{self.url('booking-agent')}/bookings/{booking_id}", token=self.token)["status"]
            if status == wanted:
                return
            if status in ("confirmed", "failed"):
                break
            time.sleep(0.05)
        raise CheckFailed(f"booking {booking_id} never reached {wanted!r} (last: {status!r})")

    def wait_final(
        self, booking_id: str, timeout: float = BOOKING_TIMEOUT_S, *, token: str | None = None
    ) -> dict[str, Any]:
        """The booking's final state over HTTP, through a booking-agent restart (connection refused meanwhile), as
        PERSON (``token``: another caller's, e.g. the operator's admin token for a booking a CLI made as ``me``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            booking = http_retrying(
                "GET",
                f"{self.url('booking-agent')}/bookings/{booking_id}?wait=10",
                deadline,
                timeout=15,
                token=token or self.token,
            )
            if booking["status"] in ("confirmed", "failed"):
                return dict(booking)
        raise CheckFailed(f"booking {booking_id} not final after {timeout:.0f}s")

    def redis(self, *command: str) -> str:
        return self.engine.exec("redis", "redis-cli", "--raw", *command).stdout.strip()

    def booking_status_in_redis(self, booking_id: str) -> str:
        return self.redis(
            "HGET", f"concierge:{{bookings}}:booking:{booking_id}", "status"
        )  # infra.bookings.booking_key

    def queue(self) -> dict[str, Any]:
        return dict(http("GET", f"{self.url('recovery-worker')}/health/queue"))

    def assert_exactly_once(self, booking_id: str, booking: dict[str, Any]) -> None:
        if booking["status"] != "confirmed":
            raise CheckFailed(f"booking {booking_id} ended {booking['status']}: {booking}")
        reservations = http("GET", f"{self.url('hotel-api')}/admin/ledger", token=self.admin_token)["reservations"]
        charges = http("GET", f"{self.url('payment-api')}/admin/ledger", token=self.admin_token)["charges"]
        mine_r = [r for r in reservations if r["reference"] == booking_id]
        mine_c = [c for c in charges if c["reference"] == booking_id]
        if [r["status"] for r in mine_r] != ["confirmed"]:
            raise CheckFailed(f"hotel-api's ledger for {booking_id}: {mine_r} (expected one confirmed reservation)")
        if [c["status"] for c in mine_c] != ["captured"]:
            raise CheckFailed(f"payment-api's ledger for {booking_id}: {mine_c} (expected one captured charge)")
        if len(reservations) != len(self.booked) or len(charges) != len(self.booked):
            raise CheckFailed(
                f"{len(self.booked)} booking(s) made, but the ledgers hold {len(reservations)} reservation(s) and "
                f"{len(charges)} charge(s): {reservations} {charges}"
            )
        if booking.get("reservation_id") != mine_r[0]["reservation_id"]:
            raise CheckFailed(f"booking {booking_id} names {booking.get('reservation_id')}, the ledger {mine_r}")
        log(f"{booking_id}: confirmed; ledgers: one confirmed reservation, one captured charge")

    def wait_healthy(self, service: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.engine.health(service) == "healthy":
                return
            time.sleep(0.5)
        raise CheckFailed(f"{service} not healthy again after {timeout:.0f}s:\n{self.engine.logs(service, tail=30)}")

    # ------------------------------------------------------------------------------------------------- kill

    def kill_mid_booking(self) -> None:
        before = self.engine.inspect("booking-agent")
        restarts_before = int(before.get("RestartCount") or 0)
        recovered_before = int(self.queue()["recovered_total"])
        self.fault("payment-api", latency_s=PAYMENT_LATENCY_S)
        booking_id = self.book(days_ahead=30)
        self.wait_status(booking_id, "paying")
        time.sleep(IN_FLIGHT_S)
        pid = int(self.engine.inspect("booking-agent")["State"]["Pid"])
        run(["kill", "-s", "KILL", str(pid)])
        killed_at = time.monotonic()
        log(f"kill -s KILL {pid} (booking-agent's PID 1) while {booking_id} is paying")
        self.fault("payment-api")  # the charge in flight keeps its delay; the recovery's calls do not wait
        deadline = time.monotonic() + 60
        while True:
            state = self.engine.inspect("booking-agent")
            if int(state.get("RestartCount") or 0) > restarts_before and state["State"].get("Running"):
                break
            if time.monotonic() > deadline:
                raise CheckFailed(f"restart: unless-stopped did not bring booking-agent back: {state['State']}")
            time.sleep(0.2)
        log(f"booking-agent restarted by its restart policy after {time.monotonic() - killed_at:.1f}s")
        booking = self.wait_final(booking_id)
        log(f"{booking_id}: {booking['status']} {time.monotonic() - killed_at:.1f}s after the kill")
        self.assert_exactly_once(booking_id, booking)
        recovered = int(self.queue()["recovered_total"]) - recovered_before
        if recovered != 1:
            raise CheckFailed(f"the recovery worker recovered {recovered} run(s), expected 1 (the killed one)")
        self.wait_healthy("booking-agent")

    # ------------------------------------------------------------------------------------------------- stop

    def stop_mid_booking(self) -> None:
        recovered_before = int(self.queue()["recovered_total"])
        self.fault("payment-api", latency_s=STOP_PAYMENT_LATENCY_S)
        booking_id = self.book(days_ahead=60)
        self.wait_status(booking_id, "paying")
        time.sleep(IN_FLIGHT_S)
        stopped_at = time.monotonic()
        log(f"stop booking-agent (SIGTERM, stop_grace_period) while {booking_id} is paying")
        stopping = subprocess.Popen(
            self._compose_argv("stop", "booking-agent"),
            env={**os.environ, **self.engine.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        output, _ = stopping.communicate(timeout=120)
        stop_s = time.monotonic() - stopped_at
        self.fault("payment-api")
        state = self.engine.inspect("booking-agent")["State"]
        grace = seconds(self.config["services"]["booking-agent"].get("stop_grace_period", "10s"))
        if stopping.returncode != 0:
            raise CheckFailed(f"stop booking-agent exited {stopping.returncode}: {output}")
        if state.get("Running") or state.get("ExitCode") != 0 or stop_s >= grace:
            raise CheckFailed(
                f"booking-agent did not stop cleanly on SIGTERM within its {grace:.0f}s grace period (took "
                f"{stop_s:.1f}s, exit code {state.get('ExitCode')}): SIGTERM must reach uvicorn in PID 1"
            )
        log(f"booking-agent exited 0 {stop_s:.1f}s after SIGTERM")
        deadline = time.monotonic() + BOOKING_TIMEOUT_S
        while (status := self.booking_status_in_redis(booking_id)) not in ("confirmed", "failed"):
            if time.monotonic() > deadline:
                raise CheckFailed(f"{booking_id} still {status} {BOOKING_TIMEOUT_S:.0f}s after the stop")
            time.sleep(0.1)
        final_s = time.monotonic() - stopped_at
        log(f"{booking_id}: {status} {final_s:.1f}s after SIGTERM, booking-agent still stopped")
        logs = self.engine.logs("booking-agent")
        # the stopped process's own lines (after its start): the SIGTERM found the run in flight and handed it off
        stopped = logs.rsplit("Started server process", 1)[-1]
        if f"run {booking_id} handed off for recovery" not in stopped:
            raise CheckFailed(
                f"booking-agent's log never says it handed {booking_id} off on SIGTERM: the SIGTERM landed after "
                f"the run was done (raise STOP_PAYMENT_LATENCY_S if `stop` is this slow to send it), or the run "
                f"was left to its lease:\n{logs[-3000:]}"
            )
        fence = self.redis("HGET", f"concierge:{{recovery}}:run:{booking_id}", "fence")
        if fence != "2":
            raise CheckFailed(f"run {booking_id} has fence {fence!r}: expected 2 (taken over once, by the worker)")
        time.sleep(2)
        if self.engine.inspect("booking-agent")["State"].get("Running"):
            raise CheckFailed("booking-agent came back after `stop`: restart: unless-stopped must leave it stopped")
        self.engine.compose("start", "booking-agent")
        self.wait_healthy("booking-agent")
        booking = self.wait_final(booking_id)
        self.assert_exactly_once(booking_id, booking)
        recovered = int(self.queue()["recovered_total"]) - recovered_before
        if recovered != 1:
            raise CheckFailed(f"the recovery worker recovered {recovered} run(s), expected 1 (the handed-off one)")

    def _compose_argv(self, *args: str) -> list[str]:
        files = [arg for path in self.engine.compose_files for arg in ("-f", str(path))]
        if isinstance(self.engine, Podman):
            return [self.engine.podman_compose, "-p", PROJECT, *files, *args]
        return ["docker", "compose", "-p", PROJECT, *files, *args]

    # ------------------------------------------------------------------------------------------------- people

    def person_token(self, person: str) -> str:
        """``concierge token --user PERSON`` in booking-agent's container: minted from the issuer volume it mounts."""
        done = self.engine.exec("booking-agent", "concierge", "token", "--user", person, check=False)
        token = done.stdout.strip()
        if done.returncode != 0 or token.count(".") != 2:
            raise CheckFailed(
                f"concierge token --user {person} in booking-agent exited {done.returncode}: {done.stderr}"
            )
        return token

    def people(self) -> None:
        """The local issuer was made once, by the one-shot service, before the services that trust it; a person's
        token is taken, no token is refused, and another person does not see this one's booking."""
        state = self.engine.inspect(ISSUER_SERVICE)["State"]
        if state.get("Running") or state.get("ExitCode") != 0:
            raise CheckFailed(f"the issuer service did not run once and exit 0: {state}")
        listed = self.engine.exec("booking-agent", "ls", "/issuer").stdout.split()
        if sorted(listed) != ["issuer-key.pem", "jwks.json"]:
            raise CheckFailed(f"the issuer volume holds {listed}, expected the key pair and jwks.json")
        self.token = self.person_token(PERSON)
        log(f"issuer: made into its volume, exited 0; {PERSON}'s token from `concierge token` in booking-agent")
        url = f"{self.url('booking-agent')}/bookings"
        status, headers, body = http_answer("GET", url)
        code = (body or {}).get("error", {}).get("code") if isinstance(body, dict) else None
        challenge = headers.get("WWW-Authenticate") if headers is not None else None
        if (status, code, challenge) != (401, "unauthenticated", "Bearer"):
            raise CheckFailed(
                f"GET /bookings without a token: {status} {code!r} WWW-Authenticate {challenge!r}: {body}"
            )
        status, _, body = http_answer("GET", url, token=self.token)
        if status != 200:
            raise CheckFailed(f"GET /bookings with {PERSON}'s token: {status} {body}")
        log("no token: 401 unauthenticated, WWW-Authenticate: Bearer; a person's token: 200")

    def another_person_sees_nothing(self, booking_id: str) -> None:
        other = self.person_token(ANOTHER_PERSON)
        status, _, body = http_answer("GET", f"{self.url('booking-agent')}/bookings/{booking_id}", token=other)
        if status != 404:
            raise CheckFailed(f"{ANOTHER_PERSON} asked for {PERSON}'s booking {booking_id}: {status} {body}")
        status, _, body = http_answer("GET", f"{self.url('booking-agent')}/bookings", token=other)
        listed = json.dumps(body)
        if status != 200 or booking_id in listed:
            raise CheckFailed(f"{ANOTHER_PERSON}'s GET /bookings: {status}, lists {PERSON}'s booking: {listed[:500]}")
        status, _, body = http_answer("GET", f"{self.url('booking-agent')}/bookings/{booking_id}", token=self.token)
        if status != 200:
            raise CheckFailed(f"{PERSON}'s own booking {booking_id}: {status} {body}")
        log(f"{ANOTHER_PERSON}: 404 for {PERSON}'s booking {booking_id}, and not in their list")

    # ------------------------------------------------------------------------------------------------- config

    def configuration(self) -> None:
        # every variable the compose file hands the application is one it reads (a misspelt name would silently
        # fall back to a default): infra.settings' names, plus the service table's URL variables
        known_script = (
            "import json; from infra.settings import Settings; from stack.services import SERVICES; "
            "names = {str(f.validation_alias) for f in Settings.model_fields.values() if f.validation_alias}; "
            "print(json.dumps(sorted(names | {s.url_env for s in SERVICES.values()})))"
        )
        known = set(json.loads(self.engine.exec("recovery-worker", "python", "-c", known_script).stdout))
        known.add("CONCIERGE_AUTH_ISSUER_DIR")  # the CLI's (stack/people.py): where `concierge token` mints from
        for service in (ISSUER_SERVICE, *APP_SERVICES):
            names = set(self.config["services"][service].get("environment") or {})
            unknown = sorted(names - known)
            if unknown:
                raise CheckFailed(f"{service}: docker-compose.yml sets {unknown}, which the application never reads")
        log(f"environment: every variable given to the {len(APP_SERVICES) + 1} services is one they read")

    def checkpoints_in_postgres(self) -> None:
        # the checkpoints went to Postgres (DATABASE_URL), not to SQLite in the container
        for booking_id in self.booked:
            count = self.engine.exec(
                "postgres", "psql", "-U", "concierge", "-d", "concierge", "-tAc",
                f"SELECT count(*) FROM checkpoints WHERE thread_id = '{booking_id}'",
            ).stdout.strip()  # fmt: skip
            if not count.isdigit() or int(count) == 0:
                raise CheckFailed(f"no checkpoint of {booking_id} in Postgres ({count!r})")
        log("checkpoints: in Postgres for every booking")

    def cli_in_a_container(self) -> None:
        """The README's `docker compose exec recovery-worker concierge ...`, as the image's non-root user."""
        user = self.engine.exec("recovery-worker", "id", "-un").stdout.strip()
        if user in ("root", "0"):
            raise CheckFailed("the application containers run as root")
        checkin = (dt.date.today() + dt.timedelta(days=90)).isoformat()
        book = self.engine.exec(
            "recovery-worker", "concierge", "book", "--city", "Lisbon", "--checkin", checkin, "--nights", "2",
            check=False,
        )  # fmt: skip
        ids = re.findall(r"\b[0-9a-f]{32}\b", book.stdout + book.stderr)
        if book.returncode != 0 or not ids:
            raise CheckFailed(
                f"concierge book in recovery-worker (as {user}) exited {book.returncode}: {book.stdout}{book.stderr}"
            )
        self.booked.append(ids[0])
        # made as the CLI's default person (`me`): read as the operator, who sees every person's
        self.assert_exactly_once(ids[0], self.wait_final(ids[0], token=self.admin_token))
        log(f"concierge book in recovery-worker, as {user}: exit 0")
        dlq = self.engine.exec("recovery-worker", "concierge", "dlq", "list", check=False)
        if dlq.returncode != 0 or any(b in dlq.stdout for b in self.booked):
            raise CheckFailed(f"concierge dlq list in recovery-worker (as {user}): {dlq.stdout}{dlq.stderr}")
        log(f"concierge dlq list in recovery-worker, as {user}: no booking dead-lettered")

    def conversation_in_a_container(self) -> None:
        """The README's one conversation, `concierge ask "..." --approve`, in concierge-agent's container."""
        checkin = (dt.date.today() + dt.timedelta(days=95)).isoformat()
        text = f"Book the cheapest hotel in Lisbon from {checkin} for 2 nights for two"
        ask = self.engine.exec("concierge-agent", "concierge", "ask", text, "--approve", check=False)
        booked = re.findall(r"booking ([0-9a-f]{32}): (\w+)", ask.stdout)
        if ask.returncode != 0 or not booked:
            raise CheckFailed(f"concierge ask in concierge-agent exited {ask.returncode}: {ask.stdout}{ask.stderr}")
        booking_id, status = booked[-1]
        if status != "confirmed":
            raise CheckFailed(f"concierge ask: booking {booking_id} {status}: {ask.stdout}")
        self.booked.append(booking_id)
        self.assert_exactly_once(booking_id, self.wait_final(booking_id, token=self.admin_token))
        log(f"concierge ask --approve in concierge-agent: exit 0, {booking_id} confirmed once")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--engine", choices=("podman", "docker"), default=os.environ.get("COMPOSE_CHECK_ENGINE", "podman")
    )
    parser.add_argument("--compose-file", type=Path, default=REPO / "docker-compose.yml")
    parser.add_argument("--rebuild-standins", action="store_true", help="rebuild the stand-in images, cache or not")
    args = parser.parse_args(argv)

    # one run at a time on a machine: a second one would tear the first one's stack down as a leftover
    CACHE.mkdir(parents=True, exist_ok=True)
    lock = (CACHE / "run.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log("another compose-check runs on this machine: waiting for it")
        fcntl.flock(lock, fcntl.LOCK_EX)

    started = time.monotonic()
    admin_token = secrets.token_hex(16)
    env = {
        # generated for this run, never written to disk
        "CONCIERGE_SERVICE_SECRET": secrets.token_hex(32),
        "CONCIERGE_ADMIN_TOKEN": admin_token,
        "RUN_LEASE_TTL": str(RUN_LEASE_TTL_S),
    }
    for variable in ("REDIS_URL", "DATABASE_URL", "OTEL_EXPORTER_OTLP_ENDPOINT", "COMPOSE_PROFILES"):
        os.environ.pop(variable, None)  # the compose file's defaults, not the caller's environment
    workdir = Path(tempfile.mkdtemp(prefix="compose-check-"))
    engine: Engine = (Podman if args.engine == "podman" else Docker)(args.compose_file.resolve(), env, workdir)
    check = Check(engine, admin_token)
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    ok = False
    entered = False
    try:
        with check.step("images"):
            engine.prepare(args.rebuild_standins)
        engine.enter()
        entered = True
        with check.step("up"):
            check.up()
        with check.step("configuration"):
            check.configuration()
        with check.step("people: the local issuer, a person's token"):
            check.people()
        with check.step("kill -s KILL booking-agent mid-booking"):
            check.kill_mid_booking()
        with check.step("stop booking-agent mid-booking"):
            check.stop_mid_booking()
        with check.step("people: another person's token"):
            check.another_person_sees_nothing(check.booked[0])
        with check.step("the CLI in a container"):
            check.cli_in_a_container()
        with check.step("a conversation in a container"):
            check.conversation_in_a_container()
        with check.step("checkpoints in Postgres"):
            check.checkpoints_in_postgres()
        ok = True
    except CheckFailed as exc:
        log(f"FAILED: {exc}")
    except KeyboardInterrupt:
        log(f"interrupted ({'SIGTERM' if interrupted else 'Ctrl-C'})")
    finally:
        if not ok and entered:
            dump_logs(engine)
        if entered:
            try:
                with check.step("down"):
                    engine.down()
            except CheckFailed as exc:
                log(f"FAILED: {exc}")
                ok = False
            finally:
                engine.leave()
        shutil.rmtree(workdir, ignore_errors=True)
    total = time.monotonic() - started
    summary = ", ".join(f"{name} {seconds_:.0f}s" for name, seconds_ in check.timings.items())
    log(f"{'PASSED' if ok else 'FAILED'} in {total:.0f}s ({summary})")
    passed = len(check.timings)
    print(f"compose-check: {passed} passed, {0 if ok else 1} failed", flush=True)
    return 0 if ok else 1


def dump_logs(engine: Engine) -> None:
    with contextlib.suppress(Exception):
        for service in engine.containers():
            print(f"----- {service} (last 40 lines)\n{engine.logs(service, tail=40)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
