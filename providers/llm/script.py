"""llm-api's scripted mode (admin): a compromised or scripted model for tests (docs/llm-api.md, "Scripted mode").

``PUT /admin/script {"model": name | null, "steps": [...]}`` · ``GET /admin/script`` · ``DELETE /admin/script``.
The next chat completions for ``model`` (any model when ``null``) are answered with the steps in order, one step
per request, whatever they asked; then the rules answer again. One script at a time, kept in Redis as one list
(every replica plays the same script in order: a step is taken by one Lua script, never by two replicas).

A step is taken only when its request is answered 200 (after the rate limits, an injected error, a context fault
and ``hang``), so a request refused by a fault leaves it for the next one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.asyncio import Redis

from infra.redis import RedisScript
from providers.keys import provider_key
from providers.llm.faults import PROVIDER, ModelName
from providers.llm.reply import Reply, calls_reply, text_reply

__all__ = [
    "MAX_STEPS",
    "ScriptStep",
    "ScriptUpdate",
    "ScriptView",
    "ScriptedCall",
    "clear_script",
    "next_step",
    "put_script",
    "scripted_reply",
    "take_step",
    "view_script",
]

MAX_STEPS = 100
"""The most steps one script may have."""
MAX_CALLS = 16
"""The most tool calls one step may have."""


class ScriptedCall(BaseModel):
    """One tool call a step makes: ``arguments`` as an object (sent as compact JSON) or a string (sent as it is,
    so a test can send arguments that are not JSON)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=256, description="The tool's name (any, offered or not).")
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="An object (sent as JSON), or a string sent as it is (broken JSON too)."
    )

    @property
    def raw_arguments(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, separators=(",", ":"), ensure_ascii=False)


_KINDS = ("tool_calls", "text")


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # the key is left out, never null


class ScriptStep(BaseModel):
    """One answer: tool calls or words, exactly one of the two keys, never ``null`` (the schema says so too)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", json_schema_extra={"oneOf": [{"required": [kind]} for kind in _KINDS]}
    )

    # the key left out is None, though not a value a body may give: typed without it, so that an error names the
    # field itself (an ``X | None`` union would add its members to the error's ``loc``); read ``calls``/``words``
    tool_calls: Annotated[list[ScriptedCall], Field(min_length=1, max_length=MAX_CALLS)] = Field(
        cast("list[ScriptedCall]", None),
        exclude_if=lambda v: v is None,
        description="The calls, in order (each its own `call_...` id).",
        json_schema_extra=_no_default,
    )
    text: Annotated[str, Field(max_length=100_000)] = Field(
        cast("str", None), exclude_if=lambda v: v is None, description="The words.", json_schema_extra=_no_default
    )

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: Any) -> Any:
        if isinstance(data, dict) and sum(kind in data for kind in _KINDS) != 1:
            raise ValueError("a step has either `tool_calls` or `text`, exactly one of them")
        return data

    @property
    def calls(self) -> list[ScriptedCall] | None:
        return self.tool_calls if "tool_calls" in self.model_fields_set else None

    @property
    def words(self) -> str | None:
        return self.text if "text" in self.model_fields_set else None


class ScriptUpdate(BaseModel):
    """``PUT /admin/script``: replaces any script there is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelName | None = Field(None, description="The model whose requests the script answers; null: any.")
    steps: list[ScriptStep] = Field(min_length=1, max_length=MAX_STEPS)


class ScriptView(BaseModel):
    """What is left of the script (``steps_left`` 0: none, the rules answer)."""

    model: ModelName | None
    steps: list[ScriptStep]
    steps_left: int


def _key() -> str:
    return provider_key(PROVIDER, "script")


def _entry(model: str | None, step: ScriptStep) -> str:
    return json.dumps({"model": model, "step": step.model_dump(mode="json")})


def _applies(raw: str | bytes | None, model: str) -> ScriptStep | None:
    if raw is None:
        return None
    entry = json.loads(raw)
    if entry["model"] is not None and entry["model"] != model:
        return None
    return ScriptStep.model_validate(entry["step"])


async def view_script(redis: Redis) -> ScriptView:
    raws = cast(list[str], await redis.lrange(_key(), 0, -1))
    entries = [json.loads(raw) for raw in raws]
    model = entries[0]["model"] if entries else None
    steps = [ScriptStep.model_validate(e["step"]) for e in entries]
    return ScriptView(model=model, steps=steps, steps_left=len(steps))


async def put_script(redis: Redis, update: ScriptUpdate) -> ScriptView:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(_key())
        pipe.rpush(_key(), *[_entry(update.model, step) for step in update.steps])
        await pipe.execute()
    return await view_script(redis)


async def clear_script(redis: Redis) -> ScriptView:
    await redis.delete(_key())
    return ScriptView(model=None, steps=[], steps_left=0)


async def next_step(redis: Redis, model: str) -> ScriptStep | None:
    """The step that would answer a request for ``model`` now, without taking it."""
    return _applies(await redis.lindex(_key(), 0), model)


# KEYS[1] the script: entries {"model": name | null, "step": {...}}, next first. ARGV[1] the request's model.
# Takes the next entry when it is for that model (or any), atomically: two replicas never answer one step.
_TAKE = RedisScript("""
local head = redis.call('LINDEX', KEYS[1], 0)
if not head then
  return false
end
local scope = cjson.decode(head).model
if scope ~= cjson.null and scope ~= ARGV[1] then
  return false
end
redis.call('LPOP', KEYS[1])
return head
""")


async def take_step(redis: Redis, model: str) -> ScriptStep | None:
    """The next step for ``model``, taken (``None``: no script for it, or another replica took the last)."""
    return _applies(await _TAKE(redis, keys=[_key()], args=[model]), model)


def scripted_reply(step: ScriptStep, *, prompt_tokens: int, limit: int) -> Reply:
    """``step`` as the normal path writes an answer (``max_tokens`` cuts it alike)."""
    if step.calls is None:
        assert step.words is not None
        return text_reply(step.words, prompt_tokens=prompt_tokens, limit=limit, scripted=True)
    calls = [(call.name, call.raw_arguments) for call in step.calls]
    return calls_reply(calls, prompt_tokens=prompt_tokens, limit=limit, scripted=True)
