"""What a service imports at start: each app module of the service table (and the CLI that serves them) imported in a
fresh interpreter, its ``sys.modules`` checked against modules it must not load there. A list, never a time.

Loaded later, where used: ``langchain_openai`` and ``openai`` with the first model call (``infra.llm.model``,
``infra.llm.classify``), the OTLP exporter only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, the Postgres saver and
its pool only when ``DATABASE_URL`` is (``infra.checkpointer``), the SQLite saver only without it, ``psycopg``
itself only with them (``infra.error_table`` names its ``OperationalError`` without importing it); schemathesis is
the API check's alone; the MCP SDK with the first caller of concierge-agent's ``/mcp``; the A2A SDK's client side (``a2a.client``, and ``grpc`` through it) with an agent's first
call to a peer (``infra.a2a.client``), and the SDK's protobuf types only where an A2A module is imported (the
package ``infra.a2a`` holds the errors without them). ``concierge serve`` builds its own parser alone: no other
command's module. The providers load no HTTP client: they send no request (``errors.connection_errors``).

The providers, the web console and the CLI load no LangGraph at all, hence nothing of ``langsmith`` or
``langgraph_sdk``, and no A2A SDK; the agents do, and LangGraph itself brings both at its top level
(``langgraph.types`` → ``langchain_core.tracers`` → ``langsmith.run_trees``, ``langgraph.runtime`` →
``langgraph_sdk.auth.types``), as the A2A SDK's server side brings its client side and ``grpc``:
docs/benchmarks.md#start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping

import pytest

from stack.services import SERVICES, ServiceKind, ServiceSpec

EVERYWHERE = (
    "langchain_openai",
    "openai",
    "schemathesis",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc",
    "psycopg",
    "psycopg_pool",
    "langgraph.checkpoint.postgres",
    "langgraph.checkpoint.sqlite",
    "aiosqlite",
    # the MCP SDK: concierge-agent's /mcp imports it with its first caller (agents/concierge/mcp_edge.py)
    "mcp",
    "mcp_types",
)
WITHOUT_LANGGRAPH = ("langsmith", "langgraph_sdk", "langgraph", "langchain_core")


def of_kind(*kinds: ServiceKind, services: Mapping[str, ServiceSpec] = SERVICES) -> set[str]:
    """The rows of the table of these kinds: the lists below follow the table."""
    return {name for name, spec in services.items() if spec.kind in kinds}


# the durable ones load LangGraph (an agent, or the worker that resumes their graphs)
AGENTS = of_kind("agent", "worker")
# the A2A SDK (its protobuf types) only where an agent is: the providers and the console name our A2A errors only
WITHOUT_A2A = ("a2a", "google.protobuf")
# its client side (and grpc, through its optional gRPC transport) only with the first call (infra.a2a.client), or
# where the SDK's server side brings both: a2a.server.routes → a2a.compat.v0_3 → a2a.client, a2a.server.request_handlers
# → its gRPC handler, loaded whenever grpcio is installed (it is: opentelemetry-exporter-otlp's gRPC exporter)
A2A_CLIENT = ("a2a.client", "grpc")
A2A_SERVERS = of_kind("agent")
# an HTTP client only where requests are sent: the providers answer, they call no one (the error table's question
# whether a request left asks sys.modules for httpx: errors.connection_errors)
WITHOUT_HTTP_CLIENT = ("httpx", "httpcore")
PROVIDERS = of_kind("provider")

# what is not configured here must not be loaded: no OTLP endpoint, no Postgres
_UNSET = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "DATABASE_URL", "LANGSMITH_TRACING")


def _forbidden(service: str) -> tuple[str, ...]:
    forbidden = EVERYWHERE if service in A2A_SERVERS else EVERYWHERE + A2A_CLIENT
    forbidden += WITHOUT_HTTP_CLIENT if service in PROVIDERS else ()
    return forbidden if service in AGENTS else forbidden + WITHOUT_LANGGRAPH + WITHOUT_A2A


def loaded_at_import(module: str, then: str = "pass") -> set[str]:
    """``sys.modules`` after ``import <module>`` (and the statement ``then``) in a fresh interpreter of this
    environment."""
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    # a name marked absent (None in sys.modules: stack.cli.without_trio) is not loaded
    code = f"import {module}, json, sys; {then}; print(json.dumps(sorted(k for k, v in sys.modules.items() if v)))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_check_sees_a_module_that_is_loaded() -> None:
    # the probe itself can fail: LangGraph is found where it is loaded, and the A2A SDK's client side
    assert {"langgraph", "langsmith", "langgraph_sdk"} <= loaded_at_import("langgraph.graph")
    assert set(A2A_CLIENT + WITHOUT_A2A) <= loaded_at_import("infra.a2a.client", "import a2a.client.transports.jsonrpc")


@pytest.mark.parametrize("service", list(SERVICES))
def test_a_service_loads_no_optional_heavy_module_at_start(service: str) -> None:
    module = SERVICES[service].app.partition(":")[0]
    loaded = loaded_at_import(module)
    assert sorted(loaded.intersection(_forbidden(service))) == []


def test_the_a2a_client_loads_the_sdks_client_side_with_its_first_call() -> None:
    assert sorted(loaded_at_import("infra.a2a.client").intersection(A2A_CLIENT)) == []


def test_the_cli_loads_no_langgraph() -> None:
    # every `concierge serve` starts here before its service's module
    loaded = loaded_at_import("stack.cli")
    assert (
        sorted(loaded.intersection(EVERYWHERE + A2A_CLIENT + WITHOUT_LANGGRAPH + WITHOUT_A2A + WITHOUT_HTTP_CLIENT))
        == []
    )


# `concierge serve` needs the CLI's own module and the service table; the other commands' modules (and what they
# import: the supervisor, the chaos driver, HTTP clients of the stack...) load only when their command runs
SERVE_PATH = {"stack", "stack.cli", "stack.services"}


def test_serve_builds_only_its_own_parser() -> None:
    loaded = loaded_at_import(
        "stack.cli", "stack.cli.parser_for(['serve', 'booking-agent']).parse_args(['serve', 'x'])"
    )
    assert sorted(name for name in loaded if name.split(".")[0] == "stack" and name not in SERVE_PATH) == []


def test_the_whole_parser_loads_every_command() -> None:
    # the probe itself can fail: the command modules are found where they are loaded
    loaded = loaded_at_import("stack.cli", "stack.cli.build_parser()")
    assert {"stack.up", "stack.chaos", "stack.demo", "stack.ops"} <= loaded


# what a process of ours does with its first HTTP client: httpcore's import of trio whenever it is installed
FIRST_CLIENT = "import httpx, asyncio; asyncio.run(httpx.AsyncClient().aclose())"


def test_a_process_of_ours_never_loads_trio() -> None:
    # the probe itself can fail: trio is here (selenium's), and httpcore loads it with a client
    assert "trio" in loaded_at_import("httpx", FIRST_CLIENT)
    # every process the CLI starts goes through run(): here a command line with no command (usage, exit 2)
    assert "trio" not in loaded_at_import("stack.cli", f"stack.cli.run(); {FIRST_CLIENT}")
