"""Deploying a change of the booking graph while bookings are parked mid-charge, and of the concierge's while a turn
waits for its approval, on a real stack: the new code is a copy of this checkout with the change made (PYTHONPATH),
the agents and the recovery worker restarted on it.

Each run finishes on the graph it started on: on the new code a run of the old shape waits (``awaiting_version``,
its journal says so, ``concierge runs`` and ``verify`` name it), nothing compensated, nothing marked done; back on
the old code (a rollback), or on new code that keeps the old builder, it finishes exactly once: one charge, one
reservation, ``concierge verify`` clean. docs/upgrades.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.booking.graph import BOOKING_BUILDERS
from agents.concierge.graph import CONCIERGE_BUILDERS
from infra.redis import create_sync_redis
from runs.leases import run_key
from runs.versions import graph_fingerprint, version_label
from tests.e2e.test_chaos import CHAOS_ENV, RECOVERY_TIMEOUT_S, assert_confirmed_exactly_once, wait_for_status
from tests.procs import REPO_ROOT, concierge_command
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = pytest.mark.e2e

SERVICES = (*CORE, "llm-api", "recovery-worker", "concierge-agent")
PACKAGES = tuple(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])
"""Every package of the project (the floors name them all): what a copy of the checkout needs to run."""
READY_TIMEOUT_S = 120.0
CHARGE_IN_FLIGHT_S = 1.5
"""After ``paying`` shows, how long until the charge surely waits at payment-api (3 s latency)."""
BOOKING_NOW = graph_fingerprint(BOOKING_BUILDERS[0](None))  # type: ignore[arg-type]
"""The booking graph's version on this checkout: what the bookings parked before each deploy run."""
BOOKING_LABEL = version_label("booking", BOOKING_NOW)
CONCIERGE_NOW = graph_fingerprint(CONCIERGE_BUILDERS[0](None))  # type: ignore[arg-type]
CONCIERGE_LABEL = version_label("concierge", CONCIERGE_NOW)

# The change, appended to the copy's agents/booking/graph.py: a new ``build_booking_graph`` (what booking-agent and the
# recovery worker build), written as a developer would change the builder, ``BOOKING_BUILDERS`` with or without the
# old one kept, and ``BOOKING_MIGRATIONS`` with or without a migration from the version ``migrate`` names.
CHANGE = """

_kept_builder = build_booking_graph
_RENAMED: dict[str, str] = {renamed}
_ADDED: list[str] = {added}
_STATE: Any = BookingState
if {key!r}:
    _old, _new = {key!r}.split("->")
    _STATE = TypedDict(  # type: ignore[misc]
        "_STATE", {{(_new if k == _old else k): v for k, v in BookingState.__annotations__.items()}}, total=False
    )


async def _look_again(state: BookingState, config: RunnableConfig, *, deps: BookingDeps) -> dict[str, Any]:
    return {{}}


def build_booking_graph(deps: BookingDeps, checkpointer: Any = None) -> Any:
    builder = StateGraph(_STATE)
    for name, step, key_fields in [*STEPS, *((added, _look_again, None) for added in _ADDED)]:
        node: Any = functools.partial(step, deps=deps)
        named = _RENAMED.get(name, name)
        if key_fields is not None:  # a renamed step keeps its idempotency record's name (docs/upgrades.md)
            node = idempotent_node(lambda: deps.redis, name, key_fields=key_fields)(node)
        if name in ASKS_FOR_CANCEL:
            node = _then_ask_for_cancel(node, deps)
        builder.add_node(named, traced_node(named)(node))
    builder.add_edge(START, "search")
    chain = [_RENAMED.get(n, n) for n in ["search", "reserve", *_ADDED, "charge", "confirm", "finish"]]
    for current, following in itertools.pairwise(chain):
        builder.add_conditional_edges(current, _next_or_compensate(following), [following, "compensate"])
    builder.add_edge("compensate", "release_hold")
    builder.add_edge("compensate", "refund")
    builder.add_edge(["release_hold", "refund"], "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name=BOOKING_GRAPH)


BOOKING_BUILDERS = (build_booking_graph, _kept_builder) if {keep} else (build_booking_graph,)
BOOKING_MIGRATIONS = (Migration({migrate!r}, nodes=_RENAMED),) if {migrate!r} else ()
"""

