"""The hostile world, against the real services: money moves only for the right caller.

No credential works on every install: the old default token, a static bearer equal to ``CONCIERGE_SERVICE_TOKEN``
or to the secret, and a token minted for another agent are all refused (401). A correctly signed token from a
service that has no business with money cannot charge or refund; nobody refunds a confirmed booking; the
providers' admin routes are the operator's; and a service without the deployment's secret does not start.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import SHARED_CORE
from tests.procs import HOST, Processes, ServiceProcess, concierge_command, free_port
from tests.stack import Stack

pytestmark = [pytest.mark.e2e, SHARED_CORE]

AGENTS = ("search-agent", "payment-agent", "booking-agent")
SKILL_OF = {"search-agent": "search_hotels", "payment-agent": "charge_payment", "booking-agent": "book_hotel"}
INVENTED = {"amount": 9999.99, "currency": "EUR", "payment_token": "tok_visa"}


def outcome(response: Any) -> dict[str, Any]:
    """What a blocking ``SendMessage`` answered: ``{"result": ...}`` or ``{"error": {"code", "message", ...}}``."""
    assert response.status_code == 200, response.text
    task = response.json()["result"]["task"]
    if task["status"]["state"] == "TASK_STATE_COMPLETED":
        return {"result": task["artifacts"][0]["parts"][0]["data"]}
    data: dict[str, Any] = task["status"]["message"]["parts"][0]["data"]
    return data


def charges_of(stack: Stack, reference: str) -> list[dict[str, Any]]:
    return [c for c in stack.ledger("payment-api")["charges"] if c["reference"] == reference]


# ------------------------------------------------------------------------------------------ (1) who is calling


@pytest.mark.parametrize("service", AGENTS)
def test_no_static_credential_opens_an_agent(stack: Stack, service: str) -> None:
    static = {
        "the old default token": "concierge-dev-token",
        "CONCIERGE_SERVICE_TOKEN, retired": stack.retired_token,
        "the secret itself": stack.secret,
    }
    for what, credential in static.items():
        response = stack.a2a(service, SKILL_OF[service], {}, authorization=f"Bearer {credential}")
        assert response.status_code == 401, f"{what}: {response.text}"
        assert response.json()["error"]["code"] == "unauthorized"
    assert stack.a2a(service, SKILL_OF[service], {}, authorization=None).status_code == 401


def test_a_token_minted_for_one_agent_is_refused_by_another(stack: Stack) -> None:
    for_payment = stack.service_token("booking-agent", "payment-agent")
    query = {"city": "Lisbon", "checkin": "2031-01-10", "checkout": "2031-01-12", "guests": 2}
    refused = stack.a2a("search-agent", "search_hotels", query, authorization=f"Bearer {for_payment}")
    assert refused.status_code == 401, refused.text
    # the same caller with a token for search-agent gets its answer: the token names the callee
    for_search = stack.service_token("booking-agent", "search-agent")
    answer = outcome(stack.a2a("search-agent", "search_hotels", query, authorization=f"Bearer {for_search}"))
    assert answer["result"]["offers"], answer
    # and a token from another deployment (another secret) opens nothing
    foreign = stack.service_token("booking-agent", "search-agent", secret="another-deployment-" + "x" * 40)
    assert stack.a2a("search-agent", "search_hotels", query, authorization=f"Bearer {foreign}").status_code == 401


def test_an_expired_token_is_refused(stack: Stack) -> None:
    stale = stack.service_token("booking-agent", "payment-agent", now=time.time() - 300)
    reference = f"expired-{uuid.uuid4().hex[:8]}"
    response = stack.a2a(
        "payment-agent", "charge_payment", {**INVENTED, "reference": reference}, authorization=f"Bearer {stale}"
    )
    assert response.status_code == 401
    assert charges_of(stack, reference) == []


# ------------------------------------------------------------------------------------------ (2) who may move money


@pytest.mark.parametrize("caller", ["search-agent", "payment-agent", "concierge-cli"])
def test_only_the_booking_saga_may_charge_or_refund(stack: Stack, caller: str) -> None:
    token = f"Bearer {stack.service_token(caller, 'payment-agent')}"
    reference = f"invented-{uuid.uuid4().hex[:8]}"
    charge = outcome(
        stack.a2a("payment-agent", "charge_payment", {**INVENTED, "reference": reference}, authorization=token)
    )
    assert charge["error"]["code"] == "forbidden", charge
    assert "booking-agent" in charge["error"]["message"]
    refund = outcome(stack.a2a("payment-agent", "refund_payment", {"reference": reference}, authorization=token))
    assert refund["error"]["code"] == "forbidden", refund
    assert charges_of(stack, reference) == [], "nothing reached payment-api"


# ------------------------------------------------------------------------------------------ (3) refunds


def test_a_confirmed_booking_is_never_refunded(stack: Stack) -> None:
    booking = stack.wait(stack.book()["booking_id"])
    assert booking["status"] == "confirmed", booking
    reference = booking["booking_id"]
    assert [c["status"] for c in charges_of(stack, reference)] == ["captured"]
    for caller in ("booking-agent", "recovery-worker"):  # even the callers allowed to refund
        token = f"Bearer {stack.service_token(caller, 'payment-agent')}"
        for data in ({"reference": reference}, {"reference": reference, "payment_id": booking["payment_id"]}):
            refused = outcome(stack.a2a("payment-agent", "refund_payment", data, authorization=token))
            assert refused["error"]["code"] == "forbidden", refused
            assert "confirmed" in refused["error"]["message"]
    assert [c["status"] for c in charges_of(stack, reference)] == ["captured"], "the charge stays captured"


def test_a_refund_needs_a_booking_and_one_that_did_not_confirm(stack: Stack) -> None:
    token = f"Bearer {stack.service_token('booking-agent', 'payment-agent')}"
    unknown = outcome(
        stack.a2a("payment-agent", "refund_payment", {"reference": "no-such-booking"}, authorization=token)
    )
    assert unknown["error"]["code"] == "forbidden", unknown
    # a booking that failed may be compensated again (a no-op here: its card was declined)
    failed = stack.wait(stack.book(payment_token="tok_declined")["booking_id"])
    assert failed["status"] == "failed"
    again = outcome(
        stack.a2a("payment-agent", "refund_payment", {"reference": failed["booking_id"]}, authorization=token)
    )
    assert again == {"result": {"refunded": [], "reference": failed["booking_id"]}}


# ------------------------------------------------------------------------------------------ (4) the operator's routes


@pytest.mark.parametrize(
    ("provider", "method", "path", "kwargs"),
    [
        ("hotel-api", "GET", "ledger", {}),
        (
            "hotel-api",
            "GET",
            "availability",
            {"params": {"hotel_id": "lisbon-01", "checkin": "2031-01-10", "checkout": "2031-01-11"}},
        ),
        ("hotel-api", "PUT", "faults", {"json": {"hang": True}}),
        ("payment-api", "GET", "ledger", {}),
        ("payment-api", "GET", "faults", {}),
        ("payment-api", "PUT", "faults", {"json": {"hang": True}}),
        ("payment-api", "DELETE", "faults", {}),
    ],
)
def test_admin_routes_need_the_admin_token(
    clean_faults: Stack, provider: str, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    stack = clean_faults
    url = f"{stack.url(provider)}/admin/{path}"
    for headers in ({}, {"Authorization": "Bearer not-the-admin-token"}, {"Authorization": f"Bearer {stack.secret}"}):
        refused = stack.http.request(method, url, headers=headers, **kwargs)
        assert refused.status_code == 401, refused.text
    assert stack.admin(method, provider, path, **kwargs).status_code == 200


@pytest.fixture(scope="module")
def bare_provider(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """payment-api started without CONCIERGE_ADMIN_TOKEN (same Redis, secret and prefix as the stack)."""
    env = {k: v for k, v in stack.env.items() if k != "CONCIERGE_ADMIN_TOKEN"}
    with Processes(tmp_path_factory.mktemp("bare"), env=env) as procs:
        if "CONCIERGE_ADMIN_TOKEN" in procs.env:  # inherited from this test process: not what we test
            del procs.env["CONCIERGE_ADMIN_TOKEN"]
        yield procs.serve("payment-api")


def test_without_an_admin_token_a_provider_has_no_admin_routes(stack: Stack, bare_provider: ServiceProcess) -> None:
    for method, path in (("GET", "ledger"), ("GET", "faults"), ("PUT", "faults"), ("DELETE", "faults")):
        for headers in ({}, {"Authorization": f"Bearer {stack.admin_token}"}):
            response = stack.http.request(method, f"{bare_provider.url}/admin/{path}", headers=headers, json={})
            assert response.status_code == 404, response.text
    assert stack.http.get(f"{bare_provider.url}/health").status_code == 200


def test_concierge_fault_says_in_one_line_what_the_provider_refused(
    stack: Stack, bare_provider: ServiceProcess
) -> None:
    env = {k: v for k, v in {**os.environ, **stack.env}.items() if k != "CONCIERGE_ADMIN_TOKEN"}
    env["CONCIERGE_DATA_DIR"] = str(stack.tmp_path / "no-stack-here")
    off = concierge(env, "fault", "payment-api", "--url", bare_provider.url)
    assert off.returncode == 1 and _one_line(off.stderr).endswith("runs without CONCIERGE_ADMIN_TOKEN")
    wrong = concierge(
        {**env, "CONCIERGE_ADMIN_TOKEN": "guessed"}, "fault", "payment-api", "--url", stack.url("payment-api")
    )
    assert wrong.returncode == 1 and "refused the admin token (HTTP 401)" in _one_line(wrong.stderr)
    right = concierge(
        {**env, "CONCIERGE_ADMIN_TOKEN": stack.admin_token}, "fault", "payment-api", "--url", stack.url("payment-api")
    )
    assert right.returncode == 0 and "payment-api faults: none" in right.stdout, right.stderr


# ------------------------------------------------------------------------------------------ (5) no secret, no start


def concierge(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("secret", [None, "", "concierge-dev-token", "too-short"])
@pytest.mark.parametrize("service", ["payment-agent", "hotel-api"])
def test_a_service_without_the_secret_exits_with_a_one_line_reason(
    stack: Stack, tmp_path: Path, service: str, secret: str | None
) -> None:
    env = {k: v for k, v in {**os.environ, **stack.env}.items() if k != "CONCIERGE_SERVICE_SECRET"}
    if secret is not None:
        env["CONCIERGE_SERVICE_SECRET"] = secret
    result = concierge(env, "serve", service, "--host", HOST, "--port", str(free_port()))
    assert result.returncode == 1
    line = _one_line(result.stderr)
    assert line.startswith(f"concierge serve {service}: CONCIERGE_SERVICE_SECRET")
    assert result.stdout == ""
