"""The concierge's chats in Redis: the chat records, their list, the payment token a person gave, and each chat's
journal (the feed ``GET /chats/{id}/events`` serves).

A chat's journal is a booking-style journal (``infra.journal``): the stream ``journal_key(chat_id)``, so the entries
the run machinery writes for a run of thread ``chat_id`` (``owner_lost``, ``resumed``, ``handed_off``, and the step
entries, not shown) land in the same stream as the chat's own (``domain.chat.ChatEventKind``). The chat's own are
written here, at once (no batching window: a token is on its way to a reader within a round trip), and the ones a
replayed step would write again carry a once-key: one ``SET NX`` in the same script, so an entry is written once
however often its step runs. Every key is under the ``{bookings}`` tag, the journal's slot.

The payment token never reaches the model, a checkpoint or the journal: it waits in its own key, with a TTL.

ChatStoreError (never raised for a missing chat: ``None``) is not needed: Redis errors go up as they are and the
error table answers them (``dependency_unavailable``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final, cast

from domain.chat import CHAT_EVENT_KINDS
from identity.people import QuotaExceededError, person_key
from infra.booking_keys import BOOKINGS_TAG, journal_key
from infra.journal import encode_entry, instance_id, parse_entries
from infra.redis import RedisClient, RedisScript, key, text
from infra.settings import get_settings

__all__ = ["ONCE_TTL_S", "ChatFeed", "ChatStore", "FeedHub", "chat_key"]

ONCE_TTL_S: Final = 7 * 24 * 3600
"""How long an entry's once-key is kept: as long as the journal itself."""
FOLLOW_BLOCK_MS: Final = 2000
"""How long one ``XREAD BLOCK`` of a live reader waits before it looks again (and lets the stream send a ping)."""


def chat_key(chat_id: str) -> str:
    return key(BOOKINGS_TAG, "chat", chat_id)


def _index_key() -> str:
    return key(BOOKINGS_TAG, "chats")


def _owner_index_key(owner: str | None) -> str:
    return key(BOOKINGS_TAG, "chats", "owner", person_key(owner) if owner is not None else "-")


def _message_key(chat_id: str, client_key: str) -> str:
    return key(BOOKINGS_TAG, "chat-key", chat_id, hashlib.sha256(client_key.encode()).hexdigest()[:32])


def _token_key(chat_id: str) -> str:
    return key(BOOKINGS_TAG, "chat-token", chat_id)


def _once_key(chat_id: str, once: str) -> str:
    return key(BOOKINGS_TAG, "chat-once", chat_id, once)


# KEYS: stream, once ('' slot unused when ARGV[4] == '0') | ARGV: max_len, ttl_s, entry, has_once, once_ttl_s
# → the entry's id, or '' when the once-key was taken (written before)
_EMIT = RedisScript("""
if ARGV[4] == '1' and not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[5]) then return '' end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'e', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return id
""")

