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
- **One command per row.** The base class sends a step's rows as a pipeline: ``executemany`` of the blobs, then
  the checkpoint; ``executemany`` of the task's writes. One network round trip, but psycopg drives the pipeline
  one command at a time, each a wait on the socket through the event loop, and the server runs each as its own
  statement. Here each call is one statement: the writes as one multi-row ``INSERT``, the blobs as a
  data-modifying ``WITH`` in front of the checkpoint's ``INSERT`` (Postgres runs it exactly once, in the same
  snapshot and transaction). Same tables, same rows, same conflict rules; a batch the single statement cannot
  express the same way (two writes to one key, where ``ON CONFLICT DO UPDATE`` would refuse to touch a row twice,
  or more than ``MAX_PARAMS_PER_STATEMENT`` parameters) goes the base class's way.

Measured by ``bench/checkpoint_saver.py`` (a five-node graph, ``durability="sync"``, one run at a time, both
classes interleaved on the same pool) and, on whole bookings, by ``bench/booking_throughput.py``.

``aput`` and ``aput_writes`` mirror langgraph-checkpoint-postgres 3.2: the same serialisation and the base class's
own SQL (only its ``VALUES`` row repeated); ``tests/integration/test_checkpointer.py`` writes the same steps and the
same calls through both classes and compares the rows, so a release that changes the base class's storage fails
there, not in production.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from functools import lru_cache
from typing import Any, Concatenate, ParamSpec, TypeVar

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
from psycopg import AsyncCursor, OperationalError
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

__all__ = ["DROPPED_CONNECTION_ATTEMPTS", "MAX_PARAMS_PER_STATEMENT", "PooledPostgresSaver"]

logger = logging.getLogger(__name__)

DROPPED_CONNECTION_ATTEMPTS = 3
"""A write or read that meets a dropped connection (``pg_terminate_backend``, a restarted server, a proxy timeout)
is tried again on another connection of the pool, this many times in all. Every statement here is an upsert or a
read, so running one twice changes nothing."""

MAX_PARAMS_PER_STATEMENT = 50
"""Larger batches go through ``executemany``. psycopg caches the parsing of a query only up to 50 parameters
(``psycopg._queries.MAX_CACHED_STATEMENT_PARAMS``): past that it would re-parse the statement on every call, which
costs more than the round trips it saves. Up to 5 task writes or 7 blobs fit."""

_ROW = re.compile(r"VALUES\s*(\((?:\s*%s\s*,)*\s*%s\s*\))", re.IGNORECASE)


@lru_cache(maxsize=256)
def multi_row(sql: str, rows: int) -> str:
    """``sql``, an ``INSERT ... VALUES (%s, ...)`` of one row, rewritten to insert ``rows`` rows."""
    match = _ROW.search(sql)
    if match is None:
        raise ValueError(f"not a one-row INSERT ... VALUES (%s, ...): {sql!r}")
    row = match.group(1)
    return f"{sql[: match.start(1)]}{', '.join([row] * rows)}{sql[match.end(1) :]}".strip().rstrip(";")


def _flatten(rows: Sequence[Sequence[Any]]) -> list[Any]:
    return [value for row in rows for value in row]


# checkpoint_writes' primary key, by position in a row of ``_dump_writes``:
# (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
_WRITE_KEY = (0, 1, 2, 3, 5)


P = ParamSpec("P")
S = TypeVar("S", bound=AsyncPostgresSaver)
T = TypeVar("T")


def _on_a_live_connection(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Retry ``method`` when its connection turns out dead; the pool checks and replaces connections on checkout."""

    @functools.wraps(method)
    async def retrying(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, DROPPED_CONNECTION_ATTEMPTS + 1):
            try:
                return await method(self, *args, **kwargs)
            except OperationalError as exc:
                if attempt == DROPPED_CONNECTION_ATTEMPTS or not isinstance(self.conn, AsyncConnectionPool):
                    raise
                logger.warning("checkpointer: %s failed on a dead connection (%s); again", method.__name__, exc)
        raise AssertionError("unreachable")

    return retrying


class PooledPostgresSaver(AsyncPostgresSaver):
    """``AsyncPostgresSaver`` without the process-wide lock (on a pool) and without the serialisation thread; a
    call that meets a dropped connection is run again on another one (``DROPPED_CONNECTION_ATTEMPTS``)."""

    aget_tuple = _on_a_live_connection(AsyncPostgresSaver.aget_tuple)

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

    @_on_a_live_connection
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
        if not blobs:
            async with self._cursor() as cur:
                await cur.execute(self.UPSERT_CHECKPOINTS_SQL, row)
        elif len(blobs) * len(blobs[0]) + len(row) <= MAX_PARAMS_PER_STATEMENT:
            statement = (
                f"WITH blobs AS ({multi_row(self.UPSERT_CHECKPOINT_BLOBS_SQL, len(blobs))}) "
                f"{self.UPSERT_CHECKPOINTS_SQL.strip().rstrip(';')}"
            )
            async with self._cursor() as cur:
                await cur.execute(statement, [*_flatten(blobs), *row])
        else:
            async with self._cursor(pipeline=True) as cur:
                await cur.executemany(self.UPSERT_CHECKPOINT_BLOBS_SQL, blobs)
                await cur.execute(self.UPSERT_CHECKPOINTS_SQL, row)
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint["id"]}
        }

    @_on_a_live_connection
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
        if not params:
            return
        keys = {tuple(row[i] for i in _WRITE_KEY) for row in params}
        if len(keys) == len(params) and len(params) * len(params[0]) <= MAX_PARAMS_PER_STATEMENT:
            async with self._cursor() as cur:
                await cur.execute(multi_row(query, len(params)), _flatten(params))
        else:
            async with self._cursor(pipeline=True) as cur:
                await cur.executemany(query, params)
