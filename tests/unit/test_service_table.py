"""stack/services.py is the one source: the deploy files are what scripts/deploy_files.py makes of it (checked here
and by ``make lint``), a row added to a copy of the table gets its compose service, k8s files and Prometheus target
(none when it is marked not deployed), and the tests' lists of services follow it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scripts import deploy_files
from scripts.deploy_files import K8S_MARKER, TableError, main, reader, render
from stack.services import DEPLOYED, SERVICES, ServiceSpec, deployed
from tests.stack import CORE, URL_ENV, url_envs
from tests.unit.test_k8s_manifests import BASE, by_kind, schema_errors
from tests.unit.test_k8s_manifests import render as kustomize
from tests.unit.test_startup_imports import AGENTS, of_kind

REPO = Path(__file__).resolve().parents[2]
COPIED = ("docker-compose.yml", "scripts/compose.check.yml", "deploy/k8s", "deploy/prometheus")
RESTAURANT = ServiceSpec(
    "restaurant-agent", "agents.restaurant:app", 8004, "RESTAURANT_AGENT_URL", depends_on=("hotel-api",)
)
SPA = ServiceSpec("spa-agent", "agents.spa:app", 8005, "SPA_AGENT_URL", deployed=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the generated files (and what they sit in) to run the generator on."""
    for path in COPIED:
        source, target = REPO / path, tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    return tmp_path


def load(root: Path, path: str) -> dict[str, Any]:
    loaded = yaml.safe_load((root / path).read_text())
    assert isinstance(loaded, dict)
    return loaded


def targets(root: Path) -> set[str]:
    config = load(root, deploy_files.PROMETHEUS)
    return {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}


def settings_literals(root: Path) -> list[str]:
    (generator,) = load(root, deploy_files.KUSTOMIZATION)["configMapGenerator"]
    return list(generator["literals"])


def with_rows(*rows: ServiceSpec) -> Mapping[str, ServiceSpec]:
    return {**SERVICES, **{row.name: row for row in rows}}


# ------------------------------------------------------------------------------------------- the committed files


def test_the_committed_deploy_files_are_what_the_table_makes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0, capsys.readouterr().err


def test_the_check_names_the_stale_file_in_one_line(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prometheus = root / deploy_files.PROMETHEUS
    prometheus.write_text(prometheus.read_text().replace("search-agent:8001", "search-agent:8101"))
    assert main(["--check"], root=root) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{deploy_files.PROMETHEUS}: not what stack/services.py makes (make deploy-files)"
    ]
    assert main([], root=root) == 0
    assert main(["--check"], root=root) == 0
    assert prometheus.read_text() == (REPO / deploy_files.PROMETHEUS).read_text()


def test_comments_on_generated_blocks_are_hand_written_and_kept(root: Path) -> None:
    compose = root / "docker-compose.yml"
    old = "  # The simulated model provider (OpenAI-compatible, under /v1)"
    compose.write_text(compose.read_text().replace(old, "  # The model provider the tests stand up"))
    head = root / deploy_files.K8S_BASE / "search-agent.yaml"
    head.write_text(head.read_text().replace("# search-agent: Finds", "# search-agent: Searches and ranks"))
    assert main(["--check"], root=root) == 0


# ------------------------------------------------------------------------------------------- a row added


