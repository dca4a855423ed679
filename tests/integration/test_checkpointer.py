"""``open_checkpointer`` and ``PooledPostgresSaver`` against a real Postgres.

Start-up: several services starting at once on a fresh database.

``concierge up`` starts payment-agent, booking-agent and the recovery worker together; each runs the LangGraph
migrations. One of them is ``CREATE INDEX CONCURRENTLY``, which waits for every open transaction in the database,
including a session blocked in ``pg_advisory_lock`` behind the one running the migrations: a deadlock Postgres
cannot see. These tests open several checkpointers at once, each with its own pool, as separate processes would.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import psycopg_pool.pool_async
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointMetadata, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph

from infra.checkpointer import open_checkpointer
from infra.pooled_saver import PooledPostgresSaver, multi_row
from infra.settings import get_settings

STARTERS = 4
ERROR, INTERRUPT = "__error__", "__interrupt__"  # channels WRITES_IDX_MAP gives fixed indexes


async def test_concurrent_first_start_on_a_fresh_database_completes(postgres_url: str) -> None:
    ready = 0

    async def start() -> None:
        nonlocal ready
        async with open_checkpointer(postgres_url) as saver:
            # Usable, not merely opened: the tables exist.
            assert await saver.aget_tuple({"configurable": {"thread_id": "none", "checkpoint_ns": ""}}) is None
            ready += 1

    # Deadlocked start-ups never finish; 60 s is far above a healthy start-up (about 1 s).
    await asyncio.wait_for(asyncio.gather(*(start() for _ in range(STARTERS))), timeout=60)
    assert ready == STARTERS

    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoint_migrations").fetchone()
        versions = conn.execute("SELECT count(DISTINCT v) FROM checkpoint_migrations").fetchone()
        invalid = conn.execute("SELECT count(*) FROM pg_index WHERE NOT indisvalid").fetchone()
    assert row is not None and versions is not None and row[0] == versions[0], "a migration was recorded twice"
    assert invalid == (0,), "an index was left invalid by an interrupted CREATE INDEX CONCURRENTLY"


async def test_start_after_the_migrations_ran_is_a_no_op(postgres_url: str) -> None:
    async with open_checkpointer(postgres_url):
        pass
    with psycopg.connect(postgres_url) as conn:
        before = conn.execute("SELECT count(*) FROM checkpoint_migrations").fetchone()
    await asyncio.wait_for(asyncio.gather(*(_open_close(postgres_url) for _ in range(STARTERS))), timeout=60)
    with psycopg.connect(postgres_url) as conn:
        after = conn.execute("SELECT count(*) FROM checkpoint_migrations").fetchone()
    assert before == after


async def _open_close(url: str) -> None:
    async with open_checkpointer(url):
        pass


# ------------------------------------------------------------------------------------- PooledPostgresSaver


class StepState(TypedDict, total=False):
    order: str
    offers: list[dict[str, Any]]
    count: int
    status: str
    error: dict[str, str] | None


def step_graph(saver: BaseCheckpointSaver[str], fail_at: str | None = None) -> Any:
    """search → reserve → finish, with the kinds of values the booking graph stores (lists, dicts, None, ints)."""

    async def search(state: StepState) -> dict[str, Any]:
        return {"offers": [{"hotel_id": f"h{i}", "price": 100.5 + i} for i in range(3)], "count": 1}

    async def reserve(state: StepState) -> dict[str, Any]:
        if fail_at == "reserve":
            raise RuntimeError("the hotel is down")
        return {"status": "held", "count": state["count"] + 1, "error": None}

    async def finish(state: StepState) -> dict[str, Any]:
        return {"status": "confirmed", "count": state["count"] + 1}

    builder = StateGraph(StepState)
    builder.add_node("search", search)
    builder.add_node("reserve", reserve)
    builder.add_node("finish", finish)
    builder.add_edge(START, "search")
    builder.add_edge("search", "reserve")
    builder.add_edge("reserve", "finish")
    builder.add_edge("finish", END)
    return builder.compile(checkpointer=saver)


async def history(saver: BaseCheckpointSaver[str], thread_id: str) -> list[tuple[Any, ...]]:
    """What LangGraph reads back for a thread: per checkpoint, oldest first, the parts that do not carry ids."""
    rows = []
    async for item in saver.alist({"configurable": {"thread_id": thread_id}}):
        checkpoint = item.checkpoint
        rows.append(
            (
                item.metadata.get("step"),
                item.metadata.get("source"),
                checkpoint["channel_values"],
                sorted(checkpoint["channel_versions"]),
                sorted((channel, repr(value)) for _task, channel, value in item.pending_writes or []),
                item.parent_config is not None,
            )
        )
    return rows[::-1]


@pytest.mark.parametrize("fail_at", [None, "reserve"])
async def test_pooled_saver_stores_what_the_base_class_stores(postgres_url: str, fail_at: str | None) -> None:
    async with open_checkpointer(postgres_url) as pooled:
        assert isinstance(pooled, PooledPostgresSaver)
        base = AsyncPostgresSaver(pooled.conn)  # the library's class, same database and pool
        threads = {"base": f"base-{uuid.uuid4().hex}", "pooled": f"pooled-{uuid.uuid4().hex}"}
        for name, saver in (("base", base), ("pooled", pooled)):
            config = {"configurable": {"thread_id": threads[name]}}
            run = step_graph(saver, fail_at).astream({"order": "o-1"}, config, durability="sync")
            if fail_at is None:
                async for _ in run:
                    pass
            else:
                with pytest.raises(RuntimeError, match="hotel is down"):
                    async for _ in run:
                        pass
        # each class reads both threads the same way, whichever class wrote them
        written_by_base = await history(base, threads["base"])
        assert written_by_base, "the base class wrote nothing"
        for reader in (base, pooled):
            assert await history(reader, threads["pooled"]) == written_by_base
            assert await history(reader, threads["base"]) == written_by_base
        if fail_at == "reserve":
            assert any(writes for *_, writes, _parent in written_by_base), "the error write was not stored"

    with psycopg.connect(postgres_url) as conn:
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            counts = [
                conn.execute(f"SELECT count(*) FROM {table} WHERE thread_id = %s", (thread,)).fetchone()
                for thread in threads.values()
            ]
            assert counts[0] == counts[1], f"{table}: base wrote {counts[0]}, pooled wrote {counts[1]} rows"


async def test_pooled_saver_runs_many_threads_at_once(postgres_url: str) -> None:
    async with open_checkpointer(postgres_url) as saver:
        graph = step_graph(saver)

        async def run(i: int) -> dict[str, Any]:
            config = {"configurable": {"thread_id": f"concurrent-{i}"}}
            return dict(await graph.ainvoke({"order": f"o-{i}"}, config, durability="sync"))

        results = await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(30))), timeout=60)
        assert [r["order"] for r in results] == [f"o-{i}" for i in range(30)]
        assert {r["status"] for r in results} == {"confirmed"} and {r["count"] for r in results} == {3}
        state = await graph.aget_state({"configurable": {"thread_id": "concurrent-7"}})
        assert state.values["order"] == "o-7" and not state.next


def _terminate_backends(url: str) -> int:
    """``pg_terminate_backend`` on every other connection to the test database: what an admin or a failover does."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


