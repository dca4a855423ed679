"""The front of a scaled service (``stack.balancer``) against real sockets: connections go to the replicas that
are up, in turn; a replica that refuses is skipped; with none up the client's connection is reset, not left
hanging; a replica dying mid-connection ends the client's connection too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from stack.balancer import Balancer
from stack.layout import Front
from stack.services import SERVICES
from tests.procs import free_port


class Replica:
    """A server that answers every line with its name (and keeps the connection); ``die`` drops everything at once,
    as a process killed -9 does."""

    def __init__(self, name: bytes) -> None:
        self.name = name
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.connections: list[asyncio.StreamWriter] = []

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        with contextlib.suppress(ConnectionError):
            while await reader.readline():
                writer.write(self.name + b"\n")
                await writer.drain()
        writer.close()

    def die(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.connections:
            writer.transport.abort()


@contextlib.asynccontextmanager
async def replica(name: bytes) -> AsyncIterator[Replica]:
    server = Replica(name)
    server.server = await asyncio.start_server(server.answer, "127.0.0.1", server.port)
    try:
        yield server
    finally:
        server.die()


@contextlib.asynccontextmanager
async def front(ports: list[int]) -> AsyncIterator[tuple[int, list[int]]]:
    """A balancer over ``ports`` (the list may be changed while it runs: it is read at each connection)."""
    balancer = Balancer(Front(SERVICES["search-agent"], free_port()), "127.0.0.1", "127.0.0.1", lambda: ports)
    await balancer.start()
    try:
        yield balancer.front.port, ports
    finally:
        await balancer.close()


async def ask(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"who?\n")
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


async def test_connections_go_to_the_replicas_in_turn_and_skip_one_that_refuses() -> None:
    async with replica(b"one") as one, replica(b"two") as two:
        dead = free_port()  # nothing listens: a replica that just died
        async with front([one.port, dead, two.port]) as (port, _):
            answers = [await ask(port) for _ in range(4)]
    assert sorted(answers) == [b"one\n", b"one\n", b"two\n", b"two\n"]


async def test_only_the_replicas_up_get_connections() -> None:
    async with replica(b"one") as one, replica(b"two") as two, front([one.port, two.port]) as (port, ports):
        ports.remove(one.port)  # the supervisor saw it exit
        assert {await ask(port) for _ in range(3)} == {b"two\n"}


async def test_with_no_replica_up_the_connection_is_reset_at_once() -> None:
    async with front([]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        writer.close()


async def test_a_replica_dying_mid_connection_ends_the_clients_connection() -> None:
    async with replica(b"one") as one, front([one.port]) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"who?\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"one\n"
        one.die()
        try:
            rest = await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            rest = b""  # reset rather than closed: ended all the same
        assert rest == b""
        writer.close()
