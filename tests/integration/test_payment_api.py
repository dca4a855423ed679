"""payment-api against real Redis: captures, declines, refunds, idempotency, faults, the ledger."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from providers import hotel_api, payment_api
from tests.conftest import TEST_ADMIN_TOKEN, TEST_SERVICE_SECRET
from tests.stack import ProviderAuth

# payment-agent's key on the business routes, the operator's admin token on /admin
AUTH = ProviderAuth("payment-api", TEST_SERVICE_SECRET, TEST_ADMIN_TOKEN)
HOTEL_AUTH = ProviderAuth("hotel-api", TEST_SERVICE_SECRET)


@pytest.fixture
async def api(redis: object) -> AsyncIterator[httpx.AsyncClient]:
    app = payment_api.create_app()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://payment-api", auth=AUTH) as client:
            yield client


def charge_body(token: str = "tok_visa", **overrides: Any) -> dict[str, Any]:
    return {"amount": 240.5, "currency": "EUR", "payment_token": token, "reference": "bk-1"} | overrides


async def charge(api: httpx.AsyncClient, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    return await api.post("/charges", json=body, headers={"Idempotency-Key": key or uuid.uuid4().hex})


async def ledger(api: httpx.AsyncClient) -> list[dict[str, Any]]:
    response = await api.get("/admin/ledger")
    assert response.status_code == 200
    charges: list[dict[str, Any]] = response.json()["charges"]
    return charges


@pytest.mark.parametrize("token", ["tok_visa", "tok_ok_anything"])
async def test_a_good_token_is_captured(api: httpx.AsyncClient, token: str) -> None:
    response = await charge(api, charge_body(token))
    assert response.status_code == 201
    captured = response.json()
    assert captured["status"] == "captured"
    assert captured["payment_id"].startswith("pay_")
    assert (captured["amount"], captured["currency"], captured["reference"]) == (240.5, "EUR", "bk-1")
    assert await ledger(api) == [
        {
            "payment_id": captured["payment_id"],
            "reference": "bk-1",
            "amount": 240.5,
            "currency": "EUR",
            "status": "captured",
        }
    ]
    assert (await api.get(f"/charges/{captured['payment_id']}")).json()["status"] == "captured"


async def test_a_declined_card_is_402_recorded_and_replayed(api: httpx.AsyncClient) -> None:
    declined = await charge(api, charge_body("tok_declined"), key="decline-1")
    assert declined.status_code == 402
    body = declined.json()
    assert body["error"] == "card_declined"
    assert "reason" not in body
    assert [(c["payment_id"], c["status"]) for c in await ledger(api)] == [(body["payment_id"], "declined")]
    replay = await charge(api, charge_body("tok_declined"), key="decline-1")
    assert (replay.status_code, replay.json()) == (402, body)
    assert len(await ledger(api)) == 1


async def test_an_unknown_token_is_declined_with_a_reason(api: httpx.AsyncClient) -> None:
    response = await charge(api, charge_body("tok_mystery"))
    assert response.status_code == 402
    assert response.json()["error"] == "card_declined"
    assert response.json()["reason"] == "unknown test token"
    assert [c["status"] for c in await ledger(api)] == ["declined"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"amount": 0}, "amount"),
        ({"amount": -5}, "amount"),
        ({"amount": "lots"}, "amount"),
        ({"currency": "eur"}, "currency"),
        ({"currency": "EURO"}, "currency"),
        ({"payment_token": ""}, "payment_token"),
        ({"reference": ""}, "reference"),
    ],
)
async def test_charge_validation_names_the_field(api: httpx.AsyncClient, overrides: dict[str, Any], field: str) -> None:
    response = await charge(api, charge_body(**overrides))
    assert response.status_code == 422
    assert ["body", field] in [e["loc"] for e in response.json()["detail"]]
    assert await ledger(api) == []


async def test_refund_then_refund_again_returns_it_unchanged(api: httpx.AsyncClient) -> None:
    captured = (await charge(api, charge_body())).json()
    pid = captured["payment_id"]
    refunded = await api.post(f"/charges/{pid}/refund", headers={"Idempotency-Key": "r-1"})
    assert refunded.status_code == 200
    assert refunded.json()["status"] == "refunded"
    assert refunded.json()["amount"] == 240.5
    assert refunded.json()["refund"]["amount"] == 240.5
    again = await api.post(f"/charges/{pid}/refund", headers={"Idempotency-Key": "r-2"})
    unchanged = {name: value for name, value in refunded.json().items() if name != "refund"}
    assert (again.status_code, again.json()) == (200, unchanged), "nothing left: nothing refunded"
    assert [c["status"] for c in await ledger(api)] == ["refunded"]


async def test_refund_of_unknown_or_declined_charge(api: httpx.AsyncClient) -> None:
    unknown = await api.post("/charges/pay_nope/refund", headers={"Idempotency-Key": "r-404"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "charge_not_found"
    assert (await api.get("/charges/pay_nope")).status_code == 404
    declined = (await charge(api, charge_body("tok_declined"))).json()
    response = await api.post(f"/charges/{declined['payment_id']}/refund", headers={"Idempotency-Key": "r-409"})
    assert response.status_code == 409
    assert response.json()["error"] == "charge_not_captured"


async def test_replay_returns_the_same_charge_and_a_new_body_is_422(api: httpx.AsyncClient) -> None:
    first = await charge(api, charge_body(), key="pay-key")
    replay = await charge(api, charge_body(), key="pay-key")
    assert (replay.status_code, replay.json()) == (201, first.json())
    assert replay.headers["idempotent-replayed"] == "true"
    different = await charge(api, charge_body(amount=999), key="pay-key")
    assert different.status_code == 422
    assert different.json()["error"] == "idempotency_key_reused"
    assert len(await ledger(api)) == 1


async def test_missing_key_is_400(api: httpx.AsyncClient) -> None:
    assert (await api.post("/charges", json=charge_body())).status_code == 400
    pid = (await charge(api, charge_body())).json()["payment_id"]
    response = await api.post(f"/charges/{pid}/refund")
    assert response.status_code == 400
    assert response.json()["error"] == "missing_idempotency_key"
    assert [c["status"] for c in await ledger(api)] == ["captured"]


async def test_twenty_concurrent_identical_charges_capture_once(api: httpx.AsyncClient) -> None:
    responses = await asyncio.gather(*(charge(api, charge_body(), key="burst") for _ in range(20)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["payment_id"] for r in responses}) == 1
    assert len(await ledger(api)) == 1


async def test_charges_can_be_found_by_reference(api: httpx.AsyncClient) -> None:
    a = (await charge(api, charge_body(reference="bk-a"))).json()
    await charge(api, charge_body(reference="bk-b"))
    d = (await charge(api, charge_body("tok_declined", reference="bk-a"))).json()
    found = (await api.get("/charges", params={"reference": "bk-a"})).json()["charges"]
    assert [(c["payment_id"], c["status"]) for c in found] == [
        (a["payment_id"], "captured"),
        (d["payment_id"], "declined"),
    ]
    assert (await api.get("/charges", params={"reference": "bk-none"})).json() == {"charges": []}


async def test_faults_are_per_provider(api: httpx.AsyncClient) -> None:
    assert (await api.put("/admin/faults", json={"error_rate": 1.0})).status_code == 200
    response = await charge(api, charge_body())
    assert response.status_code == 503
    assert response.json()["error"] == "injected_fault"
    assert await ledger(api) == []
    hotels = hotel_api.create_app()
    async with hotels.router.lifespan_context(hotels):
        transport = httpx.ASGITransport(app=hotels)
        async with httpx.AsyncClient(transport=transport, base_url="http://hotel-api", auth=HOTEL_AUTH) as hotel_client:
            assert (await hotel_client.get("/hotels/rome-01")).status_code == 200
    await api.delete("/admin/faults")
    assert (await charge(api, charge_body())).status_code == 201


async def refund(api: httpx.AsyncClient, pid: str, amount: float | None = None, key: str | None = None) -> Any:
    body = None if amount is None else {"amount": amount}
    return await api.post(f"/charges/{pid}/refund", json=body, headers={"Idempotency-Key": key or uuid.uuid4().hex})


async def test_a_refund_of_an_amount_leaves_the_rest_and_a_second_one_what_is_left(api: httpx.AsyncClient) -> None:
    pid = (await charge(api, charge_body())).json()["payment_id"]

    first = await refund(api, pid, 100.25, key="part-1")
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["status"], body["refunded_amount"]) == ("partially_refunded", 100.25)
    assert body["refund"]["amount"] == 100.25 and body["refund"]["reference"] == "bk-1"
    replayed = await refund(api, pid, 100.25, key="part-1")
    assert (replayed.json(), replayed.headers.get("Idempotent-Replayed")) == (body, "true"), "the same refund"
    assert (await refund(api, pid, 200, key="part-1")).status_code == 422, "a key names one refund"

    assert (await refund(api, pid, 0.004999, key="tiny")).status_code == 422, "less than a cent"
    too_much = await refund(api, pid, 140.26)
    assert too_much.status_code == 409 and too_much.json()["error"] == "refund_exceeds_capture"
    assert too_much.json()["left"] == 140.25
    rest = (await refund(api, pid)).json()
    assert (rest["status"], rest["refunded_amount"], rest["refund"]["amount"]) == ("refunded", 240.5, 140.25)
    nothing = (await refund(api, pid)).json()
    assert nothing["status"] == "refunded" and "refund" not in nothing, "nothing left: unchanged"

    seen = (await api.get(f"/charges/{pid}")).json()
    assert [r["amount"] for r in seen["refunds"]] == [100.25, 140.25] and seen["refunded_amount"] == 240.5
    listed = (await api.get("/admin/ledger")).json()
    assert [(r["payment_id"], r["amount"]) for r in listed["refunds"]] == [(pid, 100.25), (pid, 140.25)]
    assert set(listed["refunds"][0]) == {"refund_id", "payment_id", "reference", "amount", "currency"}


@pytest.mark.parametrize(("amount", "why"), [(0, "0.01"), (-5, "0.01"), (0.004, "0.01"), (2_000_000, "less than")])
async def test_a_refund_amount_is_validated(api: httpx.AsyncClient, amount: float, why: str) -> None:
    pid = (await charge(api, charge_body())).json()["payment_id"]
    response = await refund(api, pid, amount)
    assert response.status_code == 422 and why in response.text and "amount" in response.text
    assert (await api.get(f"/charges/{pid}")).json()["status"] == "captured", "nothing refunded"


async def test_refunds_at_once_never_sum_past_the_capture(api: httpx.AsyncClient) -> None:
    pid = (await charge(api, charge_body(amount=100))).json()["payment_id"]

    answers = await asyncio.gather(*(refund(api, pid, 30) for _ in range(10)))

    assert sorted(a.status_code for a in answers) == [200] * 3 + [409] * 7
    seen = (await api.get(f"/charges/{pid}")).json()
    assert seen["refunded_amount"] == 90 and seen["status"] == "partially_refunded" and len(seen["refunds"]) == 3
