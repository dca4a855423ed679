"""The recovery worker as a real process (health, metrics, readiness, Redis outage) and the ``concierge dlq`` /
``concierge recovery`` commands as real processes against a real Redis.

Recovering actual bookings is ``test_chaos.py``'s subject; here the queue is seeded directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from recovery import DeadLetterQueue, QueueGuard, RecoveryQueue
from runs import RunStatus, RunStore
from tests.conftest import TEST_SERVICE_SECRET, free_port, start_redis_server
from tests.procs import Processes, ServiceProcess, concierge_command
from tests.stack import fresh_database

pytestmark = pytest.mark.e2e

QUEUE_FIELDS = {"depth", "max_size", "dlq_depth", "oldest_age_s", "in_flight", "recovered_total", "dead_lettered_total"}


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def worker_env(redis_url: str, key_prefix: str, database: str) -> dict[str, str]:
    return {
        "REDIS_URL": redis_url,
        "CONCIERGE_KEY_PREFIX": key_prefix,
        "DATABASE_URL": database,
        "CONCIERGE_SERVICE_SECRET": TEST_SERVICE_SECRET,
        "RECOVERY_QUEUE_MAX_SIZE": "5",
        "ORPHAN_SCAN_INTERVAL": "0.2",
        "RUN_LEASE_TTL": "1",
    }


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[Processes]:
    with Processes(tmp_path) as processes:
        yield processes


async def serve_worker(procs: Processes, env: Mapping[str, str]) -> ServiceProcess:
    return await asyncio.to_thread(procs.serve, "recovery-worker", env=env)


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


def gauge(metrics: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    return None if match is None else float(match.group(1))


# --------------------------------------------------------------------------------------------------- the worker


async def test_worker_reports_queue_health_and_metrics_and_readiness(
    procs: Processes, redis: Any, redis_url: str, key_prefix: str, database: str
) -> None:
    worker = await serve_worker(procs, worker_env(redis_url, key_prefix, database))
    dlq = DeadLetterQueue(redis)
    await dlq.send_to_dlq("dead-1", "max_attempts", "UndefinedTable: checkpoints", 3)
    await dlq.send_to_dlq("dead-2", "queue_full", "recovery queue reached its cap", 0)
    assert await QueueGuard(redis, dlq).safe_enqueue("ghost")  # no run record: the worker skips it

    for _ in range(100):
        health = (await get(f"{worker.url}/health/queue")).json()
        if health["depth"] == 0 and health["in_flight"] == 0:
            break
        await asyncio.sleep(0.05)
    assert set(health) >= QUEUE_FIELDS, health
    assert health["dlq_depth"] == 2 and health["max_size"] == 5 and health["dead_lettered_total"] == 2
    assert health["recovered_total"] == 0 and health["oldest_age_s"] == 0
    assert (await RecoveryQueue(redis).stats())["skipped_total"] == 1, "the worker took the ghost and let it go"

    metrics = (await get(f"{worker.url}/metrics")).text
    assert gauge(metrics, "concierge_recovery_dlq_depth") == 2
    assert gauge(metrics, "concierge_recovery_queue_max_size") == 5
    assert gauge(metrics, "concierge_recovery_queue_depth") == 0
    assert gauge(metrics, "concierge_recovery_dead_lettered_total") == 2
    await dlq.purge()
    metrics = (await get(f"{worker.url}/metrics")).text
    assert gauge(metrics, "concierge_recovery_dlq_depth") == 0, "gauges are read from Redis on every scrape"

    ready = await get(f"{worker.url}/health/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"redis": "ok", "checkpointer": "ok"}


async def test_worker_survives_a_redis_outage_and_says_so(procs: Processes, key_prefix: str, database: str) -> None:
    port = free_port()
    server, url = start_redis_server(port)
    try:
        worker = await serve_worker(procs, worker_env(url, key_prefix, database))
        assert (await get(f"{worker.url}/health/queue")).status_code == 200

        server.kill()
        server.wait(timeout=10)
        queue = await get(f"{worker.url}/health/queue")
        assert queue.status_code == 503 and queue.json()["error"]["code"] == "dependency_unavailable"
        assert queue.headers["retry-after"] == "1"
        assert (await get(f"{worker.url}/health/ready")).status_code == 503
        metrics = await get(f"{worker.url}/metrics")
        assert metrics.status_code == 200, "a scrape still works, without the queue figures"
        assert gauge(metrics.text, "concierge_recovery_queue_depth") is None
        assert worker.alive, "scanner and consumer ride out the outage"

        server, url = start_redis_server(port)
        for _ in range(100):
            if (await get(f"{worker.url}/health/queue")).status_code == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the worker never came back after Redis did\n{worker.log_tail()}")
        assert worker.alive
    finally:
        server.kill()
        server.wait(timeout=10)


async def test_sigterm_stops_an_idle_worker_promptly(
    procs: Processes, redis: Any, redis_url: str, key_prefix: str, database: str
) -> None:
    worker = await serve_worker(procs, worker_env(redis_url, key_prefix, database))
    code = await asyncio.to_thread(worker.terminate, 10)
    assert code in (0, -15)
    assert "recovery-worker stopped" in worker.log_text()


# --------------------------------------------------------------------------------------------------- the CLI


async def concierge(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [*concierge_command(), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_failure(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()


@pytest.fixture
def cli_env(redis: Any, redis_url: str, key_prefix: str) -> dict[str, str]:
    return {"REDIS_URL": redis_url, "CONCIERGE_KEY_PREFIX": key_prefix, "RECOVERY_QUEUE_MAX_SIZE": "2"}


async def test_dlq_list_shows_a_table_and_json(cli_env: dict[str, str], redis: Any) -> None:
    empty = await concierge(cli_env, "dlq", "list")
    assert (empty.returncode, empty.stdout) == (0, "the DLQ is empty\n")
    assert json.loads((await concierge(cli_env, "dlq", "list", "--json")).stdout) == []

    dlq = DeadLetterQueue(redis)
    long_error = "UndefinedTable: relation checkpoints does not exist " + "x" * 200
    await dlq.send_to_dlq("booking-a", "max_attempts", long_error, 3)
    await dlq.send_to_dlq("booking-b", "queue_full", "recovery queue reached its cap of 2 waiting runs", 0)

    table = await concierge(cli_env, "dlq", "list")
    assert table.returncode == 0, table.stderr
    header, first, second, footer = table.stdout.splitlines()
    assert header.split() == ["THREAD", "ID", "REASON", "ATTEMPTS", "LAST", "ERROR", "AGE"]
    assert first.split()[:3] == ["booking-a", "max_attempts", "3"] and "…" in first and first.endswith("s")
    assert second.split()[:3] == ["booking-b", "queue_full", "0"]
    assert len(first) < 150, "long errors are clipped to keep one line per run"
    assert footer == "2 dead-lettered run(s)"

    entries = json.loads((await concierge(cli_env, "dlq", "list", "--json")).stdout)
    assert [e["thread_id"] for e in entries] == ["booking-a", "booking-b"]
    assert entries[0]["error"] == long_error and entries[0]["attempts"] == 3 and entries[0]["age_s"] >= 0


async def test_dlq_requeue_one_all_and_unknown(cli_env: dict[str, str], redis: Any) -> None:
    runs = RunStore(redis)
    lease = await runs.create("booking-c", "booking", {"booking_id": "booking-c"}, "recovery-worker-x")
    assert lease is not None
    await lease.increment_attempts()
    await lease.finish(RunStatus.DEAD_LETTERED, error="boom")
    dlq = DeadLetterQueue(redis)
    await dlq.send_to_dlq("booking-c", "max_attempts", "boom", 3)

    unknown = await concierge(cli_env, "dlq", "requeue", "no-such-booking")
    assert "no DLQ entry for thread id 'no-such-booking'" in one_line_failure(unknown)

    requeued = await concierge(cli_env, "dlq", "requeue", "booking-c")
    assert (requeued.returncode, requeued.stdout) == (0, "requeued booking-c\n"), requeued.stderr
    assert await dlq.get("booking-c") is None
    assert await redis.lrange(dlq.keys.queue, 0, -1) == ["booking-c"]
    record = await runs.get("booking-c")
    assert record is not None and record.status is RunStatus.PENDING and record.attempts == 0

    # the queue holds 2 (RECOVERY_QUEUE_MAX_SIZE): one slot is left for three entries
    for n in range(3):
        await dlq.send_to_dlq(f"booking-d{n}", "max_attempts", "boom", 3)
    partial = await concierge(cli_env, "dlq", "requeue", "--all")
    assert partial.stdout == "requeued 1 run(s)\n"
    assert "2 run(s) left in the DLQ: the recovery queue is full" in one_line_failure(partial)
    assert await dlq.depth() == 2

    full = await concierge(cli_env, "dlq", "requeue", "booking-d1")
    assert "the recovery queue is full" in one_line_failure(full)


async def test_dlq_purge_asks_nothing_and_counts(cli_env: dict[str, str], redis: Any) -> None:
    dlq = DeadLetterQueue(redis)
    for n in range(3):
        await dlq.send_to_dlq(f"booking-e{n}", "max_attempts", "boom", 3)
    purged = await concierge(cli_env, "dlq", "purge")
    assert (purged.returncode, purged.stdout) == (0, "purged 3 DLQ entries\n")
    assert await dlq.depth() == 0
    assert (await concierge(cli_env, "dlq", "purge")).stdout == "purged 0 DLQ entries\n"


async def test_recovery_status_reports_queue_and_active_runs(cli_env: dict[str, str], redis: Any) -> None:
    runs = RunStore(redis)
    for n in range(2):
        assert await runs.create(f"booking-f{n}", "booking", {}, "booking-agent-x") is not None
    assert await QueueGuard(redis, DeadLetterQueue(redis)).safe_enqueue("booking-f0")
    await DeadLetterQueue(redis).send_to_dlq("booking-g", "max_attempts", "boom", 3)

    table = await concierge(cli_env, "recovery", "status")
    assert table.returncode == 0, table.stderr
    rows = {line[:22].strip(): line[22:].strip() for line in table.stdout.splitlines()[1:]}
    assert rows["waiting"] == "1 / 2"
    assert rows["active runs"] == "2"
    assert rows["dead-lettered now"] == "1"
    assert rows["enqueued (total)"] == "1"

    status = json.loads((await concierge(cli_env, "recovery", "status", "--json")).stdout)
    assert status["depth"] == 1 and status["active_runs"] == 2 and status["dlq_depth"] == 1


@pytest.mark.parametrize(
    "args", [("dlq", "list"), ("dlq", "requeue", "--all"), ("dlq", "purge"), ("recovery", "status")]
)
async def test_every_command_explains_an_unreachable_redis_in_one_line(args: tuple[str, ...]) -> None:
    env = {"REDIS_URL": f"redis://:hunter2@127.0.0.1:{free_port()}/0", "CONCIERGE_KEY_PREFIX": "nowhere"}
    message = one_line_failure(await concierge(env, *args))
    assert "unreachable" in message and f"concierge {' '.join(args[:2])}".rstrip() in message
    assert "hunter2" not in message, "the password is not printed"


async def test_bad_configuration_is_one_line_too() -> None:
    message = one_line_failure(await concierge({"RUN_LEASE_TTL": "soon"}, "recovery", "status"))
    assert "invalid configuration" in message and "RUN_LEASE_TTL" in message