async def test_dropped_connections_cost_time_not_runs(postgres_url: str) -> None:
    async with open_checkpointer(postgres_url) as saver:
        graph = step_graph(saver)

        async def run(i: int) -> dict[str, Any]:
            config = {"configurable": {"thread_id": f"dropped-{i}"}}
            return dict(await graph.ainvoke({"order": f"o-{i}"}, config, durability="sync"))

        await asyncio.gather(*(run(i) for i in range(5)))  # the pool holds several open connections now
        assert _terminate_backends(postgres_url) >= 1
        results = await asyncio.wait_for(asyncio.gather(*(run(i) for i in range(5, 15))), timeout=60)
        assert {r["status"] for r in results} == {"confirmed"}

        # and while runs are writing: every run still ends, each step written once
        async def terminate_while_running() -> None:
            for _ in range(3):
                await asyncio.sleep(0.02)
                await asyncio.to_thread(_terminate_backends, postgres_url)

        runs = asyncio.gather(*(run(i) for i in range(15, 45)))
        await asyncio.wait_for(asyncio.gather(runs, terminate_while_running()), timeout=60)
        for i in range(15, 45):
            state = await graph.aget_state({"configurable": {"thread_id": f"dropped-{i}"}})
            assert state.values["status"] == "confirmed" and state.values["count"] == 3 and not state.next


# ----------------------------------------------------- PooledPostgresSaver, one statement per call and its limits

Call = Callable[[BaseCheckpointSaver[str], str], Awaitable[Any]]


def _config(thread_id: str, checkpoint_id: str = "cp-1") -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}}


def _writes(*writes: tuple[str, Any], task: str = "task-1") -> Call:
    async def call(saver: BaseCheckpointSaver[str], thread_id: str) -> None:
        await saver.aput_writes(_config(thread_id), list(writes), task)

    return call


