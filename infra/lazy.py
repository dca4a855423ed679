"""Lazy package exports (PEP 562): names whose modules are costly to import are loaded on first use.

The graph builders pull in the A2A SDK and the provider clients, the recovery consumer pulls in LangGraph; the
operator CLI and the decorators should not pay for either just by importing the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` resolving each name of ``exports`` (name → module) on first access."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
