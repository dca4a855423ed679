"""A thin adapter over a2a-sdk: one call to mount an agent (``infra.a2a.server``), one client per peer
(``infra.a2a.client``); this namespace holds what both sides and their callers share: the errors and the paths.

Design notes, the wire format and the measurements behind the inline path: ``docs/a2a.md``.
"""

import os

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
from infra.a2a.wire import A2A_PATH, AGENT_CARD_PATH

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