# The concierge's change, appended to the copy's agents/concierge/graph.py: its ``book`` step renamed.
CONCIERGE_CHANGE = """

def build_concierge_graph(deps: ConciergeDeps, checkpointer: Any = None) -> Any:
    def bound(step: Any) -> Any:
        return functools.partial(step, deps=deps)

    builder = StateGraph(ConciergeState)
    builder.add_node("call_model", traced_node("call_model")(bound(call_model)))
    builder.add_node("tools", traced_node("tools")(bound(tools)))
    builder.add_node("approval", approval)
    once_per_approval = idempotent_node(lambda: deps.redis, "book", key_fields=["chat_id", "pending"])
    builder.add_node("book_once", traced_node("book_once")(once_per_approval(bound(book))))
    builder.add_node("finish", traced_node("finish")(bound(finish)))
    builder.add_edge(START, "call_model")
    builder.add_conditional_edges("call_model", _after_model, ["tools", "finish"])
    builder.add_conditional_edges("tools", _after_tools, ["approval", "call_model"])
    builder.add_edge("approval", "book_once")
    builder.add_edge("book_once", "tools")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=checkpointer, name=CONCIERGE_GRAPH)


CONCIERGE_BUILDERS = (build_concierge_graph,)
"""


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def deploy_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("deploy")
    with Stack(tmp, redis_url, database_url=database, env=CHAOS_ENV) as stack:
        for proc in [stack.serve(service, wait=False) for service in SERVICES]:
            proc.wait_ready(READY_TIMEOUT_S)
        yield stack


@pytest.fixture
def stack(deploy_stack: Stack) -> Iterator[Stack]:
    """The shared stack on this checkout's code, every service up and no fault, before and after each test."""
    yield deploy_stack
    deploy_stack.fault("payment-api")
    restart(deploy_stack, None, services=("booking-agent", "recovery-worker", "concierge-agent"))


Copy = Callable[..., Path]


@pytest.fixture
def new_code(tmp_path: Path) -> Copy:
    """A copy of this checkout's packages with a change of the booking graph: the code of the next deploy."""

    def copy(
        *,
        renamed: dict[str, str] | None = None,
        added: list[str] | None = None,
        key: str = "",
        keep: bool = False,
        migrate: str = "",
        concierge: bool = False,
    ) -> Path:
        root = tmp_path / "next-deploy"
        for package in PACKAGES:
            shutil.copytree(REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
        if concierge:
            module = root / "agents" / "concierge" / "graph.py"
            module.write_text(module.read_text() + CONCIERGE_CHANGE)
            return root
        module = root / "agents" / "booking" / "graph.py"
        change = CHANGE.format(renamed=renamed or {}, added=added or [], key=key, keep=keep, migrate=migrate)
        module.write_text(module.read_text() + change)
        return root

    return copy


def fingerprint_of(code: Path | None, graph: str = "booking") -> str:
    """The graph's version as that code builds it (``graph``: booking or concierge)."""
    builders = {
        "booking": "agents.booking.graph import BOOKING_BUILDERS",
        "concierge": "agents.concierge.graph import CONCIERGE_BUILDERS",
    }
    program = f"from {builders[graph]} as B; from runs.versions import graph_fingerprint as f; print(f(B[0](None)))"
    env = {**os.environ, "PYTHONPATH": str(code)} if code else dict(os.environ)
    cwd = code or REPO_ROOT  # ``-c`` puts the working directory first on the path
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def restart(
    stack: Stack,
    code: Path | None,
    *,
    stop: str = "sigterm",
    services: tuple[str, ...] = ("booking-agent", "recovery-worker"),
) -> None:
    """Stop the recovery worker first, then the agents (``kill -9`` or SIGTERM), and start them on ``code``
    (``None``: this checkout)."""
    for service in sorted(services, key=lambda name: name != "recovery-worker"):
        proc = stack.services[service]
        if proc.alive:
            if stop == "kill" and service != "recovery-worker":
                proc.kill()
            else:
                proc.terminate()
    env = {"PYTHONPATH": str(code)} if code else {}
    started = [stack.serve(service, wait=False, env=env) for service in services]
    for proc in started:
        proc.wait_ready(timeout=READY_TIMEOUT_S)


def park_mid_charge(stack: Stack, days_ahead: int) -> str:
    """A booking whose charge is on its way (payment-api slowed), as a deploy would find it. The deploy's first step,
    stopping the recovery worker, is taken before: booking-agent is stopped while the charge still waits."""
    stack.services["recovery-worker"].terminate()
    stack.fault("payment-api", latency_s=3.0)
    checkin, checkout = stay(days_ahead=days_ahead)
    booking_id = str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])
    wait_for_status(stack, booking_id, {"paying"})
    time.sleep(CHARGE_IN_FLIGHT_S)
    return booking_id


