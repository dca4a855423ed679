"""The deploy files' service-derived parts, written from the service table (stack/services.py).

    python scripts/deploy_files.py            rewrite them (make deploy-files)
    python scripts/deploy_files.py --check    exit 1, one line per file that differs from what the table makes

Generated: each deployed row's block in docker-compose.yml and its URL in the shared settings, its host entry and
service in scripts/compose.check.yml, its file in deploy/k8s/base (with its line in kustomization.yaml, its URL in
the ConfigMap, the issuer patch's target) and its Prometheus target. Kept as written: everything else, and the
comments that sit on a generated block (above a compose service, at the head of a k8s file, after a URL line).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stack.services import SERVICES, ServiceSpec, deployed

REPO = Path(__file__).resolve().parents[1]
COMPOSE = "docker-compose.yml"
COMPOSE_CHECK = "scripts/compose.check.yml"
K8S_BASE = "deploy/k8s/base"
KUSTOMIZATION = f"{K8S_BASE}/kustomization.yaml"
PROMETHEUS = "deploy/prometheus/prometheus.yml"
# the line that marks a k8s file as generated: what is above it is the file's own comment, kept
K8S_MARKER = (
    "# Port, health paths and command are those of stack/services.py (tests/unit/test_k8s_manifests.py keeps them "
    "in step)."
)

Read = Callable[[str], str | None]
"""A repository path → its text (None: no such file)."""


@dataclass(frozen=True)
class DeployFile:
    """One file as the table makes it; ``text`` None: the file must not exist (a row removed or not deployed)."""

    path: str
    text: str | None


class TableError(ValueError):
    """The table names what it cannot deploy (a peer that is not a deployed row above it, a port or URL variable twice),
    or a file lacks the part the table writes."""


# ------------------------------------------------------------------------------------------------ splicing


def splice_keyed(text: str, pattern: str, is_generated: Callable[[str], bool], lines: Sequence[tuple[str, str]]) -> str:
    """Replace the run of lines matching ``pattern`` (its group 1 a key for which ``is_generated``) by ``lines``
    (key, line); a hand-written line inside the run stays after the generated line it follows."""
    regex = re.compile(pattern)
    old = text.split("\n")
    hits = [i for i, line in enumerate(old) if (m := regex.fullmatch(line)) and is_generated(m[1])]
    if not hits:
        raise TableError(f"no line matches {pattern!r}: nothing to regenerate")
    first, last = hits[0], hits[-1]
    kept: dict[str, list[str]] = {}
    orphans: list[str] = []
    owner: str | None = None
    for line in old[first : last + 1]:
        m = regex.fullmatch(line)
        if m and is_generated(m[1]):
            owner = m[1]
            kept.setdefault(owner, [])
        elif owner is not None:
            kept[owner].append(line)
    new_keys = {key for key, _ in lines}
    for key, extra in kept.items():
        if key not in new_keys:
            orphans.extend(extra)
    run = [out for key, line in lines for out in (line, *kept.get(key, []))] + orphans
    return "\n".join([*old[:first], *run, *old[last + 1 :]])


def splice_chunks(text: str, generated_name: Callable[[str], str | None], chunks: Sequence[tuple[str, str]]) -> str:
    """Replace the run of blank-line separated chunks for which ``generated_name`` gives a name by ``chunks`` (name,
    body); the comment lines at the top of an old chunk of that name stay on top of its new body."""
    old = text.split("\n\n")
    hits = [i for i, chunk in enumerate(old) if generated_name(chunk) is not None]
    if not hits:
        raise TableError("no generated block found: nothing to regenerate")
    first, last = hits[0], hits[-1]
    comments: dict[str, list[str]] = {}
    for chunk in old[first : last + 1]:
        name = generated_name(chunk)
        if name is None:
            raise TableError(f"a hand-written block among the generated ones: {chunk.splitlines()[0]!r}")
        comments[name] = _leading(chunk.split("\n"), lambda line: line.lstrip().startswith("#"))
    run = ["\n".join([*comments.get(name, []), body]) for name, body in chunks]
    return "\n\n".join([*old[:first], *run, *old[last + 1 :]])


def _leading(lines: Iterable[str], keep: Callable[[str], bool]) -> list[str]:
    """The lines before the first that ``keep`` refuses."""
    out = []
    for line in lines:
        if not keep(line):
            break
        out.append(line)
    return out


# ------------------------------------------------------------------------------------------------ compose

_COMPOSE_APP = re.compile(r'^  ([a-z0-9-]+):\n    <<: \*concierge\n    command: \["concierge", "serve", ', re.M)


def compose_app_name(chunk: str) -> str | None:
    """The name of a compose service block that runs ``concierge serve`` (a generated one), else None."""
    body = "\n".join(line for line in chunk.split("\n") if not line.lstrip().startswith("#"))
    match = _COMPOSE_APP.match(body)
    return match[1] if match else None


def compose_block(spec: ServiceSpec) -> str:
    published = f"127.0.0.1:{spec.port}:{spec.port}" if spec.loopback_only else f"{spec.port}:{spec.port}"
    probe = (
        '["CMD", "python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('
        f"'http://127.0.0.1:{spec.port}{spec.health_path}', timeout=2).status != 200)\"]"
    )
    lines = [
        f"  {spec.name}:",
        "    <<: *concierge",
        f'    command: ["concierge", "serve", "{spec.name}", "--host", "0.0.0.0"]',
    ]
    if spec.mounts_issuer:
        lines += ["    volumes:", "      - issuer:/issuer:ro"]
    lines += [
        "    ports:",
        f'      - "{published}"',
        "    healthcheck:",
        f"      test: {probe}",
        "      <<: *probe-timing",
        "    depends_on:",
        *(f"      {name}: {{ condition: {condition} }}" for name, condition in compose_depends_on(spec)),
    ]
    return "\n".join(lines)


def compose_depends_on(spec: ServiceSpec) -> list[tuple[str, str]]:
    """(service, condition) in compose's order: storage, the table's peers, the one-shot issuer, tracing."""
    waits = [("redis", "service_healthy")]
    waits += [("postgres", "service_healthy")] if spec.durable else []
    waits += [(peer, "service_healthy") for peer in spec.depends_on]
    waits += [("issuer", "service_completed_successfully")] if spec.mounts_issuer else []
    return [*waits, ("jaeger", "service_started")]


def render_compose(text: str, services: Mapping[str, ServiceSpec], known: set[str]) -> str:
    rows = deployed(services).values()
    text = splice_chunks(text, compose_app_name, [(spec.name, compose_block(spec)) for spec in rows])
    return splice_keyed(
        text,
        r"    ([A-Z0-9_]+_URL): \$\{[A-Z0-9_]+:-http://[a-z0-9-]+:\d+\}",
        lambda env: env in _url_envs(services, known),
        [(spec.url_env, f"    {spec.url_env}: ${{{spec.url_env}:-http://{spec.name}:{spec.port}}}") for spec in rows],
    )


def render_compose_check(text: str, services: Mapping[str, ServiceSpec], known: set[str]) -> str:
    rows = deployed(services).values()
    text = splice_keyed(
        text,
        r'    - "([a-z0-9-]+):127\.0\.0\.1"',
        known.__contains__,
        [(spec.name, f'    - "{spec.name}:127.0.0.1"') for spec in rows],
    )
    return splice_keyed(
        text, r"  ([a-z0-9-]+): \*app", known.__contains__, [(spec.name, f"  {spec.name}: *app") for spec in rows]
    )


def _url_envs(services: Mapping[str, ServiceSpec], known: set[str]) -> set[str]:
    """Every URL variable a row has or had (a removed row's is recognised by its name)."""
    return {spec.url_env for spec in services.values()} | {f"{name.replace('-', '_').upper()}_URL" for name in known}


# ------------------------------------------------------------------------------------------------ kubernetes


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    memory_limit: str


SMALL = Resources("100m", "128Mi", "256Mi")
LARGE = Resources("250m", "256Mi", "512Mi")
_ROLLING = """\
  strategy:
    # a rolling update never takes a replica away before its successor is ready
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
"""
_K8S_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: {name}
    app.kubernetes.io/component: service
spec:
  replicas: {replicas}
{rolling}  selector:
    matchLabels:
      app.kubernetes.io/name: {name}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: {name}
        app.kubernetes.io/component: service
    spec:
      containers:
        - name: {name}
          image: concierge
          imagePullPolicy: IfNotPresent
          command: ["concierge", "serve", "{name}", "--host", "0.0.0.0"]
          ports:
            - name: http
              containerPort: {port}
          # up to 60 s to start (imports, the checkpointer's tables) before liveness counts
          startupProbe:
            httpGet:
              path: {health}
              port: http
            periodSeconds: 2
            failureThreshold: 30
          # the process answers: restart it if not
          livenessProbe:
            httpGet:
              path: {health}
              port: http
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          # Redis and the checkpointer answer: send it traffic only then (no restart for a dependency's outage)
          readinessProbe:
            httpGet:
              path: {ready}
              port: http
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          resources:
            requests:
              cpu: {cpu}
              memory: {memory}
            limits:
              cpu: "1"
              memory: {memory_limit}
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: {name}
spec:
  selector:
    app.kubernetes.io/name: {name}
  ports:
    - name: http
      port: {port}
      targetPort: http
"""
_K8S_PDB = """\
---
# Voluntary disruptions (node drains, cluster upgrades) take one replica at a time.
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {name}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app.kubernetes.io/name: {name}
"""
_KIND_NOTE = {
    "provider": "a simulated provider. One replica: it stands in for the outside world.",
    "agent": "a durable agent (A2A).",
    "worker": "a durable worker.",
    "tooling": "the operator's. One replica.",
}


def k8s_file(spec: ServiceSpec, old: str | None) -> str:
    """base/<name>.yaml: Deployment, Service and, replicated (durable), a PodDisruptionBudget; the comment above the
    marker line is the old file's, or a line naming the kind."""
    head = _leading((old or "").split("\n"), lambda line: line.startswith("#") and line != K8S_MARKER) if old else []
    head = head or [f"# {spec.name}: {_KIND_NOTE[spec.kind]}"]
    resources = LARGE if spec.durable else SMALL
    body = _K8S_DEPLOYMENT.format(
        name=spec.name,
        replicas=2 if spec.durable else 1,
        rolling=_ROLLING if spec.durable else "",
        port=spec.port,
        health=spec.health_path,
        ready=spec.ready_path,
        cpu=resources.cpu,
        memory=resources.memory,
        memory_limit=resources.memory_limit,
    )
    body += _K8S_PDB.format(name=spec.name) if spec.durable else ""
    return "\n".join([*head, K8S_MARKER, body])


def render_kustomization(text: str, services: Mapping[str, ServiceSpec], known: set[str]) -> str:
    rows = deployed(services).values()
    text = splice_keyed(
        text, r"  - ([a-z0-9-]+)\.yaml", known.__contains__, [(spec.name, f"  - {spec.name}.yaml") for spec in rows]
    )
    text = splice_keyed(
        text,
        r"      - ([A-Z0-9_]+_URL)=http://[a-z0-9-]+:\d+",
        lambda env: env in _url_envs(services, known),
        [(spec.url_env, f"      - {spec.url_env}=http://{spec.name}:{spec.port}") for spec in rows],
    )
    issuer = "|".join(sorted(spec.name for spec in rows if spec.mounts_issuer))
    patched, count = re.subn(r"(?m)^(      name: )\^\([a-z0-9|-]*\)\$$", rf"\g<1>^({issuer})$", text)
    if count != 1:
        raise TableError(f"{KUSTOMIZATION}: not one `name: ^(...)$` target for the issuer patch")
    return patched


# ------------------------------------------------------------------------------------------------ prometheus


def render_prometheus(text: str, services: Mapping[str, ServiceSpec], known: set[str]) -> str:
    return splice_keyed(
        text,
        r"          - ([a-z0-9-]+):\d+",
        known.__contains__,
        [(spec.name, f"          - {spec.name}:{spec.port}") for spec in deployed(services).values() if spec.metrics],
    )


# ------------------------------------------------------------------------------------------------ the whole


def validate(services: Mapping[str, ServiceSpec]) -> None:
    rows = deployed(services)
    for spec in rows.values():
        for peer in spec.depends_on:
            if peer not in rows or list(services).index(peer) >= list(services).index(spec.name):
                raise TableError(f"{spec.name} depends on {peer!r}, not a deployed row above it in the table")
    for attribute in ("port", "url_env"):
        values = [getattr(spec, attribute) for spec in services.values()]
        if twice := sorted({value for value in values if values.count(value) > 1}):
            raise TableError(f"two rows share a {attribute}: {', '.join(map(str, twice))}")


def known_names(services: Mapping[str, ServiceSpec], read: Read) -> set[str]:
    """The table's names and those the files generated before (a row removed since): both are generated parts."""
    compose = read(COMPOSE) or ""
    names = {name for chunk in compose.split("\n\n") if (name := compose_app_name(chunk))}
    return set(services) | names


def render(services: Mapping[str, ServiceSpec], read: Read, old_k8s: Iterable[str] = ()) -> list[DeployFile]:
    """Every generated file as ``services`` makes it, from the files as ``read`` gives them; ``old_k8s``: the names
    of the generated files in deploy/k8s/base today (one of a row no longer deployed is to be removed)."""
    validate(services)
    known = known_names(services, read) | set(old_k8s)

    def edited(path: str, make: Callable[[str, Mapping[str, ServiceSpec], set[str]], str]) -> DeployFile:
        text = read(path)
        if text is None:
            raise TableError(f"{path} is missing")
        return DeployFile(path, make(text, services, known))

    files = [
        edited(COMPOSE, render_compose),
        edited(COMPOSE_CHECK, render_compose_check),
        edited(KUSTOMIZATION, render_kustomization),
        edited(PROMETHEUS, render_prometheus),
    ]
    rows = deployed(services)
    files += [
        DeployFile(f"{K8S_BASE}/{name}.yaml", k8s_file(spec, read(f"{K8S_BASE}/{name}.yaml")))
        for name, spec in rows.items()
    ]
    files += [DeployFile(f"{K8S_BASE}/{name}.yaml", None) for name in sorted(set(old_k8s) - set(rows))]
    return files


def generated_k8s(root: Path = REPO) -> list[str]:
    """The service names of the files in deploy/k8s/base that carry the marker line (those this script wrote)."""
    return sorted(path.stem for path in (root / K8S_BASE).glob("*.yaml") if K8S_MARKER in path.read_text())


def reader(root: Path = REPO) -> Read:
    def read(path: str) -> str | None:
        file = root / path
        return file.read_text() if file.exists() else None

    return read


def stale(files: Iterable[DeployFile], read: Read) -> list[str]:
    """One line per file that is not what the table makes."""
    lines = []
    for file in files:
        current = read(file.path)
        if file.text is None and current is not None:
            lines.append(f"{file.path}: no deployed row of stack/services.py makes it (make deploy-files removes it)")
        elif file.text is not None and current != file.text:
            lines.append(f"{file.path}: not what stack/services.py makes (make deploy-files)")
    return lines


def write(files: Iterable[DeployFile], root: Path = REPO) -> list[str]:
    """Write (or remove) the files that differ; their paths."""
    changed = []
    read = reader(root)
    for file in files:
        if read(file.path) == file.text:
            continue
        target = root / file.path
        if file.text is None:
            target.unlink()
        else:
            target.write_text(file.text)
        changed.append(file.path)
    return changed


def main(argv: list[str] | None = None, root: Path = REPO, services: Mapping[str, ServiceSpec] = SERVICES) -> int:
    """``root``, ``services``: another copy of the files and of the table (the tests')."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is stale")
    args = parser.parse_args(argv)
    read = reader(root)
    try:
        files = render(services, read, generated_k8s(root))
    except TableError as exc:
        print(f"stack/services.py: {exc}", file=sys.stderr)
        return 2
    if args.check:
        lines = stale(files, read)
        print(
            "\n".join(lines) if lines else "the deploy files are the service table's",
            file=sys.stderr if lines else sys.stdout,
        )
        return 1 if lines else 0
    for path in write(files, root):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
