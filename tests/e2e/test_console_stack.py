"""The console as docker-compose runs it (no supervisor: it finds the services by their URL variables) and the
metrics that tell the same story, against real processes: every service, the recovery worker and the console.

One booking loses its booking-agent (kill -9) while paying: the console's timeline relay outlives the agent and ends
at ``confirmed``; then the services' ``/metrics`` count the outcome, the time to final, the recovery and the
duplicate that did not happen, and every metric the Grafana dashboard queries is one a service exposes.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stack.services import DEFAULT_STACK
from tests.procs import free_port
from tests.stack import CORE, Stack, stay

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "concierge.json"
CONSOLE = {"X-Concierge-Console": "1"}
READY_S = 120.0
_METRIC = re.compile(r"\b(?:concierge|gen_ai)_[a-z0-9_]+\b")
# what a family of each type exposes (prometheus_client's suffixes)
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("console")
    env = {"RUN_LEASE_TTL": "1", "ORPHAN_SCAN_INTERVAL": "0.2", "BOOKING_BUDGET_S": "60"}
    with Stack(tmp, redis_url, env=env) as stack:
        stack.ports["console"] = free_port()
        # all at once, and a generous bound on the wait: the machine may be busy
        started = [
            stack.serve(name, wait=False)
            for name in (*CORE, "llm-api", "concierge-agent", "recovery-worker", "console")
        ]
        for proc in started:
            proc.wait_ready(timeout=READY_S)
        yield stack


def console(stack: Stack) -> str:
    return stack.url("console")


def dashboard_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and all(_METRIC.search(expr) for expr in exprs), exprs
    # label names (gen_ai_request_model in `by (...)` or in a matcher) look like metric names: leave them out
    series = [re.sub(r"\b(?:by|without)\s*\([^)]*\)|\{[^}]*\}", "", expr) for expr in exprs]
    return {name for expr in series for name in _METRIC.findall(expr)}


def exposed(text: str) -> set[str]:
    """Every series name a /metrics page declares, also for a family with no sample yet (a labelled counter)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


