"""A chat's journal on real Redis: once-keys write an entry once, the run's own step entries are not shown, and the
feed hub gives every follower everything after its ``Last-Event-ID`` once, in order, written before or during its
subscription, with one live reader per chat."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from infra.chats import ChatFeed, FeedHub


async def _collect(hub: FeedHub, chat_id: str, after: str | None, n: int) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async with contextlib.aclosing(hub.follow(chat_id, after)) as entries:
        async for entry in entries:
            if entry:
                seen.append(entry)
            if len(seen) == n:
                return seen
    return seen


async def test_an_entry_with_a_once_key_is_written_once_and_step_entries_are_not_shown(redis):
    feed = ChatFeed(redis)
    first = await feed.emit("c1", "tool_call", once="call:x", name="search_hotels")
    again = await feed.emit("c1", "tool_call", once="call:x", name="search_hotels")
    await feed.emit("c1", "step_started", step="tools")
    assert first is not None and again is None
    assert [e["kind"] for e in await feed.read("c1")] == ["tool_call"]
    assert [e["kind"] for e in await feed.read("c1", every=True)] == ["tool_call", "step_started"]


async def test_followers_get_everything_after_their_id_once_in_order(redis):
    feed = ChatFeed(redis)
    hub = FeedHub(feed)
    ids = [await feed.emit("c2", "token", text=str(i)) for i in range(5)]
    try:
        late = asyncio.create_task(_collect(hub, "c2", ids[1], 3 + 20))
        whole = asyncio.create_task(_collect(hub, "c2", None, 5 + 20))
        for i in range(20):  # written while both follow
            await feed.emit("c2", "token", text=str(5 + i))
            if i == 3:
                await asyncio.sleep(0.05)
        late_seen, whole_seen = await asyncio.wait_for(asyncio.gather(late, whole), timeout=20)
    finally:
        await hub.aclose()
    assert [e["text"] for e in whole_seen] == [str(i) for i in range(25)]
    assert [e["text"] for e in late_seen] == [str(i) for i in range(2, 25)]
    assert len({e["id"] for e in whole_seen}) == 25
