"""The typed provider clients: happy paths against the real providers, and every error converted at the boundary."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from infra.clients import (
    HotelApiClient,
    IdempotencyMismatchError,
    InvalidProviderRequestError,
    NoAvailabilityError,
    PaymentApiClient,
    PaymentDeclinedError,
    ProviderAuthError,
    ProviderConflictError,
    ProviderError,
    ProviderNotFoundError,
    ProviderRejectedError,
    ProviderUnavailableError,
)
from infra.http import create_http_client
from providers import hotel_api, payment_api
from providers.inventory import HOTELS
from resilience import BudgetExhaustedError, NonRetryableError, budget_scope
from tests.conftest import free_port
from tests.procs import serve_in_process

CHECKIN, CHECKOUT = "2032-05-01", "2032-05-03"


@asynccontextmanager
async def in_process(app: FastAPI, base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        create_http_client(base_url, transport=httpx.ASGITransport(app=app)) as http,
    ):
        yield http


@pytest.fixture
async def hotels(redis: object) -> AsyncIterator[HotelApiClient]:
    async with in_process(hotel_api.create_app(), "http://hotel-api") as http:
        yield HotelApiClient(http=http, client="booking-agent")


@pytest.fixture
async def payments(redis: object) -> AsyncIterator[PaymentApiClient]:
    async with in_process(payment_api.create_app(), "http://payment-api") as http:
        yield PaymentApiClient(http=http, client="payment-agent")


async def test_search_reserve_confirm_cancel(hotels: HotelApiClient) -> None:
    offers = await hotels.search("Lisbon", CHECKIN, CHECKOUT, 2)
    assert offers and offers[0]["price_per_night"] == min(o["price_per_night"] for o in offers)
    hotel_id = offers[0]["hotel_id"]
    held = await hotels.reserve(
        hotel_id=hotel_id, checkin=CHECKIN, checkout=CHECKOUT, guests=2, reference="bk-1", idempotency_key="k-res"
    )
    assert held["status"] == "held"
    again = await hotels.reserve(
        hotel_id=hotel_id, checkin=CHECKIN, checkout=CHECKOUT, guests=2, reference="bk-1", idempotency_key="k-res"
    )
    assert again == held
    confirmed = await hotels.confirm(held["reservation_id"], idempotency_key="k-confirm")
    assert confirmed["status"] == "confirmed"
    assert (await hotels.reservation(held["reservation_id"]))["status"] == "confirmed"
    assert (await hotels.cancel(held["reservation_id"], idempotency_key="k-cancel"))["status"] == "cancelled"
    assert [(r["reservation_id"], r["status"]) for r in await hotels.ledger()] == [
        (held["reservation_id"], "cancelled")
    ]
    assert (await hotels.availability(hotel_id, CHECKIN, CHECKOUT))["available_rooms"] == HOTELS[hotel_id].rooms


async def test_charge_find_and_refund(payments: PaymentApiClient) -> None:
    captured = await payments.charge(
        amount=99.9, currency="EUR", payment_token="tok_visa", reference="bk-9", idempotency_key="k-charge"
    )
    assert captured["status"] == "captured"
    assert [c["payment_id"] for c in await payments.find_charges(reference="bk-9")] == [captured["payment_id"]]
    refunded = await payments.refund(captured["payment_id"], idempotency_key="k-refund")
    assert refunded["status"] == "refunded"
    assert (await payments.get_charge(captured["payment_id"]))["status"] == "refunded"
    assert [c["status"] for c in await payments.ledger()] == ["refunded"]


async def test_no_availability_is_a_rejection_not_a_failure(hotels: HotelApiClient) -> None:
    hotel_id = min(HOTELS.values(), key=lambda h: h.rooms).hotel_id
    with pytest.raises(NoAvailabilityError) as caught:
        for n in range(30):
            await hotels.reserve(
                hotel_id=hotel_id, checkin=CHECKIN, checkout=CHECKOUT, guests=8, reference="r", idempotency_key=f"k{n}"
            )
    error = caught.value
    assert isinstance(error, ProviderRejectedError) and isinstance(error, NonRetryableError)
    assert (error.status_code, error.code, error.provider) == (409, "no_availability", "hotel-api")
    assert isinstance(error.__cause__, httpx.HTTPStatusError)


async def test_declined_card_carries_reason_and_payment_id(payments: PaymentApiClient) -> None:
    with pytest.raises(PaymentDeclinedError) as caught:
        await payments.charge(
            amount=10, currency="EUR", payment_token="tok_stolen", reference="bk-2", idempotency_key="k-d"
        )
    assert caught.value.reason == "unknown test token"
    assert caught.value.payment_id is not None
    assert isinstance(caught.value, NonRetryableError)
    assert [c["status"] for c in await payments.ledger()] == ["declined"]


async def test_provider_answers_map_to_their_errors(hotels: HotelApiClient, payments: PaymentApiClient) -> None:
    with pytest.raises(ProviderNotFoundError):
        await hotels.confirm("res_missing", idempotency_key="k-404")
    with pytest.raises(ProviderNotFoundError):
        await hotels.hotel("nowhere-1")
    held = await hotels.reserve(
        hotel_id="rome-01", checkin=CHECKIN, checkout=CHECKOUT, guests=1, reference="bk", idempotency_key="k-1"
    )
    with pytest.raises(IdempotencyMismatchError):
        await hotels.reserve(
            hotel_id="rome-01", checkin=CHECKIN, checkout=CHECKOUT, guests=2, reference="bk", idempotency_key="k-1"
        )
    await hotels.cancel(held["reservation_id"], idempotency_key="k-2")
    with pytest.raises(ProviderConflictError) as conflict:
        await hotels.confirm(held["reservation_id"], idempotency_key="k-3")
    assert not isinstance(conflict.value, NoAvailabilityError)
    with pytest.raises(InvalidProviderRequestError) as invalid:
        await hotels.search("Rome", CHECKOUT, CHECKIN, 2)
    assert invalid.value.status_code == 422
    with pytest.raises(InvalidProviderRequestError):
        await payments.charge(amount=5, currency="eur", payment_token="tok_visa", reference="x", idempotency_key="k")


async def test_injected_faults_are_unavailable_and_retryable(hotels: HotelApiClient) -> None:
    await hotels.set_faults(error_rate=1.0)
    assert (await hotels.faults())["error_rate"] == 1.0
    with pytest.raises(ProviderUnavailableError) as caught:
        await hotels.search("Rome", CHECKIN, CHECKOUT, 1)
    assert caught.value.status_code == 503 and caught.value.code == "injected_fault"
    assert not isinstance(caught.value, NonRetryableError)
    await hotels.clear_faults()
    assert await hotels.search("Rome", CHECKIN, CHECKOUT, 1)


def answering(status: int, body: dict[str, Any] | None = None) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body if body is not None else {"error": "whatever"})

    return handler


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (500, None, ProviderUnavailableError),
        (502, None, ProviderUnavailableError),
        (503, {"error": "injected_fault"}, ProviderUnavailableError),
        (504, None, ProviderUnavailableError),
        (429, None, ProviderUnavailableError),
        (408, None, ProviderUnavailableError),
        (400, {"error": "missing_idempotency_key"}, InvalidProviderRequestError),
        (401, {"error": "unauthorized"}, ProviderAuthError),
        (403, None, ProviderAuthError),
        (402, {"error": "card_declined"}, PaymentDeclinedError),
        (404, {"error": "charge_not_found"}, ProviderNotFoundError),
        (409, {"error": "no_availability"}, NoAvailabilityError),
        (409, {"error": "charge_not_captured"}, ProviderConflictError),
        (422, {"error": "idempotency_key_reused"}, IdempotencyMismatchError),
        (422, {"detail": [{"loc": ["body", "amount"]}]}, InvalidProviderRequestError),
        (418, {"error": {"code": "teapot", "message": "short and stout"}}, InvalidProviderRequestError),
    ],
)
async def test_every_status_maps_to_one_error(
    status: int, body: dict[str, Any] | None, expected: type[ProviderError]
) -> None:
    # A stand-in server for statuses the simulated providers never send.
    http = create_http_client("http://payment-api", transport=httpx.MockTransport(answering(status, body)))
    async with PaymentApiClient(http=http) as client:
        with pytest.raises(ProviderError) as caught:
            await client.refund("pay_1", idempotency_key="k")
    assert type(caught.value) is expected
    assert caught.value.status_code == status
    assert isinstance(caught.value, NonRetryableError) == (expected is not ProviderUnavailableError)
    await http.aclose()


async def test_a_provider_that_is_down_is_unavailable() -> None:
    async with HotelApiClient(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(ProviderUnavailableError) as caught:
            await client.search("Rome", CHECKIN, CHECKOUT, 1)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


async def test_a_hanging_provider_is_given_up_at_the_budget(redis: object) -> None:
    async with serve_in_process(hotel_api.create_app()) as url, HotelApiClient(url, client="booking-agent") as client:
        await client.set_faults(hang=True)
        started = time.monotonic()
        with budget_scope(0.5), pytest.raises(BudgetExhaustedError) as caught:
            await client.search("Rome", CHECKIN, CHECKOUT, 1)
        elapsed = time.monotonic() - started
        await client.clear_faults()
    assert elapsed > 0.3, "it waited for the provider until the budget ran out"
    assert isinstance(caught.value.__cause__, httpx.TimeoutException), "then gave the hanging call up"


async def test_no_call_is_made_when_the_budget_is_already_spent(hotels: HotelApiClient) -> None:
    with budget_scope(0.01), pytest.raises(BudgetExhaustedError):
        await hotels.reserve(
            hotel_id="rome-01", checkin=CHECKIN, checkout=CHECKOUT, guests=1, reference="late", idempotency_key="k"
        )
    assert await hotels.ledger() == []


async def test_client_closes_only_the_http_client_it_created() -> None:
    own = HotelApiClient("http://127.0.0.1:1")
    await own.aclose()
    assert own._http.is_closed
    shared = httpx.AsyncClient(base_url="http://127.0.0.1:1")
    async with PaymentApiClient(http=shared):
        pass
    assert not shared.is_closed
    await shared.aclose()
    with pytest.raises(ValueError):
        HotelApiClient("http://a", http=shared)