def value(text: str, name: str, **labels: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def held(stack: Stack) -> float:
    """How many requests payment-api has held for its latency fault so far."""
    text = httpx.get(f"{stack.url('payment-api')}/metrics", timeout=10).text
    return value(text, "concierge_provider_faults_injected_total", provider="payment-api", kind="latency")


def follow(stack: Stack, booking_id: str, kinds: list[str]) -> None:
    """The console's timeline stream, read to its end (the final entry, then the ``end`` event)."""
    url = f"{console(stack)}/api/bookings/{booking_id}/events"
    with stack.console.stream("GET", url, timeout=httpx.Timeout(10, read=90)) as response:
        assert response.status_code == 200
        event = None
        for line in response.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
            elif line.startswith("data:") and event is None:
                kinds.append(json.loads(line.partition(":")[2])["kind"])
            elif line.startswith("data:") and event == "end":
                return
            elif not line:
                event = None


def test_the_overview_without_a_supervisor(stack: Stack) -> None:
    overview = stack.console.get(f"{console(stack)}/api/overview", timeout=30).json()
    assert overview["supervised"] is False
    services = {s["name"]: s for s in overview["services"]}
    assert set(services) == set(DEFAULT_STACK) - {"console"}
    not_ready = {name: s for name, s in services.items() if s["ready"] is not True}
    assert not not_ready, not_ready
    assert overview["queue"] is not None and overview["queue"]["depth"] == 0
    assert overview["faults"]["payment-api"] == {"latency_s": 0.0, "error_rate": 0.0, "hang": False}
    assert {c["name"] for c in overview["circuits"]} >= {"hotel_api", "payment_api"}
    assert overview["bulkheads"]
    # the page and its assets come from the console itself, nothing from elsewhere
    page = stack.console.get(console(stack), timeout=10).text
    assert "/static/console.js" in page and "http" not in page.split("<body>")[1]
    assert stack.console.get(f"{console(stack)}/static/console.js", timeout=10).status_code == 200
    # the admin token is the console's own: nothing it serves contains it
    streamed = stack.console.get(f"{console(stack)}/api/overview", timeout=30).text
    assert stack.admin_token not in streamed and stack.admin_token not in page


def test_the_console_drives_llm_apis_faults_for_every_model(stack: Stack) -> None:
    base = console(stack)
    injected = stack.console.put(
        f"{base}/api/faults/llm-api", json={"latency_s": 1.5, "error_rate": 0.25}, headers=CONSOLE
    )
    assert injected.status_code == 200, injected.text
    expected = {"sim-large": (1.5, 0.25), "sim-small": (1.5, 0.25)}
    deadline = time.monotonic() + 10
    while True:  # the overview is built once a second
        faults = stack.console.get(f"{base}/api/overview", timeout=30).json()["faults"]["llm-api"]["models"]
        shown = {m: (f["first_token_latency_s"], f["error_rate"]) for m, f in faults.items()}
        if shown == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert shown == expected
    cleared = stack.console.delete(f"{base}/api/faults/llm-api", headers=CONSOLE)
    assert cleared.status_code == 200, cleared.text
    assert stack.admin("GET", "llm-api", "faults").json()["models"]["sim-large"]["first_token_latency_s"] == 0


def test_bad_input_is_a_4xx_naming_the_field(stack: Stack) -> None:
    base = console(stack)
    checkin, _ = stay()
    refused = stack.console.post(
        f"{base}/api/bookings", json={"city": "Lisbon", "checkin": checkin, "nights": 0}, headers=CONSOLE
    )
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "nights"]
    past = stack.console.post(f"{base}/api/bookings", json={"city": "Lisbon", "checkin": "2020-01-01"}, headers=CONSOLE)
    assert past.status_code == 422 and past.json()["detail"][0]["loc"] == ["body", "checkin"]
    fault = stack.console.put(f"{base}/api/faults/payment-api", json={"error_rate": 2}, headers=CONSOLE)
    assert fault.status_code == 422 and fault.json()["detail"][0]["loc"] == ["body", "error_rate"]
    unknown = stack.console.put(f"{base}/api/faults/search-agent", json={}, headers=CONSOLE)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["path", "provider"]
    target = stack.console.post(f"{base}/api/services/nope/kill", headers=CONSOLE)
    assert target.status_code == 422 and target.json()["detail"][0]["loc"] == ["path", "target"]
    booking = stack.console.get(f"{base}/api/bookings/not%20an%20id/events", timeout=10)
    assert booking.status_code == 422 and booking.json()["detail"][0]["loc"] == ["path", "booking_id"]
    resume = stack.console.get(f"{base}/api/bookings/abc/events", headers={"Last-Event-ID": "yesterday"}, timeout=10)
    assert resume.status_code == 422 and resume.json()["detail"][0]["loc"] == ["header", "Last-Event-ID"]
    # another origin, or no header of the page's: refused before anything is done, logged in or not
    foreign = stack.console.post(
        f"{base}/api/services/booking-agent/kill", headers={**CONSOLE, "Origin": "http://evil.example"}
    )
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "forbidden"
    bare = stack.console.post(
        f"{base}/api/bookings", json={"city": "Lisbon", "checkin": checkin}, headers={"X-Concierge-Console": ""}
    )
    assert bare.status_code == 403
    # no supervisor: the control buttons have nothing to drive
    control = stack.console.post(f"{base}/api/services/booking-agent/kill", headers=CONSOLE)
    assert control.status_code == 403 and "concierge up" in control.json()["error"]["message"]
    assert stack.services["booking-agent"].alive


