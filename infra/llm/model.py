"""``ChatModel``: the one way this project asks a language model, with every layer around the call.

One ``respond`` is one model step of a turn::

    budgets (turn/chat tokens, calls)  → TokenBudgetExhausted before anything is sent
    primary:  breaker → bulkhead → budget → retry (policy_for("llm_primary"), server hints on)
                each attempt: shared rate limiter (Redis) → one streamed request, a first-token limit, a call limit
    fallback: the same, on its own breaker (policy_for("llm_fallback")), when the primary's breaker is open, its
              retries are spent, the wait it asks for does not fit, or its stream broke after it started

``ChatOpenAI`` is the transport only (``max_retries=0``): the retry loop above is the only one. Why each choice:
``docs/model-dependency.md``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.runnables import Runnable
from pydantic import SecretStr

from identity.auth import llm_api_key
from infra.llm.classify import classify
from infra.llm.errors import (
    ModelError,
    ModelQuotaExceededError,
    ModelRateLimitedError,
    ModelStreamBrokenError,
    ModelTimeoutError,
    ModelUnavailableError,
    TokenBudgetExhausted,
)
from infra.llm.limiter import RateLimiter
from infra.llm.telemetry import ModelCallSpan, count_budget_stop, count_fallback
from infra.redis import Redis
from infra.settings import Settings
from resilience import bulkhead_registry, remaining_budget
from resilience.errors import (
    BudgetExhaustedError,
    CircuitOpenError,
    NonRetryableError,
    OverloadedError,
    ResilienceError,
)
from resilience.policy import ResiliencePolicy, policy_for

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI

__all__ = ["Budget", "ChatModel", "ModelEvents", "ModelReply", "Usage", "estimate_tokens"]

logger = logging.getLogger(__name__)

MIN_CALL_S = 0.2
"""Below this much budget a model call (or a fallback) is not started: it could not stream an answer."""


@dataclass(frozen=True)
class Usage:
    """Tokens as the provider reported them, and model calls (``respond``s) made."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens, self.calls + other.calls
        )

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total,
            "calls": self.calls,
        }


MAX_ANSWER_TOKENS: Final = 4096
"""The longest answer a budget lets a call ask for (``max_tokens``); more room than this leaves it unset."""


@dataclass(frozen=True)
class Budget:
    """A turn's limits; ``None``: no limit. Time is the request's timeout budget (``resilience.budget``)."""

    turn_tokens: int | None = None
    chat_tokens: int | None = None
    calls_per_turn: int = 8

    @classmethod
    def from_settings(cls, settings: Settings) -> Budget:
        return cls(settings.llm_turn_token_budget, settings.llm_chat_token_budget, settings.llm_max_calls_per_turn)


@dataclass(frozen=True)
class ModelReply:
    message: AIMessage
    """Content, ``tool_calls`` (id, name, args) and ``invalid_tool_calls``; ``usage_metadata`` as reported."""
    model: str
    """The model that answered (primary or fallback)."""
    usage: Usage
    """This call's usage as the provider reported it (``calls`` = 1)."""
    attempts: int
    """Requests sent for it, across both models."""


class ModelEvents(Protocol):
    async def token(self, text: str, attempt: int) -> None:
        """Text as it streams; ``attempt`` (1-based, across both models) is the request it belongs to."""

    async def switched(self, reason: str, from_model: str, to_model: str, attempt: int) -> None:
        """A new attempt replaces ``attempt``: whatever it streamed is discarded (event ``model_switched``)."""


def estimate_tokens(messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]]) -> int:
    """A cheap, generous estimate of a request's prompt tokens (about four characters a token), for the budgets and
    the rate limiter before the provider counts; the provider's count is what is charged afterwards."""
    chars = 0
    for message in messages:
        content = message.content
        chars += len(content) if isinstance(content, str) else len(json.dumps(content))
        calls = getattr(message, "tool_calls", None)
        if calls:
            chars += len(json.dumps(calls, default=str))
        chars += 16
    if tools:
        chars += _tools_chars(tools)
    return chars // 4 + 3


_tools_seen: tuple[Sequence[dict[str, Any]], int] | None = None


def _tools_chars(tools: Sequence[dict[str, Any]]) -> int:
    global _tools_seen
    seen = _tools_seen
    if seen is not None and seen[0] is tools:
        return seen[1]
    chars = len(json.dumps(list(tools)))
    _tools_seen = (tools, chars)
    return chars


