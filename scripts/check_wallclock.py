"""Reports test assertions that put an upper bound on wall-clock time (`elapsed < 5` asserted).

Such a bound fails on a loaded machine without anything being wrong; a test waits for a condition with a generous
deadline instead and timing claims live in bench/. Lower bounds (a wait happened) are fine. Stdlib only, AST-based.
Usage: python scripts/check_wallclock.py [PATH ...]  (default: tests); exit 1 with the findings when any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

MESSAGE = "wall-clock upper bound in an assertion"
# Names that say they hold a measured time, wherever they come from (a journal's "duration_ms", a result's .took).
MEASURE_WORDS = ("elapsed", "took", "duration", "latency")
CLOCK_FUNCS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}
LOOP_FACTORIES = {"get_running_loop", "get_event_loop"}
POINT, DURATION = "point", "duration"
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)


def _is_clock_call(node: ast.AST) -> bool:
    """time.monotonic(), time.perf_counter(), time.time(), loop.time(), asyncio.get_running_loop().time()."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in CLOCK_FUNCS
    if not isinstance(func, ast.Attribute):
        return False
    owner = func.value
    if func.attr in CLOCK_FUNCS or func.attr == "time_ns":
        return True
    if func.attr != "time":
        return False
    if isinstance(owner, ast.Name):
        return owner.id == "time" or "loop" in owner.id.lower()
    if isinstance(owner, ast.Attribute):
        return "loop" in owner.attr.lower()
    if isinstance(owner, ast.Call):
        inner = owner.func
        name = inner.id if isinstance(inner, ast.Name) else inner.attr if isinstance(inner, ast.Attribute) else ""
        return name in LOOP_FACTORIES
    return False


def _says_measure(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in MEASURE_WORDS)


def _target_names(target: ast.AST) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _target_names(element)


def _own_nodes(scope: ast.AST) -> Iterator[tuple[ast.AST, bool]]:
    """A scope's nodes (not those of nested functions) and whether each sits in a loop's body."""
    stack = [(child, False) for child in ast.iter_child_nodes(scope)]
    while stack:
        node, in_loop = stack.pop()
        yield node, in_loop
        if isinstance(node, SCOPES):
            continue
        looping = in_loop or isinstance(node, ast.While | ast.For | ast.AsyncFor)
        stack.extend((child, looping) for child in ast.iter_child_nodes(node))


class _Scope:
    """What one function (or the module) assigns from the clock: points (`t0 = time.monotonic()`) and durations."""

    def __init__(self, node: ast.AST, outer: dict[str, str]) -> None:
        self.kinds = dict(outer)
        # Twice: `t1 = time.monotonic()` then `waited = t1 - t0` whatever order they appear in.
        for _ in range(2):
            for child, _in_loop in _own_nodes(node):
                value: ast.AST | None = None
                targets: list[ast.AST] = []
                if isinstance(child, ast.Assign):
                    value, targets = child.value, list(child.targets)
                elif (isinstance(child, ast.AnnAssign | ast.AugAssign) and child.value is not None) or isinstance(
                    child, ast.NamedExpr
                ):
                    value, targets = child.value, [child.target]
                kind = None if value is None else self.kind(value)
                if kind is not None:
                    for target in targets:
                        for name in _target_names(target):
                            self.kinds[name] = kind

    def kind(self, node: ast.AST) -> str | None:
        """POINT (a clock reading, a deadline), DURATION (a measured time) or None (not a time)."""
        if _is_clock_call(node):
            return POINT
        if isinstance(node, ast.Name):
            return DURATION if _says_measure(node.id) else self.kinds.get(node.id)
        if isinstance(node, ast.Attribute):
            return DURATION if _says_measure(node.attr) else None
        if isinstance(node, ast.Constant):
            return None
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and _says_measure(key.value):
                return DURATION
            return self.kind(node.value)
        if isinstance(node, ast.BinOp):
            left, right = self.kind(node.left), self.kind(node.right)
            if isinstance(node.op, ast.Sub) and POINT in (left, right):
                # a deadline minus a constant margin is a point; now minus anything else (then, started) a duration
                return POINT if left == POINT and isinstance(node.right, ast.Constant) else DURATION
            if isinstance(node.op, ast.Add) and POINT in (left, right):
                return POINT
            return DURATION if (left or right) else None
        kinds = {self.kind(child) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)}
        return DURATION if DURATION in kinds else POINT if POINT in kinds else None


