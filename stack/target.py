"""Which stack an operator command talks to: the one running here (its state and secrets in the data directory),
unless the environment names another (``REDIS_URL``, ``HOTEL_API_URL``, ``CONCIERGE_ADMIN_TOKEN``...).

``concierge dlq``, ``recovery status``, ``verify`` and ``fault`` used to read only the environment, so in a shell
without ``REDIS_URL`` they looked at the default Redis and reported an empty DLQ while the running stack's held runs.
The Redis ``up`` starts itself requires the password in ``secrets.json``: ``stack_redis_url`` is the one place a
command gets a URL that carries it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

import httpx

from identity.auth import admin_token as admin_token_from_env
from infra.settings import get_settings
from stack.console import stack_paths
from stack.control import supervisor_running
from stack.errors import StackError
from stack.redis_server import url_with_password
from stack.state import StackSecrets, StackState, read_secrets, read_state

__all__ = [
    "admin_token",
    "adopt_stack_redis",
    "provider_url",
    "refusal",
    "running_stack",
    "service_urls",
    "stack_redis_url",
]

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def running_stack() -> StackState | None:
    """The state of the stack running from this data directory, or None."""
    paths = stack_paths()
    return read_state(paths) if supervisor_running(paths) else None


def stack_redis_url(state: StackState, stack_secrets: StackSecrets | None, env: Mapping[str, str]) -> str | None:
    """The URL a command on this machine should use for the stack in ``state``, or None when ``env`` stands.

    ``REDIS_URL`` unset, or naming the server ``up`` started itself (same loopback port, no password of its own):
    the stack's Redis, with the password from ``secrets.json`` when ours has one. A URL recorded redacted that is not
    ours needs ``REDIS_URL``: its password is the operator's, never kept here.
    """
    recorded = state.redis.url
    password = stack_secrets.redis_password if stack_secrets is not None and state.redis.own else ""
    if password:
        url = url_with_password(recorded, password)
    elif "***" in recorded:
        return None
    else:
        url = recorded
    configured = env.get("REDIS_URL")
    if configured is None or (state.redis.own and _same_server(configured, state.redis.port)):
        return url
    return None


def _same_server(url: str, port: int | None) -> bool:
    """``url`` points at the loopback ``port`` with no credentials: the own Redis, as the user configured it."""
    try:
        parts = urlsplit(url)
        return (
            parts.scheme == "redis"
            and (parts.hostname or "") in _LOOPBACK
            and (parts.port or 6379) == port
            and not parts.password
            and not parts.username
        )
    except ValueError:
        return False  # a port out of range, say: not ours; the settings will name what is wrong with it


def adopt_stack_redis() -> str | None:
    """Point this process's settings at the running stack's Redis (``stack_redis_url``) and key prefix.

    Returns where they came from (for messages), or None when the environment (or the defaults) stand. Every command
    that talks to the stack's Redis calls this first: without it, one would get NOAUTH from ours.
    """
    state = running_stack()
    if state is None:
        return None
    stack_secrets = read_secrets(stack_paths()) if state.redis.own else None
    url = stack_redis_url(state, stack_secrets, os.environ)
    if url is None:
        return None
    os.environ["REDIS_URL"] = url
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
    from_env = admin_token_from_env(get_settings())
    if explicit_url and from_env is not None:
        return from_env
    paths = stack_paths()
    stack_secrets = read_secrets(paths) if supervisor_running(paths) else None
    return stack_secrets.admin_token if stack_secrets is not None else from_env