_FALLBACK_REASONS: tuple[tuple[type[BaseException], str | None], ...] = (
    # first match wins; None: the fallback would be refused alike (the request, the key, the budget)
    (ModelStreamBrokenError, "stream_broken"),
    (ModelQuotaExceededError, "quota_exceeded"),
    (ModelRateLimitedError, "rate_limited"),  # retry-after past the budget, the limiter's room too, or spent retries
    (NonRetryableError, None),
    (CircuitOpenError, "circuit_open"),
    (BudgetExhaustedError, "retries_exhausted"),  # the next backoff would not fit: what is left goes to the fallback
    (ResilienceError, "bulkhead_full"),
    (ModelTimeoutError, "timeout"),
    (ModelError, "retries_exhausted"),
)


class _Endpoint:
    """One model at one base URL, with its own policy (breaker, bulkhead, retry) and its bound clients."""

    def __init__(self, role: str, model: str, base_url: str, api_key: str, settings: Settings) -> None:
        self.role = role
        self.name = f"llm_{role}"
        self.model = model
        self.base_url = base_url
        self._api_key = api_key
        self.limits = settings.llm_limits(base_url)
        """Its first-token and call limits: a local CPU model's are longer (``Settings.llm_limits``)."""
        bulkhead = policy_for(self.name).bulkhead
        if bulkhead is not None and bulkhead.cfg.timeout < self.limits.call_s:
            # its bulkhead must not cut a call the endpoint allows (a CPU model reading a new prompt under load)
            bulkhead_registry.configure(bulkhead.name, timeout=self.limits.call_s)
        self._chat: ChatOpenAI | None = None
        self._bound: dict[str, Runnable[Any, Any]] = {}
        self._last: tuple[Sequence[dict[str, Any]], str | None, Runnable[Any, Any]] | None = None
        self._policy: tuple[ResiliencePolicy, ResiliencePolicy] | None = None
        self.typical_s = 1.0
        """What a call to this endpoint takes lately (a moving average of the answered ones): a limiter's slot must
        leave that much of the budget, or waiting for it only to run out of time helps nobody."""

    @property
    def chat(self) -> ChatOpenAI:
        """Built at the first call: ``langchain_openai`` (and ``openai``) cost a second of import on a 2-core
        machine, which a service's start-up (and the recovery worker's, which may never resume a chat) need not pay."""
        if self._chat is None:
            import openai
            from langchain_openai import ChatOpenAI

            self._chat = ChatOpenAI(
                model=self.model,
                base_url=self.base_url,
                api_key=SecretStr(self._api_key),
                max_retries=0,  # the policy's retry loop is the only one
                # the SDK's own Timeout class (httpx2's since openai 3): an ``httpx.Timeout`` is refused by
                # openai ≥ 3.63, failing every call. Unhashable on purpose: a hashable timeout (a tuple) makes
                # langchain-openai share one cached client between models, and our ``aclose`` would close it
                timeout=openai.Timeout(self.limits.call_s, connect=min(5.0, self.limits.call_s)),
                stream_usage=True,
                include_response_headers=True,
            )
        return self._chat

    def took(self, seconds: float) -> None:
        self.typical_s = 0.8 * self.typical_s + 0.2 * seconds

    def policy(self) -> ResiliencePolicy:
        """``policy_for(name)`` with the model's errors as the retryable ones (rebuilt when the registries are)."""
        base = policy_for(self.name)
        cached = self._policy
        if cached is not None and cached[0] is base:
            return cached[1]
        retry = replace(
            base.retry,
            retryable_exceptions=(ModelUnavailableError, ModelRateLimitedError),
            non_retryable_exceptions=(NonRetryableError,),
        )
        policy = ResiliencePolicy(self.name, circuit=base.circuit, bulkhead=base.bulkhead, retry=retry)
        self._policy = (base, policy)
        return policy

    def bound(self, tools: Sequence[dict[str, Any]], tool_choice: str | None = None) -> Runnable[Any, Any]:
        last = self._last
        if last is not None and last[0] is tools and last[1] == tool_choice:  # as the last call (module constants)
            return last[2]
        runnable = self._bind(tools, tool_choice)
        self._last = (tools, tool_choice, runnable)
        return runnable

    def _bind(self, tools: Sequence[dict[str, Any]], tool_choice: str | None) -> Runnable[Any, Any]:
        key = json.dumps([list(tools), tool_choice], sort_keys=True, default=str)
        runnable = self._bound.get(key)
        if runnable is None:
            runnable = self.chat.bind_tools(list(tools), tool_choice=tool_choice) if tools else self.chat
            if len(self._bound) > 32:
                self._bound.clear()
            self._bound[key] = runnable
        return runnable


