"""httpx client factory for calls between our services and to the providers.

Every request leaving a service carries what the callee needs to behave well:

- ``X-Timeout-Budget``: the remaining budget minus a safety margin (``BudgetExhaustedError`` before sending when
  too little is left), and the same figure as the request's timeout, so we never wait longer than our caller;
- ``traceparent``/``tracestate``: the current OpenTelemetry context (W3C);
- ``Authorization: Bearer <CONCIERGE_SERVICE_TOKEN>``: only to our own agents (``with_token=True``).
"""

from __future__ import annotations

import httpx
from opentelemetry import propagate

from infra.settings import get_settings
from resilience.budget import BUDGET_HEADER, outgoing_budget_seconds


def _make_hook(token: str | None) -> object:
    async def add_context(request: httpx.Request) -> None:
        seconds = outgoing_budget_seconds()
        request.headers[BUDGET_HEADER] = f"{seconds:.3f}"
        request.extensions["timeout"] = httpx.Timeout(seconds).as_dict()
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        request.headers.update(carrier)
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"

    return add_context


def create_http_client(
    base_url: str,
    *,
    with_token: bool = False,
    max_connections: int = 100,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """A pooled client for one peer. The caller owns it (``await client.aclose()``)."""
    token = get_settings().service_token if with_token else None
    return httpx.AsyncClient(
        base_url=base_url,
        event_hooks={"request": [_make_hook(token)]},  # type: ignore[list-item]
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        transport=transport,
    )
