"""The booking product end to end: five real uvicorn processes, real Redis, Postgres checkpoints, real HTTP/A2A."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections import Counter
from datetime import date, timedelta
from typing import Any

import httpx
import pytest

from providers.inventory import HOTELS
from tests.e2e.conftest import SHARED_CORE
from tests.kill_kit import assert_one_per_reference, ledger_entries, wait_for_run
from tests.stack import Stack, stay

pytestmark = [pytest.mark.e2e, SHARED_CORE]


def lisbon_availability(stack: Stack, checkin: str, checkout: str) -> dict[str, int]:
    response = stack.http.get(
        f"{stack.url('hotel-api')}/hotels",
        params={"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2},
        auth=stack.provider_auth("hotel-api"),
    )
    assert response.status_code == 200, response.text
    return {offer["hotel_id"]: offer["available_rooms"] for offer in response.json()["offers"]}


def test_twenty_concurrent_bookings_all_confirm_exactly_once(stack: Stack) -> None:
    checkin, checkout = stay(days_ahead=60, nights=2)
    before = lisbon_availability(stack, checkin, checkout)

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        accepted = list(pool.map(lambda _: stack.book(checkin=checkin, checkout=checkout, guests=2), range(20)))
        final = list(pool.map(lambda b: stack.wait(b["booking_id"]), accepted))

    ids = {b["booking_id"] for b in accepted}
    assert len(ids) == 20
    assert [b["status"] for b in final] == ["confirmed"] * 20, [b["error"] for b in final]
    free_until = f"{date.fromisoformat(checkin) - timedelta(days=2)}T00:00:00Z"
    for booking in final:
        assert booking["reservation_id"] and booking["payment_id"] and booking["hotel_name"]
        assert booking["total_price"] > 0 and booking["currency"] == "EUR"
        # the policy the hotel held the stay with: free until 48 h before check-in, then its first night
        assert booking["cancellation"] == {
            "free_until": free_until,
            "fee": round(booking["total_price"] / 2, 2),
            "currency": "EUR",
            "refundable": HOTELS[booking["hotel_id"]].refundable,
        }, booking

    reservations = [r for r in stack.ledger("hotel-api")["reservations"] if r["reference"] in ids]
    confirmed = Counter(r["reference"] for r in reservations if r["status"] == "confirmed")
    assert confirmed == Counter(ids), "exactly one confirmed reservation per booking"
    assert not [r for r in reservations if r["status"] == "held"], "no room left on hold"

    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] in ids]
    captured = Counter(c["reference"] for c in charges if c["status"] == "captured")
    assert captured == Counter(ids), "exactly one captured charge per booking"

    after = lisbon_availability(stack, checkin, checkout)
    taken = sum(before[h] - after.get(h, 0) for h in before)
    assert taken == 20, "two guests take one room; twenty bookings take twenty rooms for the stay"
    by_hotel = Counter(b["hotel_id"] for b in final)
    for hotel_id, count in by_hotel.items():
        assert before[hotel_id] - after.get(hotel_id, 0) == count


def test_declined_card_fails_and_leaves_nothing_behind(stack: Stack) -> None:
    booking = stack.wait(stack.book(payment_token="tok_declined")["booking_id"])
    assert booking["status"] == "failed"
    assert booking["error"]["code"] == "payment_declined"

    reference = booking["booking_id"]
    reservations = ledger_entries(stack, "hotel-api", reference)
    assert reservations and all(r["status"] == "cancelled" for r in reservations), reservations
    assert not [c for c in ledger_entries(stack, "payment-api", reference) if c["status"] == "captured"]


def test_same_idempotency_key_gives_the_same_booking(stack: Stack) -> None:
    checkin, checkout = stay(days_ahead=70)
    headers = {"Idempotency-Key": f"client-{time.time_ns()}"}
    first = stack.book(headers=headers, checkin=checkin, checkout=checkout)
    second = stack.book(headers=headers, checkin=checkin, checkout=checkout)
    assert first["booking_id"] == second["booking_id"]
    assert stack.wait(first["booking_id"])["status"] == "confirmed"

    changed = stack.http.post(
        f"{stack.url('booking-agent')}/bookings",
        json={"city": "Porto", "checkin": checkin, "checkout": checkout, "guests": 1, "payment_token": "tok_visa"},
        headers=headers,
    )
    assert changed.status_code == 422
    assert "Idempotency-Key" in changed.text
    assert_one_per_reference(stack, "payment-api", first["booking_id"])


def test_a_booking_run_is_read_back_by_get_runs_and_an_unknown_one_is_404(stack: Stack) -> None:
    booking_id = stack.book(checkin=stay(days_ahead=71)[0], checkout=stay(days_ahead=71)[1])["booking_id"]
    assert stack.wait(booking_id)["status"] == "confirmed"
    run = wait_for_run(stack, "booking-agent", booking_id)
    assert (run["graph"], run["status"], run["held_by"], run["checkpoint"]["next"]) == ("booking", "done", None, [])
    assert run["checkpoint"]["graph_version"] == run["version"] and "input" not in run
    assert stack.http.get(f"{stack.url('booking-agent')}/runs/{uuid.uuid4().hex}").status_code == 404


def test_hotel_api_down_opens_the_breaker_and_bookings_wait_it_out_within_their_budget(clean_faults: Stack) -> None:
    """An accepted booking spends its own budget waiting for an outage to end (issue 24; it used to fail at once on
    the open breaker). One whose outage outlasts its budget fails within it: tests/e2e/test_stopping_and_waiting.py."""
    stack = clean_faults
    stack.fault("hotel-api", error_rate=1.0)
    waiting = [stack.book()["booking_id"] for _ in range(3)]
    time.sleep(4.0)
    assert [stack.booking(b)["status"] for b in waiting] == ["searching"] * 3, "waiting, not failed"
    circuits = stack.http.get(f"{stack.url('search-agent')}/health/circuits").json()
    assert circuits["hotel_api"]["state"] in ("open", "half_open")

    stack.fault("hotel-api")
    finals = [stack.wait(b) for b in waiting]
    assert [b["status"] for b in finals] == ["confirmed"] * 3, [b["error"] for b in finals]
    # hotel_api needs two successful probes (success_threshold=2) before it closes again
    assert stack.http.get(f"{stack.url('search-agent')}/health/circuits").json()["hotel_api"]["state"] == "closed"


def test_a2a_requires_the_service_token_and_serves_agent_cards(stack: Stack) -> None:
    for service in ("search-agent", "payment-agent", "booking-agent"):
        card = stack.http.get(f"{stack.url(service)}/.well-known/agent-card.json")
        assert card.status_code == 200
        assert card.json()["name"] == service
        refused = stack.http.post(
            f"{stack.url(service)}/a2a",
            json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}},
        )
        assert refused.status_code == 401
        wrong = stack.http.post(
            f"{stack.url(service)}/a2a",
            json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}},
            headers={"Authorization": "Bearer not-the-token"},
        )
        assert wrong.status_code == 401


AGENT_SKILLS = {
    "search-agent": {"search_hotels": ["city", "checkin", "checkout", "guests"]},
    "booking-agent": {
        "book_hotel": ["city", "checkin", "checkout", "guests", "payment_token"],
        "get_booking": ["booking_id"],
        "list_bookings": [],
        "cancel_booking": ["booking_id"],
    },
    "payment-agent": {
        "charge_payment": ["amount", "currency", "payment_token", "reference"],
        "refund_payment": ["reference"],
        "refund_cancellation": ["reference"],
    },
}


def rpc(
    stack: Stack, service: str, method: str, params: dict[str, Any], *, person: str | None = None
) -> dict[str, Any]:
    token = stack.service_token("booking-agent", service, person=person)
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    body = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
    response = stack.http.post(f"{stack.url(service)}/a2a", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.mark.parametrize("service", list(AGENT_SKILLS))
def test_a_text_message_to_an_agent_asks_for_the_data_part_of_its_skills(stack: Stack, service: str) -> None:
    """What a stranger's A2A client sends first (text): the task waits for input, naming the skills and their input."""
    card = stack.http.get(f"{stack.url(service)}/.well-known/agent-card.json")
    assert card.headers["Cache-Control"] == "public, max-age=300" and "ETag" in card.headers
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "two nights in Lisbon"}]}
    task = rpc(stack, service, "SendMessage", {"message": message})["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    words, data = task["status"]["message"]["parts"]
    wanted = {s["id"]: s["input"]["required"] for s in data["data"]["skills"]}
    assert wanted == AGENT_SKILLS[service]
    assert all(skill in words["text"] for skill in wanted), words["text"]
    assert [m["messageId"] for m in task["history"]] == [message["messageId"]]


def test_a_search_asked_for_in_words_runs_when_the_data_part_follows_in_the_same_task(stack: Stack) -> None:
    text = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "hotels in Lisbon?"}]}
    task = rpc(stack, "search-agent", "SendMessage", {"message": text})["result"]["task"]
    checkin, checkout = stay()
    query = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2}
    reply = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "taskId": task["id"],
        "parts": [{"data": {"skill": "search_hotels", "input": query}}],
    }
    done = rpc(stack, "search-agent", "SendMessage", {"message": reply})["result"]["task"]
    assert done["id"] == task["id"] and done["status"]["state"] == "TASK_STATE_COMPLETED", done
    assert done["artifacts"][0]["parts"][0]["data"]["offers"], done["artifacts"]
    found = rpc(stack, "search-agent", "GetTask", {"id": task["id"]})["result"]
    assert [m["role"] for m in found["history"]] == ["ROLE_USER", "ROLE_AGENT", "ROLE_USER"]
    assert all(m["contextId"] == task["contextId"] for m in found["history"])