def test_a_row_added_gets_its_deploy_files_and_a_row_not_deployed_none(root: Path) -> None:
    table = with_rows(RESTAURANT, SPA)
    assert main([], root=root, services=table) == 0
    assert main(["--check"], root=root, services=table) == 0

    compose = load(root, "docker-compose.yml")
    service = compose["services"]["restaurant-agent"]
    assert service["command"] == ["concierge", "serve", "restaurant-agent", "--host", "0.0.0.0"]
    assert service["ports"] == ["8004:8004"]
    assert "http://127.0.0.1:8004/health" in " ".join(service["healthcheck"]["test"])
    assert list(service["depends_on"]) == ["redis", "postgres", "hotel-api", "jaeger"]
    assert compose["x-concierge"]["environment"]["RESTAURANT_AGENT_URL"] == (
        "${RESTAURANT_AGENT_URL:-http://restaurant-agent:8004}"
    )
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    jsonschema.Draft7Validator(schema).validate(compose)
    check = load(root, deploy_files.COMPOSE_CHECK)
    assert "restaurant-agent" in check["services"]
    assert "restaurant-agent:127.0.0.1" in check["x-check"]["extra_hosts"]

    objects = kustomize(root / "deploy" / "k8s", BASE)
    assert schema_errors(objects) == []
    deployment = by_kind(objects, "Deployment")["restaurant-agent"]
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 8004}]
    assert "restaurant-agent" in by_kind(objects, "Service")
    assert "restaurant-agent" in by_kind(objects, "PodDisruptionBudget")
    assert "RESTAURANT_AGENT_URL=http://restaurant-agent:8004" in settings_literals(root)
    assert "restaurant-agent:8004" in targets(root)

    # the row not deployed: in none of them
    assert "spa-agent" not in compose["services"] and "SPA_AGENT_URL" not in compose["x-concierge"]["environment"]
    assert "spa-agent" not in check["services"]
    assert not (root / deploy_files.K8S_BASE / "spa-agent.yaml").exists()
    assert not any("spa-agent" in name for obj in objects for name in [obj["metadata"]["name"]])
    assert not any(literal.startswith("SPA_AGENT_URL=") for literal in settings_literals(root))
    assert not any(target.startswith("spa-agent:") for target in targets(root))

    # what was there before is unchanged, comments included
    for path in ("deploy/k8s/base/booking-agent.yaml", "deploy/k8s/base/console.yaml"):
        assert (root / path).read_text() == (REPO / path).read_text()
    assert "# The simulated model provider" in (root / "docker-compose.yml").read_text()


def test_the_tests_lists_follow_the_table() -> None:
    table = with_rows(RESTAURANT, SPA)
    # the test stack runs every row as a process, deployed or not; the deploy files only the deployed ones
    assert url_envs(table) == {**URL_ENV, "restaurant-agent": "RESTAURANT_AGENT_URL", "spa-agent": "SPA_AGENT_URL"}
    assert of_kind("agent", "worker", services=table) == AGENTS | {"restaurant-agent", "spa-agent"}
    assert of_kind("agent", services=table) >= {"restaurant-agent", "spa-agent"}
    assert set(deployed(table)) == set(DEPLOYED) | {"restaurant-agent"}


def test_a_new_file_gets_a_head_naming_its_service(root: Path) -> None:
    assert main([], root=root, services=with_rows(RESTAURANT)) == 0
    lines = (root / deploy_files.K8S_BASE / "restaurant-agent.yaml").read_text().splitlines()
    assert lines[0].startswith("# restaurant-agent: ") and lines[1] == K8S_MARKER


# ------------------------------------------------------------------------------------------- a row taken out


def test_a_row_marked_not_deployed_loses_its_deploy_files(root: Path) -> None:
    table = {**SERVICES, "console": dataclasses.replace(SERVICES["console"], deployed=False)}
    assert main([], root=root, services=table) == 0
    assert main(["--check"], root=root, services=table) == 0
    assert main(["--check"], root=root) == 1  # the real table still deploys it
    compose = load(root, "docker-compose.yml")
    assert "console" not in compose["services"] and "CONSOLE_URL" not in compose["x-concierge"]["environment"]
    assert not (root / deploy_files.K8S_BASE / "console.yaml").exists()
    assert "console.yaml" not in (root / deploy_files.KUSTOMIZATION).read_text()
    assert not any(literal.startswith("CONSOLE_URL=") for literal in settings_literals(root))
    assert "console:8090" not in targets(root)
    # the hand-written blocks around it stay
    assert {"prometheus", "grafana", "issuer"} <= set(compose["services"])


@pytest.mark.parametrize(
    "row",
    [
        dataclasses.replace(RESTAURANT, depends_on=("spa-agent",)),  # a peer that is not deployed
        dataclasses.replace(RESTAURANT, depends_on=("restaurant-agent",)),  # not above it
        dataclasses.replace(RESTAURANT, port=SERVICES["booking-agent"].port),
        dataclasses.replace(RESTAURANT, url_env="BOOKING_AGENT_URL"),
    ],
)
def test_the_generator_refuses_a_table_it_cannot_deploy(row: ServiceSpec) -> None:
    with pytest.raises(TableError):
        render(with_rows(SPA, row), reader(REPO), deploy_files.generated_k8s())


# ------------------------------------------------------------------------------------------- the test stack


def test_the_test_stacks_core_is_rows_of_the_table_in_its_order() -> None:
    assert set(CORE) <= set(URL_ENV)
    assert list(CORE) == [name for name in SERVICES if name in CORE]
    # the console is started by the tests that want it, on a port they give it
    assert "console" not in URL_ENV
