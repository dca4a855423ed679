"""``bench/layer_costs.py`` and ``bench/real_model.py`` edit copies of the code by exact text; nothing runs those
benches in CI, so without this check a refactor would break them silently until someone needs their numbers. Each
edit must still match the code exactly once, and applied together they must leave Python that compiles."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def layer_costs() -> ModuleType:
    from bench import layer_costs

    return layer_costs


def test_every_edit_matches_the_code_exactly_once(layer_costs: ModuleType) -> None:
    for variant in layer_costs.VARIANTS:
        for edit in variant.edits:
            count = (REPO / edit.path).read_text().count(edit.old)
            assert count == 1, f"variant {variant.name}: {edit.path} holds its text {count} times:\n{edit.old}"


def test_all_edits_together_leave_code_that_compiles(layer_costs: ModuleType, tmp_path: Path) -> None:
    edits = layer_costs.variant_edits(layer_costs.ALL)
    layer_costs.make_tree(tmp_path, edits)
    for path in sorted({edit.path for edit in edits}):
        source = (tmp_path / path).read_text()
        assert source != (REPO / path).read_text(), f"{path} was not changed"
        compile(source, path, "exec")


def test_an_edit_that_no_longer_matches_stops_the_bench_naming_it(layer_costs: ModuleType, tmp_path: Path) -> None:
    stale = layer_costs.Edit("graph/idempotency.py", "text that is not in the code\n", "")
    with pytest.raises(SystemExit, match=r"graph/idempotency\.py: the text this variant replaces is found 0 times"):
        layer_costs.make_tree(tmp_path, (stale,))


def test_the_control_variant_copies_the_code_unchanged(layer_costs: ModuleType, tmp_path: Path) -> None:
    assert layer_costs.variant_edits(layer_costs.CONTROL) == ()
    layer_costs.make_tree(tmp_path, layer_costs.variant_edits(layer_costs.CONTROL))
    assert (tmp_path / "infra/journal.py").read_text() == (REPO / "infra/journal.py").read_text()
    assert layer_costs.CONTROL not in layer_costs.parse_args([]).variants  # opt-in: it prices no layer
    assert layer_costs.parse_args(["--variants", "control"]).variants == ["control"]


SWITCHED = ["tracing", "fence", "fault-reads", "progress", "idempotency-records", "journal", "values-stream"]


def test_every_layer_has_a_switched_form(layer_costs: ModuleType) -> None:
    assert [v.name for v in layer_costs.VARIANTS if v.switched] == SWITCHED


@pytest.mark.parametrize("name", [*SWITCHED, "all", "control"])
def test_a_switched_tree_applies_and_compiles(layer_costs: ModuleType, tmp_path: Path, name: str) -> None:
    edits = layer_costs.switched_edits(name)
    layer_costs.make_switched_tree(tmp_path, edits)
    for path in sorted({edit.path for edit in (layer_costs.SWITCH_IMPORT, *edits)}):
        source = (tmp_path / path).read_text()
        assert "import bench_switch" in source, f"{path} does not read the switch"
        compile(source, path, "exec")
    compile((tmp_path / "bench_switch.py").read_text(), "bench_switch.py", "exec")
    if name in ("journal", "all"):
        bookings = (tmp_path / "infra/bookings.py").read_text()
        assert bookings.count("if ARGV[2] ~= '' then") == 2, "both booking scripts append only what they are given"


def test_one_stack_takes_only_variants_with_a_switched_form(layer_costs: ModuleType) -> None:
    assert layer_costs.parse_args(["--one-stack", "--variants", "journal,all,control"]).one_stack
    stale = layer_costs.Variant("unswitched", "a layer without a switched form", ())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(layer_costs, "VARIANTS", (*layer_costs.VARIANTS, stale))
        with pytest.raises(SystemExit):
            layer_costs.parse_args(["--one-stack", "--variants", "unswitched"])


def test_the_real_model_bench_s_no_coping_edits_match_once_and_compile(tmp_path: Path) -> None:
    from bench.layer_costs import make_tree
    from bench.real_model import NO_COPING

    for edit in NO_COPING:
        count = (REPO / edit.path).read_text().count(edit.old)
        assert count == 1, f"{edit.path} holds its text {count} times:\n{edit.old}"
    make_tree(tmp_path, NO_COPING)
    for path in sorted({edit.path for edit in NO_COPING}):
        compile((tmp_path / path).read_text(), path, "exec")