def test_a2a_tasks_are_found_and_listed_only_for_the_person_and_service_they_were_made_for(stack: Stack) -> None:
    checkin, checkout = stay()
    query = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2}

    def search(person: str | None) -> str:
        message = {
            "messageId": uuid.uuid4().hex,
            "role": "ROLE_USER",
            "parts": [{"data": {"skill": "search_hotels", "input": query}}],
        }
        task = rpc(stack, "search-agent", "SendMessage", {"message": message}, person=person)["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        return str(task["id"])

    ana, bruno = f"ana-{uuid.uuid4().hex[:8]}", f"bruno-{uuid.uuid4().hex[:8]}"
    anas, brunos, services_own = search(ana), search(bruno), search(None)

    def listed(person: str | None) -> set[str]:
        answer = rpc(stack, "search-agent", "ListTasks", {"pageSize": 100}, person=person)
        return {task["id"] for task in answer["result"].get("tasks", [])}

    assert anas in listed(ana) and brunos not in listed(ana) and services_own not in listed(ana)
    assert brunos in listed(bruno) and anas not in listed(bruno)
    assert services_own in listed(None) and not {anas, brunos} & listed(None)
    assert rpc(stack, "search-agent", "GetTask", {"id": anas}, person=ana)["result"]["id"] == anas
    for task_id, person in ((anas, bruno), (brunos, ana), (anas, None), (services_own, ana)):
        refused = rpc(stack, "search-agent", "GetTask", {"id": task_id}, person=person)
        assert "result" not in refused and refused["error"]["code"] == -32001, refused  # TaskNotFoundError
    # the same person through another service is another owner: a task is its caller's
    token = stack.service_token("concierge-agent", "search-agent", person=ana)
    body = {"jsonrpc": "2.0", "id": "x", "method": "GetTask", "params": {"id": anas}}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    other = stack.http.post(f"{stack.url('search-agent')}/a2a", json=body, headers=headers).json()
    assert other["error"]["code"] == -32001, other


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"checkout": "2020-01-01"}, "checkout"),
        ({"guests": 0}, "guests"),
        ({"guests": 9}, "guests"),
        ({"checkin": "10/01/2027"}, "checkin"),
        ({"payment_token": ""}, "payment_token"),
        ({"max_price_per_night": -5}, "max_price_per_night"),
    ],
)
def test_bad_booking_fields_get_422_naming_the_field(stack: Stack, change: dict[str, object], field: str) -> None:
    checkin, checkout = stay()
    body = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}
    body.update(change)
    response = stack.http.post(f"{stack.url('booking-agent')}/bookings", json=body)
    assert response.status_code == 422, response.text
    assert field in {str(part) for item in response.json()["detail"] for part in item["loc"]}


