"""The durable graphs the recovery worker runs come from the agent packages named in DURABLE_AGENTS, each graph named
once; a package that declares none, or a name declared twice, stops the worker at start-up with a line saying why."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from infra.settings import Settings
from recovery.registry import DurableGraph, RegistryError, load_durable_graphs
from runs.versions import VERSIONS_FILE
from scripts.graph_versions import families


def test_the_default_packages_declare_every_graph_whose_versions_are_recorded() -> None:
    # with the optional rows' packages (examples/), which `concierge up --with` adds to DURABLE_AGENTS
    graphs = families()
    assert sorted(graphs) == sorted(json.loads(VERSIONS_FILE.read_text()))
    assert all(graphs.values())
    assert set(graphs) - {graph.name for graph in load_durable_graphs(Settings().durable_agents)} == {"restaurant"}


@pytest.fixture
def fake_agents() -> Iterator[types.ModuleType]:
    """Two made-up agent packages in ``sys.modules``: ``fake_a`` declares a graph, ``fake_b`` is filled per test."""
    declared = DurableGraph("fake", (lambda deps, saver: None,), open_deps=lambda redis: None, recoverable=print)  # type: ignore[arg-type,return-value]
    modules = {
        "fake_a": types.ModuleType("fake_a"),
        "fake_a.durable": types.ModuleType("fake_a.durable"),
        "fake_b": types.ModuleType("fake_b"),
        "fake_b.durable": types.ModuleType("fake_b.durable"),
    }
    modules["fake_a.durable"].DURABLE_GRAPHS = (declared,)  # type: ignore[attr-defined]
    sys.modules.update(modules)
    try:
        yield modules["fake_b.durable"]
    finally:
        for name in modules:
            sys.modules.pop(name, None)


def test_a_graph_declared_twice_is_refused(fake_agents: types.ModuleType) -> None:
    fake_agents.DURABLE_GRAPHS = sys.modules["fake_a.durable"].DURABLE_GRAPHS  # type: ignore[attr-defined]
    with pytest.raises(RegistryError, match="'fake' is declared twice"):
        load_durable_graphs(("fake_a", "fake_b"))
    assert [g.name for g in load_durable_graphs(("fake_a",))] == ["fake"]


def test_a_package_that_declares_nothing_or_does_not_exist_is_refused(fake_agents: types.ModuleType) -> None:
    with pytest.raises(RegistryError, match=r"fake_b\.durable declares no DURABLE_GRAPHS"):
        load_durable_graphs(("fake_a", "fake_b"))
    with pytest.raises(RegistryError, match=r"'no_such_agent', which has no module no_such_agent\.durable"):
        load_durable_graphs(("no_such_agent",))


def test_the_setting_takes_a_comma_separated_list_of_package_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENTS", " agents.booking, examples.restaurant ,")
    assert Settings().durable_agents == ("agents.booking", "examples.restaurant")
    monkeypatch.setenv("DURABLE_AGENTS", "agents.booking,not a/package")
    with pytest.raises(ValidationError, match="not a package name"):
        Settings()
