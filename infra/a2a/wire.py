"""The A2A wire format our agents speak: one data part in, one terminal ``Task`` out (see ``docs/a2a.md``).

``google.protobuf.Value`` stores every number as a double; both sides turn whole floats (up to 2**53) back into
``int``, so ``{"amount_cents": 1200}`` round-trips as an int.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from a2a.types.a2a_pb2 import Part, Task
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

SECRET_FIELDS: Final = frozenset({"payment_token"})
"""Request fields that are used, never kept: a task's history holds ``REDACTED`` in their place (``without_secrets``)."""
REDACTED: Final = "[redacted]"

A2A_PATH = "/a2a"
AGENT_CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH
RESULT_ARTIFACT = "result"
_MAX_EXACT_INT = 2**53


def data_part(payload: dict[str, Any]) -> Part:
    return Part(data=ParseDict(payload, struct_pb2.Value()))


def without_secrets(task: Task) -> Task:
    """A copy of ``task`` whose history's data parts hold ``REDACTED`` for every ``SECRET_FIELDS`` entry, at any
    depth: what a task store may keep and a ``GetTask`` may show."""
    clean = Task()
    clean.CopyFrom(task)
    for message in clean.history:
        for part in message.parts:
            if part.HasField("data"):
                _redact(part.data)
    return clean


def _redact(value: struct_pb2.Value) -> None:
    if value.HasField("struct_value"):
        for name, inner in value.struct_value.fields.items():
            if name in SECRET_FIELDS:
                inner.string_value = REDACTED
            else:
                _redact(inner)
    elif value.HasField("list_value"):
        for inner in value.list_value.values:
            _redact(inner)


def _restore_ints(value: Any) -> Any:
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _MAX_EXACT_INT:
            return int(value)
        return value
    if isinstance(value, dict):
        return {k: _restore_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_ints(v) for v in value]
    return value


def first_data(parts: Sequence[Part]) -> Any:
    for part in parts:
        if part.HasField("data"):
            return _restore_ints(MessageToDict(part.data))
    return None


def error_payload(kind: str, code: str, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"kind": kind, "code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"error": error}
