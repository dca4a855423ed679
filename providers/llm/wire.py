"""llm-api's wire: the OpenAI Chat Completions request as it is validated, the answers and chunks as they are sent,
and OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``).

The request models are strict (a string is not a boolean, an unknown argument is refused), as the real API is;
``history_error`` adds the rule a schema cannot say: every tool call of an assistant message is answered by a tool
message before the conversation goes on, and a tool message answers one.
"""

from __future__ import annotations

import secrets
import string
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from domain.llm import SIMULATED_MODELS

__all__ = [
    "MAX_OUTPUT_TOKENS",
    "WHOLE",
    "AssistantMessage",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChunkWriter",
    "Message",
    "ModelCard",
    "ModelList",
    "OpenAIApiError",
    "OpenAIError",
    "OpenAIErrorBody",
    "SystemMessage",
    "ToolMessage",
    "UserMessage",
    "call_id",
    "completion_id",
    "history_error",
    "invalid_request",
    "model_not_found",
    "openai_error",
    "parse_request",
    "text_of",
]

MAX_OUTPUT_TOKENS = 4096
"""The most tokens one answer may have (``max_tokens``/``max_completion_tokens`` above it are refused)."""
_ALPHABET = string.ascii_letters + string.digits


def _random_id(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def completion_id() -> str:
    return _random_id("chatcmpl-", 29)


def call_id() -> str:
    return _random_id("call_", 24)


# ------------------------------------------------------------------------------------------------------ request

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


def _whole(value: object) -> object:
    """JSON's ``1.0`` is the integer 1 (JSON Schema says so); a string or a boolean is still refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WHOLE = BeforeValidator(_whole)
"""``Annotated[int, Field(...), WHOLE]``: an integer as JSON writes one, ``3`` or ``3.0`` (after the ``Field``, so
that the schema keeps its bounds)."""


class TextPart(BaseModel):
    model_config = _STRICT

    type: Literal["text"]
    text: str


class RefusalPart(BaseModel):
    model_config = _STRICT

    type: Literal["refusal"]
    refusal: str


class SystemMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(BaseModel):
    model_config = _STRICT

    role: Literal["user"]
    content: str | list[TextPart]
    name: str | None = None


class FunctionCall(BaseModel):
    model_config = _STRICT

    name: str
    arguments: str
    """JSON as the model wrote it (not necessarily valid: a model may write broken JSON)."""


class ToolCall(BaseModel):
    model_config = _STRICT

    id: str = Field(min_length=1)
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    model_config = _STRICT

    role: Literal["assistant"]
    content: str | list[TextPart | RefusalPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class ToolMessage(BaseModel):
    model_config = _STRICT

    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(min_length=1)


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDefinition(BaseModel):
    model_config = _STRICT

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """The arguments' JSON Schema."""
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    """Accepted; nothing is obfuscated here."""


class ResponseFormat(BaseModel):
    model_config = _STRICT

    type: Literal["text"]


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions``: what the simulator reads, and the arguments it accepts without using (the
    sampling ones: a rule-based model has nothing to sample). Unknown arguments are refused (400)."""

    model_config = _STRICT

    model: str = Field(
        min_length=1,
        max_length=256,
        description="One of the models served (`GET /v1/models`); any other answers 404 `model_not_found`.",
        json_schema_extra={"enum": list(SIMULATED_MODELS)},
    )
    messages: list[Message] = Field(min_length=1, max_length=2048)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS), WHOLE] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS), WHOLE] | None = None
    n: Annotated[int, Field(ge=1, le=1), WHOLE] | None = Field(None, description="One choice only.")
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    seed: Annotated[int, WHOLE] | None = None
    stop: str | list[str] | None = Field(None, description="Accepted; the answers here never contain one.")
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    logprobs: bool | None = Field(None, description="Accepted; `logprobs` is always null.")
    top_logprobs: Annotated[int, Field(ge=0, le=20), WHOLE] | None = None
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def answer_limit(self) -> int:
        """The most tokens the answer may have."""
        limits = [v for v in (self.max_tokens, self.max_completion_tokens) if v is not None]
        return min(limits) if limits else MAX_OUTPUT_TOKENS

    @property
    def tool_choice_name(self) -> str | None:
        """``tool_choice`` as one word: ``auto``, ``none``, ``required``, or the tool a named choice names."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return self.tool_choice

    def offered_tools(self) -> tuple[str, ...]:
        """The tools the answer may call, as ``tool_choice`` narrows ``tools``."""
        names = tuple(dict.fromkeys(t.function.name for t in self.tools or ()))
        if self.tool_choice == "none":
            return ()
        if isinstance(self.tool_choice, NamedToolChoice):
            return tuple(n for n in names if n == self.tool_choice.function.name)
        return names


def text_of(content: str | Sequence[Any] | None) -> str:
    """A message's text: the string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def history_error(messages: Sequence[SystemMessage | UserMessage | AssistantMessage | ToolMessage]) -> str | None:
    """What OpenAI would refuse in the order of a history (a tool call without its result, a result without its
    call), as its message; ``None`` when the history is sound."""
    waiting: set[str] = set()
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in waiting:
                return (
                    f"Invalid parameter: messages[{index}]: messages with role 'tool' must be a response to a "
                    f"preceding message with 'tool_calls' (no open tool call {message.tool_call_id!r})."
                )
            waiting.discard(message.tool_call_id)
            continue
        if waiting:
            break
        if isinstance(message, AssistantMessage):
            waiting = {call.id for call in message.tool_calls or ()}
    if waiting:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(sorted(waiting))}"
        )
    return None


# ------------------------------------------------------------------------------------------------------ answers


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AnsweredFunction(BaseModel):
    name: str
    arguments: str


class AnsweredToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: AnsweredFunction


class AnsweredMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    refusal: None = None
    tool_calls: list[AnsweredToolCall] | None = None


class Choice(BaseModel):
    index: int
    message: AnsweredMessage
    logprobs: None = None
    finish_reason: Literal["stop", "tool_calls", "length"]


class ChatCompletion(BaseModel):
    """A whole answer (``stream`` false)."""

    id: str = Field(pattern=r"^chatcmpl-")
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[Choice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: None = None
    finish_reason: Literal["stop", "tool_calls", "length"] | None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed answer: ``data: <this JSON>``; after the last, ``data: [DONE]``. With
    ``stream_options.include_usage``, every chunk has ``usage: null`` but the last, which has no choices and the
    usage."""

    id: str = Field(pattern=r"^chatcmpl-")
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(BaseModel):
    """OpenAI's error answer."""

    error: OpenAIError


def openai_error(message: str, type_: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class OpenAIApiError(Exception):
    """Answered as ``status`` with OpenAI's error body (and ``headers``)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = openai_error(message, type_, param=param, code=code)
        self.headers = dict(headers or {})


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIApiError:
    return OpenAIApiError(400, message, "invalid_request_error", param=param, code=code)


def model_not_found(model: str) -> OpenAIApiError:
    return OpenAIApiError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        "invalid_request_error",
        param="model",
        code="model_not_found",
    )


def parse_request(raw: bytes) -> ChatCompletionRequest:
    """The body, validated; 400 ``invalid_request_error`` naming the parameter at fault (as OpenAI answers)."""
    try:
        return ChatCompletionRequest.model_validate_json(raw or b"null")
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        location = first.get("loc", ())
        param = ".".join(str(part) if isinstance(part, str) else f"[{part}]" for part in location) or None
        if first["type"] == "json_invalid":
            raise invalid_request(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
                "HTTP library correctly. The OpenAI API expects a JSON payload.)"
            ) from None
        if first["type"] == "extra_forbidden":
            raise invalid_request(f"Unrecognized request argument supplied: {location[-1]}", param) from None
        if first["type"] == "missing":
            raise invalid_request(f"Missing required parameter: '{param}'.", param) from None
        raise invalid_request(f"Invalid value for '{param}': {first['msg']}.", param) from None


# ------------------------------------------------------------------------------------------------- chunk builders


class ChunkWriter:
    """The chunks of one streamed answer (same id, created and model on each)."""

    def __init__(self, model: str, *, include_usage: bool, fingerprint: str, created: int | None = None) -> None:
        self.id = completion_id()
        self.model = model
        self.created = int(time.time()) if created is None else created
        self.include_usage = include_usage
        self.fingerprint = fingerprint

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def delta(self, delta: Mapping[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}])

    def usage(self, usage: Mapping[str, int]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": dict(usage)}