@pytest.mark.parametrize("change", [{"hotel_id": "nowhere-99"}, {"city": "Atlantis"}])
def test_a_city_or_hotel_search_cannot_serve_fails_the_booking_with_what_search_says(
    stack: Stack, change: dict[str, object]
) -> None:
    # booking-agent does not read the simulator's inventory: whether a city or hotel can be served is search's call
    booking = stack.wait(stack.book(**change)["booking_id"])
    assert booking["status"] == "failed"
    assert booking["error"]["code"] == "no_availability"
    assert not [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == booking["booking_id"]]


def test_malformed_and_oversized_bodies_and_bad_budgets(stack: Stack) -> None:
    url = f"{stack.url('booking-agent')}/bookings"
    malformed = stack.http.post(url, content=b'{"city": ', headers={"Content-Type": "application/json"})
    assert malformed.status_code == 422
    huge = stack.http.post(url, content=b"x" * (65 * 1024), headers={"Content-Type": "application/json"})
    assert huge.status_code == 413
    bad_budget = stack.http.get(f"{url}/anything", headers={"X-Timeout-Budget": "soon"})
    assert bad_budget.status_code == 400
    assert "X-Timeout-Budget" in bad_budget.text
    assert stack.http.get(f"{url}/does-not-exist").status_code == 404
    assert stack.http.get(f"{url}/x", params={"wait": "-1"}).status_code == 422


