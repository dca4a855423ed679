"""``concierge fault llm-api ...``: the simulated model provider's options, per model (``--model``; all without it).

Its faults are richer than hotel-api's and payment-api's (``providers.llm.faults``): latency to the first token and
per token, errors with a chosen status (the next N, or a fraction), ``retry-after``, a hang, a stream cut, broken
tool arguments, a runaway search, and the published rate limits. The body is checked here by the provider's own
model, so a bad value is one line and exit 2 before anything is sent.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from pydantic import ValidationError

from domain.llm import SIMULATED_MODELS
from providers.llm.faults import ERROR_STATUSES, FaultsUpdate
from stack.errors import UsageError

__all__ = [
    "LLM_OPTIONS",
    "add_llm_options",
    "check_model",
    "describe_llm_faults",
    "llm_fault_body",
    "llm_options_given",
]

LLM_OPTIONS = (
    "model",
    "first_token_latency",
    "token_delay",
    "error_count",
    "error_status",
    "error_code",
    "retry_after",
    "should_retry",
    "context_length_exceeded",
    "cut_after_tokens",
    "malformed_tool_args",
    "loop_tool",
    "rpm",
    "tpm",
)
"""The options only llm-api takes (``--error-rate``, ``--hang``, ``--clear`` and ``--latency`` are shared)."""


def add_llm_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("llm-api only (per model; --latency is the latency to the first token)")
    group.add_argument("--model", default=None, metavar="NAME", help=f"one model: {' or '.join(SIMULATED_MODELS)}")
    group.add_argument("--first-token-latency", default=None, metavar="S", help="delay before the first token")
    group.add_argument("--token-delay", default=None, metavar="S", help="delay between tokens")
    group.add_argument(
        "--error-count", default=None, metavar="N", help="only the next N requests fail (all, or --error-rate of them)"
    )
    group.add_argument(
        "--error-status", default=None, metavar="CODE", help=f"{', '.join(map(str, ERROR_STATUSES))} (default 503)"
    )
    group.add_argument(
        "--error-code", default=None, metavar="CODE", help="a 429's: rate_limit_exceeded or insufficient_quota"
    )
    group.add_argument("--retry-after", default=None, metavar="S", help="sent as retry-after and retry-after-ms")
    group.add_argument("--should-retry", default=None, metavar="BOOL", help="sent as x-should-retry: true or false")
    group.add_argument("--context-length-exceeded", action="store_true", help="answer 400 context_length_exceeded")
    group.add_argument("--cut-after-tokens", default=None, metavar="N", help="drop the connection after N tokens")
    group.add_argument("--malformed-tool-args", default=None, metavar="KIND", help="invalid_json or bad_stay")
    group.add_argument("--loop-tool", action="store_true", help="call search_hotels on every request")
    group.add_argument("--rpm", default=None, metavar="N", help="requests per rolling minute")
    group.add_argument("--tpm", default=None, metavar="N", help="tokens per rolling minute")


def llm_options_given(args: argparse.Namespace) -> list[str]:
    """The llm-only options on the command line (``--model`` included), as written."""
    given = []
    for name in LLM_OPTIONS:
        value = getattr(args, name, None)
        if value not in (None, False):
            given.append("--" + name.replace("_", "-"))
    return given


def _float(value: str, option: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{option} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"{option} must be a finite number, got {value}")
    return number


def _int(value: str, option: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"{option} must be a whole number, got {value!r}") from None


def _text(value: str, option: str) -> str:
    return value


def _bool(value: str, option: str) -> bool:
    if value.lower() in ("true", "yes", "1"):
        return True
    if value.lower() in ("false", "no", "0"):
        return False
    raise UsageError(f"{option} must be true or false, got {value!r}")


_CONVERT = {
    "first_token_latency_s": ("--first-token-latency", "first_token_latency", _float),
    "token_delay_s": ("--token-delay", "token_delay", _float),
    "error_rate": ("--error-rate", "error_rate", _float),
    "error_count": ("--error-count", "error_count", _int),
    "error_status": ("--error-status", "error_status", _int),
    "error_code": ("--error-code", "error_code", _text),
    "retry_after_s": ("--retry-after", "retry_after", _float),
    "should_retry": ("--should-retry", "should_retry", _bool),
    "cut_after_tokens": ("--cut-after-tokens", "cut_after_tokens", _int),
    "malformed_tool_args": ("--malformed-tool-args", "malformed_tool_args", _text),
    "rpm": ("--rpm", "rpm", _int),
    "tpm": ("--tpm", "tpm", _int),
}
_FLAGS = {"hang": "hang", "context_length_exceeded": "context_length_exceeded", "loop_tool": "loop_tool"}
_OPTION_OF = {field: option for field, (option, _, _) in _CONVERT.items()} | {
    field: "--" + field.replace("_", "-") for field in _FLAGS
}


def check_model(args: argparse.Namespace) -> str | None:
    if args.model is not None and args.model not in SIMULATED_MODELS:
        raise UsageError(f"--model must be {' or '.join(SIMULATED_MODELS)}, got {args.model!r}")
    return str(args.model) if args.model is not None else None


def llm_fault_body(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``PUT /admin/faults`` body, or ``None`` for "show" (no fault option; ``--model`` alone shows one)."""
    model = check_model(args)
    body: dict[str, Any] = {}
    latency = args.first_token_latency if args.first_token_latency is not None else args.latency
    option = "--first-token-latency" if args.first_token_latency is not None else "--latency"
    if latency is not None:
        body["first_token_latency_s"] = _float(latency, option)
    for field, (option, attribute, convert) in _CONVERT.items():
        value = getattr(args, attribute, None)
        if value is not None and field != "first_token_latency_s":
            body[field] = convert(value, option)
    for field, attribute in _FLAGS.items():
        if getattr(args, attribute, False):
            body[field] = True
    if not body:
        return None
    try:
        FaultsUpdate.model_validate({**body, "model": model})
    except ValidationError as exc:
        first = exc.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        field = str(first["loc"][0]) if first.get("loc") else ""
        raise UsageError(f"{_OPTION_OF[field]}: {message}" if field in _OPTION_OF else message) from None
    return {**body, "model": model}


