"""`make api-check`: schemathesis against the OpenAPI of every service, started as real processes.

    python scripts/api_check.py [--max-examples N] [--seed S] [--service NAME ...] [--keep]

Starts the services with the tests' harness (``tests.stack.Stack``: its own service secret and admin token,
one Redis key prefix, a fresh Postgres database on ``TEST_DATABASE_URL`` when that server answers, else the SQLite
checkpointer), then runs ``schemathesis run <service>/openapi.json --checks all`` against each one, every phase
(examples, coverage, fuzzing, stateful), ``--max-examples`` cases per operation (default 25) from a fixed seed so a
run is reproducible. The admin token is sent on every request (``Authorization: Bearer``), so the providers'
``/admin`` routes are exercised too; ``ignored_auth`` checks they refuse a request without it. hotel-api's and
payment-api's business routes want a client's key instead (docs/people.md): they have a pass of their own presenting
it (booking-agent's, payment-agent's, derived from the stack's secret), and their ``/admin`` one with the admin token. Exits 1 when any run
reports a failure (a 5xx, an answer its schema does not document, ...), and ends with ``api-check: N passed, M
failed`` (one per service run).

What is left out, and why:

- ``POST /a2a`` of the three agents: JSON-RPC behind a service token (a JWT for one audience, valid a minute) that
  schemathesis cannot mint, and every JSON-RPC outcome, errors included, is a 200 with a JSON-RPC body the SDK
  documents, not us. Its 401 and the shell's answers are documented all the same; tests/e2e covers its behaviour.
- nothing else. ``/admin/faults`` is run last, on its own: a generated ``PUT`` (``hang``, ``error_rate``) would
  otherwise break the provider, and search-agent and the bookings behind it, for every run after it; the faults
  are cleared afterwards. llm-api's ``/v1`` (OpenAI's wire) has a run of its own too, presenting the model API key
  (``LLM_API_KEY``) where the others present the admin token.

This file is also the schemathesis hooks module (``SCHEMATHESIS_HOOKS``), importing only schemathesis and the
standard library; its ``before_call`` changes *positive* cases only (those that fit the schema), so that schema-valid
means valid and they reach the real work instead of a 422:

- a JSON Schema cannot say that ``checkout`` comes 1 to 30 nights after ``checkin``, nor that ``checkin`` is within
  the booking horizon from today: every stay becomes one that keeps those rules;
- a ``GET /bookings`` cursor is one the API gave out, not any string: it becomes a position the API could have given;
- ``Idempotency-Key`` names one operation: a generated key is a constant reused for every request, which the
  providers rightly refuse (422 ``idempotency_key_reused``); it gets a prefix derived from the request.
- a chat history is in order only when every assistant tool call is answered by a tool message before anything
  else and no tool message answers nothing (OpenAI refuses any other with 400), and a named ``tool_choice`` names
  one of the ``tools``: a generated ``POST /v1/chat/completions`` body gets its history put in that order.

And one documented answer is not a refusal of the request: ``POST /charges`` with a well-formed token the card
processor declines answers 402 ``card_declined`` (``CONFIG``). Negative cases are left as generated.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import schemathesis
from schemathesis.core.parameters import ParameterLocation

REPO = Path(__file__).resolve().parents[1]
SERVICES = ("hotel-api", "payment-api", "llm-api", "search-agent", "payment-agent", "booking-agent", "recovery-worker")
A2A_PATHS = ("/a2a",)
"""Left out of the agents' runs (see the module docstring)."""
FAULTS_PATH = "/admin/faults"
PROVIDERS = ("hotel-api", "payment-api", "llm-api")
FAULTED = (*PROVIDERS, "search-agent")
"""The services with ``/admin/faults``: fuzzed in a pass of its own, last, and cleared after it (a generated PUT that
hangs search-agent would otherwise time out the rest of its pass)."""
MODEL_API = "^/v1/"
ADMIN_API = "^/admin/"
CLIENT_KEYED = ("hotel-api", "payment-api")
"""The providers whose business routes want a client's key: their ``/admin`` routes have a pass of their own."""
"""llm-api's OpenAI-compatible routes: their own run, with the model API key instead of the admin token."""
CHAT_PATH = "/v1/chat/completions"
DEFAULT_MAX_EXAMPLES = 25
DEFAULT_SEED = 20270110
REQUEST_TIMEOUT_S = 70.0
"""Longer than ``GET /bookings/{id}?wait=60``, the longest an answer may rightly take."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_DAYS_AHEAD = 700
"""Inside domain.booking.MAX_DAYS_AHEAD (730): a positive check-in is 1 to this many days from today."""
MAX_NIGHTS = 30


CONFIG = """
[[operations]]
include-path = "/charges"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "402", "403", "404", "409", "429", "5xx"]
"""
"""``schemathesis.toml`` of every run: the statuses a schema-valid request may get besides the defaults."""

# ------------------------------------------------------------------------------------------- schemathesis hooks


def _valid_stay(container: dict[str, Any]) -> dict[str, Any]:
    """The container with a stay that keeps the rules, derived from the generated one (so cases still differ)."""
    seed = zlib.crc32(f"{container.get('checkin')}|{container.get('checkout')}".encode())
    checkin = dt.date.today() + dt.timedelta(days=1 + seed % MAX_DAYS_AHEAD)
    nights = 1 + (seed // MAX_DAYS_AHEAD) % MAX_NIGHTS
    return {**container, "checkin": checkin.isoformat(), "checkout": (checkin + dt.timedelta(days=nights)).isoformat()}


def _positive(case: Any, location: ParameterLocation) -> bool:
    component = case.meta.components.get(location)
    mode = component.mode if component is not None else case.meta.generation.mode
    return bool(mode.is_positive)


def _idempotency_key(case: Any, generated: str) -> str:
    """One key per request, as a client makes them: the same request gets the same key, another request another.

    A generated key is a constant (``"0"``) reused for every request, which a provider must refuse (422
    ``idempotency_key_reused``): that says nothing about the request, so the generated key is kept only as a
    suffix. Within every schema's limits (1-200 characters, printable ASCII at both ends)."""
    body = case.body if isinstance(case.body, dict | list | str | int | float | bool) else None
    request = [case.method, case.path, case.path_parameters, case.query, body]
    digest = hashlib.sha256(json.dumps(request, sort_keys=True, default=repr).encode()).hexdigest()[:24]
    return f"{digest}-{generated[:100]}".rstrip()


