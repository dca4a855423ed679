"""The lockfiles (scripts/lock.py): made from pyproject.toml as it is now, so `make install`, the Dockerfile and CI
install what was tested; an edit of the dependencies that is not followed by `make lock` fails here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_lock_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("concierge_lock_script", REPO / "scripts" / "lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


lock = load_lock_module()


def test_the_locks_are_made_from_pyproject_toml_as_it_is_now() -> None:
    problems = lock.check()
    assert not problems, "\n".join(problems)


def test_every_pin_carries_hashes_and_the_tools_are_pinned() -> None:
    for path in (lock.LOCK, lock.DEV_LOCK):
        pins = lock.pins(path)
        assert pins, path
        for name, found in pins.items():
            assert all("--hash=sha256:" in pin.block for pin in found), f"{path.name}: {name} has no hash"
    dev = lock.pins(lock.DEV_LOCK)
    for tool in ("uv", "pip", "podman-compose", "setuptools", "wheel"):
        assert tool in dev, f"{tool} is not pinned in {lock.DEV_LOCK.name}"
    # the image gets the build backend it builds the project with, not the installers and tools
    runtime = lock.pins(lock.LOCK)
    assert {"setuptools", "wheel"} <= set(runtime)
    assert not {"uv", "podman-compose", "pytest"} & set(runtime)


def _drop_first_dependency(text: str) -> str:
    head, _, rest = text.partition("dependencies = [\n")
    first, _, tail = rest.partition("\n")
    return f"{head}dependencies = [\n{tail}" if first.strip().startswith('"') else text


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace("dependencies = [\n", 'dependencies = [\n    "tomli-w>=1",\n', 1),
        _drop_first_dependency,
        # still satisfied by the pins, but not what the lock was made from
        lambda text: text.replace("dev = [\n", 'dev = [\n    "pytest!=0.0.1",\n', 1),
        lambda text: re.sub(r'requires-python = "[^"]*"', 'requires-python = ">=3.12"', text),
    ],
    ids=["added", "removed", "range-changed", "requires-python"],
)
def test_an_edit_of_the_dependencies_without_make_lock_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object
) -> None:
    original = lock.PYPROJECT.read_text()
    edited = edit(original)  # type: ignore[operator]
    assert edited != original, "the edit no longer applies to pyproject.toml: update this test"
    (tmp_path / "pyproject.toml").write_text(edited)
    monkeypatch.setattr(lock, "PYPROJECT", tmp_path / "pyproject.toml")
    problems = lock.check()
    assert problems and "make lock" in problems[0]


def test_comments_and_formatting_of_pyproject_toml_do_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text("# a comment\n" + lock.PYPROJECT.read_text().replace("    ", "  "))
    monkeypatch.setattr(lock, "PYPROJECT", tmp_path / "pyproject.toml")
    assert lock.check() == []


def test_an_edit_of_the_development_dependencies_leaves_the_images_lock_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    edited = lock.PYPROJECT.read_text().replace("dev = [\n", 'dev = [\n    "pytest!=0.0.1",\n', 1)
    (tmp_path / "pyproject.toml").write_text(edited)
    monkeypatch.setattr(lock, "PYPROJECT", tmp_path / "pyproject.toml")
    problems = lock.check()
    assert problems and all(problem.startswith(lock.DEV_LOCK.name) for problem in problems), problems