class _Turn:
    """What one ``respond`` has done so far: the attempts sent and what the current one streamed."""

    __slots__ = ("attempt", "raw_estimate", "streamed")

    def __init__(self, raw_estimate: int) -> None:
        self.attempt = 0
        self.streamed = 0
        self.raw_estimate = raw_estimate


class ChatModel:
    """The model client every agent uses (``docs/model-dependency.md``)."""

    def __init__(self, settings: Settings, redis: Redis | None = None) -> None:
        self.settings = settings
        key = llm_api_key(settings) or "unset"
        base = settings.llm_primary_base_url
        self.primary = _Endpoint("primary", settings.llm_model, base, key, settings)
        self.fallback: _Endpoint | None = None
        if settings.llm_fallback_model:
            fallback_url = settings.llm_fallback_base_url or base
            self.fallback = _Endpoint("fallback", settings.llm_fallback_model, fallback_url, key, settings)
        self.limiter = RateLimiter(redis, settings) if redis is not None else None
        self._ratio = 1.0
        """Reported prompt tokens per estimated one, the largest seen lately: the estimate learns the provider's
        tokenizer from its own counts, so a budget is not passed by a guess that was low."""

    def _calibrated(self, raw: int) -> int:
        return int(raw * self._ratio * 1.05) + 1

    def _learn(self, raw_estimate: int, reported_input: int) -> None:
        if raw_estimate > 0 and reported_input > 0:
            seen = reported_input / raw_estimate
            self._ratio = max(1.0, seen, self._ratio * 0.9)

    async def check_capacity(self, budget_s: float) -> float:
        """The door's question before it accepts a turn: how long until the shared rate limiter has room for a model
        call (0: now). Raises ``OverloadedError`` (429 ``overloaded`` with ``Retry-After``) when that wait, on the
        primary and on the fallback, does not fit ``budget_s``: refused before anything is recorded."""
        if self.limiter is None:
            return 0.0
        options = [(await self.limiter.wait_for(self.primary.model), self.primary.typical_s)]
        if self.fallback is not None and self.fallback.model != self.primary.model:
            options.append((await self.limiter.wait_for(self.fallback.model), self.fallback.typical_s))
        wait, need = min(options, key=sum)  # the slot's wait, then the call itself
        if wait + need + MIN_CALL_S >= budget_s:
            count_budget_stop("rate_limit_door")
            raise OverloadedError(
                "llm",
                self.settings.llm_rpm or 0,
                f"the model's rate limit has room in {wait:.1f}s, more than this turn's {budget_s:.1f}s budget",
                retry_after=max(1.0, wait),
            )
        return wait

    async def aclose(self) -> None:
        for endpoint in (self.primary, self.fallback):
            if endpoint is not None:
                client = endpoint.chat.root_async_client
                if client is not None:
                    await client.close()

    async def warm_up(
        self, messages: Sequence[BaseMessage], tools: Sequence[dict[str, Any]], tool_choice: str | None = None
    ) -> bool:
        """One small request to the primary, outside the turn's layers (no breaker, budget or limiter to charge), so
        a cold local server loads the model and caches the prompt's prefix before a person waits on it. True when
        it answered; a failure is logged once and never raised (a cancellation is)."""
        endpoint = self.primary
        try:
            # the import (a second on 2 cores) off the loop: the service answers while it warms up
            await asyncio.to_thread(importlib.import_module, "langchain_openai")
            async with asyncio.timeout(endpoint.limits.call_s):
                async for _chunk in endpoint.bound(tools, tool_choice).astream(list(messages), max_tokens=1):
                    pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = classify(exc, endpoint.model) if not isinstance(exc, TimeoutError) else None
            logger.warning(
                "model warm-up of %s at %s failed (the first turn pays the cold start): %s",
                endpoint.model,
                endpoint.base_url,
                error or f"{type(exc).__name__}: {exc}",
            )
            return False
        logger.info("model warm-up of %s at %s answered", endpoint.model, endpoint.base_url)
        return True

    # ------------------------------------------------------------------------------------------------ respond

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
    ) -> ModelReply:
        """One model step: the answer (text and tool calls) and its usage, or a ``ModelError``. ``tool_choice`` as
        OpenAI's (``"required"``: the answer must call a tool); None: the model decides."""
        raw = estimate_tokens(messages, tools)
        estimate = self._calibrated(raw)
        max_tokens = self._check_budgets(budget, spent_turn, spent_chat, estimate)
        turn = _Turn(raw)
        primary, fallback = self.primary, self.fallback
        try:
            return await self._call(primary, messages, (tools, tool_choice), events, turn, estimate, max_tokens)
        except Exception as exc:
            reason = self._fallback_reason(exc)
            if reason is None:
                raise self._final(exc, primary.model) from exc
            target = fallback if fallback is not None and not self._same_account_quota(exc) else None
            if target is None and isinstance(exc, ModelStreamBrokenError):
                target = primary  # no fallback: start again, the partial answer marked discarded
            if target is None or remaining_budget() < MIN_CALL_S:
                raise self._final(exc, primary.model) from exc
            first_error = exc
        count_fallback(reason, primary.model, target.model)
        await events.switched(reason, primary.model, target.model, turn.attempt)
        try:
            return await self._call(target, messages, (tools, tool_choice), events, turn, estimate, max_tokens)
        except Exception as exc:
            raise self._final(exc, target.model, first_error) from exc

    def _check_budgets(self, budget: Budget, turn: Usage, chat: Usage, estimate: int) -> int | None:
        """Refuse the call that would pass a budget; else the most tokens its answer may take."""
        if turn.calls >= budget.calls_per_turn:
            count_budget_stop("turn_calls")
            raise TokenBudgetExhausted(
                f"this turn made its {budget.calls_per_turn} model calls (LLM_MAX_CALLS_PER_TURN)",
                budget="turn_calls",
                limit=budget.calls_per_turn,
                spent=turn.calls,
            )
        room: int | None = None
        for name, limit, spent, setting in (
            ("turn_tokens", budget.turn_tokens, turn.total, "LLM_TURN_TOKEN_BUDGET"),
            ("chat_tokens", budget.chat_tokens, chat.total, "LLM_CHAT_TOKEN_BUDGET"),
        ):
            if limit is None:
                continue
            left = limit - spent - estimate
            if left <= 0:
                count_budget_stop(name)
                raise TokenBudgetExhausted(
                    f"the next model call (about {estimate} tokens in) would pass the {name.replace('_', ' ')} budget "
                    f"of {limit} ({spent} spent; {setting})",
                    budget=name,
                    limit=limit,
                    spent=spent,
                )
            room = left if room is None else min(room, left)
        # only a budget nearly spent bounds the answer: a larger room is the model's own cap (and would only
        # inflate what the shared rate limiter reserves for the call)
        return room if room is not None and room < MAX_ANSWER_TOKENS else None

    @staticmethod
    def _fallback_reason(exc: BaseException) -> str | None:
        """Why the fallback is asked, or ``None`` when it would not help (the request itself is refused)."""
        for cls, reason in _FALLBACK_REASONS:
            if isinstance(exc, cls):
                wait = getattr(exc, "retry_after", None)
                if reason == "rate_limited" and isinstance(wait, float):
                    return "retry_after_exceeds_budget" if wait >= remaining_budget() else reason
                if reason == "timeout" and getattr(exc, "limit", None) == "first_token":
                    return "first_token_timeout"
                return reason
        return None

    def _same_account_quota(self, exc: BaseException) -> bool:
        # a billing quota is the account's: a fallback on the same endpoint shares it
        return (
            isinstance(exc, ModelQuotaExceededError)
            and self.fallback is not None
            and self.fallback.base_url == self.primary.base_url
        )

    @staticmethod
    def _final(exc: BaseException, model: str, first: BaseException | None = None) -> BaseException:
        """What ``respond`` raises: a ``ModelError`` (a resilience refusal becomes ``model_unavailable``)."""
        if isinstance(exc, ModelError):
            if first is not None and not isinstance(exc, NonRetryableError | ModelRateLimitedError):
                return ModelUnavailableError(f"both models failed: {first}; then {exc}", model=model)
            return exc
        if isinstance(exc, ResilienceError):
            wait = getattr(exc, "retry_after", None)
            cause = exc.__cause__
            if isinstance(cause, ModelError) and first is None:
                cause_text = f" (last: {cause})"
            else:
                cause_text = f" (first: {first})" if first is not None else ""
            return ModelUnavailableError(
                f"{model}: {exc}{cause_text}", model=model, retry_after=wait if isinstance(wait, float) else None
            )
        return exc

    # ------------------------------------------------------------------------------------------------ one model

    async def _call(
        self,
        endpoint: _Endpoint,
        messages: Sequence[BaseMessage],
        offer: tuple[Sequence[dict[str, Any]], str | None],
        events: ModelEvents,
        turn: _Turn,
        estimate: int,
        max_tokens: int | None,
    ) -> ModelReply:
        runnable = endpoint.bound(*offer)
        message, usage = await endpoint.policy().call(
            self._attempt, endpoint, runnable, messages, events, turn, estimate, max_tokens
        )
        self._learn(turn.raw_estimate, usage.input_tokens)
        return ModelReply(message, endpoint.model, usage, turn.attempt)

    async def _attempt(
        self,
        endpoint: _Endpoint,
        runnable: Runnable[Any, Any],
        messages: Sequence[BaseMessage],
        events: ModelEvents,
        turn: _Turn,
        estimate: int,
        max_tokens: int | None,
    ) -> tuple[AIMessage, Usage]:
        """One request, streamed: the limits, the rate limiter, the tokens to ``events``, errors classified."""
        if self.limiter is not None:
            await self.limiter.acquire(endpoint.model, estimate + (max_tokens or 0), endpoint.typical_s)
        turn.attempt += 1
        turn.streamed = 0
        attempt = turn.attempt
        left = remaining_budget()
        loop = asyncio.get_running_loop()
        begun = loop.time()
        call_deadline = begun + min(endpoint.limits.call_s, left)
        first_deadline = min(begun + endpoint.limits.first_token_s, call_deadline)
        kwargs: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
        full: AIMessageChunk | None = None
        first_token_at: float | None = None
        with ModelCallSpan(endpoint.model, endpoint.base_url, attempt, max_tokens) as span:
            try:
                try:
                    async with asyncio.timeout_at(first_deadline) as limit:
                        async for chunk in runnable.astream(list(messages), **kwargs):
                            if full is None and self.limiter is not None:
                                headers = chunk.response_metadata.get("headers")
                                if headers:
                                    await self.limiter.observe(endpoint.model, headers)
                            if first_token_at is None and (chunk.content or chunk.tool_call_chunks):
                                first_token_at = loop.time()
                                span.first_token(first_token_at - begun)
                                limit.reschedule(call_deadline)
                            full = chunk if full is None else full + chunk
                            text = chunk.content
                            if isinstance(text, str) and text:
                                turn.streamed += 1
                                await events.token(text, attempt)
                            elif chunk.tool_call_chunks:
                                turn.streamed += 1
                except TimeoutError as exc:
                    which = "first_token" if first_token_at is None else "call"
                    limit_s = (first_deadline if which == "first_token" else call_deadline) - begun
                    raise ModelTimeoutError(
                        f"{endpoint.model}: no {'first token' if which == 'first_token' else 'whole answer'} within "
                        f"{limit_s:.2f}s",
                        model=endpoint.model,
                        limit=which,
                    ) from exc
                if full is None:
                    raise ModelUnavailableError(f"{endpoint.model}: an empty stream", model=endpoint.model)
            except Exception as exc:
                error = classify(exc, endpoint.model)
                if error is None:
                    raise
                if turn.streamed and not isinstance(error, ModelStreamBrokenError):
                    error = ModelStreamBrokenError(
                        f"{endpoint.model}: the stream broke after {turn.streamed} chunks ({error})",
                        model=endpoint.model,
                        tokens=turn.streamed,
                    )
                if isinstance(error, ModelTimeoutError) and endpoint is self.primary and self.fallback is not None:
                    error.retryable = False  # a hung model stays hung: its limit again costs more than the fallback
                span.failed(error)
                if self.limiter is not None and error.status == 429:
                    headers = getattr(getattr(exc, "response", None), "headers", None)
                    if headers:
                        await self.limiter.observe(endpoint.model, headers)
                    wait = getattr(error, "retry_after", None)
                    if isinstance(wait, int | float) and wait > 0:
                        await self.limiter.hold(endpoint.model, float(wait))
                if error is exc:
                    raise
                raise error from exc
            message, usage = _finish(full)
            endpoint.took(loop.time() - begun)
            span.done(message, usage, str(full.response_metadata.get("model_name") or endpoint.model))
        if self.limiter is not None:
            await self.limiter.settle(endpoint.model, estimate + (max_tokens or 0), usage.total)
        return message, usage


def _finish(full: AIMessageChunk) -> tuple[AIMessage, Usage]:
    """The chunks added up into one ``AIMessage`` (tool calls parsed) and the usage the provider reported."""
    metadata = full.usage_metadata
    usage = Usage(metadata["input_tokens"], metadata["output_tokens"], 1) if metadata else Usage(calls=1)
    response = {k: v for k, v in full.response_metadata.items() if k != "headers"}
    message = AIMessage(
        content=full.content,
        tool_calls=full.tool_calls,
        invalid_tool_calls=full.invalid_tool_calls,
        usage_metadata=metadata,
        response_metadata=response,
        id=full.id,
    )
    return message, usage
