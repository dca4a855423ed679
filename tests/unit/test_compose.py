"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the compose file is valid Compose, and
its application services are exactly the service table ``concierge up`` runs (names, commands, ports, health
checks, peer URLs), so the two ways of running the stack cannot drift apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from domain.llm import PRIMARY_MODEL
from identity.people import LOCAL_ISSUER, LocalIssuer
from stack.services import DEPLOYED, SERVICES

REPO = Path(__file__).resolve().parents[2]
# The Compose Specification's own JSON schema, kept verbatim in the repository (tests/data/README.md: origin, licence).
SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
INFRASTRUCTURE = {"redis", "postgres", "jaeger", "prometheus", "grafana"}
# one-shots: run once, exit 0, and the services wait for that (service_completed_successfully)
ONE_SHOTS = {"issuer"}
# the services that take people's tokens (identity/people.py PeopleGate), and the containers people's commands run in
# (`docker compose exec recovery-worker concierge book`, `exec concierge-agent concierge ask`, `exec booking-agent
# concierge token`): they mount the local issuer, as the table marks them (mounts_issuer)
PEOPLE_GATED = ("booking-agent", "concierge-agent")
ISSUER_MOUNTED = tuple(name for name, spec in DEPLOYED.items() if spec.mounts_issuer)
_SET_DEFAULTED = re.compile(r"^\$\{(?P<var>[A-Z0-9_]+)-(?P<default>[^}]*)\}$")
_DEFAULTED = re.compile(r"^\$\{(?P<var>[A-Z0-9_]+):-(?P<default>[^}]*)\}$")
_REQUIRED = re.compile(r"^\$\{(?P<var>[A-Z0-9_]+):\?(?P<message>[^}$]+)\}$")
# published on the host's loopback only: the outside world's stand-ins, and the console (an operator's page)
LOOPBACK_ONLY = tuple(name for name, spec in DEPLOYED.items() if spec.loopback_only)
_PROBE_URL = re.compile(r"http://127\.0\.0\.1:(?P<port>\d+)(?P<path>/[\w/]*)")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def dockerfile() -> list[str]:
    return [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if name not in INFRASTRUCTURE | ONE_SHOTS}


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration):
        total += float(amount) * units[unit]
    return total


