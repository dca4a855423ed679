"""The declared dependency ranges, installed as a user's ``pip install`` would today: the newest versions they allow
(``--resolution highest``) and the lowest direct ones (``lowest-direct``), each in a venv of its own, then the e2e
booking and concierge tests run on it. A release that breaks us within our own ranges fails here the day it
appears, not at a user's (docs/development.md#dependency-ranges).

    python scripts/resolutions.py [--only highest|lowest-direct] [--keep DIR] [-- pytest args]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESOLUTIONS = ("highest", "lowest-direct")
TESTS = ("tests/e2e/test_booking_flow.py", "tests/e2e/test_concierge.py", "tests/e2e/test_concierge_model.py")
SHOWN = ("openai", "langchain-openai", "httpx", "httpx2", "langgraph", "langchain-core", "fastapi", "redis", "a2a-sdk")


def _uv() -> str:
    found = Path(sys.executable).with_name("uv")
    if not found.exists():
        raise SystemExit(f"resolutions: no uv beside {sys.executable}: run make install first")
    return str(found)


def _versions(python: Path) -> str:
    program = (
        "from importlib import metadata as m\n"
        f"for name in {SHOWN!r}:\n"
        "    try: print(f'{name} {m.version(name)}')\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    done = subprocess.run([str(python), "-c", program], capture_output=True, text=True, check=True)
    return ", ".join(done.stdout.split("\n")[:-1])


def run(resolution: str, where: Path, pytest_args: list[str]) -> tuple[bool, str]:
    """Install ``resolution`` of the ranges into ``where`` and run the tests there: (passed, its summary line)."""
    venv = where / resolution
    uv = _uv()
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(python), "--resolution", resolution]
    installed = subprocess.run([*install, "-e", f"{ROOT}[dev]"], capture_output=True, text=True)
    if installed.returncode != 0:
        return False, f"{resolution}: could not install the ranges: {installed.stderr.strip().splitlines()[-1:]}"
    started = time.monotonic()
    tests = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *pytest_args], cwd=ROOT
    )
    took = time.monotonic() - started
    verdict = "passed" if tests.returncode == 0 else f"FAILED (pytest exit {tests.returncode})"
    return tests.returncode == 0, f"{resolution}: {verdict} in {took:.0f} s with {_versions(python)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=RESOLUTIONS, help="one resolution (default: both)")
    parser.add_argument("--keep", type=Path, help="build the venvs here and keep them (default: a temporary dir)")
    args, pytest_args = parser.parse_known_args(argv)
    pytest_args = [arg for arg in pytest_args if arg != "--"]
    chosen = (args.only,) if args.only else RESOLUTIONS
    with tempfile.TemporaryDirectory(prefix="concierge-resolutions-") as scratch:
        where = args.keep or Path(scratch)
        where.mkdir(parents=True, exist_ok=True)
        results = [run(resolution, where, pytest_args) for resolution in chosen]
    print(f"\n# dependency ranges (concierge {metadata.version('concierge')})")
    for _, line in results:
        print(f"#   {line}")
    return 0 if all(passed for passed, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
