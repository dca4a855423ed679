"""The front of a scaled service under ``concierge up``: one port, each connection handed to the next replica that
is up, as a Kubernetes Service (kube-proxy) does.

Balancing is per connection, not per request: a client's keep-alive connection stays with one replica, and a
client with a pool of connections spreads over them all. A replica that dies takes its connections with it (the
client sees them end, as with a direct connection) and gets no new ones: the supervisor marks it down as soon as
its process exits, and a replica that refuses a connection is skipped for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from stack.layout import Front

__all__ = ["Balancer"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
CHUNK = 64 * 1024


class Balancer:
    """Listens on ``front``'s port; ``replicas()`` says, at each connection, which ports are up, in turn order."""

    def __init__(self, front: Front, host: str, connect_host: str, replicas: Callable[[], Sequence[int]]) -> None:
        self.front = front
        self.host = host
        self.connect_host = connect_host
        self.replicas = replicas
        self.connections = 0
        self._turn = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.front.port, reuse_address=True)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._relay(reader, writer)
        finally:
            self._handlers.discard(task)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The next replica up that accepts, each tried once; None when none does."""
        ports = list(self.replicas())
        for _ in range(len(ports)):
            port = ports[self._turn % len(ports)]
            self._turn += 1
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    return await asyncio.open_connection(self.connect_host, port)
            except (OSError, TimeoutError):
                continue  # dead or not listening yet: the next one
        return None

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            # no replica up: the client sees the connection refused in effect (reset), not a hang
            client_writer.transport.abort()
            return
        self.connections += 1
        replica_reader, replica_writer = upstream
        pipes = {
            asyncio.create_task(_pipe(client_reader, replica_writer)),
            asyncio.create_task(_pipe(replica_reader, client_writer)),
        }
        try:
            done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            # either side gone: end the other, closed if it closed, aborted if the connection broke
            failed = any(task.exception() is not None for task in done)
            for writer in (client_writer, replica_writer):
                if failed:
                    writer.transport.abort()
                else:
                    writer.close()
        finally:
            for task in pipes:
                task.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for writer in (client_writer, replica_writer):
                if not writer.is_closing():
                    writer.transport.abort()
                with contextlib.suppress(OSError, ConnectionError):
                    await writer.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF; a connection error ends the copy with that error."""
    while data := await reader.read(CHUNK):
        writer.write(data)
        await writer.drain()
