"""A graph's version is its shape: what changes it (a step renamed or added, a state key renamed) and what does not,
and the committed list runs/graph_versions.json that makes every change of shape a decision."""

from __future__ import annotations

import itertools
import json
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from runs.versions import VERSIONS_FILE, graph_fingerprint, legacy_version, version_label
from scripts.graph_versions import main, shapes, unrecorded


class State(TypedDict, total=False):
    booking_id: str
    reservation_id: str
    status: str


class Renamed(TypedDict, total=False):
    booking_id: str
    hold_id: str
    status: str


async def _step(state: Any) -> dict[str, Any]:
    return {}


def saga(
    steps: tuple[str, ...] = ("reserve", "charge", "confirm"), state: type = State, *, reverse: bool = False
) -> Any:
    builder = StateGraph(state)
    for name in reversed(steps) if reverse else steps:
        builder.add_node(name, _step)
    builder.add_edge(START, steps[0])
    for current, following in itertools.pairwise(steps):

        async def route(values: Any, following: str = following) -> str:
            return following if not values.get("status") else END

        builder.add_conditional_edges(current, route, [following, END])
    builder.add_edge(steps[-1], END)
    return builder.compile(name="saga")


def test_a_renamed_step_an_added_step_and_a_renamed_state_key_are_each_another_version() -> None:
    today = graph_fingerprint(saga())
    assert graph_fingerprint(saga(("reserve", "capture", "confirm"))) != today
    assert graph_fingerprint(saga(("reserve", "verify", "charge", "confirm"))) != today
    assert graph_fingerprint(saga(state=Renamed)) != today
    assert len(today) == 16 and int(today, 16) >= 0


def test_the_same_shape_built_again_or_in_another_order_is_the_same_version() -> None:
    assert graph_fingerprint(saga()) == graph_fingerprint(saga()) == graph_fingerprint(saga(reverse=True))


def test_every_builder_the_code_keeps_is_in_the_committed_list() -> None:
    """Fails when a graph's shape changed: runs of the old shape would wait for a process that runs it. Keep the old
    builder (or declare a migration) and record the new shape: python scripts/graph_versions.py --record."""
    recorded = json.loads(VERSIONS_FILE.read_text())
    assert unrecorded(recorded) == [], "\n".join(unrecorded(recorded))
    for name, index, fingerprint, _ in shapes():
        if index == 0:
            assert recorded[name][-1] == fingerprint, f"{name}: the current builder is the newest recorded version"


def test_the_check_names_an_unrecorded_shape_and_exits_non_zero(capsys: Any, tmp_path: Any, monkeypatch: Any) -> None:
    assert main([]) == 0
    listed = tmp_path / "versions.json"
    listed.write_text(json.dumps({"booking": ["0000000000000000"]}))
    monkeypatch.setattr("scripts.graph_versions.VERSIONS_FILE", listed)
    assert main([]) == 1
    err = capsys.readouterr().err
    assert "booking: the current builder has shape" in err and "concierge: the current builder" in err
    assert main(["--record"]) == 0
    assert json.loads(listed.read_text())["booking"][0] == "0000000000000000", "earlier versions stay listed"
    assert main([]) == 0


def test_labels_number_the_recorded_versions_and_name_the_unrecorded() -> None:
    first = json.loads(VERSIONS_FILE.read_text())["booking"][0]
    assert version_label("booking", first) == "booking@1"
    assert version_label("booking", "abcdef0123456789") == "booking@abcdef0123456789"
    assert version_label("booking", None) == "booking@?"
    assert legacy_version("booking") == first, "a run recorded before versions is the first recorded shape's"
    assert legacy_version("no-such-graph") is None
