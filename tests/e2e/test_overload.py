"""Overload: a burst far past booking-agent's in-flight cap, on real processes.

An accepted booking is a promise. So the door sheds (202 or 429 with ``Retry-After``, nothing else) and whatever
it accepted confirms, exactly once, however full the bulkheads behind it were: a run waits for a slot within its
budget instead of failing. The cap is low (``BOOKING_MAX_IN_FLIGHT``) so the burst stays CI-sized.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.stack import CORE, Stack, fresh_database

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CAP = 40
BURST = 300
ENV = {"BOOKING_MAX_IN_FLIGHT": str(CAP)}
CITIES = ("Lisbon", "Porto", "Madrid", "Barcelona", "Paris", "London", "Berlin", "Rome", "Amsterdam", "Vienna")
FINAL = {"confirmed", "failed"}
START_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    """The five services with a low in-flight cap; this module's own, so no other test's load changes the figures."""
    tmp: Path = tmp_path_factory.mktemp("overload")
    with fresh_database() as database_url, Stack(tmp, redis_url, database_url=database_url, env=ENV) as stack:
        stack.start()
        yield stack


def request_body(n: int, *, days_ahead: int = 100) -> dict[str, Any]:
    """A one-night stay of its own (city x date), so no booking can fail for want of a room."""
    checkin = dt.date.today() + dt.timedelta(days=days_ahead + n // len(CITIES))
    return {
        "city": CITIES[n % len(CITIES)],
        "checkin": checkin.isoformat(),
        "checkout": (checkin + dt.timedelta(days=1)).isoformat(),
        "guests": 2,
        "payment_token": "tok_visa",
    }


@dataclass
class Answer:
    status: int
    retry_after: str | None
    body: dict[str, Any]
    seconds: float
    """How long the POST took."""
    final: dict[str, Any] | None = None
    """The booking once final (202s only)."""


async def wait_final(client: httpx.AsyncClient, booking_id: str, within_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + within_s
    while True:
        left = deadline - time.monotonic()
        response = await client.get(f"/bookings/{booking_id}", params={"wait": max(0.1, min(left, 20))})
        assert response.status_code == 200, response.text
        booking: dict[str, Any] = response.json()
        if booking["status"] in FINAL or left <= 0:
            return booking


_TLS = ssl.create_default_context()


def new_client(stack: Stack) -> httpx.AsyncClient:
    """A client of its own per request: one pool shared by hundreds of connections spends more time in its own
    bookkeeping than the server does answering (seconds for 300), and each client building its own TLS context
    costs ~35 ms, so they share one."""
    return httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=120, verify=_TLS)


async def post_and_follow(stack: Stack, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
    async with new_client(stack) as client:
        started = time.monotonic()
        response = await client.post("/bookings", json=body, headers=headers or {})
        answer = Answer(response.status_code, response.headers.get("Retry-After"), response.json(), 0.0)
        answer.seconds = time.monotonic() - started
        if response.status_code == 202:
            answer.final = await wait_final(client, answer.body["booking_id"])
    return answer


def bulkheads(stack: Stack, service: str) -> dict[str, dict[str, int]]:
    return dict(stack.http.get(f"{stack.url(service)}/health/bulkheads").json())


def slots_in_use(stack: Stack, within_s: float = 10.0) -> int:
    """The cap's slots in use once the runs wind down: a booking reads final a moment before its run has ended."""
    deadline = time.monotonic() + within_s
    while (in_use := bulkheads(stack, "booking-agent")["booking_runs"]["in_use"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(in_use)


def rejected(stack: Stack) -> dict[str, int]:
    """Refusals so far by every bulkhead a booking goes through: the door's cap, booking-agent's outbound ones,
    the peers' inbound ones."""
    figures = {f"booking-agent {name}": s["rejected"] for name, s in bulkheads(stack, "booking-agent").items()}
    for service in ("search-agent", "payment-agent"):
        figures |= {f"{service} {name}": s["rejected"] for name, s in bulkheads(stack, service).items()}
    return figures


def assert_exactly_once(stack: Stack, ids: set[str]) -> None:
    reservations = [r for r in stack.ledger("hotel-api")["reservations"] if r["reference"] in ids]
    confirmed = Counter(r["reference"] for r in reservations if r["status"] == "confirmed")
    assert confirmed == Counter(ids), "one confirmed reservation per booking"
    assert not [r for r in reservations if r["status"] == "held"], "no room left on hold"
    charges = [c for c in stack.ledger("payment-api")["charges"] if c["reference"] in ids]
    captured = Counter(c["reference"] for c in charges if c["status"] == "captured")
    assert captured == Counter(ids), "one captured charge per booking"


def assert_refusal(answer: Answer) -> None:
    assert answer.retry_after is not None and int(answer.retry_after) >= 1, answer
    error = answer.body["error"]
    assert error["code"] == "overloaded" and error["limit"] == CAP, error
    assert "in flight" in error["message"] and "BOOKING_MAX_IN_FLIGHT" in error["message"], error


def test_a_burst_past_the_cap_is_shed_at_the_door_and_every_accepted_booking_confirms(stack: Stack) -> None:
    before = rejected(stack)

    async def burst() -> tuple[list[Answer], float]:
        started = time.monotonic()
        answers = await asyncio.gather(*(post_and_follow(stack, request_body(n)) for n in range(BURST)))
        return answers, time.monotonic() - started

    answers, all_final_s = asyncio.run(burst())

    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {202, 429}, {s: [a.body for a in answers if a.status == s][:3] for s in statuses}
    accepted = [answer for answer in answers if answer.status == 202]
    refused = [answer for answer in answers if answer.status == 429]
    assert len(accepted) >= CAP and refused, statuses
    for answer in refused:
        assert_refusal(answer)
    finals = Counter(answer.final["status"] for answer in accepted if answer.final)
    failures = [answer.final["error"] for answer in accepted if answer.final and answer.final["status"] != "confirmed"]
    assert finals == {"confirmed": len(accepted)}, failures[:5]
    ids = {answer.body["booking_id"] for answer in accepted}
    assert len(ids) == len(accepted)
    assert_exactly_once(stack, ids)

    after = rejected(stack)
    refusals = {name: after[name] - before.get(name, 0) for name in after}
    assert refusals.pop("booking-agent booking_runs") == len(refused), "every 429 is the cap's, counted once"
    assert not {name: n for name, n in refusals.items() if n}, "no bulkhead behind the door refused anything"
    assert slots_in_use(stack) == 0, "every run gave its slot back"

    refusal_s = sorted(answer.seconds for answer in refused)
    print(
        f"\n{BURST} concurrent POSTs, cap {CAP}: {dict(statuses)}; all final in {all_final_s:.1f}s; "
        f"429 in p50 {statistics.median(refusal_s) * 1000:.0f} ms, max {refusal_s[-1] * 1000:.0f} ms; "
        f"202 in max {max(answer.seconds for answer in accepted) * 1000:.0f} ms"
    )


def test_at_capacity_a_retry_of_an_accepted_booking_still_gets_it(stack: Stack) -> None:
    keys = [f"overload-{uuid.uuid4().hex}" for _ in range(CAP)]
    bodies = [request_body(n, days_ahead=200) for n in range(CAP)]
    stack.fault("payment-api", latency_s=1.5)  # every run now holds its slot for at least 1.5 s
    try:

        async def post(body: dict[str, Any], key: str) -> httpx.Response:
            async with new_client(stack) as client:
                return await client.post("/bookings", json=body, headers={"Idempotency-Key": key})

        async def fill_then_knock() -> tuple[list[httpx.Response], httpx.Response, httpx.Response, httpx.Response]:
            filled = await asyncio.gather(*(post(body, key) for body, key in zip(bodies, keys, strict=True)))
            async with new_client(stack) as client:
                new = await client.post("/bookings", json=request_body(CAP, days_ahead=200))
                retry = await client.post("/bookings", json=bodies[0], headers={"Idempotency-Key": keys[0]})
                reused = await client.post("/bookings", json=bodies[1], headers={"Idempotency-Key": keys[0]})
                return filled, new, retry, reused

        filled, new, retry, reused = asyncio.run(fill_then_knock())
    finally:
        stack.fault("payment-api")

    assert [r.status_code for r in filled] == [202] * CAP, [r.text for r in filled if r.status_code != 202][:3]
    assert new.status_code == 429, new.text
    assert_refusal(Answer(new.status_code, new.headers.get("Retry-After"), new.json(), 0.0))
    assert retry.status_code == 202, retry.text
    assert retry.json()["booking_id"] == filled[0].json()["booking_id"]
    assert reused.status_code == 422, reused.text  # the same key with another body is still refused as such

    ids = {r.json()["booking_id"] for r in filled}
    finals = [stack.wait(booking_id, timeout=90) for booking_id in ids]
    assert [b["status"] for b in finals] == ["confirmed"] * CAP, [b["error"] for b in finals]
    assert_exactly_once(stack, ids)


def test_runs_wait_out_full_bulkheads_behind_the_door_instead_of_failing(stack: Stack) -> None:
    """Slow providers keep every bulkhead behind the door full for longer than its ``acquire_timeout``.

    hotel-api answers in 1.5 s, so the 20 slots of ``outbound:search_agent`` turn over once every 1.5 s: half of
    CAP runs wait longer than its 1 s ``acquire_timeout``. payment-api answers in 1 s, so booking-agent's 20
    ``outbound:payment_api`` slots and payment-agent's 5 inbound ones serve CAP charges in about 8 s, far past their
    1 s and (formerly) 2 s ``acquire_timeout``. Every booking still confirms, within the default 60 s budget.
    """
    before = rejected(stack)
    stack.fault("hotel-api", latency_s=1.5)
    stack.fault("payment-api", latency_s=1.0)
    try:

        async def load() -> tuple[list[Answer], float]:
            started = time.monotonic()
            bodies = [request_body(n, days_ahead=300) for n in range(CAP)]
            answers = await asyncio.gather(*(post_and_follow(stack, body) for body in bodies))
            return answers, time.monotonic() - started

        answers, all_final_s = asyncio.run(load())
    finally:
        stack.fault("hotel-api")
        stack.fault("payment-api")

    assert [answer.status for answer in answers] == [202] * CAP, [a.body for a in answers if a.status != 202][:3]
    failures = [answer.final for answer in answers if answer.final and answer.final["status"] != "confirmed"]
    assert not failures, [(f["status"], f["error"]) for f in failures[:5]]
    assert_exactly_once(stack, {answer.body["booking_id"] for answer in answers})
    after = rejected(stack)
    assert not {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
    print(f"\n{CAP} bookings through slow providers: all confirmed in {all_final_s:.1f}s, no bulkhead refused one")


@pytest.fixture(scope="module")
def adaptive_stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    """The five services with the door as it ships: adaptive (no ``BOOKING_MAX_IN_FLIGHT``, not even inherited)."""
    tmp: Path = tmp_path_factory.mktemp("adaptive-door")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("BOOKING_MAX_IN_FLIGHT", raising=False)
        with fresh_database() as database_url, Stack(tmp, redis_url, database_url=database_url) as stack:
            for service in CORE:
                # a two-core machine shared by a whole team can take over a minute to start one service
                stack.serve(service, wait=False).wait_ready(START_TIMEOUT_S)
            yield stack


def test_the_adaptive_door_sheds_a_burst_with_429_and_retry_after_and_never_a_5xx(adaptive_stack: Stack) -> None:
    stack = adaptive_stack
    door = stack.http.get(f"{stack.url('booking-agent')}/health/door").json()
    assert door["door"] == "adaptive" and door["min"] <= door["limit"] <= door["max"], door
    before = rejected(stack)

    async def burst() -> list[Answer]:
        # most without a key (refused before their body is read), some with one (refused by the door's admit)
        unkeyed = (post_and_follow(stack, request_body(n, days_ahead=20)) for n in range(BURST))
        keyed = (
            post_and_follow(stack, request_body(BURST + n, days_ahead=20), {"Idempotency-Key": uuid.uuid4().hex})
            for n in range(BURST // 5)
        )
        return await asyncio.gather(*unkeyed, *keyed)

    answers = asyncio.run(burst())

    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {202, 429}, {s: [a.body for a in answers if a.status == s][:3] for s in statuses}
    refused = [answer for answer in answers if answer.status == 429]
    accepted = [answer for answer in answers if answer.status == 202]
    assert refused and accepted, statuses
    for answer in refused:
        assert answer.retry_after is not None and int(answer.retry_after) >= 1, answer
        error = answer.body["error"]
        assert error["code"] == "overloaded" and door["min"] <= error["limit"] <= door["max"], error
        assert "adaptive limit" in error["message"], error
    finals = Counter(answer.final["status"] for answer in accepted if answer.final)
    assert finals == {"confirmed": len(accepted)}, [a.final for a in accepted if a.final][:3]
    assert_exactly_once(stack, {answer.body["booking_id"] for answer in accepted})

    after = rejected(stack)
    refusals = {name: after[name] - before.get(name, 0) for name in after}
    assert refusals.pop("booking-agent booking_runs") == len(refused), "every 429 is the door's, counted once"
    assert not {name: n for name, n in refusals.items() if n}, "no bulkhead behind the door refused anything"
    assert slots_in_use(stack) == 0, "every run gave its slot back"
    learned = stack.http.get(f"{stack.url('booking-agent')}/health/door").json()
    assert learned["rtt_s"] is not None and learned["baseline_s"] is not None, "the runs' latency reached the limit"
    print(f"\nadaptive door, {len(answers)} concurrent POSTs: {dict(statuses)}; door now {learned}")