def run_record(stack: Stack, booking_id: str) -> dict[str, str]:
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return dict(client.hgetall(run_key(booking_id, prefix=stack.prefix)))
    finally:
        client.close()


def wait_run(stack: Stack, booking_id: str, status: str) -> dict[str, str]:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while (record := run_record(stack, booking_id)).get("status") != status:
        assert time.monotonic() < deadline, f"run never {status}: {record}"
        assert record.get("status") != "done", f"marked done on the new code: {record}"
        time.sleep(0.05)
    return record


def events(stack: Stack, booking_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(f"{stack.url('booking-agent')}/bookings/{booking_id}/events")
    assert response.status_code == 200, response.text
    return list(response.json()["events"])


def ledgers_of(stack: Stack, booking_id: str) -> tuple[Counter[str], Counter[str]]:
    rooms = Counter(r["status"] for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == booking_id)
    money = Counter(c["status"] for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking_id)
    return rooms, money


def concierge(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env={**os.environ, **stack.env}, capture_output=True, text=True, timeout=90
    )


def verify(stack: Stack) -> subprocess.CompletedProcess[str]:
    urls = ("--hotel-api", stack.url("hotel-api"), "--payment-api", stack.url("payment-api"))
    return concierge(stack, "verify", *urls)


def assert_waits_untouched(stack: Stack, booking_id: str) -> None:
    """On code that lacks its version: waiting, visibly, with nothing undone and nothing marked done."""
    record = wait_run(stack, booking_id, "awaiting_version")
    assert record["version"] == BOOKING_NOW and not record.get("owner"), record
    assert stack.booking(booking_id)["status"] == "paying", "not finished, failed or compensated by other code"
    rooms, money = ledgers_of(stack, booking_id)
    assert rooms == Counter({"held": 1}) and money["refunded"] == 0, (rooms, money)
    waiting = [e for e in events(stack, booking_id) if e["kind"] == "waiting_for_version"]
    assert waiting and waiting[-1]["version"] == BOOKING_LABEL and waiting[-1]["fingerprint"] == BOOKING_NOW, waiting
    by_version = concierge(stack, "runs", "--by-version", "--json")
    assert by_version.returncode == 0, by_version.stderr
    rows = {row["version"]: row for row in json.loads(by_version.stdout)}
    assert booking_id in rows[BOOKING_LABEL]["waiting"], rows
    checked = verify(stack)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"wait for graph version {BOOKING_LABEL}" in checked.stdout, checked.stdout


def assert_new_code_books_on_its_own_shape(stack: Stack, fingerprint: str, days_ahead: int) -> None:
    checkin, checkout = stay(days_ahead=days_ahead)
    booking_id = str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])
    assert_confirmed_exactly_once(stack, booking_id)
    assert run_record(stack, booking_id)["version"] == fingerprint


def assert_finished_once(stack: Stack, booking_id: str) -> None:
    assert_confirmed_exactly_once(stack, booking_id)
    record = run_record(stack, booking_id)
    assert record["status"] == "done" and record["version"] == BOOKING_NOW, record
    assert Counter(e["kind"] for e in events(stack, booking_id))["confirmed"] == 1
    checked = verify(stack)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "wait for graph version" not in checked.stdout, checked.stdout


def test_a_renamed_step_deployed_after_kill_9_waits_and_a_rollback_finishes_it_once(
    stack: Stack, new_code: Copy
) -> None:
    code = new_code(renamed={"charge": "capture"})
    new_version = fingerprint_of(code)
    assert new_version != BOOKING_NOW == fingerprint_of(None), "the rename is a new version"
    booking_id = park_mid_charge(stack, days_ahead=301)

    restart(stack, code, stop="kill")
    stack.fault("payment-api")

    assert_waits_untouched(stack, booking_id)
    assert_new_code_books_on_its_own_shape(stack, new_version, days_ahead=302)
    restart(stack, None)  # the rollback
    assert_finished_once(stack, booking_id)


def test_an_added_step_deployed_after_a_sigterm_handoff_waits_and_a_rollback_finishes_it_once(
    stack: Stack, new_code: Copy
) -> None:
    code = new_code(added=["verify"])
    assert fingerprint_of(code) != BOOKING_NOW
    booking_id = park_mid_charge(stack, days_ahead=303)

    restart(stack, code, stop="sigterm")
    stack.fault("payment-api")

    assert_waits_untouched(stack, booking_id)
    restart(stack, None)
    assert_finished_once(stack, booking_id)


