"""scripts/check_wallclock.py: it finds every form of a wall-clock upper bound in an assertion, and nothing else."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_wallclock.py"


def load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_wallclock", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


checker = load_checker()


def flagged(snippet: str) -> list[int]:
    return list(checker.check_source(textwrap.dedent(snippet)))


# The samples spell their assertions through ``ELAPSED`` and ``BETWEEN``, so a plain grep of tests/ for
# wall-clock upper bounds finds real ones only, not these pieces of text the checker is shown.
ELAPSED = "assert elapsed"
BETWEEN = "assert 1.0 < elapsed"

BOUNDS = {
    "elapsed_name": f"""
        def test():
            {ELAPSED} < 5
        """,
    "monotonic_difference": """
        import time
        def test():
            started = time.monotonic()
            assert time.monotonic() - started < 1.0
        """,
    "chained": f"""
        def test():
            {BETWEEN} < 4.0, "about 2 s"
        """,
    "against_a_budget": f"""
        def test(budget_s):
            {ELAPSED} <= budget_s + 5
        """,
    "took_reversed": """
        def test():
            assert 10 > took
        """,
    "assigned_from_the_clock": """
        import time
        def test():
            started = time.perf_counter()
            ready_s = time.perf_counter() - started
            assert ready_s < 60, ready_s
        """,
    "loop_time": """
        import asyncio
        async def test():
            loop = asyncio.get_running_loop()
            begun = loop.time()
            waited = loop.time() - begun
            assert waited < 10
        """,
    "time_time": """
        import time
        def test(t0):
            assert time.time() - t0 <= 2
        """,
    "in_a_helper": """
        import time
        def check(started):
            spent = time.monotonic() - started
            assert spent < 3
        """,
    "approx": """
        import pytest
        def test():
            assert duration == pytest.approx(2.0, abs=0.5)
        """,
    "journal_field": """
        def test(entry):
            assert entry["latency_ms"] < 100
        """,
    "inside_and": """
        def test(view):
            assert view["bookings"] == [] and took < 30, took
        """,
    "now_before_a_deadline_outside_a_wait": """
        import time
        def test():
            deadline = time.monotonic() + 5
            run()
            assert time.monotonic() < deadline
        """,
    "unittest_helper": """
        def test(self):
            self.assertLess(elapsed, 1.0)
        """,
}

FINE = {
    "lower_bound": """
        import time
        def test():
            started = time.monotonic()
            assert time.monotonic() - started >= 0.3, "a wait happened"
        """,
    "lower_bound_reversed": """
        def test():
            assert 1.0 <= elapsed
        """,
    "hang_guard_of_a_wait": """
        import time
        def test(ready):
            deadline = time.monotonic() + 60
            while not ready():
                assert time.monotonic() < deadline, "never ready"
                time.sleep(0.05)
        """,
    "configuration": """
        def test(budget_s, cfg):
            assert budget_s < 10
            assert cfg.timeout_s <= 5.0
            assert 0 < cfg.recovery_timeout
        """,
    "equality": """
        def test(breaker, durations):
            assert breaker.open_duration == 0.2
            assert durations == [0.2, 0.4, 0.8]
        """,
    "timestamps_in_order": """
        import time
        def test(stamp):
            before = time.time()
            assert before <= stamp
        """,
    "not_an_assertion": """
        import time
        def test():
            started = time.monotonic()
            if time.monotonic() - started < 1:
                pass
        """,
}


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_every_form_of_an_upper_bound_is_reported(name: str) -> None:
    snippet = textwrap.dedent(BOUNDS[name])
    [line] = flagged(snippet)
    assert "assert" in snippet.splitlines()[line - 1], (name, line)


@pytest.mark.parametrize("name", sorted(FINE))
def test_lower_bounds_hang_guards_and_settings_are_not(name: str) -> None:
    assert flagged(FINE[name]) == []


def test_the_command_lists_findings_and_fails_then_passes_once_they_are_gone(tmp_path: Path) -> None:
    bad = tmp_path / "test_bad.py"
    bad.write_text(f"def test():\n    x = 1\n    {ELAPSED} < 5\n")
    (tmp_path / "test_good.py").write_text("def test():\n    assert elapsed >= 1\n")
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert run.stdout.splitlines() == [f"{bad}:3: wall-clock upper bound in an assertion"]

    bad.write_text("def test():\n    assert elapsed >= 5\n")
    run = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, check=False)
    assert (run.returncode, run.stdout) == (0, "")


def test_the_tests_tree_itself_is_clean() -> None:
    tests = Path(__file__).resolve().parents[1]
    assert checker.main([str(tests)]) == 0
