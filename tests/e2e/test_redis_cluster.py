"""The stack on a real three-master Redis Cluster (``REDIS_URL=redis+cluster://...``): bookings, recovery after
``kill -9`` of booking-agent, the recovery queue and the DLQ with the operator's commands.

Every Lua script and multi-key command must find its keys in one slot, or the cluster answers ``CROSSSLOT``: these
tests are the proof that the hash tags (``{bookings}``, ``{recovery}``, ``{hotel-api}``, ``{payment-api}``) are
where they must be. The master serving ``{bookings}`` has a replica, so the accepts there wait for it (``WAIT``).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from infra.bookings import booking_key
from infra.redis import create_sync_redis
from runs.leases import run_key
from tests.procs import concierge_command
from tests.redis_topologies import ClusterTopology
from tests.stack import CORE, Stack, fresh_database, stay

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

READY_TIMEOUT_S = 180.0
"""Starting a service on this shared machine has taken more than the harness's 30 s."""

CLUSTER_ENV = {
    "RUN_LEASE_TTL": "1",
    "ORPHAN_SCAN_INTERVAL": "0.2",
    "IDEMPOTENCY_LEASE_S": "1",
    "BOOKING_BUDGET_S": "20",
    "CONCIERGE_CIRCUITS": '{"hotel_api": {"recovery_timeout": 2.0}, "payment_api": {"recovery_timeout": 2.0}}',
}
RECOVERY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    with ClusterTopology(masters=3, replica_of=booking_key("any", prefix="x")) as topology:
        yield topology


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def cluster_stack(tmp_path_factory: pytest.TempPathFactory, cluster: ClusterTopology, database: str) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("cluster")
    with Stack(tmp, cluster.url, database_url=database, env=CLUSTER_ENV) as stack:
        start(stack, (*CORE, "recovery-worker"))
        yield stack


@pytest.fixture
def stack(cluster_stack: Stack) -> Iterator[Stack]:
    """Every service up and no faults, before and after each test."""
    start(cluster_stack, tuple(s for s in (*CORE, "recovery-worker") if not cluster_stack.services[s].alive))
    yield cluster_stack
    for provider in ("hotel-api", "payment-api"):
        cluster_stack.fault(provider)


def start(stack: Stack, services: tuple[str, ...]) -> None:
    """Every service at once, then each waited for with a bound that suits a machine under load."""
    for service in services:
        stack.serve(service, wait=False)
    for service in services:
        stack.services[service].wait_ready(timeout=READY_TIMEOUT_S)


def book(stack: Stack, days_ahead: int) -> str:
    checkin, checkout = stay(days_ahead=days_ahead)
    return str(stack.book(checkin=checkin, checkout=checkout)["booking_id"])


def wait_for_status(stack: Stack, booking_id: str, wanted: set[str], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (status := stack.booking(booking_id)["status"]) not in wanted:
        assert status not in {"confirmed", "failed"}, f"ended {status} before reaching {wanted}"
        assert time.monotonic() < deadline, f"{booking_id} never reached {wanted}"
        time.sleep(0.02)


def assert_confirmed_exactly_once(stack: Stack, booking_id: str) -> None:
    booking = stack.wait(booking_id, timeout=RECOVERY_TIMEOUT_S)
    assert booking["status"] == "confirmed", booking
    reservations = Counter(
        r["status"] for r in stack.ledger("hotel-api")["reservations"] if r["reference"] == booking_id
    )
    assert reservations == Counter(confirmed=1), reservations
    charges = Counter(c["status"] for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking_id)
    assert charges["captured"] == 1, charges


def run_record(stack: Stack, booking_id: str) -> dict[str, str]:
    client = create_sync_redis(stack.env["REDIS_URL"])
    try:
        return dict(client.hgetall(run_key(booking_id, prefix=stack.prefix)))
    finally:
        client.close()


def concierge(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.env, "CONCIERGE_DATA_DIR": str(stack.tmp_path / "no-local-stack")}
    return subprocess.run([*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=60)


def test_bookings_run_on_the_cluster_with_keys_on_several_masters(stack: Stack, cluster: ClusterTopology) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        accepted = list(pool.map(lambda n: book(stack, 40 + n), range(8)))
    for booking_id in accepted:
        assert_confirmed_exactly_once(stack, booking_id)

    # the keys really are spread: each master holds some of this stack's keys, each script's keys in one slot
    keys_by_port = {node.port: node.client.keys(f"{stack.prefix}:*") for node in cluster.nodes}
    masters = [node for node in cluster.nodes if node.client.execute_command("ROLE")[0] == "master"]
    assert len(masters) == 3 and all(keys_by_port[node.port] for node in masters), keys_by_port
    slots = {
        tag: {
            cluster.nodes[0].client.execute_command("CLUSTER", "KEYSLOT", k)
            for ks in keys_by_port.values()
            for k in ks
            if tag in k
        }
        for tag in ("{bookings}", "{recovery}", "{hotel-api}", "{payment-api}")
    }
    assert all(len(found) == 1 for found in slots.values()), slots
    booking_master = cluster.master_of(booking_key("any", prefix=stack.prefix))
    assert booking_master.client.info("commandstats")["cmdstat_wait"]["calls"] >= 2 * len(accepted), (
        "the accepts waited for the replica of the {bookings} master"
    )


def test_booking_agent_killed_mid_charge_is_recovered_on_the_cluster(stack: Stack) -> None:
    stack.fault("payment-api", latency_s=2.0)
    booking_id = book(stack, 80)
    wait_for_status(stack, booking_id, {"paying"})
    stack.services["booking-agent"].kill()
    stack.fault("payment-api")
    start(stack, ("booking-agent",))

    assert_confirmed_exactly_once(stack, booking_id)
    record = run_record(stack, booking_id)
    assert record["status"] == "done" and int(record["fence"]) >= 2, record


def test_the_queue_and_the_dlq_work_on_the_cluster(stack: Stack, database: str) -> None:
    stack.fault("hotel-api", latency_s=2.0)
    booking_id = book(stack, 90)
    wait_for_status(stack, booking_id, {"reserving"})
    # every resume fails (the checkpoint table is gone): the run goes through the queue, then to the DLQ
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE checkpoints RENAME TO checkpoints_broken")
    try:
        deadline = time.monotonic() + 30
        while True:
            listing = concierge(stack, "dlq", "list", "--json")
            assert listing.returncode == 0, listing.stderr
            entries = {entry["thread_id"]: entry for entry in json.loads(listing.stdout)}
            if booking_id in entries:
                break
            assert time.monotonic() < deadline, "never dead-lettered"
            time.sleep(0.2)
        assert entries[booking_id]["reason"] == "max_attempts"
        status = concierge(stack, "recovery", "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["dlq_depth"] >= 1, status.stdout
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("ALTER TABLE checkpoints_broken RENAME TO checkpoints")
    stack.fault("hotel-api")

    requeue = concierge(stack, "dlq", "requeue", booking_id)
    assert (requeue.returncode, requeue.stdout.strip()) == (0, f"requeued {booking_id}"), requeue.stderr
    assert_confirmed_exactly_once(stack, booking_id)
    assert booking_id not in concierge(stack, "dlq", "list").stdout
    audit = concierge(stack, "verify", "--hotel-api", stack.url("hotel-api"), "--payment-api", stack.url("payment-api"))
    assert audit.returncode == 0 and "0 disagreement(s)" in audit.stdout, audit.stdout + audit.stderr