def test_compose_file_validates_against_the_compose_spec(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    # the file names draft-07 by an URL jsonschema does not know; say it explicitly
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(compose)


def test_application_services_are_the_service_table(compose: dict[str, Any]) -> None:
    assert set(app_services(compose)) == set(DEPLOYED)
    assert set(compose["services"]) >= INFRASTRUCTURE


@pytest.mark.parametrize("name", list(DEPLOYED))
def test_each_service_runs_concierge_serve_on_its_table_port(compose: dict[str, Any], name: str) -> None:
    spec = DEPLOYED[name]
    service = compose["services"][name]
    assert service["command"] == ["concierge", "serve", name, "--host", "0.0.0.0"]
    published = f"127.0.0.1:{spec.port}:{spec.port}" if name in LOOPBACK_ONLY else f"{spec.port}:{spec.port}"
    assert published in service["ports"]
    assert service["build"] == "."
    assert service["restart"] == "unless-stopped"
    # the SIGTERM handoff: the booking-agent's drain (10 s) runs inside uvicorn's graceful shutdown
    assert seconds(service["stop_grace_period"]) >= 20


@pytest.mark.parametrize("name", list(DEPLOYED))
def test_each_health_check_probes_the_table_health_path(compose: dict[str, Any], name: str) -> None:
    spec = DEPLOYED[name]
    test = compose["services"][name]["healthcheck"]["test"]
    assert test[0] == "CMD"
    match = _PROBE_URL.search(" ".join(test))
    assert match, test
    assert (int(match["port"]), match["path"]) == (spec.port, spec.health_path)


def test_one_image_for_every_application_service(compose: dict[str, Any]) -> None:
    images = {svc["image"] for svc in app_services(compose).values()}
    assert len(images) == 1


@pytest.mark.parametrize("name", list(DEPLOYED))
def test_peers_are_found_by_service_dns_name(compose: dict[str, Any], name: str) -> None:
    env = compose["services"][name]["environment"]
    for peer in DEPLOYED.values():
        match = _DEFAULTED.match(env[peer.url_env])
        assert match, f"{peer.url_env} should be ${{{peer.url_env}:-default}}"
        assert match["var"] == peer.url_env
        assert match["default"] == f"http://{peer.name}:{peer.port}"


@pytest.mark.parametrize("name", LOOPBACK_ONLY)
def test_the_providers_and_the_console_are_published_on_the_hosts_loopback_only(
    compose: dict[str, Any], name: str
) -> None:
    ports = compose["services"][name]["ports"]
    assert ports and all(str(port).startswith("127.0.0.1:") for port in ports), ports


def test_no_well_known_secret_the_service_secret_is_required_and_the_admin_token_optional(
    compose: dict[str, Any],
) -> None:
    for name, service in app_services(compose).items():
        env = service["environment"]
        # ${CONCIERGE_SERVICE_SECRET:?...}: compose refuses to start without it, and there is no default to fall to
        required = _REQUIRED.match(env["CONCIERGE_SERVICE_SECRET"])
        assert required and required["var"] == "CONCIERGE_SERVICE_SECRET", f"{name}: {env['CONCIERGE_SERVICE_SECRET']}"
        admin = _DEFAULTED.match(env["CONCIERGE_ADMIN_TOKEN"])
        assert admin and admin["var"] == "CONCIERGE_ADMIN_TOKEN" and admin["default"] == "", name
        assert "CONCIERGE_SERVICE_TOKEN" not in env, f"{name}: the retired static token is still passed"
        assert not any("concierge-dev-token" in str(value) for value in env.values()), name


def test_configuration_comes_from_the_environment_with_defaults(compose: dict[str, Any]) -> None:
    for name, service in app_services(compose).items():
        env = service["environment"]
        for variable in ("REDIS_URL", "DATABASE_URL", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            match = _DEFAULTED.match(env[variable])
            assert match and match["var"] == variable, f"{name}: {variable}={env[variable]!r}"
        assert _DEFAULTED.match(env["REDIS_URL"])["default"].startswith("redis://redis:")  # type: ignore[index]
        assert "@postgres:" in _DEFAULTED.match(env["DATABASE_URL"])["default"]  # type: ignore[index]
        assert _DEFAULTED.match(env["OTEL_EXPORTER_OTLP_ENDPOINT"])["default"] == "http://jaeger:4318"  # type: ignore[index]


def test_dependencies_wait_for_health_and_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in app_services(compose).items():
        depends = service["depends_on"]
        assert depends["redis"]["condition"] == "service_healthy", name
        for dependency, rule in depends.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if dependency in ONE_SHOTS:
                assert rule["condition"] == "service_completed_successfully", f"{name} → {dependency}"
            elif dependency != "jaeger":  # tracing is best effort: spans are dropped until jaeger listens
                assert rule["condition"] == "service_healthy", f"{name} → {dependency}"
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}, which has no healthcheck"
    for name in ("booking-agent", "recovery-worker"):
        assert {"postgres", "search-agent", "payment-agent", "hotel-api"} <= set(services[name]["depends_on"])


def test_infrastructure_is_durable_and_observable(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "--appendonly" in services["redis"]["command"]
    assert services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1] == "yes"
    assert "healthcheck" in services["redis"] and "healthcheck" in services["postgres"]
    assert "16686:16686" in services["jaeger"]["ports"]
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_dockerfile_runs_as_a_non_root_user(dockerfile: list[str]) -> None:
    users = [line.split()[1] for line in dockerfile if line.startswith("USER ")]
    assert users, "no USER instruction"
    assert users[-1] not in ("root", "0")


def test_dockerfile_has_a_healthcheck_and_a_slim_base(dockerfile: list[str]) -> None:
    assert any(line.startswith("HEALTHCHECK ") for line in dockerfile)
    base = next(line for line in dockerfile if line.startswith("FROM ")).split()[1]
    # the base is a build argument (make compose-check passes a local stand-in): its default is what everyone gets
    defaults = dict(line.split()[1].split("=", 1) for line in dockerfile if line.startswith("ARG ") and "=" in line)
    base = defaults.get(base.removeprefix("${").removesuffix("}"), base)
    assert "slim" in base and "python" in base


def test_dockerfile_installs_dependencies_before_copying_the_source(dockerfile: list[str]) -> None:
    copies = [(i, line) for i, line in enumerate(dockerfile) if line.startswith("COPY ")]
    install = next(i for i, line in enumerate(dockerfile) if "pip install" in line and "-r requirements.lock" in line)
    source = [i for i, line in copies if any(pkg in line.split() for pkg in ("agents", "infra", "graph", "recovery"))]
    assert source, "the source is never copied"
    assert install < min(source)
    # the dependency layer sees the lock and nothing else: editing the code keeps it cached
    assert [line for i, line in copies if i < install] == ["COPY requirements.lock ./"]


def test_the_concierge_talks_to_the_simulator_unless_told_otherwise(compose: dict[str, Any]) -> None:
    """LLM_BASE_URL is the OpenAI client's base URL (with /v1): llm-api's by default, a real server's when set."""
    env = compose["services"]["concierge-agent"]["environment"]
    base = _DEFAULTED.match(env["LLM_BASE_URL"])
    assert base and base["var"] == "LLM_BASE_URL"
    llm_api = SERVICES["llm-api"]
    assert base["default"] == f"http://{llm_api.name}:{llm_api.port}/v1"
    model = _DEFAULTED.match(env["LLM_MODEL"])
    assert model and model["var"] == "LLM_MODEL" and model["default"] == PRIMARY_MODEL, env["LLM_MODEL"]
    # its key is the stack's own unless one is given (llm-api and the concierge derive the same one)
    assert _DEFAULTED.match(env["LLM_API_KEY"])["default"] == ""  # type: ignore[index]


def test_the_concierge_starts_once_the_model_and_the_agents_it_calls_are_healthy(compose: dict[str, Any]) -> None:
    depends = compose["services"]["concierge-agent"]["depends_on"]
    for peer in ("redis", "postgres", "llm-api", "search-agent", "booking-agent"):
        assert depends[peer] == {"condition": "service_healthy"}, peer
    # published on every interface like the other agents: it has its own service tokens and host check
    assert (
        f"{SERVICES['concierge-agent'].port}:{SERVICES['concierge-agent'].port}"
        in compose["services"]["concierge-agent"]["ports"]
    )


# --------------------------------------------------------------------------------------------------- people


def test_the_local_issuer_is_made_once_into_a_volume_by_a_one_shot(compose: dict[str, Any]) -> None:
    """`concierge issuer --dir /issuer`, the services' own image, into the named volume `issuer`; it runs once (no
    restart, no healthcheck: it exits) and a second `up` keeps the key pair it made."""
    issuer = compose["services"]["issuer"]
    anchor = compose["x-concierge"]
    assert issuer["image"] == anchor["image"] and issuer["build"] == anchor["build"]
    assert issuer["command"] == ["concierge", "issuer", "--dir", "/issuer"]
    assert issuer["restart"] == "no"
    assert issuer["healthcheck"] == {"disable": True}
    assert issuer["volumes"] == ["issuer:/issuer"]
    assert "issuer" in compose["volumes"]
    assert "ports" not in issuer and "depends_on" not in issuer


def test_the_image_gives_the_issuer_directory_to_its_non_root_user(dockerfile: list[str]) -> None:
    """A new named volume takes the owner of the image's directory: /issuer must be the `concierge` user's, or the
    one-shot (non-root) cannot write its key pair."""
    made = " ".join(line for line in dockerfile if "mkdir" in line or "chown" in line)
    assert "/issuer" in made.split("mkdir", 1)[1]
    assert re.search(r"chown -R concierge:concierge [^&]*/issuer", made), made


def test_the_table_mounts_the_issuer_where_people_call_and_where_their_commands_run() -> None:
    assert {*PEOPLE_GATED, "recovery-worker"} <= set(ISSUER_MOUNTED)


@pytest.mark.parametrize("name", ISSUER_MOUNTED)
def test_services_mount_the_issuer_read_only_after_it_is_made(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    assert "issuer:/issuer:ro" in service["volumes"]
    assert service["depends_on"]["issuer"] == {"condition": "service_completed_successfully"}


@pytest.mark.parametrize("name", [*ISSUER_MOUNTED, "issuer"])
def test_people_settings_name_the_local_issuer_unless_told_otherwise(compose: dict[str, Any], name: str) -> None:
    env = compose["services"][name]["environment"]
    defaults = {
        "CONCIERGE_AUTH_ISSUER": LOCAL_ISSUER,  # what `concierge issuer` mints as
        "CONCIERGE_AUTH_AUDIENCE": "concierge",
        "CONCIERGE_AUTH_JWKS_URL": "",  # a real provider's jwks_uri; empty is unset (infra.settings)
        "CONCIERGE_AUTH_ISSUER_DIR": "/issuer",
    }
    for variable, default in defaults.items():
        match = _DEFAULTED.match(env[variable])
        assert match and match["var"] == variable and match["default"] == default, f"{variable}={env[variable]!r}"
    # defaulted only when unset, so that CONCIERGE_AUTH_JWKS_FILE= (empty) lets JWKS_URL replace it: exactly one
    # of the two may be set
    jwks_file = _SET_DEFAULTED.match(env["CONCIERGE_AUTH_JWKS_FILE"])
    assert jwks_file and jwks_file["var"] == "CONCIERGE_AUTH_JWKS_FILE", env["CONCIERGE_AUTH_JWKS_FILE"]
    assert jwks_file["default"] == f"/issuer/{LocalIssuer.JWKS_FILE}"


def test_people_are_never_turned_off_in_compose_or_kubernetes() -> None:
    """CONCIERGE_AUTH=off is for tests only: nothing a deployment is made from sets it (nor CONCIERGE_AUTH at all)."""
    files = [
        REPO / "docker-compose.yml",
        REPO / "scripts" / "compose.check.yml",
        *sorted((REPO / "deploy" / "k8s").rglob("*.yaml")),
        *sorted((REPO / "deploy" / "k8s").rglob("*.yml")),
    ]
    assert len(files) > 3
    for path in files:
        for document in yaml.safe_load_all(path.read_text()):
            assert "CONCIERGE_AUTH" not in _settings_named(document), path
        assert not re.search(r"CONCIERGE_AUTH\b\s*[:=]", path.read_text()), path


def _settings_named(node: Any) -> set[str]:
    """Every setting a compose or Kubernetes document gives: environment keys, env names, ConfigMap/Secret literals."""
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "environment" and isinstance(value, dict):
                found |= set(value)
            if key == "name" and isinstance(value, str) and "value" in node:
                found.add(value)
            if key == "literals" and isinstance(value, list):
                found |= {str(item).split("=", 1)[0] for item in value}
            if key in ("data", "stringData") and isinstance(value, dict):
                found |= set(value)
            found |= _settings_named(value)
    elif isinstance(node, list):
        for item in node:
            found |= _settings_named(item)
    return found
