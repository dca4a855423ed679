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
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph

from infra.checkpointer import open_checkpointer
from infra.pooled_saver import PooledPostgresSaver

STARTERS = 4


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