def test_a_renamed_step_deployed_with_its_migration_is_migrated_and_finished_once_on_the_new_code(
    stack: Stack, new_code: Copy
) -> None:
    code = new_code(renamed={"charge": "capture"}, migrate=BOOKING_NOW)
    new_version = fingerprint_of(code)
    assert new_version != BOOKING_NOW
    booking_id = park_mid_charge(stack, days_ahead=306)

    restart(stack, code, stop="kill")
    stack.fault("payment-api")

    assert_confirmed_exactly_once(stack, booking_id)  # the charge that was on its way, answered once
    record = wait_run(stack, booking_id, "done")
    assert record["version"] == new_version, "finished on the shape it was migrated to"
    kinds = Counter(e["kind"] for e in events(stack, booking_id))
    assert kinds["migrated"] == 1 and kinds["confirmed"] == 1 and kinds["waiting_for_version"] == 0, kinds
    moved = next(e for e in events(stack, booking_id) if e["kind"] == "migrated")
    assert moved["from"] == BOOKING_LABEL and moved["to"] == f"booking@{new_version}", moved
    checked = verify(stack)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "wait for graph version" not in checked.stdout, checked.stdout


def test_a_renamed_state_key_deployed_with_the_old_builder_kept_finishes_it_once_without_waiting(
    stack: Stack, new_code: Copy
) -> None:
    code = new_code(key="hotel_name->hotel_label", keep=True)
    assert fingerprint_of(code) != BOOKING_NOW
    booking_id = park_mid_charge(stack, days_ahead=304)

    restart(stack, code, stop="kill")
    stack.fault("payment-api")

    assert_finished_once(stack, booking_id)  # on the new code: its worker runs the kept builder
    assert "waiting_for_version" not in {e["kind"] for e in events(stack, booking_id)}


# ------------------------------------------------------------------------------------------------ a chat turn


def chat_url(stack: Stack, path: str) -> str:
    return f"{stack.url('concierge-agent')}{path}"


def chat_view(stack: Stack, chat_id: str, wait: float = 0) -> dict[str, Any]:
    response = stack.http.get(chat_url(stack, f"/chats/{chat_id}"), params={"wait": wait}, timeout=wait + 30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_turn_parked_at_its_approval_deployed_with_another_graph_waits_and_books_once_after_a_rollback(
    stack: Stack, new_code: Copy
) -> None:
    code = new_code(concierge=True)
    assert fingerprint_of(code, "concierge") != CONCIERGE_NOW == fingerprint_of(None, "concierge")
    created = stack.http.post(chat_url(stack, "/chats"))
    assert created.status_code == 201, created.text
    chat_id = created.json()["chat_id"]
    checkin, checkout = stay(days_ahead=305)
    text = f"Book the cheapest hotel in Lisbon checkin {checkin} checkout {checkout} for two"
    said = stack.http.post(
        chat_url(stack, f"/chats/{chat_id}/messages"), json={"text": text, "payment_token": "tok_visa"}
    )
    assert said.status_code == 202, said.text
    view = chat_view(stack, chat_id, wait=60)
    assert view["status"] == "awaiting_approval", view
    pending = view["pending_approval"]
    charges_before = len(stack.ledger("payment-api")["charges"])

    restart(stack, code, services=("recovery-worker", "concierge-agent"))
    decided = stack.http.post(
        chat_url(stack, f"/chats/{chat_id}/approvals/{pending['approval_id']}"), json={"approve": True}
    )
    assert decided.status_code == 202, decided.text  # the decision is kept; the turn waits for its graph

    record = wait_run(stack, chat_id, "awaiting_version")
    assert record["version"] == CONCIERGE_NOW, record
    assert chat_view(stack, chat_id)["bookings"] == [], "nothing booked on the other graph"
    assert len(stack.ledger("payment-api")["charges"]) == charges_before, "nothing charged"
    checked = verify(stack)
    assert checked.returncode == 0 and f"wait for graph version {CONCIERGE_LABEL}" in checked.stdout, checked.stdout

    restart(stack, None, services=("recovery-worker", "concierge-agent"))  # the rollback
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while (view := chat_view(stack, chat_id, wait=5))["status"] != "idle":
        assert time.monotonic() < deadline, view
    assert len(view["bookings"]) == 1, view
    booking = stack.wait(view["bookings"][0], timeout=RECOVERY_TIMEOUT_S)
    assert booking["status"] == "confirmed" and booking["hotel_id"] == pending["hotel_id"], booking
    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking["booking_id"]]
    assert [c["status"] for c in charges] == ["captured"], charges
    record = run_record(stack, chat_id)
    assert record["status"] == "done" and record["version"] == CONCIERGE_NOW, record
    checked = verify(stack)
    assert checked.returncode == 0 and "wait for graph version" not in checked.stdout, checked.stdout
