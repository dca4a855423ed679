"""What the concierge graph talks to (the model, the peers, the stores), built once per process.

Protocols rather than classes so a test can hand the graph a scripted model or a fake peer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.messages import BaseMessage
from redis.asyncio import Redis

from infra.a2a.client import A2AClient
from infra.bookings import BookingStore
from infra.chats import ChatFeed, ChatStore
from infra.llm import Budget, ChatModel, ModelEvents, ModelReply, Usage
from infra.quotas import PersonQuotas
from infra.settings import get_settings

__all__ = ["ConciergeDeps", "Model", "Peer", "open_concierge_deps"]


class Model(Protocol):
    """``infra.llm.ChatModel`` as the graph uses it (or a scripted model in a test)."""

    async def respond(
        self,
        messages: Sequence[BaseMessage],
        tools: Sequence[dict[str, Any]],
        *,
        budget: Budget,
        events: ModelEvents,
        spent_turn: Usage,
        spent_chat: Usage,
        tool_choice: str | None = None,
    ) -> ModelReply: ...


class Peer(Protocol):
    """Another agent, as the concierge calls it (``infra.a2a.client.A2AClient``, or a fake in a test)."""

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ConciergeDeps:
    """What the concierge graph talks to; built once per process (concierge-agent, recovery worker)."""

    redis: Redis
    chats: ChatStore
    feed: ChatFeed
    bookings: BookingStore
    model: Model
    search_agent: Peer
    booking_agent: Peer
    quotas: PersonQuotas | None = None
    """The chats' owners' shares (model tokens a day); ``None`` with ``CONCIERGE_AUTH=off``: nobody to share among."""


@asynccontextmanager
async def open_concierge_deps(redis: Redis) -> AsyncIterator[ConciergeDeps]:
    settings = get_settings()
    # the tokens name the peer (``aud``) and, from the service shell's identity, this service
    search_agent = A2AClient(settings.search_agent_url, audience="search-agent")
    booking_agent = A2AClient(settings.booking_agent_url, audience="booking-agent")
    model = ChatModel(settings, redis)
    try:
        yield ConciergeDeps(
            redis=redis,
            chats=ChatStore(redis),
            feed=ChatFeed(redis),
            bookings=BookingStore(redis),
            model=model,
            search_agent=search_agent,
            booking_agent=booking_agent,
            quotas=PersonQuotas.from_settings(redis, settings) if settings.auth == "on" else None,
        )
    finally:
        await model.aclose()
        await search_agent.aclose()
        await booking_agent.aclose()