def _cursor(generated: str) -> str:
    """A cursor booking-agent could have given out (``GET /bookings``): the next page after a position (a creation
    time and a booking id), which any generated string is not."""
    booking_id = "".join(c for c in generated if c.isascii() and (c.isalnum() or c in "_-"))[:64] or "b"
    return base64.urlsafe_b64encode(f"{float(len(generated))!r}|{booking_id}".encode()).decode().rstrip("=")


def _answered_history(messages: list[Any]) -> list[Any]:
    """A chat history in the order OpenAI takes (which a JSON Schema cannot say): every assistant tool call answered
    by a tool message before anything else, and no tool message answering nothing."""
    repaired: list[Any] = []
    waiting: list[str] = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "tool":
            if message.get("tool_call_id") in waiting:
                waiting.remove(message["tool_call_id"])
                repaired.append(message)
            continue
        repaired += [{"role": "tool", "content": "{}", "tool_call_id": pending} for pending in waiting]
        waiting = []
        if isinstance(message, dict) and message.get("role") == "assistant" and message.get("tool_calls"):
            calls = {c["id"]: c for c in message["tool_calls"] if isinstance(c, dict) and "id" in c}
            message = {**message, "tool_calls": list(calls.values())}
            waiting = list(calls)
        repaired.append(message)
    repaired += [{"role": "tool", "content": "{}", "tool_call_id": pending} for pending in waiting]
    return repaired