def test_search_agent_serves_hotels_for_people(stack: Stack) -> None:
    checkin, checkout = stay()
    response = stack.http.get(
        f"{stack.url('search-agent')}/hotels",
        params={"city": "Paris", "checkin": checkin, "checkout": checkout, "guests": 2},
    )
    assert response.status_code == 200
    offers = response.json()["offers"]
    assert offers and all(o["city"] == "Paris" for o in offers)
    prices = [o["price_per_night"] for o in offers]
    assert prices == sorted(prices)
    bad = stack.http.get(f"{stack.url('search-agent')}/hotels", params={"city": "Paris", "checkin": "x"})
    assert bad.status_code == 422


def test_search_agent_matches_a_city_as_a_hotel_site_would(stack: Stack) -> None:
    """A small model asked for "Lisboa": the same offers as "Lisbon", however it is written."""
    checkin, checkout = stay(days_ahead=70)

    def offers(city: str) -> list[dict[str, Any]]:
        params = {"city": city, "checkin": checkin, "checkout": checkout, "guests": 2}
        response = stack.http.get(f"{stack.url('search-agent')}/hotels", params=params)
        assert response.status_code == 200, response.text
        return list(response.json()["offers"])

    lisbon = offers("Lisbon")
    assert lisbon and all(o["city"] == "Lisbon" for o in lisbon)
    for city in ("Lisboa", "LISBON", "lisbon "):
        assert offers(city) == lisbon, city


def test_a_booking_in_lisboa_books_in_lisbon(stack: Stack) -> None:
    booking = stack.wait(stack.book(city="lisboa")["booking_id"])
    assert booking["status"] == "confirmed", booking["error"]
    assert booking["hotel_id"].startswith("lisbon-")


def test_one_trace_follows_a_booking_across_every_process(stack: Stack) -> None:
    booking = stack.wait(stack.book(city="Madrid")["booking_id"])
    assert booking["status"] == "confirmed"
    time.sleep(0.5)  # span processors export on end; give the last ones a moment to hit the files
    booking_spans = stack.spans("booking-agent")
    run_spans = [s for s in booking_spans if s["attributes"].get("langgraph.thread_id") == booking["booking_id"]]
    node_names = {s["name"] for s in run_spans}
    assert {"node search", "node reserve", "node charge", "node confirm"} <= node_names
    trace_ids = {s["trace_id"] for s in run_spans}
    assert len(trace_ids) == 1
    trace_id = trace_ids.pop()
    for service in ("search-agent", "payment-agent", "hotel-api", "payment-api"):
        assert any(s["trace_id"] == trace_id for s in stack.spans(service)), f"{service} not in the trace"
    assert any(s["trace_id"] == trace_id and s["name"] == "node charge" for s in stack.spans("payment-agent"))


def test_health_endpoints_on_every_service(stack: Stack) -> None:
    for service in ("hotel-api", "payment-api", "search-agent", "payment-agent", "booking-agent"):
        base = stack.url(service)
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/health/ready").status_code == 200
        assert isinstance(httpx.get(f"{base}/health/bulkheads").json(), dict)
        assert isinstance(httpx.get(f"{base}/health/circuits").json(), dict)
        assert "# TYPE" in httpx.get(f"{base}/metrics").text
    bulkheads = httpx.get(f"{stack.url('booking-agent')}/health/bulkheads").json()
    assert bulkheads["booking_agent"]["max"] == 10
