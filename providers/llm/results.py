"""What a tool result says, in the shapes the concierge sends (and a few more a client might): offers, a booking,
an error (``{"error": {"code", "message", "field"}}``, ``{"error": "code"}``, or words starting with "Error"),
the person's refusal of an approval; JSON, possibly wrapped (``{"result": ...}``), or plain text."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["arguments_of", "booking_of", "declined", "error_of", "offers_of", "parse_content", "unwrap"]

_DECLINED = ("declined", "refused", "rejected", "denied")


def parse_content(content: str) -> Any:
    """JSON when it is JSON, else the text itself."""
    try:
        return json.loads(content)
    except ValueError:
        return content


def arguments_of(raw: str) -> dict[str, Any] | None:
    """A tool call's arguments, or ``None`` when they are not a JSON object."""
    value = parse_content(raw)
    return value if isinstance(value, dict) else None


def unwrap(data: Any) -> Any:
    """A tool result inside a wrapper (``{"result": ...}``, ``{"data": ...}``, ``{"output": ...}``)."""
    for _ in range(3):
        if isinstance(data, Mapping) and len(data) == 1:
            ((key, inner),) = data.items()
            if key in ("result", "data", "output", "content") and isinstance(inner, Mapping | list | str):
                data = parse_content(inner) if isinstance(inner, str) else inner
                continue
        break
    return data


def error_of(data: Any) -> dict[str, Any] | None:
    """``{"code", "message", "field"}`` when a tool result is an error, else ``None``."""
    if isinstance(data, str):
        if re.match(r"^\s*(?:error|exception|tool error)\b", data, re.I):
            return {"code": None, "message": data.strip(), "field": None}
        return None
    if not isinstance(data, Mapping):
        return None
    error = data.get("error")
    if error is None or error is False:
        return None
    if isinstance(error, str):
        message = data.get("message") if isinstance(data.get("message"), str) else None
        return {"code": error, "message": message, "field": data.get("field") or data.get("param")}
    if isinstance(error, Mapping):
        return {
            "code": error.get("code") or error.get("type"),
            "message": error.get("message"),
            "field": error.get("field") or error.get("param") or error.get("fields"),
        }
    return {"code": None, "message": str(error), "field": None}


def offers_of(data: Any) -> list[dict[str, Any]] | None:
    """A search's offers (``{"offers": [...]}`` or the bare list), in the order shown."""
    if isinstance(data, Mapping) and isinstance(data.get("offers"), list):
        return [o for o in data["offers"] if isinstance(o, Mapping)]  # type: ignore[misc]
    if isinstance(data, list) and all(isinstance(o, Mapping) and "hotel_id" in o for o in data):
        return list(data)
    return None


def booking_of(data: Any) -> dict[str, Any] | None:
    """A booking (its ``booking_id``, ``status``...), bare or under ``booking``."""
    if isinstance(data, Mapping):
        if isinstance(data.get("booking"), Mapping):
            return dict(data["booking"])
        if "booking_id" in data or "status" in data:
            return dict(data)
    return None


def declined(data: Any) -> bool:
    """The person refused the approval (``{"approved": false}``, a ``declined`` status or code, or words saying so;
    a declined card is a failed booking, not a refusal)."""
    if isinstance(data, str):
        return any(word in data.lower() for word in _DECLINED) and "card" not in data.lower()
    if not isinstance(data, Mapping):
        return False
    if data.get("approved") is False or data.get("approve") is False:
        return True
    status = str(data.get("status") or data.get("decision") or "").lower()
    if status in _DECLINED:
        return True
    error = error_of(data)
    code = str((error or {}).get("code") or "").lower()
    return any(word in code for word in _DECLINED) and "payment" not in code and "card" not in code
