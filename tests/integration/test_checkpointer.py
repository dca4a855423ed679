"""``open_checkpointer`` against a real Postgres: several services starting at once on a fresh database.

``concierge up`` starts payment-agent, booking-agent and the recovery worker together; each runs the LangGraph
migrations. One of them is ``CREATE INDEX CONCURRENTLY``, which waits for every open transaction in the database,
including a session blocked in ``pg_advisory_lock`` behind the one running the migrations: a deadlock Postgres
cannot see. These tests open several checkpointers at once, each with its own pool, as separate processes would.
"""

from __future__ import annotations

import asyncio

import psycopg

from infra.checkpointer import open_checkpointer

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
