"""The providers want their client's key, against real processes: hotel-api and payment-api answer 401 on every
business route (taken from the apps' route tables, so a new route cannot be left open) without the key of one of
their clients, or with another client's, another provider's or another deployment's; with the right key the route
works, a booking through the stack confirms and ``concierge verify`` is clean, and no key is ever written down (logs,
spans, journals, checkpoints). ``HOTEL_API_KEY`` set on both sides replaces the derived keys; a client whose key
the provider refuses fails its booking ``provider_auth`` with nothing held or charged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from identity.auth import PROVIDER_CLIENTS, derived_provider_key
from infra.redis import create_sync_redis
from infra.service import create_service_app
from providers import hotel_api, payment_api
from tests.e2e.conftest import SHARED_CORE
from tests.stack import CORE, Stack, stay

pytestmark = [pytest.mark.e2e, SHARED_CORE]

APPS: dict[str, FastAPI] = {"hotel-api": hotel_api.create_app(), "payment-api": payment_api.create_app()}
SHELL = frozenset(route.path for route in create_service_app("shell").routes if isinstance(route, APIRoute))
"""The service shell's own routes (health, metrics, OpenAPI): open to anyone, as on every service."""
CLIENTS = ("booking-agent", "search-agent", "payment-agent", "recovery-worker", "concierge-agent")


def api_routes(routes: Any, prefix: str = "") -> Iterator[tuple[str, APIRoute]]:
    """``(path, route)`` of every route an app serves, into the routers it includes (FastAPI keeps them apart)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield prefix + route.path, route
        elif (included := getattr(route, "original_router", None)) is not None:
            yield from api_routes(included.routes, prefix + route.include_context.prefix)


def business_routes() -> list[tuple[str, str, str]]:
    """``(provider, method, path)`` of every route but the shell's and ``/admin``, path parameters filled in."""
    found = []
    for provider, app in APPS.items():
        for full_path, route in api_routes(app.routes):
            if full_path in SHELL or full_path.startswith("/admin"):
                continue
            path = re.sub(r"\{[^}]+\}", "nope", full_path)
            found += [(provider, method, path) for method in sorted(route.methods)]
    return found


ROUTES = business_routes()


def test_the_route_table_is_what_the_providers_serve() -> None:
    # a guard against the parametrisation going empty: the routes the module docstrings list, at least
    assert {(p, m, path) for p, m, path in ROUTES} >= {
        ("hotel-api", "GET", "/hotels"),
        ("hotel-api", "POST", "/reservations"),
        ("hotel-api", "POST", "/reservations/nope/cancel"),
        ("payment-api", "POST", "/charges"),
        ("payment-api", "GET", "/charges"),
        ("payment-api", "POST", "/charges/nope/refund"),
    }


