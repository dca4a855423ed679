"""The A2A wire format our agents speak: one data part in, one terminal ``Task`` out (see ``docs/a2a.md``).

``google.protobuf.Value`` stores every number as a double; both sides turn whole floats (up to 2**53) back into
``int``, so ``{"amount_cents": 1200}`` round-trips as an int.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from a2a.types.a2a_pb2 import (
    Part,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

A2A_PATH = "/a2a"
AGENT_CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH
RESULT_ARTIFACT = "result"
_MAX_EXACT_INT = 2**53


def data_part(payload: dict[str, Any]) -> Part:
    return Part(data=ParseDict(payload, struct_pb2.Value()))


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
