"""The supervisor's control socket: one JSON line in, one JSON line out, per connection.

Requests: ``{"op": "ping"|"status"|"kill"|"stop"|"start"|"restart"|"down", ...}``; answers ``{"ok": true, ...}`` or
``{"ok": false, "error": "<one line>"}``. A Unix socket in the data directory (mode 0600): whoever may read the
stack's files may drive it, nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from stack.errors import ControlError, StackNotRunningError
from stack.state import StackPaths, pid_alive, read_state

__all__ = ["MAX_MESSAGE_BYTES", "call", "decode", "encode", "supervisor_running"]

MAX_MESSAGE_BYTES = 1 << 20
CONNECT_TIMEOUT_S = 2.0


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ControlError(f"unreadable control message: {exc}") from exc
    if not isinstance(message, dict):
        raise ControlError("control message is not a JSON object")
    return message


def supervisor_running(paths: StackPaths) -> bool:
    state = read_state(paths)
    return state is not None and state.phase not in ("stopped", "failed") and pid_alive(state.supervisor_pid)


def _not_running(paths: StackPaths) -> StackNotRunningError:
    return StackNotRunningError(f"stack not running (no supervisor for {paths.root}); start it with `concierge up`")


async def call(paths: StackPaths, op: str, *, answer_within_s: float = 30.0, **fields: Any) -> dict[str, Any]:
    """Send one request and return the answer's fields; ``ControlError`` when the supervisor refused it."""
    state = read_state(paths)
    if state is None or not pid_alive(state.supervisor_pid):
        raise _not_running(paths)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_unix_connection(state.socket, limit=MAX_MESSAGE_BYTES)
    except (OSError, TimeoutError) as exc:
        raise _not_running(paths) from exc
    try:
        writer.write(encode({"op": op, **fields}))
        await writer.drain()
        try:
            async with asyncio.timeout(answer_within_s):
                line = await reader.readline()
        except TimeoutError:
            raise ControlError(f"the supervisor did not answer {op!r} within {answer_within_s:g}s") from None
    except (ConnectionError, OSError) as exc:
        raise ControlError(f"lost the supervisor while asking {op!r}: {exc}") from exc
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    if not line:
        raise ControlError(f"the supervisor closed the connection without answering {op!r}")
    answer = decode(line)
    if not answer.get("ok"):
        raise ControlError(str(answer.get("error") or f"{op} refused"))
    return answer
