"""The LangGraph checkpointer every graph that touches money or rooms writes to.

``DATABASE_URL`` set → ``PooledPostgresSaver`` (``AsyncPostgresSaver`` tuned for a pool, see
``infra/pooled_saver.py``) on a connection pool; unset → ``AsyncSqliteSaver`` on a file in ``CONCIERGE_DATA_DIR``
(WAL, with a busy timeout so the booking agents and the recovery worker can share it).
Opened as an async context manager in a service's lifespan, with ``setup()`` run once at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from infra.settings import get_settings

if TYPE_CHECKING:
    from psycopg import AsyncConnection

logger = logging.getLogger(__name__)

# Any fixed number works; it only has to be the same in every process that runs the migrations.
_SETUP_LOCK_ID = 0x636F6E63  # "conc"
_SETUP_LOCK_POLL_S = 0.05
# The migrations take about a second; a holder that long gone is stuck, and a service should say so, not hang.
_SETUP_LOCK_TIMEOUT_S = 60.0


@asynccontextmanager
async def open_checkpointer(database_url: str | None = None) -> AsyncIterator[BaseCheckpointSaver[str]]:
    """Yield a ready checkpointer (tables created); closes its connections on exit."""
    url = database_url if database_url is not None else get_settings().database_url
    if url:
        async with _postgres(url) as saver:
            yield saver
    else:
        async with _sqlite() as saver:
            yield saver


@asynccontextmanager
async def _postgres(url: str) -> AsyncIterator[BaseCheckpointSaver[str]]:
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    from infra.pooled_saver import PooledPostgresSaver

    sweeping: set[asyncio.Task[None]] = set()

    async def sweep() -> None:
        try:
            await pool.check()
        except Exception as exc:  # Postgres down altogether: the checkouts find out and say so
            logger.warning("checkpointer: sweeping the pool's dead connections failed (%s)", exc)

    async def check(conn: AsyncConnection[dict[str, Any]]) -> None:
        # A dropped connection rarely comes alone (pg_terminate_backend, a restart, a failover drop them all). The
        # pool's check loop would meet the others one by one and back off 1, 2, 4, 8 s between them: measured, one
        # checkout waited 30 s. So the first failed check sweeps the pool's other idle connections at once.
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            if not sweeping:
                task = asyncio.get_running_loop().create_task(sweep(), name="checkpointer-pool-sweep")
                sweeping.add(task)
                task.add_done_callback(sweeping.discard)
            raise

    pool: AsyncConnectionPool[AsyncConnection[dict[str, Any]]] = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=10,
        open=False,
        # a connection the server dropped (pg_terminate_backend, a restart) is found and replaced on checkout
        check=check,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True, timeout=10)
    try:
        saver = PooledPostgresSaver(pool)
        # Several services start at once; the migrations table is not safe against concurrent first runs.
        async with pool.connection() as conn:
            await _acquire_setup_lock(conn)
            try:
                await saver.setup()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK_ID,))
        logger.info("checkpointer: postgres")
        yield saver
    finally:
        await pool.close()


async def _acquire_setup_lock(conn: AsyncConnection[dict[str, Any]]) -> None:
    """Take the migrations lock by polling, never by waiting inside Postgres.

    A session blocked in ``pg_advisory_lock`` sits in an open transaction, and one of the migrations is
    ``CREATE INDEX CONCURRENTLY``, which waits for every open transaction to end: the holder would wait for the
    waiters and the waiters for the holder, a deadlock Postgres does not detect. Between two tries a waiter is idle.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _SETUP_LOCK_TIMEOUT_S
    while True:
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s) AS locked", (_SETUP_LOCK_ID,))
        row = await cursor.fetchone()
        if row is not None and row["locked"]:
            return
        if loop.time() >= deadline:
            raise TimeoutError(
                f"checkpointer: another process has held the migrations lock for {_SETUP_LOCK_TIMEOUT_S:.0f}s"
            )
        await asyncio.sleep(_SETUP_LOCK_POLL_S)


@asynccontextmanager
async def _sqlite() -> AsyncIterator[BaseCheckpointSaver[str]]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    data_dir = get_settings().data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "checkpoints.sqlite"
    # the checkpoints hold every booking's state: readable by this user only (SQLite gives its WAL and shared-memory
    # files the database file's permissions)
    await asyncio.to_thread(_owner_only, path)
    # timeout= is SQLite's busy timeout: other processes may hold the write lock for a moment.
    conn = await aiosqlite.connect(str(path), timeout=30)
    try:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        logger.info("checkpointer: sqlite at %s", path)
        yield saver
    finally:
        await conn.close()


def _owner_only(path: Path) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)


async def checkpointer_ready(saver: BaseCheckpointSaver[str]) -> None:
    """A cheap round trip for ``/health/ready``: reading a thread that does not exist."""
    await saver.aget_tuple({"configurable": {"thread_id": "__readiness__", "checkpoint_ns": ""}})
