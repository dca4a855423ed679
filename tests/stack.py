"""The whole stack as real processes for end-to-end tests: five services (and optionally the recovery worker) wired
together on free ports, one Redis key prefix, one fresh Postgres database, a span file per service.

    with Stack(tmp_path, redis_url, env={"BOOKING_BUDGET_S": "5"}) as stack:
        stack.start()                      # hotel-api, payment-api, search-agent, payment-agent, booking-agent
        booking = stack.book(city="Lisbon")
        assert stack.wait(booking["booking_id"])["status"] == "confirmed"

Every stack has its own ``CONCIERGE_SERVICE_SECRET`` (``stack.secret``), ``CONCIERGE_ADMIN_TOKEN``
(``stack.admin_token``) and ``LLM_API_KEY`` (``stack.llm_api_key``, what llm-api takes); ``stack.admin(...)``,
``stack.fault(...)``, ``stack.script_model(...)`` and ``stack.ledger(...)`` present the admin token,
``stack.service_token(issuer, audience)`` mints what a service would present and ``stack.a2a(...)`` calls a skill with it. ``CONCIERGE_SERVICE_TOKEN`` is set too (``stack.retired_token``), only so a test can show nobody takes it.
A test calling hotel-api's or payment-api's business routes itself presents a client's key as the services do:
``auth=stack.provider_auth("hotel-api")`` (``ProviderAuth``, also for in-process apps and the test secret).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import psycopg

from domain.booking import FINAL_BOOKING_STATUSES
from identity.auth import PROVIDER_CLIENTS, derived_provider_key, mint_service_token
from stack.login import login_url
from stack.services import DEFAULT_STACK, SERVICES, ServiceSpec
from tests.procs import Processes, ServiceProcess, concierge_command, free_port


def url_envs(services: Mapping[str, ServiceSpec] = SERVICES) -> dict[str, str]:
    """Service → the variable its peers find it by: every row of the table, deployed or not, but the operator's
    tooling (a test that serves the console gives it a port itself)."""
    return {name: spec.url_env for name, spec in services.items() if spec.kind != "tooling"}


# what ``Stack.start()`` serves: the booking path (tests/unit/test_service_table.py keeps it within URL_ENV)
CORE = ("hotel-api", "payment-api", "search-agent", "payment-agent", "booking-agent")
URL_ENV = url_envs()
TEST_DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def stay(days_ahead: int = 40, nights: int = 2) -> tuple[str, str]:
    checkin = dt.date.today() + dt.timedelta(days=days_ahead)
    return checkin.isoformat(), (checkin + dt.timedelta(days=nights)).isoformat()


@contextlib.contextmanager
def fresh_database(admin_url: str = TEST_DATABASE_URL, *, name_prefix: str = "concierge_e2e") -> Iterator[str]:
    """A new, empty database on the server of ``admin_url``; dropped (connections forced out) afterwards."""
    name = f"{name_prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class ProviderAuth(httpx.Auth):
    """What a test's client presents at hotel-api or payment-api: the admin token under ``/admin``, elsewhere the key
    ``secret`` derives for ``client`` (default: the provider's first), as the services do. A request that brings its
    own ``Authorization`` keeps it (a test sending a wrong one)."""

    def __init__(self, provider: str, secret: str, admin_token: str | None = None, client: str | None = None) -> None:
        self.key = derived_provider_key(secret, provider, client or PROVIDER_CLIENTS[provider][0])
        self.admin_token = admin_token

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        if "authorization" not in request.headers:
            admin = request.url.path == "/admin" or request.url.path.startswith("/admin/")
            credential = self.admin_token if admin else self.key
            if credential is not None:
                request.headers["Authorization"] = f"Bearer {credential}"
        yield request


class Stack:
    def __init__(
        self,
        tmp_path: Path,
        redis_url: str,
        *,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        key_prefix: str | None = None,
        span_files: bool = True,
    ) -> None:
        """``span_files=False``: no ``CONCIERGE_SPAN_FILE``, for runs that measure (the export is synchronous)."""
        self.tmp_path = tmp_path
        self.ports = {name: free_port() for name in URL_ENV}
        self.secret = secrets.token_hex(32)
        self.admin_token = secrets.token_urlsafe(24)
        self.retired_token = secrets.token_hex(16)
        self.llm_api_key = f"sk-test-{secrets.token_urlsafe(16)}"
        self.prefix = key_prefix or f"e2e-{uuid.uuid4().hex[:10]}"
        self.span_files = span_files
        self.env: dict[str, str] = {
            "REDIS_URL": redis_url,
            "CONCIERGE_KEY_PREFIX": self.prefix,
            "CONCIERGE_SERVICE_SECRET": self.secret,
            "CONCIERGE_ADMIN_TOKEN": self.admin_token,
            "CONCIERGE_SERVICE_TOKEN": self.retired_token,
            "LLM_API_KEY": self.llm_api_key,
            "CONCIERGE_DATA_DIR": str(tmp_path / "data"),
            "CONCIERGE_LOG_LEVEL": "INFO",
            # people's identities off unless a test turns them on (tests/e2e/test_identities.py; docs/people.md)
            "CONCIERGE_AUTH": os.environ.get("CONCIERGE_AUTH", "off"),
            # an optional row (an example) has a port, but its peers are not told of it: it is no stack's default
            **{URL_ENV[name]: f"http://127.0.0.1:{port}" for name, port in self.ports.items() if name in DEFAULT_STACK},
        }
        if database_url:
            self.env["DATABASE_URL"] = database_url
        self.env.update(env or {})
        self.procs = Processes(tmp_path / "logs", env=self.env)
        (tmp_path / "logs").mkdir(exist_ok=True)
        self.services: dict[str, ServiceProcess] = {}
        self.http = httpx.Client(timeout=30)

    def span_file(self, service: str) -> Path:
        return self.tmp_path / f"spans-{service}.jsonl"

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def serve(self, service: str, *, wait: bool = True, env: Mapping[str, str] | None = None) -> ServiceProcess:
        spans = {"CONCIERGE_SPAN_FILE": str(self.span_file(service))} if self.span_files else {}
        extra = {**spans, **(env or {})}
        proc = self.procs.serve(service, port=self.ports[service], env=extra, wait=wait)
        self.services[service] = proc
        return proc

    def start(self, services: tuple[str, ...] = CORE) -> Self:
        for service in services:
            self.serve(service)
        return self

    # --- the user's view -------------------------------------------------------------------------------------
    def book(self, *, headers: Mapping[str, str] | None = None, **fields: Any) -> dict[str, Any]:
        checkin, checkout = stay()
        body = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
        body.update(fields)
        response = self.http.post(f"{self.url('booking-agent')}/bookings", json=body, headers=dict(headers or {}))
        assert response.status_code == 202, response.text
        return dict(response.json())

    def booking(self, booking_id: str, wait: float = 0) -> dict[str, Any]:
        response = self.http.get(f"{self.url('booking-agent')}/bookings/{booking_id}", params={"wait": wait})
        assert response.status_code == 200, response.text
        return dict(response.json())

    def wait(self, booking_id: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            booking = self.booking(booking_id, wait=max(0.1, min(left, 20)))
            if booking["status"] in FINAL_BOOKING_STATUSES or left <= 0:
                return booking
            time.sleep(0.05)

    # --- a client's view: the providers' business routes, with a client's key --------------------------------
    def provider_auth(self, provider: str, client: str | None = None) -> ProviderAuth:
        """``auth=`` for a request to ``provider``: ``client``'s key (default its first client), derived from this
        stack's secret; the admin token under ``/admin``."""
        return ProviderAuth(provider, self.secret, self.admin_token, client)

    # --- the operator's view: the providers' /admin routes, with the stack's admin token ---------------------
    def admin(self, method: str, provider: str, path: str, **kwargs: Any) -> httpx.Response:
        """``method /admin/<path>`` on ``provider`` with ``Authorization: Bearer <admin token>``."""
        headers = {"Authorization": f"Bearer {self.admin_token}", **kwargs.pop("headers", {})}
        return self.http.request(method, f"{self.url(provider)}/admin/{path}", headers=headers, **kwargs)

    def ledger(self, provider: str) -> dict[str, Any]:
        response = self.admin("GET", provider, "ledger")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def fault(self, provider: str, **fault: Any) -> None:
        if fault:
            response = self.admin("PUT", provider, "faults", json=fault)
        else:
            response = self.admin("DELETE", provider, "faults")
        assert response.status_code in (200, 204), response.text

    def script_model(self, steps: list[dict[str, Any]] | None, model: str | None = None) -> dict[str, Any]:
        """llm-api answers its next requests with ``steps`` (``tests.llm.script_model``); ``None`` or ``[]`` clears
        the script."""
        from tests.llm import clear_script, script_model

        if not steps:
            clear_script(self.url("llm-api"), admin_token=self.admin_token)
            return {"model": None, "steps": [], "steps_left": 0}
        return script_model(self.url("llm-api"), steps, model, admin_token=self.admin_token)

    # --- another service's view: A2A with a service token ---------------------------------------------------
    def service_token(
        self,
        issuer: str,
        audience: str,
        *,
        secret: str | None = None,
        now: float | None = None,
        ttl_s: int = 60,
        person: str | None = None,
    ) -> str:
        """A token from ``issuer`` for ``audience`` (acting for ``person`` when given), signed with this stack's
        secret (or ``secret``)."""
        return mint_service_token(
            secret or self.secret, issuer=issuer, audience=audience, now=now, ttl_s=ttl_s, person=person
        )

    def a2a(self, service: str, skill: str, data: dict[str, Any], *, authorization: str | None) -> httpx.Response:
        """A raw JSON-RPC ``SendMessage`` running ``skill`` on ``service``, with the given ``Authorization``."""
        body = {
            "jsonrpc": "2.0",
            "id": uuid.uuid4().hex,
            "method": "SendMessage",
            "params": {
                "message": {
                    "messageId": uuid.uuid4().hex,
                    "role": "ROLE_USER",
                    "parts": [{"data": {"skill": skill, "input": data}}],
                }
            },
        }
        headers = {"A2A-Version": "1.0"}
        if authorization is not None:
            headers["Authorization"] = authorization
        return self.http.post(f"{self.url(service)}/a2a", json=body, headers=headers)

    def verify(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``concierge verify`` of this stack (its Redis and prefix, both providers, the admin token); a cold CLI on a
        loaded machine takes long to start."""
        urls = ("--hotel-api", self.url("hotel-api"), "--payment-api", self.url("payment-api"))
        return subprocess.run(
            [*concierge_command(), "verify", *urls],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def spans(self, service: str) -> list[dict[str, Any]]:
        path = self.span_file(service)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # --- the web console's operator: a session opened by a one-time login link -----------------------------
    def console_login_url(self, ttl_s: float = 600) -> str:
        """A one-time login link to this stack's console (what ``concierge console-url`` prints for it)."""
        return login_url(self.url("console"), self.secret, ttl_s)

    @functools.cached_property
    def console(self) -> httpx.Client:
        """A client of the console logged in as the operator by a one-time link (its session cookie), sending the
        page's ``X-Concierge-Console: 1``, as the page does."""
        client = httpx.Client(timeout=30, headers={"X-Concierge-Console": "1"})
        opened = client.get(self.console_login_url())
        assert opened.status_code == 303 and "concierge_console" in client.cookies, opened.text
        return client

    def close(self) -> None:
        self.http.close()
        if "console" in self.__dict__:
            self.console.close()
        self.procs.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


SharedStacks = Callable[[tuple[str, ...], Mapping[str, str]], Stack]
"""The ``shared_stack`` fixture (tests/conftest.py): ``shared_stack(services, env)`` is a running stack of the worker's."""


def people_env(issuer: Any, name: str) -> dict[str, str]:
    """A stack's settings with people's identities on, trusting ``issuer`` (a ``LocalIssuer`` named ``name``)."""
    return {"CONCIERGE_AUTH": "on", "CONCIERGE_AUTH_ISSUER": name, "CONCIERGE_AUTH_JWKS_FILE": str(issuer.jwks_path)}


def new_person(issuer: Any) -> dict[str, str]:
    """The ``Authorization`` header of a person nobody has seen before (a fresh ``sub``)."""
    return {"Authorization": f"Bearer {issuer.mint(f'guest-{uuid.uuid4().hex[:8]}')}"}