# KEYS: chat | ARGV: message JSON → 1, 0 no chat
_APPEND_MESSAGE = RedisScript("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local raw = redis.call('HGET', KEYS[1], 'messages')
local messages = {}
if raw and raw ~= '' then messages = cjson.decode(raw) end
table.insert(messages, cjson.decode(ARGV[1]))
redis.call('HSET', KEYS[1], 'messages', cjson.encode(messages))
return 1
""")


# KEYS: chat | ARGV: booking ids JSON → 1, 0 no chat. Each id not there yet is appended (in order, once).
_ADD_BOOKINGS = RedisScript("""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local raw = redis.call('HGET', KEYS[1], 'bookings')
local bookings = {}
if raw and raw ~= '' and raw ~= '[]' then bookings = cjson.decode(raw) end
local seen = {}
for _, id in ipairs(bookings) do seen[id] = true end
local added = false
for _, id in ipairs(cjson.decode(ARGV[1])) do
  if not seen[id] then table.insert(bookings, id); seen[id] = true; added = true end
end
if added then redis.call('HSET', KEYS[1], 'bookings', cjson.encode(bookings)) end
return 1
""")


INDEX_MAX: Final = 100_000
"""Chats kept in the ``GET /chats`` indexes (each also trimmed to the chats' retention); the oldest go first."""

# KEYS: chat, index, owner's index | ARGV: now, ttl_s, index max, chat id, owner ('' none)
# KEYS: chat, index, owner's index | ARGV: now, ttl_s, index max, chat id, owner, the owner's cap (0: none)
# → {1} created | {0, count, oldest} the owner has ``cap`` chats kept already: nothing created
_CREATE = RedisScript("""
for i = 2, 3 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. (tonumber(ARGV[1]) - tonumber(ARGV[2])))
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -1 - tonumber(ARGV[3]))
end
local cap = tonumber(ARGV[6])
if cap > 0 then
  local count = redis.call('ZCARD', KEYS[3])
  if count >= cap then
    local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {0, count, oldest[2] or ARGV[1]}
  end
end
redis.call('HSET', KEYS[1], 'chat_id', ARGV[4], 'created_at', ARGV[1], 'messages', '[]', 'owner', ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[2])
for i = 2, 3 do
  redis.call('ZADD', KEYS[i], ARGV[1], ARGV[4])
end
redis.call('EXPIRE', KEYS[3], ARGV[2])
return {1}
""")

# KEYS: the message key | ARGV: text digest, ttl_s → 1 same text (or first use), 0 used with another text
_CLAIM_MESSAGE_KEY = RedisScript("""
local stored = redis.call('GET', KEYS[1])
if not stored then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]); return 1 end
if stored == ARGV[1] then return 1 end
return 0
""")


class ChatStore:
    """Chat records: ``chat_id``, ``created_at``, ``messages`` (what people read: user and assistant texts),
    ``bookings`` (ids booked in it), ``last_turn`` (the last finished turn) and ``usage`` (the whole chat's)."""

    def __init__(self, redis: RedisClient) -> None:
        settings = get_settings()
        self.redis = redis
        self.ttl_s = settings.journal_ttl_s
        self.token_ttl_s = max(1, round(settings.approval_ttl_s + settings.concierge_turn_budget_s))

    async def create(self, chat_id: str, owner: str | None = None, *, max_chats: int | None = None) -> float:
        """A new chat of ``owner`` (the person's ``sub``; ``None``: nobody's but the operator's);
        ``QuotaExceededError`` when ``owner`` keeps ``max_chats`` already (``PERSON_MAX_CHATS``, a person's cap)."""
        now = time.time()
        keys = [chat_key(chat_id), _index_key(), _owner_index_key(owner)]
        cap = max_chats or 0
        args = [repr(now), self.ttl_s, INDEX_MAX, chat_id, owner or "", cap]
        reply = await _CREATE(self.redis, keys=keys, args=args)
        if int(reply[0]) == 0:
            count, oldest = int(reply[1]), float(text(reply[2]))
            frees = max(1.0, oldest + self.ttl_s - now)
            raise QuotaExceededError(
                "chats",
                f"you have {count} chats, PERSON_MAX_CHATS: continue one of them; the oldest is kept "
                f"{frees:.0f} s more",
                retry_after=frees,
            )
        return now

    async def owner(self, chat_id: str) -> tuple[bool, str | None]:
        """Whether the chat exists, and whose it is."""
        found, owner = await self.redis.hmget(chat_key(chat_id), ["chat_id", "owner"])
        return found is not None, (text(owner) or None) if owner is not None else None

    async def claim_message_key(self, chat_id: str, client_key: str, text_digest: str) -> bool:
        """Bind the chat's ``Idempotency-Key`` to the message's text; False when it came before with another."""
        found = await _CLAIM_MESSAGE_KEY(
            self.redis, keys=[_message_key(chat_id, client_key)], args=[text_digest, self.ttl_s]
        )
        return bool(found)

    async def get(self, chat_id: str) -> dict[str, Any] | None:
        raw = await self.redis.hgetall(chat_key(chat_id))
        if not raw:
            return None
        fields = {text(name): text(value) for name, value in raw.items()}
        return {
            "chat_id": fields.get("chat_id", chat_id),
            "owner": fields.get("owner") or None,
            "created_at": float(fields.get("created_at") or 0.0),
            "messages": json.loads(fields.get("messages") or "[]"),
            "bookings": json.loads(fields.get("bookings") or "[]"),
            "last_turn": json.loads(fields["last_turn"]) if fields.get("last_turn") else None,
            "usage": json.loads(fields["usage"]) if fields.get("usage") else None,
        }

    async def exists(self, chat_id: str) -> bool:
        return bool(await self.redis.exists(chat_key(chat_id)))

    async def page(
        self, limit: int, before: float | None = None, *, owner: str | None = None, everyone: bool = True
    ) -> list[tuple[str, float]]:
        """Chat ids newest first (``before``: created strictly earlier), with their creation times; every chat, or
        (``everyone=False``) only ``owner``'s."""
        top = f"({before!r}" if before is not None else "+inf"
        index = _index_key() if everyone else _owner_index_key(owner)
        rows = cast(
            list[tuple[Any, float]],
            await self.redis.zrevrangebyscore(index, top, "-inf", start=0, num=limit, withscores=True),
        )
        return [(text(member), float(score)) for member, score in rows]

    async def append_message(self, chat_id: str, message: Mapping[str, Any]) -> None:
        """Show a message at once (the user's, at ``POST``); the turn's end rewrites the transcript from its state."""
        await _APPEND_MESSAGE(self.redis, keys=[chat_key(chat_id)], args=[json.dumps(dict(message))])

    async def record_turn(
        self,
        chat_id: str,
        *,
        messages: list[dict[str, Any]],
        bookings: list[str],
        last_turn: Mapping[str, Any] | None,
        usage: Mapping[str, Any],
    ) -> None:
        """The transcript and usage as the turn's state has them (a replay writes the same again); its bookings are
        added to the chat's (``add_booking`` may have written one the state does not hold)."""
        mapping: dict[Any, Any] = {"messages": json.dumps(messages), "usage": json.dumps(dict(usage))}
        if last_turn is not None:
            mapping["last_turn"] = json.dumps(dict(last_turn))
        await self.redis.hset(chat_key(chat_id), mapping=mapping)
        if bookings:
            await _ADD_BOOKINGS(self.redis, keys=[chat_key(chat_id)], args=[json.dumps(list(bookings))])

    async def add_booking(self, chat_id: str, booking_id: str) -> None:
        """A booking is the chat's as soon as booking-agent accepted it, while its turn goes on (idempotent)."""
        await _ADD_BOOKINGS(self.redis, keys=[chat_key(chat_id)], args=[json.dumps([booking_id])])

    # the payment token: apart from everything else, with a TTL

    async def put_token(self, chat_id: str, token: str) -> None:
        await self.redis.set(_token_key(chat_id), token, ex=self.token_ttl_s)

    async def token(self, chat_id: str) -> str | None:
        value = await self.redis.get(_token_key(chat_id))
        return None if value is None else text(value)

    async def drop_token(self, chat_id: str) -> None:
        await self.redis.delete(_token_key(chat_id))


class ChatFeed:
    """A chat's journal: write its entries (once where a replay could repeat them), read them, follow them live."""

    def __init__(self, redis: RedisClient) -> None:
        settings = get_settings()
        self.redis = redis
        self.max_len = settings.journal_max_len
        self.ttl_s = settings.journal_ttl_s

    async def emit(self, chat_id: str, kind: str, *, once: str | None = None, **fields: Any) -> str | None:
        """Append one entry now; with ``once``, only the first call with that key writes (``None`` after)."""
        stream = journal_key(chat_id)
        entry = encode_entry(kind, instance_id(), fields)
        reply = await _EMIT(
            self.redis,
            keys=[stream, _once_key(chat_id, once) if once is not None else stream],
            args=[self.max_len, self.ttl_s, entry, "1" if once is not None else "0", ONCE_TTL_S],
        )
        written = text(reply)
        return written or None

    async def read(
        self, chat_id: str, *, after: str | None = None, count: int | None = None, every: bool = False
    ) -> list[dict[str, Any]]:
        """The chat's entries after stream id ``after`` (all with ``None``), oldest first, its kinds only (``every``:
        the run's step entries too, for a reader that pages by id)."""
        start = "-" if after is None else f"({after}"
        raw = await self.redis.xrange(journal_key(chat_id), min=start, max="+", count=count)
        return [entry for entry in parse_entries(raw) if every or entry.get("kind") in CHAT_EVENT_KINDS]


def _stream_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


class _ChatReader:
    """One ``XREAD BLOCK`` loop for one chat in this process, handing each new entry to every local subscriber."""

    def __init__(self, redis: RedisClient, chat_id: str) -> None:
        self.redis = redis
        self.chat_id = chat_id
        self.queues: set[asyncio.Queue[dict[str, Any]]] = set()
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        stream = journal_key(self.chat_id)
        try:
            last = cast(list[tuple[Any, Any]], await self.redis.xrevrange(stream, count=1))
            position = text(last[0][0]) if last else "0-0"
        finally:
            self.ready.set()
        while self.queues:
            reply = await self.redis.xread({stream: position}, count=500, block=FOLLOW_BLOCK_MS)
            for _, raw in cast(list[tuple[Any, Any]], reply or []):
                for entry in parse_entries(raw):
                    position = entry["id"]
                    for queue in list(self.queues):
                        queue.put_nowait(entry)


class FeedHub:
    """Live readers of chats' journals in one process: one Redis connection blocks per followed chat, however many
    clients follow it (a hundred SSE clients of one chat cost one ``XREAD BLOCK``, not a hundred pooled
    connections). A subscriber gets everything after its ``after`` exactly once: it registers, waits until the
    chat's reader knows where the stream ended, reads what came before from Redis, then takes the live entries
    newer than the last it read."""

    def __init__(self, feed: ChatFeed) -> None:
        self.feed = feed
        self._readers: dict[str, _ChatReader] = {}

    async def follow(self, chat_id: str, after: str | None) -> AsyncGenerator[dict[str, Any], None]:
        """The chat's entries after ``after``, then each new one; ``{}`` every ``FOLLOW_BLOCK_MS`` without one."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        reader = self._readers.get(chat_id)
        if reader is None or reader.task is None or reader.task.done():
            reader = self._readers[chat_id] = _ChatReader(self.feed.redis, chat_id)
            reader.queues.add(queue)
            reader.task = asyncio.create_task(reader.run(), name=f"chat-feed:{chat_id}")
            reader.task.add_done_callback(functools.partial(self._ended, reader))
        else:
            reader.queues.add(queue)
        try:
            await reader.ready.wait()
            cursor = after
            while True:  # what was written before the live reader started (and after ``after``)
                page = await self.feed.read(chat_id, after=cursor, count=500, every=True)
                for entry in page:
                    cursor = entry["id"]
                    if entry.get("kind") in CHAT_EVENT_KINDS:
                        yield entry
                if len(page) < 500:
                    break
            position = _stream_id(cursor) if cursor else (0, 0)
            while True:
                try:
                    async with asyncio.timeout(FOLLOW_BLOCK_MS / 1000):
                        entry = await queue.get()
                except TimeoutError:
                    if reader.task is not None and reader.task.done():
                        raise RuntimeError(f"the journal reader of chat {chat_id} stopped") from None
                    yield {}
                    continue
                if not entry:  # woken (``wake``): a keep-alive now
                    yield {}
                    continue
                if _stream_id(entry["id"]) <= position:
                    continue
                position = _stream_id(entry["id"])
                if entry.get("kind") in CHAT_EVENT_KINDS:
                    yield entry
        finally:
            reader.queues.discard(queue)

    def _ended(self, reader: _ChatReader, _task: object) -> None:
        # a reader that failed (Redis): its subscribers notice at their next wait and end (their clients resume)
        if self._readers.get(reader.chat_id) is reader:
            del self._readers[reader.chat_id]

    def wake(self) -> None:
        """Hand every follower a keep-alive at once: a stopping process's streams see why and end now, not at the
        next ``FOLLOW_BLOCK_MS``."""
        for reader in self._readers.values():
            for queue in reader.queues:
                queue.put_nowait({})

    async def aclose(self) -> None:
        for reader in list(self._readers.values()):
            if reader.task is not None:
                reader.task.cancel()