def _describe_one(faults: dict[str, Any], left: int | None) -> str:
    parts = []
    if faults.get("first_token_latency_s"):
        parts.append(f"first token after {faults['first_token_latency_s']:g}s")
    if faults.get("token_delay_s"):
        parts.append(f"{faults['token_delay_s']:g}s a token")
    if faults.get("error_count") is not None or faults.get("error_rate"):
        which = []
        if faults.get("error_count") is not None:
            which.append(f"next {faults['error_count']} ({left if left is not None else 0} left)")
        if faults.get("error_rate"):
            which.append(f"rate {faults['error_rate']:g}")
        code = f" {faults['error_code']}" if faults.get("error_code") else ""
        after = f", retry-after {faults['retry_after_s']:g}s" if faults.get("retry_after_s") is not None else ""
        retry = (
            f", x-should-retry {str(faults['should_retry']).lower()}" if faults.get("should_retry") is not None else ""
        )
        parts.append(f"error {faults.get('error_status', 503)}{code} {' at '.join(which)}{after}{retry}")
    for flag, words in (
        ("context_length_exceeded", "context length exceeded"),
        ("hang", "hang"),
        ("loop_tool", "loop on search_hotels"),
    ):
        if faults.get(flag):
            parts.append(words)
    if faults.get("cut_after_tokens") is not None:
        parts.append(f"cut after {faults['cut_after_tokens']} tokens")
    if faults.get("malformed_tool_args"):
        parts.append(f"tool arguments {faults['malformed_tool_args']}")
    limits = [f"{faults[k]} {k}" for k in ("rpm", "tpm") if faults.get(k) is not None]
    if limits:
        parts.append("limits " + ", ".join(limits))
    return " · ".join(parts) or "none"


def describe_llm_faults(view: dict[str, Any], model: str | None = None) -> str:
    """One line: each model's faults (``model``: that one only)."""
    models: dict[str, Any] = view.get("models", {})
    left: dict[str, Any] = view.get("errors_left", {})
    shown = [model] if model else list(models)
    return "; ".join(f"{name}: {_describe_one(models.get(name, {}), left.get(name))}" for name in shown)
