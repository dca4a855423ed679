"""Which stack an operator command talks to: the one running here (its state and secrets in the data directory),
unless the environment names another (``REDIS_URL``, ``HOTEL_API_URL``, ``CONCIERGE_ADMIN_TOKEN``...).

``concierge dlq``, ``recovery status``, ``verify`` and ``fault`` used to read only the environment, so in a shell
without ``REDIS_URL`` they looked at the default Redis and reported an empty DLQ while the running stack's held runs.
"""

from __future__ import annotations

import os

import httpx

from infra.auth import admin_token as admin_token_from_env
from infra.settings import get_settings
from stack.console import stack_paths
from stack.control import supervisor_running
from stack.errors import StackError
from stack.state import StackState, read_secrets, read_state

__all__ = ["admin_token", "adopt_stack_redis", "provider_url", "refusal", "running_stack", "service_urls"]


def running_stack() -> StackState | None:
    """The state of the stack running from this data directory, or None."""
    paths = stack_paths()
    return read_state(paths) if supervisor_running(paths) else None


def adopt_stack_redis() -> str | None:
    """Point this process's settings at the running stack's Redis and key prefix when ``REDIS_URL`` is unset.

    Returns where they came from (for messages), or None when the environment (or the defaults) stand. A stack whose
    Redis URL carried a password is recorded redacted: then ``REDIS_URL`` must be given.
    """
    if "REDIS_URL" in os.environ:
        return None
    state = running_stack()
    if state is None or "***" in state.redis.url:
        return None
    os.environ["REDIS_URL"] = state.redis.url
    if state.key_prefix and "CONCIERGE_KEY_PREFIX" not in os.environ:
        os.environ["CONCIERGE_KEY_PREFIX"] = state.key_prefix
    get_settings.cache_clear()
    return f"the running stack's ({state.data_dir})"


def service_urls(service: str, explicit: str | None, configured: str) -> list[str]:
    """``--url``, else every replica of ``service`` in the running stack, else ``configured`` (the settings' URL:
    a compose stack publishes the service where the settings expect it)."""
    if explicit:
        return [explicit.rstrip("/")]
    state = running_stack()
    urls = [i.url for i in state.instances if i.service == service] if state is not None else []
    return urls or [configured.rstrip("/")]


def refusal(response: httpx.Response) -> str:
    """An error answer in one line: the fields a 422 names, or the error table's ``code: message``."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        parts = []
        for item in detail:
            loc = [str(p) for p in item.get("loc", ()) if p not in ("body", "header", "path", "query")]
            parts.append(f"{'.'.join(loc) or 'request'}: {item.get('msg')}")
        return "; ".join(parts)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        return f"{error.get('code')}: {error.get('message', '')}".rstrip(": ")
    return f"HTTP {response.status_code}: {detail or body}"


def provider_url(service: str, explicit: str | None) -> tuple[str, bool]:
    """The provider's URL, and whether it is only a guess (no local stack: the settings' URL, as compose uses)."""
    if explicit:
        return explicit.rstrip("/"), False
    state = running_stack()
    if state is None:
        settings = get_settings()
        guess = {
            "hotel-api": settings.hotel_api_url,
            "payment-api": settings.payment_api_url,
            "llm-api": settings.llm_api_url,
            "search-agent": settings.search_agent_url,
        }[service]
        return guess.rstrip("/"), True
    for instance in state.instances:
        if instance.service == service:
            return instance.url, False
    raise StackError(f"{service} is not part of the running stack")


def admin_token(explicit_url: bool) -> str | None:
    """The local stack's admin token for its own providers; ``CONCIERGE_ADMIN_TOKEN`` first for any other."""
    from_env = admin_token_from_env()
    if explicit_url and from_env is not None:
        return from_env
    paths = stack_paths()
    stack_secrets = read_secrets(paths) if supervisor_running(paths) else None
    return stack_secrets.admin_token if stack_secrets is not None else from_env
