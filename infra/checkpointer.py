"""The LangGraph checkpointer every graph that touches money or rooms writes to.

``DATABASE_URL`` set → ``AsyncPostgresSaver`` on a connection pool; unset → ``AsyncSqliteSaver`` on a file in
``CONCIERGE_DATA_DIR`` (WAL, with a busy timeout so the booking agents and the recovery worker can share it).
Opened as an async context manager in a service's lifespan, with ``setup()`` run once at start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver

from infra.settings import get_settings

logger = logging.getLogger(__name__)

# Any fixed number works; it only has to be the same in every process that runs the migrations.
_SETUP_LOCK_ID = 0x636F6E63  # "conc"


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
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    pool: AsyncConnectionPool = AsyncConnectionPool(
        url,
        min_size=1,
        max_size=10,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True, timeout=10)
    try:
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        # Several services start at once; the migrations table is not safe against concurrent first runs.
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK_ID,))
            try:
                await saver.setup()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK_ID,))
        logger.info("checkpointer: postgres")
        yield saver
    finally:
        await pool.close()


@asynccontextmanager
async def _sqlite() -> AsyncIterator[BaseCheckpointSaver[str]]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    data_dir = get_settings().data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "checkpoints.sqlite"
    # timeout= is SQLite's busy timeout: other processes may hold the write lock for a moment.
    conn = await aiosqlite.connect(str(path), timeout=30)
    try:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        logger.info("checkpointer: sqlite at %s", path)
        yield saver
    finally:
        await conn.close()


async def checkpointer_ready(saver: BaseCheckpointSaver[str]) -> None:
    """A cheap round trip for ``/health/ready``: reading a thread that does not exist."""
    await saver.aget_tuple({"configurable": {"thread_id": "__readiness__", "checkpoint_ns": ""}})
