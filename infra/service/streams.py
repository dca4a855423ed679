"""A journal over Server-Sent Events, as every agent serves one: keep-alives, a bound on a slow client, and the
``shutting_down`` last event a stopping process ends with, so the client resumes elsewhere (docs/liveness.md)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Final

from sse_starlette import EventSourceResponse, ServerSentEvent

from domain.errors import ErrorCode
from infra.error_table import error_body

__all__ = ["STREAM_ID_PATTERN", "journal_response", "shutting_down_event"]

STREAM_ID_PATTERN: Final = r"^\d{1,19}(-\d{1,19})?$"
"""A journal entry's id (a Redis stream id), as ``Last-Event-ID`` carries it back."""
PING_S: Final = 15.0
"""Keep-alive comments while a stream waits (proxies close silent connections)."""
SEND_TIMEOUT_S: Final = 30.0
"""A client that takes no bytes for this long is dropped: a stream never queues more than one send for it."""
SHUTDOWN_GRACE_S: Final = 1.0
"""How long a stream may take to end on its own once the server stops (sse-starlette cancels it after that)."""
SHUTDOWN_RECONNECT_MS: Final = 1000
"""What a stream ended by a shutdown tells the client (SSE ``retry:``): reconnect after this, with ``Last-Event-ID``."""


def journal_response(events: AsyncIterator[ServerSentEvent]) -> EventSourceResponse:
    return EventSourceResponse(
        events,
        ping=PING_S,
        send_timeout=SEND_TIMEOUT_S,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def shutting_down_event(service: str) -> ServerSentEvent:
    """The last event of a stream ended by a shutdown, not by its journal: resume from a replica or the restart."""
    body = error_body(ErrorCode.SHUTTING_DOWN, f"{service} is shutting down: reconnect with Last-Event-ID")
    return ServerSentEvent(event="shutting_down", data=json.dumps(body), retry=SHUTDOWN_RECONNECT_MS)
