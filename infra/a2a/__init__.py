"""A thin adapter over a2a-sdk: one call to mount an agent (``infra.a2a.server``), one client per peer
(``infra.a2a.client``); this namespace holds what both sides and their callers share: the errors and the paths.

Design notes, the wire format and the measurements behind the inline path: ``docs/a2a.md``.
"""

import os
from typing import TYPE_CHECKING, Any

# The SDK wraps its internal plumbing (event queues, dispatch) in ~15 spans per call; with a real tracer provider
# that almost doubles the cost of a call and buries the spans that matter (ours: ``a2a.call``, ``a2a.skill``).
# Set OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=true to get them back. Set before the SDK is imported: it reads it once.
os.environ.setdefault("OTEL_INSTRUMENTATION_A2A_SDK_ENABLED", "false")

from infra.a2a.errors import (
    A2AError,
    A2AProtocolError,
    A2ASkillError,
    A2ATimeoutError,
    A2AUnauthorizedError,
    A2AUnavailableError,
    SkillFailure,
    SkillInputRequired,
)

if TYPE_CHECKING:
    from infra.a2a.wire import A2A_PATH, AGENT_CARD_PATH


def __getattr__(name: str) -> Any:
    # the paths come from the wire module, which loads the SDK's protobuf types: only for who asks (PEP 562). The
    # errors above do not, and every service's error table imports them (docs/benchmarks.md#start-up).
    if name in ("A2A_PATH", "AGENT_CARD_PATH"):
        from infra.a2a import wire

        return getattr(wire, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "A2A_PATH",
    "AGENT_CARD_PATH",
    "A2AError",
    "A2AProtocolError",
    "A2ASkillError",
    "A2ATimeoutError",
    "A2AUnauthorizedError",
    "A2AUnavailableError",
    "SkillFailure",
    "SkillInputRequired",
]