def test_a_booking_that_loses_its_agent_in_the_timeline_and_in_the_metrics(stack: Stack) -> None:
    base = console(stack)
    before = {name: httpx.get(f"{stack.url(name)}/metrics", timeout=10).text for name in ("booking-agent",)}
    assert value(before["booking-agent"], "concierge_bookings_final_total", outcome="confirmed") == 0

    held_before = held(stack)
    injected = stack.console.put(f"{base}/api/faults/payment-api", json={"latency_s": 3}, headers=CONSOLE, timeout=10)
    assert injected.status_code == 200, injected.text
    checkin, _ = stay()
    booked = stack.console.post(
        f"{base}/api/bookings", json={"city": "Lisbon", "checkin": checkin}, headers=CONSOLE, timeout=30
    )
    assert booked.status_code == 202, booked.text
    booking_id = booked.json()["booking_id"]
    kinds: list[str] = []
    reader = threading.Thread(target=follow, args=(stack, booking_id, kinds), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while stack.booking(booking_id)["status"] != "paying":
        assert time.monotonic() < deadline, "never paying"
        time.sleep(0.05)
    # killed only once the charge is held at payment-api: "paying" is written before the charge is sent, and a kill
    # in between leaves nothing made to replay
    while held(stack) <= held_before:
        assert time.monotonic() < deadline, "the charge never reached payment-api"
        time.sleep(0.05)
    stack.services["booking-agent"].kill()
    cleared = stack.console.delete(f"{base}/api/faults/payment-api", headers=CONSOLE, timeout=10)
    assert cleared.status_code in (200, 204), cleared.text
    stack.serve("booking-agent", wait=False).wait_ready(timeout=READY_S)
    reader.join(timeout=120)
    assert not reader.is_alive(), f"the timeline never ended: {kinds}"
    assert kinds[0] == "accepted" and kinds[-1] == "confirmed", kinds
    assert "owner_lost" in kinds and "resumed" in kinds, kinds
    assert kinds.index("owner_lost") < kinds.index("resumed") < kinds.index("confirmed"), kinds
    assert stack.booking(booking_id)["status"] == "confirmed"

    # the same story in the metrics (the recovery worker finished it: its /metrics counts the outcome)
    metrics = {
        name: httpx.get(f"{stack.url(name)}/metrics", timeout=10).text for name in (*CORE, "recovery-worker", "console")
    }
    everywhere = "\n".join(metrics.values())
    assert value(everywhere, "concierge_bookings_final_total", outcome="confirmed") >= 1
    assert value(everywhere, "concierge_booking_time_to_final_seconds_count", outcome="confirmed") >= 1
    assert value(metrics["recovery-worker"], "concierge_recovery_time_seconds_count") >= 1
    assert value(everywhere, "concierge_duplicates_prevented_total") >= 1, "the resumed charge acted again?"

    # every metric the dashboard queries is one a service exposes
    names = set().union(*(exposed(text) for text in metrics.values()))
    missing = dashboard_metrics() - names
    assert not missing, f"the dashboard queries metrics no service exposes: {sorted(missing)}"


def test_a_cancel_from_the_console_is_counted(stack: Stack) -> None:
    base = console(stack)
    checkin, _ = stay()
    stack.fault("payment-api", latency_s=3)
    try:
        booked = stack.console.post(
            f"{base}/api/bookings", json={"city": "Lisbon", "checkin": checkin}, headers=CONSOLE, timeout=30
        )
        booking_id = booked.json()["booking_id"]
        cancelled = stack.console.post(f"{base}/api/bookings/{booking_id}/cancel", headers=CONSOLE, timeout=30)
        assert cancelled.status_code in (200, 202), cancelled.text
        kinds: list[str] = []
        follow(stack, booking_id, kinds)
        assert kinds[-1] == "cancelled", kinds
    finally:
        stack.fault("payment-api")
    unknown = stack.console.post(f"{base}/api/bookings/nosuchbooking/cancel", headers=CONSOLE, timeout=30)
    assert unknown.status_code == 404
    metrics = httpx.get(f"{stack.url('booking-agent')}/metrics", timeout=10).text
    assert value(metrics, "concierge_cancel_requests_total", outcome="requested") >= 1
    everywhere = "\n".join(
        httpx.get(f"{stack.url(n)}/metrics", timeout=10).text for n in ("booking-agent", "recovery-worker")
    )
    assert value(everywhere, "concierge_bookings_final_total", outcome="cancelled") >= 1
