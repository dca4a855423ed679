"""The image and the compose check's files, checked without an engine (`make compose-check` runs them): the image
gets every package pyproject.toml installs and exactly the lock's dependencies; the check's override and stand-ins
cover every service of docker-compose.yml."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "scripts" / "standins"


def dockerfile() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined."""
    joined: list[str] = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        line = line.strip()
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line
        elif line and not line.startswith("#"):
            joined.append(line)
    return joined


def packages() -> set[str]:
    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return {pattern.rstrip("*") for pattern in found["include"]}


def load(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_the_image_copies_every_package_pyproject_installs() -> None:
    copied = {line.split()[1] for line in dockerfile() if line.startswith("COPY ") and line.split()[1] in packages()}
    assert copied == packages(), "the image would miss a package: `concierge serve` fails to import it"


def test_the_build_context_lets_in_the_packages_the_lock_and_nothing_else() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*", "the context is a list of what goes in"
    admitted = {rule[1:] for rule in rules if rule.startswith("!")}
    assert admitted == packages() | {"requirements.lock", "pyproject.toml", "README.md"}


def test_the_image_installs_the_lock_with_its_hashes_and_builds_offline() -> None:
    runs = [line for line in dockerfile() if line.startswith("RUN ")]
    assert any("pip install --no-deps --require-hashes -r requirements.lock" in line for line in runs)
    assert any("--no-build-isolation ." in line and "pip check" in line for line in runs)


def test_the_base_image_is_an_argument_defaulting_to_the_official_one() -> None:
    lines = dockerfile()
    assert lines[0] == "ARG PYTHON_IMAGE=python:3.11-slim"
    assert lines[1] == "FROM ${PYTHON_IMAGE}"


def test_the_check_override_runs_every_service_on_the_host_network_with_stand_ins() -> None:
    compose = load(REPO / "docker-compose.yml")["services"]
    override = load(REPO / "scripts" / "compose.check.yml")["services"]
    assert set(override) == set(compose)
    tags = {
        line.removeprefix("# image: ").strip()
        for path in STANDINS.glob("*.Containerfile")
        for line in path.read_text().splitlines()
        if line.startswith("# image: ")
    }
    for name, service in override.items():
        if "profiles" in service:  # no stand-in: not started (tracing, observability)
            assert name in ("jaeger", "prometheus", "grafana"), name
            continue
        assert service["network_mode"] == "host", name
        hosts = {entry.split(":")[0] for entry in service["extra_hosts"]}
        assert hosts >= set(compose) - {name} - {"jaeger"}, f"{name} cannot resolve every peer"
        image = service.get("image", compose[name].get("image"))
        if compose[name].get("build"):
            assert image == compose[name]["image"], "the project's image keeps its name"
        else:
            assert image in tags, f"{name}: {image} is not a stand-in scripts/standins builds"
