"""The node contract LangGraph holds our decorators to: an async ``(state, config)`` node, and its thread id.

Both ``traced_node`` and ``idempotent_node`` check it when the graph is built, not on the first run.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Optional, TypeVar

from langchain_core.runnables import RunnableConfig

NodeFn = Callable[..., Awaitable[dict[str, Any]]]
F = TypeVar("F", bound=NodeFn)


def thread_id_of(config: RunnableConfig | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    value = configurable.get("thread_id")
    return None if value is None or value == "" else str(value)


# What LangGraph 1.x recognises as a config parameter (the string forms come from ``from __future__ import
# annotations``); with any other annotation it warns and does not pass the config.
_CONFIG_ANNOTATIONS: tuple[object, ...] = (
    inspect.Parameter.empty,
    RunnableConfig,
    "RunnableConfig",
    Optional[RunnableConfig],  # noqa: UP045 - the exact object LangGraph compares against
    "Optional[RunnableConfig]",
)


def check_node(fn: Callable[..., Any], decorator: str, name: str) -> None:
    # Fail at graph-build time: LangGraph silently omits ``config`` for a node that does not declare it (or types it
    # as something else), and the wrapper would then fail on every run instead.
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@{decorator}({name!r}) needs an async node function, got {fn!r}")
    param = inspect.signature(fn).parameters.get("config")
    if param is None or param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        raise TypeError(f"@{decorator}({name!r}): the node must declare a 'config' parameter: (state, config)")
    annotation = param.annotation
    if not any(annotation is a or annotation == a for a in _CONFIG_ANNOTATIONS):
        raise TypeError(
            f"@{decorator}({name!r}): annotate 'config' as RunnableConfig (or not at all); "
            f"LangGraph does not pass a config typed {annotation!r}"
        )