def _is_approx(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "approx") or (
        isinstance(func, ast.Attribute) and func.attr == "approx"
    )


def _bounds(small: ast.AST, large: ast.AST, scope: _Scope, in_loop: bool) -> bool:
    """`small < large` bounds time from above: a duration below anything, or now before a deadline outside a
    wait loop (inside one, `assert time.monotonic() < deadline` is the hang guard of a wait for a condition)."""
    small_kind = scope.kind(small)
    if small_kind == DURATION:
        return True
    return small_kind == POINT and scope.kind(large) == POINT and not in_loop


def _upper_bounded(compare: ast.Compare, scope: _Scope, in_loop: bool) -> bool:
    """Any pair of a comparison chain that bounds time from above, or a duration `==` pytest.approx(...)."""
    operands = [compare.left, *compare.comparators]
    for index, op in enumerate(compare.ops):
        left, right = operands[index], operands[index + 1]
        if isinstance(op, ast.Lt | ast.LtE) and _bounds(left, right, scope, in_loop):
            return True
        if isinstance(op, ast.Gt | ast.GtE) and _bounds(right, left, scope, in_loop):
            return True
        if isinstance(op, ast.Eq | ast.NotEq) and (
            (_is_approx(right) and scope.kind(left) == DURATION) or (_is_approx(left) and scope.kind(right) == DURATION)
        ):
            return True
    return False


def _assertion_bounds(test: ast.AST, scope: _Scope, in_loop: bool) -> bool:
    """Any comparison in an assert's test (`ok and elapsed < 1` in one too)."""
    return any(isinstance(node, ast.Compare) and _upper_bounded(node, scope, in_loop) for node in ast.walk(test))


def _helper_bounds(call: ast.Call, scope: _Scope, in_loop: bool) -> bool:
    """unittest's assertLess(elapsed, 1) and kin."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if len(call.args) < 2:
        return False
    first, second = call.args[0], call.args[1]
    if name in ("assertLess", "assertLessEqual"):
        return _bounds(first, second, scope, in_loop)
    if name in ("assertGreater", "assertGreaterEqual"):
        return _bounds(second, first, scope, in_loop)
    if name == "assertAlmostEqual":
        return DURATION in (scope.kind(first), scope.kind(second))
    return False


def check_source(source: str, filename: str = "<string>") -> list[int]:
    """The lines of `source` whose assertions bound wall-clock time from above."""
    tree = ast.parse(source, filename)
    lines: set[int] = set()

    def visit(scope_node: ast.AST, outer: dict[str, str]) -> None:
        scope = _Scope(scope_node, outer)
        for node, in_loop in _own_nodes(scope_node):
            if isinstance(node, SCOPES):
                visit(node, scope.kinds)
            elif (isinstance(node, ast.Assert) and _assertion_bounds(node.test, scope, in_loop)) or (
                isinstance(node, ast.Call) and _helper_bounds(node, scope, in_loop)
            ):
                lines.add(node.lineno)

    visit(tree, {})
    return sorted(lines)


def _python_files(paths: Iterable[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from sorted(path.rglob("*.py"))
        elif path.suffix == ".py":
            yield path


def main(argv: list[str] | None = None) -> int:
    paths = (sys.argv[1:] if argv is None else argv) or ["tests"]
    findings = [
        f"{path}:{line}: {MESSAGE}"
        for path in _python_files(paths)
        for line in check_source(path.read_text(encoding="utf-8"), str(path))
    ]
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