def _checkpoint(channels: int, *, parent: str | None = None, checkpoint_id: str = "cp-1") -> Call:
    """A checkpoint with ``channels`` list-valued channels (each a blob row) and two inline ones."""

    async def call(saver: BaseCheckpointSaver[str], thread_id: str) -> None:
        checkpoint = empty_checkpoint()
        checkpoint["id"] = checkpoint_id
        checkpoint["ts"] = "2033-06-01T12:00:00+00:00"
        values: dict[str, Any] = {f"list{i}": [i, {"n": i}] for i in range(channels)}
        values.update(status="held", count=3)
        checkpoint["channel_values"] = values
        checkpoint["channel_versions"] = {name: f"0000{i}.1" for i, name in enumerate(values)}
        config = (
            _config(thread_id, parent) if parent else {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        )
        metadata: CheckpointMetadata = {"source": "loop", "step": 1}
        await saver.aput(config, checkpoint, metadata, dict(checkpoint["channel_versions"]))

    return call


_ROWS = {
    "checkpoints": "checkpoint_id, parent_checkpoint_id, checkpoint, metadata",
    "checkpoint_blobs": "channel, version, type, blob",
    "checkpoint_writes": "checkpoint_id, task_id, task_path, idx, channel, type, blob",
}


def _rows(url: str, thread_id: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            table: conn.execute(
                f"SELECT {columns} FROM {table} WHERE thread_id = %s ORDER BY 1, 2, 3", (thread_id,)
            ).fetchall()
            for table, columns in _ROWS.items()
        }


SCENARIOS: dict[str, list[Call]] = {
    # one multi-row INSERT each
    "three writes": [_writes(("offers", [1, 2]), ("status", "held"), ("count", 2))],
    "the same writes again, new values (upsert over an earlier call)": [
        _writes((ERROR, "first"), (INTERRUPT, "x")),
        _writes((ERROR, "second"), (INTERRUPT, "y")),
    ],
    "checkpoint with blobs": [_checkpoint(3)],
    "checkpoint without blobs": [_checkpoint(0)],
    "checkpoint and its child": [_checkpoint(3), _checkpoint(3, parent="cp-1", checkpoint_id="cp-2")],
    "the same checkpoint twice (upsert)": [_checkpoint(2), _checkpoint(2)],
    # what one statement cannot say the same way: the executemany path
    "two writes to one key in one call (the last one wins)": [_writes((ERROR, "first"), (ERROR, "second"))],
    "five writes, the most one statement takes": [_writes(*((f"c{i}", i) for i in range(5)))],
    "six writes (one statement would be re-parsed every time)": [_writes(*((f"c{i}", i) for i in range(6)))],
    "seven blobs, the most one statement takes": [_checkpoint(7)],
    "eight blobs": [_checkpoint(8)],
    "forty blobs": [_checkpoint(40)],
}


@pytest.mark.parametrize("calls", SCENARIOS.values(), ids=SCENARIOS.keys())
async def test_pooled_saver_writes_the_rows_the_base_class_writes(postgres_url: str, calls: list[Call]) -> None:
    async with open_checkpointer(postgres_url) as pooled:
        assert isinstance(pooled, PooledPostgresSaver)
        base = AsyncPostgresSaver(pooled.conn)
        threads = {"base": f"base-{uuid.uuid4().hex}", "pooled": f"pooled-{uuid.uuid4().hex}"}
        for call in calls:
            await call(base, threads["base"])
            await call(pooled, threads["pooled"])
    expected = _rows(postgres_url, threads["base"])
    assert any(expected.values()), "the scenario wrote nothing"
    assert _rows(postgres_url, threads["pooled"]) == expected


def test_multi_row_repeats_the_values_row_only() -> None:
    sql = "INSERT INTO t (a, b) VALUES (%s, %s) ON CONFLICT (a) DO UPDATE SET b = EXCLUDED.b;"
    assert multi_row(sql, 3) == (
        "INSERT INTO t (a, b) VALUES (%s, %s), (%s, %s), (%s, %s) ON CONFLICT (a) DO UPDATE SET b = EXCLUDED.b"
    )
    with pytest.raises(ValueError, match="one-row INSERT"):
        multi_row("DELETE FROM t WHERE a = %s", 2)


async def test_the_sqlite_checkpoints_are_readable_by_their_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONCIERGE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        async with open_checkpointer("") as saver:
            await step_graph(saver).ainvoke({"order": "o-1"}, {"configurable": {"thread_id": "perm"}})
        modes = await asyncio.to_thread(lambda: {f.name: oct(f.stat().st_mode & 0o777) for f in tmp_path.iterdir()})
        assert "checkpoints.sqlite" in modes, modes
        assert modes == dict.fromkeys(modes, "0o600")
    finally:
        get_settings.cache_clear()


async def test_one_dropped_connection_sweeps_the_others_so_a_checkout_backs_off_at_most_once(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pg_terminate_backend`` kills every idle connection of the pool at once. psycopg_pool's check on checkout
    backs off 1, 2, 4, 8 s between the dead connections it meets one by one: 15 s for one write (seen in a CI run,
    a charge cancelled by its 15 s budget). One failed check must clear the rest."""
    backoffs: list[float] = []
    real_sleep = psycopg_pool.pool_async.asleep

    async def recorded(delay: float) -> None:
        backoffs.append(delay)
        await real_sleep(delay)

    monkeypatch.setattr(psycopg_pool.pool_async, "asleep", recorded)
    async with open_checkpointer(postgres_url) as saver:
        graph = step_graph(saver)

        async def run(i: int) -> dict[str, Any]:
            config = {"configurable": {"thread_id": f"swept-{uuid.uuid4().hex}-{i}"}}
            return dict(await graph.ainvoke({"order": f"o-{i}"}, config, durability="sync"))

        await asyncio.gather(*(run(i) for i in range(8)))  # several idle connections in the pool
        assert _terminate_backends(postgres_url) >= 3
        result = await asyncio.wait_for(run(99), timeout=60)

    assert result["status"] == "confirmed"
    assert len(backoffs) <= 1, f"the checkout met the dead connections one by one: {backoffs}"
