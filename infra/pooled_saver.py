"""``PooledPostgresSaver``: LangGraph's ``AsyncPostgresSaver`` on a connection pool, minus two per-step costs.

With ``durability="sync"`` every step of a run waits for its task writes (``aput_writes``) and its checkpoint
(``aput``) before the next step starts, so whatever those calls spend around the database round trip is paid on
the booking's critical path, ten times per booking. The base class spends it twice:

- **One lock for the whole process.** Every operation holds ``self.lock`` (an ``asyncio.Lock``) from before it
  takes a connection until it is done. With a single connection that lock is what keeps two coroutines off it;
  with a pool each operation has a connection of its own, and the lock only makes concurrent runs queue behind
  each other's round trips. Here it is skipped when the saver was given a pool (and no shared pipeline).
- **A thread hop per write.** Blobs and writes are serialised on a worker thread (``asyncio.to_thread``) so a
  huge state cannot stall the event loop. Our states are small and bounded (a booking's input, three offers and
  a few ids: about 0.5 KB serialised), which take microseconds to dump; the hop to a thread and back costs far
  more, while holding the connection. Here they are serialised inline. A graph whose state can grow large
  should keep the base class.

Measured by ``bench/checkpoint_saver.py`` (a five-node graph, ``durability="sync"``, one run at a time, both
classes interleaved on the same pool) and, on whole bookings, by ``bench/booking_throughput.py``.

``aput`` and ``aput_writes`` mirror langgraph-checkpoint-postgres 3.2 statement for statement, only without the
thread; ``tests/integration/test_checkpointer.py`` writes the same steps through both classes and compares the
rows, so a release that changes the base class's storage fails there, not in production.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from psycopg import AsyncCursor
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

__all__ = ["PooledPostgresSaver"]


class PooledPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` without the process-wide lock (on a pool) and without the serialisation thread."""

    @asynccontextmanager
    async def _cursor(self, *, pipeline: bool = False) -> AsyncIterator[AsyncCursor[DictRow]]:
        if not isinstance(self.conn, AsyncConnectionPool) or self.pipe is not None or not self.supports_pipeline:
            async with super()._cursor(pipeline=pipeline) as cur:
                yield cur
            return
        async with self.conn.connection() as conn:
            if pipeline:
                async with conn.pipeline(), conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur
            else:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    yield cur

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = dict(config["configurable"])
        thread_id = configurable.pop("thread_id")
        checkpoint_ns = configurable.pop("checkpoint_ns")
        parent_id = configurable.pop("checkpoint_id", None)

        copy: dict[str, Any] = dict(checkpoint)
        copy["channel_values"] = dict(copy["channel_values"])
        # Primitive values stay inline in the checkpoint row; everything else goes to the blobs table.
        blob_values: dict[str, Any] = {}
        for name, value in checkpoint["channel_values"].items():
            if isinstance(value, _DeltaSnapshot):
                blob_values[name] = copy["channel_values"].pop(name)
                copy["channel_values"][name] = True
            elif value is None or isinstance(value, str | int | float | bool):
                continue
            else:
                blob_values[name] = copy["channel_values"].pop(name)
        blob_versions = {k: v for k, v in new_versions.items() if k in blob_values}
        blobs = self._dump_blobs(thread_id, checkpoint_ns, blob_values, blob_versions) if blob_versions else None
        row = (
            thread_id,
            checkpoint_ns,
            checkpoint["id"],
            parent_id,
            Jsonb(copy),
            Jsonb(get_serializable_checkpoint_metadata(config, metadata)),
        )
        async with self._cursor(pipeline=True) as cur:
            if blobs:
                await cur.executemany(self.UPSERT_CHECKPOINT_BLOBS_SQL, blobs)
            await cur.execute(self.UPSERT_CHECKPOINTS_SQL, row)
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint["id"]}
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        query = (
            self.UPSERT_CHECKPOINT_WRITES_SQL
            if all(channel in WRITES_IDX_MAP for channel, _ in writes)
            else self.INSERT_CHECKPOINT_WRITES_SQL
        )
        configurable = config["configurable"]
        params = self._dump_writes(
            configurable["thread_id"],
            configurable["checkpoint_ns"],
            configurable["checkpoint_id"],
            task_id,
            task_path,
            writes,
        )
        async with self._cursor(pipeline=True) as cur:
            await cur.executemany(query, params)