def _chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A chat completion OpenAI would take: its history in order, and a named ``tool_choice`` among ``tools``."""
    out = dict(body)
    if isinstance(out.get("messages"), list):
        out["messages"] = _answered_history(out["messages"])
    choice = out.get("tool_choice")
    if isinstance(choice, dict):
        names = {t.get("function", {}).get("name") for t in out.get("tools") or [] if isinstance(t, dict)}
        if choice.get("function", {}).get("name") not in names:
            out.pop("tool_choice")
    return out


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    """Right before the request goes out, on the case as it will be sent (a phase may still change a case after
    ``map_case``). New containers, never edits in place: a generated dict may be shared with other cases."""
    if case.meta is None:
        return
    for name, location in (("query", ParameterLocation.QUERY), ("body", ParameterLocation.BODY)):
        container = getattr(case, name)
        if (
            isinstance(container, dict)
            and isinstance(container.get("checkin"), str)
            and isinstance(container.get("checkout"), str)
            and _positive(case, location)
        ):
            setattr(case, name, _valid_stay(container))
    query = case.query
    if isinstance(query, dict) and isinstance(query.get("cursor"), str) and _positive(case, ParameterLocation.QUERY):
        case.query = {**query, "cursor": _cursor(query["cursor"])}
    if case.path == CHAT_PATH and isinstance(case.body, dict) and _positive(case, ParameterLocation.BODY):
        case.body = _chat_request(case.body)
    headers = case.headers
    if headers and isinstance(headers.get(IDEMPOTENCY_HEADER), str) and _positive(case, ParameterLocation.HEADER):
        headers = headers.copy()
        headers[IDEMPOTENCY_HEADER] = _idempotency_key(case, headers[IDEMPOTENCY_HEADER])
        case.headers = headers


# ------------------------------------------------------------------------------------------------ the runner


def _redis_url() -> tuple[str, subprocess.Popen[bytes] | None]:
    """``REDIS_URL``, else the local server when it answers, else a private ``redis-server`` (as the tests do)."""
    import redis

    from infra.redis import create_sync_redis

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        create_sync_redis(url, socket_connect_timeout=1).ping()
        return url, None
    except redis.RedisError:
        if "REDIS_URL" in os.environ:
            raise SystemExit(f"api-check: Redis at REDIS_URL={url} does not answer") from None
    from tests.procs import free_port

    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=0.2).ping()
            return url, proc
        except redis.RedisError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("api-check: no Redis (REDIS_URL unset, nothing on 127.0.0.1:6379, redis-server did not start)")


def _postgres_reachable(url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.OperationalError:
        return False
    return True


def _forget(redis_url: str, prefix: str) -> None:
    """Delete the run's keys (the stack's own prefix) from a Redis that outlives it."""
    from infra.redis import create_sync_redis

    client = create_sync_redis(redis_url)
    try:
        for batch in _batches(client.scan_iter(match=f"{prefix}:*", count=1000), 500):
            client.delete(*batch)
    finally:
        client.close()


def _batches(items: Any, size: int) -> Any:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _schemathesis(
    url: str,
    args: argparse.Namespace,
    token: str,
    work: Path,
    label: str,
    *,
    include: str | None,
    exclude: list[str],
) -> list[str]:
    argv = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(work / "schemathesis.toml"),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(args.max_examples),
        "--seed",
        str(args.seed),
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--generation-database",
        "none",
        "--header",
        f"Authorization: Bearer {token}",
        "--report",
        "junit",
        "--report-junit-path",
        str(work / f"junit-{label}.xml"),
        "--no-color",
    ]
    if include is not None:
        argv += ["--include-path-regex" if include.startswith("^") else "--include-path", include]
    for path in exclude:
        argv += ["--exclude-path-regex" if path.startswith("^") else "--exclude-path", path]
    return argv


def _run(argv: list[str], label: str, log: Path) -> tuple[bool, float]:
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(Path(__file__).resolve())}
    print(f"\n=== {label}: schemathesis", flush=True)
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - start
    lines = log.read_text().splitlines()
    if proc.returncode == 0:  # its summary; the whole report when something failed
        summary = [i for i, line in enumerate(lines) if line.strip(" =") == "SUMMARY"]
        lines = lines[summary[-1] :] if summary else lines
    print("\n".join(lines), flush=True)
    return proc.returncode == 0, elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=DEFAULT_MAX_EXAMPLES, help="cases per operation")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="schemathesis' seed (a run is reproducible)")
    parser.add_argument("--service", action="append", choices=SERVICES, help="only this service (repeatable)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, reports)")
    args = parser.parse_args()
    services = tuple(args.service or SERVICES)

    sys.path.insert(0, str(REPO))
    from tests.stack import TEST_DATABASE_URL, Stack, fresh_database

    redis_url, redis_proc = _redis_url()
    work = Path(tempfile.mkdtemp(prefix="api-check-"))
    results: list[tuple[str, bool, float]] = []
    started = time.monotonic()
    prefix: str | None = None
    try:
        use_postgres = _postgres_reachable(TEST_DATABASE_URL)
        database = fresh_database(name_prefix="concierge_api") if use_postgres else contextlib.nullcontext(None)
        with database as database_url, Stack(work, redis_url, database_url=database_url, span_files=False) as stack:
            prefix = stack.prefix
            stack.start(services)
            checkpointer = "Postgres" if database_url else "SQLite"
            print(f"api-check: {len(services)} services up in {time.monotonic() - started:.1f}s ({checkpointer})")
            passes: list[tuple[str, str | None, list[str]]] = [
                (name, None, [*([] if name in PROVIDERS else A2A_PATHS), *([FAULTS_PATH] if name in FAULTED else [])])
                for name in services
            ]
            if "llm-api" in services:
                passes[services.index("llm-api")][2].append(MODEL_API)
                passes.append(("llm-api", MODEL_API, []))
            for name in (n for n in services if n in CLIENT_KEYED):
                passes[services.index(name)][2].append(ADMIN_API)
                passes.append((name, ADMIN_API, [FAULTS_PATH]))
            passes += [(name, FAULTS_PATH, []) for name in services if name in FAULTED]
            (work / "schemathesis.toml").write_text(CONFIG)
            for name, include, exclude in passes:
                label = name if include is None else f"{name} {include}"
                slug = label.replace(" ", "").replace("/", "_").replace("^", "")
                if include == MODEL_API:
                    token = stack.llm_api_key
                elif name in CLIENT_KEYED and include is None:
                    token = stack.provider_auth(name).key  # a client's key: the business routes
                else:
                    token = stack.admin_token
                argv = _schemathesis(stack.url(name), args, token, work, slug, include=include, exclude=exclude)
                ok, elapsed = _run(argv, label, work / f"{slug}.log")
                results.append((label, ok, elapsed))
                if include == FAULTS_PATH:
                    stack.fault(name)  # clear whatever the generated PUTs left
                if name == "llm-api" and include is None:
                    stack.script_model([])  # a generated PUT /admin/script would answer the /v1 pass's requests
    finally:
        if prefix is not None:
            _forget(redis_url, prefix)
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
        if not args.keep:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"api-check: logs and reports kept in {work}")

    print("\napi-check:")
    for label, ok, elapsed in results:
        print(f"  {'ok  ' if ok else 'FAIL'} {label:28} {elapsed:6.1f}s")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"  total {time.monotonic() - started:.0f}s")
    print(f"api-check: {len(results) - failed} passed, {failed} failed")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
