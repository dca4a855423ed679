"""The OpenAPI documentation of the answers a service really gives: the shell's, once, and helpers for a route's own.

The shell answers some requests before (or instead of) any route, so every operation of every service can get them
(``infra.service.middleware``, ``infra.error_table``); ``install_openapi`` adds them to each operation of the app's
schema, merged with what the route documents for the same status (one ``anyOf``):

- 400 ``invalid_header``: ``X-Timeout-Budget`` or ``Content-Length`` is not a valid number (and, on a route with a
  body, FastAPI's ``{"detail": "There was an error parsing the body"}`` for a body that is not text);
- 413 ``body_too_large``: a body over 64 KiB;
- 421 ``host_not_allowed``: the request's ``Host`` is not a name of this service (the DNS-rebinding guard);
- 422 FastAPI's validation answer (``detail`` list), on every operation with parameters or a body;
- 500 ``internal``: a bug, logged; the body says nothing more;
- 503 ``dependency_unavailable`` with ``Retry-After``: our Redis or Postgres cannot be reached right now.

A route documents its own answers with ``responses=answers(...)``, from ``error`` (our nested body, ``{"error":
{"code", "message", ...}}``), ``provider_error`` (the simulated providers' flat body, ``infra.clients.wire``),
``detail`` (FastAPI's ``HTTPException`` body) and ``validation_error``; ``document(app, ...)`` does the same for
operations a route decorator does not reach (the A2A SDK's routes, a router included whole).

Documentation only: nothing here changes an answer. ``scripts/api_check.py`` checks every answer against it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import validation_error_definition, validation_error_response_definition

from domain.errors import ErrorCode
from infra.service.middleware import MAX_BODY_BYTES, MAX_HEADER_BYTES
from resilience import BUDGET_HEADER

__all__ = [
    "RETRY_AFTER",
    "Answer",
    "answers",
    "detail",
    "document",
    "document_service_token",
    "error",
    "install_openapi",
    "provider_error",
    "validation_error",
]

JSON = "application/json"
_REF = "#/components/schemas/"

RETRY_AFTER_DESCRIPTION = "Seconds to wait before sending the same request again."


def retry_after(*, required: bool) -> dict[str, Any]:
    """The ``Retry-After`` response header (integer seconds, at least 1)."""
    return {"description": RETRY_AFTER_DESCRIPTION, "required": required, "schema": {"type": "integer", "minimum": 1}}


RETRY_AFTER = retry_after(required=True)

_ERROR_BODY = "ErrorBody"
_PROVIDER_ERROR = "ProviderError"
_DETAIL = "HTTPErrorDetail"

COMPONENTS: Mapping[str, dict[str, Any]] = {
    _ERROR_BODY: {
        "title": _ERROR_BODY,
        "description": "Our services' error answer; `code` is one of `ErrorCode` (domain/booking.py), each with one "
        "HTTP status. More fields may follow `message` (the circuit's name, the limit, the header at fault).",
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                "additionalProperties": True,
            }
        },
    },
    _PROVIDER_ERROR: {
        "title": _PROVIDER_ERROR,
        "description": "A simulated provider's own error answer, flat as a third-party API's: "
        '`{"error": "<code>"[, "message": ...][, more fields]}` (infra/clients/wire.py).',
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
        "additionalProperties": True,
    },
    _DETAIL: {
        "title": _DETAIL,
        "description": "FastAPI's answer to an HTTPException: one sentence.",
        "type": "object",
        "required": ["detail"],
        "properties": {"detail": {"type": "string"}},
    },
    "ValidationError": validation_error_definition,
    "HTTPValidationError": {**validation_error_response_definition, "required": ["detail"]},
}


@dataclass(frozen=True)
class Answer:
    """One documented answer of an operation: a status, what it means, its JSON body's schema, its headers."""

    status: int
    description: str
    schema: Mapping[str, Any] | None
    headers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _codes(codes: Iterable[str]) -> dict[str, Any]:
    values = sorted({str(code) for code in codes})
    return {"type": "string", "enum": values} if values else {"type": "string"}


