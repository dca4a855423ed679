"""The providers' ``/admin`` routes are the operator's: the admin token or 401, and no routes at all without one.

The client here presents a client's key on the business routes (``ProviderAuth``) and nothing on ``/admin``
unless a test sends it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI

from infra.settings import get_settings
from providers import hotel_api, payment_api
from stack.cli import main
from tests.conftest import TEST_ADMIN_TOKEN, TEST_SERVICE_SECRET
from tests.procs import serve_in_process
from tests.stack import ProviderAuth

STAY = {"hotel_id": "rome-01", "checkin": "2031-04-01", "checkout": "2031-04-02"}
# every admin route of both providers, as (provider, method, path, params or body)
ADMIN_CALLS = [
    ("hotel-api", "GET", "/admin/ledger", None),
    ("hotel-api", "GET", "/admin/availability", STAY),
    ("hotel-api", "GET", "/admin/faults", None),
    ("hotel-api", "PUT", "/admin/faults", {"hang": True}),
    ("hotel-api", "DELETE", "/admin/faults", None),
    ("payment-api", "GET", "/admin/ledger", None),
    ("payment-api", "GET", "/admin/faults", None),
    ("payment-api", "PUT", "/admin/faults", {"hang": True}),
    ("payment-api", "DELETE", "/admin/faults", None),
]
APPS: dict[str, Callable[[], FastAPI]] = {"hotel-api": hotel_api.create_app, "payment-api": payment_api.create_app}


@asynccontextmanager
async def provider(name: str) -> AsyncIterator[httpx.AsyncClient]:
    app = APPS[name]()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        auth = ProviderAuth(name, TEST_SERVICE_SECRET)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{name}", auth=auth) as client:
            yield client


async def send(client: httpx.AsyncClient, method: str, path: str, data: object, **headers: str) -> httpx.Response:
    if method == "PUT":
        return await client.request(method, path, json=data, headers=headers)
    return await client.request(method, path, params=data, headers=headers)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "method", "path", "data"), ADMIN_CALLS)
async def test_admin_routes_need_the_admin_token(
    redis: object, name: str, method: str, path: str, data: object
) -> None:
    async with provider(name) as client:
        missing = await send(client, method, path, data)
        wrong = await send(client, method, path, data, Authorization="Bearer not-the-admin-token")
        other_scheme = await send(client, method, path, data, Authorization=f"Basic {TEST_ADMIN_TOKEN}")
        right = await send(client, method, path, data, Authorization=f"Bearer {TEST_ADMIN_TOKEN}")
        await send(client, "DELETE", "/admin/faults", None, Authorization=f"Bearer {TEST_ADMIN_TOKEN}")
    for refused in (missing, wrong, other_scheme):
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"] == "unauthorized"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert right.status_code == 200, right.text


@pytest.mark.parametrize(("name", "method", "path", "data"), ADMIN_CALLS)
async def test_without_an_admin_token_the_admin_routes_do_not_exist(
    settings_env: pytest.MonkeyPatch, redis: object, name: str, method: str, path: str, data: object
) -> None:
    settings_env.delenv("CONCIERGE_ADMIN_TOKEN")
    get_settings.cache_clear()
    async with provider(name) as client:
        # not even the token of another install opens them
        for headers in ({}, {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}):
            response = await send(client, method, path, data, **headers)
            assert response.status_code == 404, response.text
            assert response.json() == {"detail": "Not Found"}  # what any unknown path answers
        # the business routes do not care (they want a client's key)
        assert (await client.get("/health")).status_code == 200
        if name == "hotel-api":
            assert (await client.get("/hotels/rome-01")).status_code == 200
        else:
            assert (await client.get("/charges", params={"reference": "none"})).json() == {"charges": []}


async def test_an_empty_admin_token_means_none(settings_env: pytest.MonkeyPatch, redis: object) -> None:
    settings_env.setenv("CONCIERGE_ADMIN_TOKEN", "")  # what docker-compose passes when it is not set
    get_settings.cache_clear()
    async with provider("payment-api") as client:
        assert (await client.get("/admin/ledger", headers={"Authorization": "Bearer "})).status_code == 404


async def test_the_token_is_checked_before_the_body_is_read(redis: object) -> None:
    async with provider("hotel-api") as client:
        response = await client.put(
            "/admin/faults", content=b'{"latency_s": 1e400', headers={"content-type": "application/json"}
        )
    assert response.status_code == 401  # not 422: a stranger learns nothing about the route


async def test_business_routes_need_no_admin_token(redis: object) -> None:
    async with provider("hotel-api") as client:
        assert (await client.get("/hotels", params={"city": "Rome", **STAY, "guests": 1})).status_code == 200
        # nor does the admin token open them: it reads and faults, a client's key books and charges
        admin = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
        assert (await client.get("/hotels/rome-01", headers=admin)).status_code == 401


async def test_concierge_fault_presents_the_admin_token(redis: object, capsys: pytest.CaptureFixture[str]) -> None:
    async with serve_in_process(hotel_api.create_app()) as url:
        set_code = await asyncio.to_thread(main, ["fault", "hotel-api", "--url", url, "--latency", "0.5"])
        clear_code = await asyncio.to_thread(main, ["fault", "hotel-api", "--url", url, "--clear"])
    out, err = capsys.readouterr()
    assert (set_code, clear_code) == (0, 0), err
    assert "hotel-api faults: latency 0.5s" in out