def call(stack: Stack, provider: str, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": "provider-keys"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    # a body and a query that fit no route in particular: the guard must answer before either is read
    return stack.http.request(
        method, f"{stack.url(provider)}{path}", headers=headers, params={"reference": "pk"}, json={"x": 1}
    )


@pytest.mark.parametrize(("provider", "method", "path"), ROUTES, ids=[f"{p} {m} {path}" for p, m, path in ROUTES])
def test_every_business_route_wants_a_clients_key(stack: Stack, provider: str, method: str, path: str) -> None:
    missing = call(stack, provider, method, path, None)
    assert missing.status_code == 401, missing.text
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    assert missing.json()["error"] == "unauthorized"

    other_provider = "payment-api" if provider == "hotel-api" else "hotel-api"
    wrong = {
        "another client's key": derived_provider_key(stack.secret, provider, "concierge-agent"),
        "another provider's key": derived_provider_key(
            stack.secret, other_provider, PROVIDER_CLIENTS[other_provider][0]
        ),
        "another deployment's key": derived_provider_key("another-deployment-" + "x" * 40, provider, "booking-agent"),
        "the admin token": stack.admin_token,
        "the service secret": stack.secret,
    }
    for what, key in wrong.items():
        refused = call(stack, provider, method, path, key)
        assert refused.status_code == 401, f"{what}: {refused.text}"
        assert refused.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"', what
        assert key not in refused.text, f"{what} is repeated in the answer"

    for client in PROVIDER_CLIENTS[provider]:
        let_in = call(stack, provider, method, path, derived_provider_key(stack.secret, provider, client))
        assert let_in.status_code != 401, f"{client}: {let_in.text}"  # the route's own answer: 200, 400, 404, 422


def test_only_the_named_clients_hold_a_key(stack: Stack) -> None:
    for provider, clients in PROVIDER_CLIENTS.items():
        path = "/hotels/lisbon-01" if provider == "hotel-api" else "/charges/nope"
        for client in CLIENTS:
            status = call(
                stack, provider, "GET", path, derived_provider_key(stack.secret, provider, client)
            ).status_code
            assert (status != 401) == (client in clients), (provider, client, status)
        # a path that is no route: 401 without a key (nobody learns which routes exist), 404 with one
        assert call(stack, provider, "GET", "/nothing-here", None).status_code == 401
        key = derived_provider_key(stack.secret, provider, clients[0])
        assert call(stack, provider, "GET", "/nothing-here", key).status_code == 404


def test_health_metrics_and_openapi_need_no_key_and_the_401_is_documented(stack: Stack) -> None:
    for provider in APPS:
        for path in ("/health", "/health/ready", "/metrics", "/openapi.json"):
            response = stack.http.get(f"{stack.url(provider)}{path}")
            assert response.status_code == 200, f"{provider} {path}: {response.text}"
        spec = stack.http.get(f"{stack.url(provider)}/openapi.json").json()
        assert "clientKey" in spec["components"]["securitySchemes"]
        for path, item in spec["paths"].items():
            for method, operation in item.items():
                if path in SHELL or path.startswith("/admin"):
                    assert "401" not in operation["responses"] or path.startswith("/admin"), (path, method)
                    continue
                assert operation["security"] == [{"clientKey": []}], (provider, method, path)
                assert "401" in operation["responses"], (provider, method, path)


def test_a_booking_confirms_verify_is_clean_and_no_key_is_written_down(stack: Stack, redis_url: str) -> None:
    checkin, checkout = stay(days_ahead=90)
    booking = stack.book(city="Porto", checkin=checkin, checkout=checkout)
    assert stack.wait(booking["booking_id"])["status"] == "confirmed"
    found = stack.http.get(
        f"{stack.url('payment-api')}/charges",
        params={"reference": booking["booking_id"]},
        auth=stack.provider_auth("payment-api"),
    )
    assert [c["status"] for c in found.json()["charges"]] == ["captured"], found.text
    audit = stack.verify()
    assert audit.returncode == 0 and "0 disagreement(s)" in audit.stdout, audit.stdout + audit.stderr

    keys = {derived_provider_key(stack.secret, p, c) for p, clients in PROVIDER_CLIENTS.items() for c in clients}
    written = {f"log of {name}": proc.log_text() for name, proc in stack.services.items()}
    written |= {f"spans of {name}": _read(stack.span_file(name)) for name in stack.services}
    written["redis (journals, records, queues)"] = _redis_text(redis_url, stack.prefix)
    written["postgres (checkpoints)"] = _postgres_text(stack.env["DATABASE_URL"])
    assert written["log of booking-agent"] and written["postgres (checkpoints)"], "something was read"
    for where, text in written.items():
        for key in keys:
            assert key not in text and key.encode().hex() not in text, f"a client key in the {where}"


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _redis_text(redis_url: str, prefix: str) -> str:
    """Every value under the stack's prefix, as text."""
    client = create_sync_redis(redis_url)
    parts: list[Any] = []
    try:
        for name in client.scan_iter(match=f"{prefix}:*", count=1000):
            kind = client.type(name)
            kind = kind.decode() if isinstance(kind, bytes) else kind
            read = {
                "string": lambda k: client.get(k),
                "list": lambda k: client.lrange(k, 0, -1),
                "hash": lambda k: client.hgetall(k),
                "set": lambda k: client.smembers(k),
                "zset": lambda k: client.zrange(k, 0, -1),
                "stream": lambda k: client.xrange(k),
            }.get(kind)
            parts.append(read(name) if read is not None else None)
    finally:
        client.close()
    return repr(parts)


def _postgres_text(database_url: str) -> str:
    """Every row of every table of the checkpointer's database, as text (bytea as hex)."""
    with psycopg.connect(database_url) as db:
        tables = [row[0] for row in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        return "\n".join(str(row[0]) for table in tables for row in db.execute(f'SELECT t::text FROM "{table}" t'))


# ---------------------------------------------------------------------------- a configured key, and a refused one


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    """hotel-api and search-agent with one ``HOTEL_API_KEY``; booking-agent with a stale one."""
    with Stack(tmp_path_factory.mktemp("configured-key"), redis_url) as stack:
        own = {"hotel-api": "hk-configured-" + "c" * 24, "search-agent": "hk-configured-" + "c" * 24}
        own["booking-agent"] = "hk-stale-" + "s" * 24
        for service in CORE:
            stack.serve(service, env={"HOTEL_API_KEY": own[service]} if service in own else None)
        yield stack


def test_a_configured_key_replaces_the_derived_ones(configured: Stack) -> None:
    url = f"{configured.url('hotel-api')}/hotels/lisbon-01"
    assert configured.http.get(url, headers={"Authorization": "Bearer hk-configured-" + "c" * 24}).status_code == 200
    derived = derived_provider_key(configured.secret, "hotel-api", "booking-agent")
    assert configured.http.get(url, headers={"Authorization": f"Bearer {derived}"}).status_code == 401
    # payment-api is not concerned: payment-agent's derived key still opens it
    charges = configured.http.get(
        f"{configured.url('payment-api')}/charges",
        params={"reference": "none"},
        auth=configured.provider_auth("payment-api"),
    )
    assert charges.status_code == 200, charges.text


def test_a_client_whose_key_is_refused_fails_its_booking_and_nothing_moves(configured: Stack) -> None:
    checkin, checkout = stay(days_ahead=91)
    booking = configured.book(city="Lisbon", checkin=checkin, checkout=checkout)
    ended = configured.wait(booking["booking_id"])
    # search-agent's key was taken (the offers came), booking-agent's hold was refused
    assert ended["status"] == "failed" and ended["error"]["code"] == "provider_auth", ended
    assert "hk-stale" not in str(ended) and "hk-configured" not in str(ended)
    reservations = configured.ledger("hotel-api")["reservations"]
    charges = configured.ledger("payment-api")["charges"]
    assert not [r for r in reservations if r["reference"] == booking["booking_id"]]
    assert not [c for c in charges if c["reference"] == booking["booking_id"]]
    audit = configured.verify()
    assert audit.returncode == 0, audit.stdout + audit.stderr
    for name, proc in configured.services.items():
        assert "hk-stale" not in proc.log_text() and "hk-configured" not in proc.log_text(), f"a key in {name}'s log"