def error(status: int, *codes: str, description: str, headers: Mapping[str, Mapping[str, Any]] | None = None) -> Answer:
    """Our error body, ``{"error": {"code": <one of codes>, "message": ...}}``."""
    schema = {
        "allOf": [
            {"$ref": f"{_REF}{_ERROR_BODY}"},
            {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": _codes(codes)}}}},
        ]
    }
    return Answer(status, description, schema, dict(headers or {}))


def provider_error(
    status: int, *codes: str, description: str, headers: Mapping[str, Mapping[str, Any]] | None = None
) -> Answer:
    """A simulated provider's flat error body, ``{"error": <one of codes>, ...}``."""
    schema = {
        "allOf": [{"$ref": f"{_REF}{_PROVIDER_ERROR}"}, {"type": "object", "properties": {"error": _codes(codes)}}]
    }
    return Answer(status, description, schema, dict(headers or {}))


def detail(status: int, *, description: str, headers: Mapping[str, Mapping[str, Any]] | None = None) -> Answer:
    """FastAPI's ``HTTPException`` answer, ``{"detail": "..."}``."""
    return Answer(status, description, {"$ref": f"{_REF}{_DETAIL}"}, dict(headers or {}))


def validation_error(description: str = "The request does not fit its schema (FastAPI's validation).") -> Answer:
    """422 with FastAPI's ``detail`` list (one entry per field at fault), as the shell answers it."""
    return Answer(422, description, {"$ref": f"{_REF}HTTPValidationError"})


def headers_only(status: int, headers: Mapping[str, Mapping[str, Any]], description: str = "") -> Answer:
    """Headers for an answer whose body the route's response model already documents (a 2xx)."""
    return Answer(status, description, None, headers)


def _response(answer: Answer) -> dict[str, Any]:
    response: dict[str, Any] = {"description": answer.description}
    if answer.schema is not None:
        response["content"] = {JSON: {"schema": dict(answer.schema)}}
    if answer.headers:
        response["headers"] = {name: dict(header) for name, header in answer.headers.items()}
    return response


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    """Merge one response object into another of the same status: descriptions joined, bodies as ``anyOf``,
    headers united (required only when every alternative sends it)."""
    first, second = into.get("description", ""), extra.get("description", "")
    if second and second not in first:
        into["description"] = f"{first} Or: {second}" if first else second
    extra_content = extra.get("content", {})
    content = into.setdefault("content", {}) if extra_content else into.get("content", {})
    for media, body in extra_content.items():
        schema = body.get("schema")
        if media not in content or "schema" not in content[media] or not content[media]["schema"]:
            content[media] = {**content.get(media, {}), "schema": schema}
            continue
        current = content[media]["schema"]
        alternatives = list(current["anyOf"]) if set(current) == {"anyOf"} else [current]
        for option in schema.get("anyOf", [schema]) if set(schema) == {"anyOf"} else [schema]:
            if option not in alternatives:
                alternatives.append(option)
        content[media]["schema"] = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    headers = into.get("headers", {})
    extra_headers = extra.get("headers", {})
    merged = {}
    for name in {*headers, *extra_headers}:
        header = dict(headers.get(name) or extra_headers[name])
        # required only when every alternative sends it
        header["required"] = bool(headers.get(name, {}).get("required") and extra_headers.get(name, {}).get("required"))
        merged[name] = header
    if merged:
        into["headers"] = merged


def answers(*documented: Answer) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=``: the answers it gives besides its success, merged per status."""
    out: dict[int | str, dict[str, Any]] = {}
    for answer in documented:
        response = _response(answer)
        if answer.status in out:
            _merge(out[answer.status], response)
        else:
            out[answer.status] = response
    return out


# ----------------------------------------------------------------------------------------------- the shell's

_BUDGET_400 = error(
    400,
    ErrorCode.INVALID_HEADER,
    description=f"`{BUDGET_HEADER}` is not a positive number of seconds, or `Content-Length` is not a number. "
    f"Every operation reads `{BUDGET_HEADER}` (optional): the seconds its caller gives it, at most "
    "`CONCIERGE_MAX_BUDGET_S` (more is cut to it; absent or blank: `CONCIERGE_DEFAULT_BUDGET_S`); every outbound call "
    "gets what is left, and a budget too short for the work answers `timeout` (504) where the operation says so.",
)
_BODY_400 = detail(
    400, description="The body could not be read as text (FastAPI: `There was an error parsing the body`)."
)
SHELL_ANSWERS: tuple[Answer, ...] = (
    _BUDGET_400,
    error(
        408,
        ErrorCode.REQUEST_TIMEOUT,
        description="The body did not arrive within `BODY_READ_TIMEOUT_S` of the headers (or the headers within "
        "`HEADER_READ_TIMEOUT_S`): the connection is closed.",
    ),
    error(413, ErrorCode.BODY_TOO_LARGE, description=f"The request body is over {MAX_BODY_BYTES} bytes."),
    error(
        421,
        ErrorCode.HOST_NOT_ALLOWED,
        description="The request's `Host` is not a name of this service, so nothing ran: every service answers "
        "loopback names, IP addresses, its own name, the hosts of the deployment's `*_URL` settings and "
        "`CONCIERGE_ALLOWED_HOSTS`; a page on another domain (DNS rebinding) cannot reach it through a browser.",
    ),
    error(
        431,
        ErrorCode.HEADERS_TOO_LARGE,
        description=f"The request line and headers are over {MAX_HEADER_BYTES} bytes: the connection is closed.",
    ),
    error(500, ErrorCode.INTERNAL, description="A bug: logged with its traceback; the body says nothing more."),
    error(
        503,
        ErrorCode.DEPENDENCY_UNAVAILABLE,
        description="Our own Redis or Postgres cannot be reached right now; nothing accepted is lost: "
        "send the same request again after `Retry-After`.",
        headers={"Retry-After": RETRY_AFTER},
    ),
)


@dataclass(frozen=True)
class _OperationDocs:
    match: Callable[[str, str], bool]
    answers: tuple[Answer, ...]
    security: tuple[Mapping[str, list[str]], ...] | None
    security_schemes: Mapping[str, Mapping[str, Any]]


def _registry(app: FastAPI) -> list[_OperationDocs]:
    docs: list[_OperationDocs] | None = getattr(app.state, "openapi_docs", None)
    if docs is None:
        docs = []
        app.state.openapi_docs = docs
    return docs


def document(
    app: FastAPI,
    *,
    path: str | None = None,
    prefix: str | None = None,
    method: str | None = None,
    answers: Iterable[Answer] = (),
    security: Iterable[Mapping[str, list[str]]] | None = None,
    security_schemes: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Document operations that no route decorator of ours reaches: ``path`` exactly, or every path under
    ``prefix`` (and itself); ``method`` (lower case) or every method. ``security`` names the schemes they require,
    ``security_schemes`` defines them."""

    def match(op_path: str, op_method: str) -> bool:
        if method is not None and op_method != method.lower():
            return False
        if path is not None:
            return op_path == path
        assert prefix is not None
        return op_path == prefix or op_path.startswith(f"{prefix.rstrip('/')}/")

    if (path is None) == (prefix is None):
        raise ValueError("document: give exactly one of path and prefix")
    _registry(app).append(
        _OperationDocs(match, tuple(answers), None if security is None else tuple(security), security_schemes or {})
    )


SERVICE_TOKEN_SCHEMES: Mapping[str, Mapping[str, Any]] = {
    "serviceToken": {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "JWT",
        "description": "A service token of this deployment for this agent: HS256 with `CONCIERGE_SERVICE_SECRET`, "
        "`iss` the calling service, `aud` this agent (identity/auth.py).",
    }
}


def document_service_token(app: FastAPI, path: str) -> None:
    """The A2A endpoint at ``path`` (served by the SDK, no decorator of ours): service token required, else 401."""
    document(
        app,
        path=path,
        method="post",
        answers=[
            error(
                401,
                ErrorCode.UNAUTHORIZED,
                description="No valid service token for this agent (missing, expired, for another agent, signed "
                "with another secret, or a static bearer).",
                headers={"WWW-Authenticate": {"required": True, "schema": {"type": "string", "const": "Bearer"}}},
            )
        ],
        security=[{"serviceToken": []}],
        security_schemes=SERVICE_TOKEN_SCHEMES,
    )


_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _apply(app: FastAPI, schema: dict[str, Any]) -> None:
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name, definition in COMPONENTS.items():
        schemas.setdefault(name, definition)
    docs = _registry(app)
    for scheme_docs in docs:
        if scheme_docs.security_schemes:
            components.setdefault("securitySchemes", {}).update(
                {k: dict(v) for k, v in scheme_docs.security_schemes.items()}
            )
    for op_path, item in schema.get("paths", {}).items():
        for op_method in _METHODS:
            operation = item.get(op_method)
            if operation is None:
                continue
            responses = operation.setdefault("responses", {})
            extra: list[Answer] = []
            for entry in docs:
                if entry.match(op_path, op_method):
                    extra.extend(entry.answers)
                    if entry.security is not None:
                        operation["security"] = [dict(s) for s in entry.security]
            has_body = "requestBody" in operation
            has_input = has_body or bool(operation.get("parameters"))
            extra.extend(SHELL_ANSWERS)
            if has_body:
                extra.append(_BODY_400)
            if has_input:
                extra.append(validation_error())
            for answer in extra:
                key = str(answer.status)
                if key in responses:
                    _merge(responses[key], _response(answer))
                else:
                    responses[key] = _response(answer)
            operation["responses"] = dict(sorted(responses.items()))


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` document the shell's answers on every operation, and what ``document`` registered."""
    original = app.openapi
    done: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        schema = original()
        if done.get("schema") is not schema:
            _apply(app, schema)
            done["schema"] = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
