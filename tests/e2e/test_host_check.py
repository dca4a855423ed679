"""No page elsewhere may drive the stack: ``concierge up`` (search-agent scaled behind its front), the real CLI, and
requests as a DNS-rebinding page sends them from someone's browser (``Host: evil.example:<port>`` and the matching
``Origin``): refused by every service of the table before anything runs, while the stack's own paths keep working.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from stack.services import DEFAULT_STACK, SERVICES
from stack.state import StackPaths, pid_alive, read_secrets, read_state
from tests.procs import concierge_command, concierge_env, stack_port_base

pytestmark = pytest.mark.e2e

CONSOLE = {"X-Concierge-Console": "1"}
EVIL = "evil.example"


def concierge(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*concierge_command(), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


class UpStack:
    """What a test needs of the running stack: its env, where its files are, each service's URL (a front's for a
    scaled one), the admin token ``up`` generated and a console session from the login link it printed."""

    def __init__(self, env: dict[str, str], data: Path, printed: str) -> None:
        self.env = env
        self.paths = StackPaths.at(data)
        self.logs = data / "logs"
        state = read_state(self.paths)
        assert state is not None
        self.urls = {i.service: i.url for i in state.instances if i.replica == 1} | dict(state.fronts)
        stack_secrets = read_secrets(self.paths)
        assert stack_secrets is not None
        self.admin = {"Authorization": f"Bearer {stack_secrets.admin_token}"}
        link = next(word for word in printed.split() if "/?login=" in word)  # `up` prints it under the table
        opened = httpx.get(link, timeout=30)
        assert opened.status_code == 303, opened.text
        self.session = {"Cookie": f"concierge_console={opened.cookies['concierge_console']}"}

    def port(self, service: str) -> int:
        port = urlsplit(self.urls[service]).port
        assert port is not None
        return port

    def as_page_of(self, host: str, service: str) -> dict[str, str]:
        """What a browser sends with a page's request to ``service`` when the page's address is ``host``."""
        origin = f"{host}:{self.port(service)}"
        session = self.session if service == "console" else {}
        return {"Host": origin, "Origin": f"http://{origin}", **CONSOLE, **session}

    def pid(self, service: str) -> int | None:
        state = read_state(self.paths)
        assert state is not None
        return next(i.pid for i in state.instances if i.name == service)

    def faults(self) -> dict[str, Any]:
        response = httpx.get(f"{self.urls['hotel-api']}/admin/faults", headers=self.admin, timeout=10)
        assert response.status_code == 200, response.text
        return dict(response.json())


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[UpStack]:
    tmp = tmp_path_factory.mktemp("hosts")
    env = concierge_env(tmp / "data", redis_url, prefix="hosts", BOOKING_BUDGET_S="30")
    # the second replica and the front take the ports after the table's: a free block holds all of them
    base = str(stack_port_base({"search-agent": 2}))
    started = concierge(
        env, "up", "--detach", "--scale", "search-agent=2", "--timeout", "150", "--port-base", base, timeout=240
    )
    log = tmp / "data" / "logs" / "supervisor.log"
    assert started.returncode == 0, f"{started.stdout}\n{started.stderr}\n{log.read_text() if log.exists() else ''}"
    try:
        yield UpStack(env, tmp / "data", started.stdout)
    finally:
        state = read_state(StackPaths.at(tmp / "data"))
        if state is not None and any(pid_alive(pid) for pid in state.pids()):
            concierge(env, "down", timeout=120)


def refused(response: httpx.Response) -> bool:
    return response.status_code == 421 and response.json()["error"]["code"] == "host_not_allowed"


def bookings(up: UpStack) -> list[str]:
    response = httpx.get(f"{up.urls['booking-agent']}/bookings", params={"limit": 100}, timeout=10)
    assert response.status_code == 200, response.text
    return [b["booking_id"] for b in response.json()["bookings"]]


def test_a_rebinding_page_can_neither_drive_the_console_nor_reach_booking_agent(up: UpStack) -> None:
    console, agent, concierge = up.urls["console"], up.urls["booking-agent"], up.urls["concierge-agent"]
    page, agent_page = up.as_page_of(EVIL, "console"), up.as_page_of(EVIL, "booking-agent")
    concierge_page = up.as_page_of(EVIL, "concierge-agent")
    search_pid, before = up.pid("search-agent:1"), bookings(up)
    checkin = (dt.date.today() + dt.timedelta(days=45)).isoformat()
    checkout = (dt.date.today() + dt.timedelta(days=47)).isoformat()
    stay = {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2, "payment_token": "tok_visa"}

    answers = {
        "inject a fault": httpx.put(f"{console}/api/faults/hotel-api", json={"latency_s": 5}, headers=page),
        "read the overview": httpx.get(f"{console}/api/overview", headers=page, timeout=10),
        "stop search-agent": httpx.post(f"{console}/api/services/search-agent:1/stop", headers=page, timeout=30),
        "book from the console": httpx.post(
            f"{console}/api/bookings", json={"city": "Lisbon", "checkin": checkin}, headers=page, timeout=30
        ),
        "book at booking-agent": httpx.post(f"{agent}/bookings", json=stay, headers=agent_page, timeout=30),
        "list the bookings": httpx.get(f"{agent}/bookings", headers=agent_page, timeout=10),
        "open a chat at concierge-agent": httpx.post(f"{concierge}/chats", headers=concierge_page, timeout=10),
        "approve a booking at concierge-agent": httpx.post(
            f"{concierge}/chats/c1/approvals/ap_1", json={"approve": True}, headers=concierge_page, timeout=10
        ),
        "list the chats": httpx.get(f"{concierge}/chats", headers=concierge_page, timeout=10),
    }

    time.sleep(1)  # a stop the supervisor had been asked for would have happened by now
    assert up.faults()["latency_s"] == 0, "the page injected a fault"
    assert up.pid("search-agent:1") == search_pid and pid_alive(search_pid or 0), "the page stopped search-agent"
    assert bookings(up) == before, "the page booked"
    assert "services" not in answers["read the overview"].text, "the page read the overview"
    assert [what for what, answer in answers.items() if not refused(answer)] == []
    # logged once per offending host however many requests it sent
    lines = [line for line in (up.logs / "console.log").read_text().splitlines() if "refusing requests" in line]
    assert len(lines) == 1 and EVIL in lines[0], lines


def test_the_stack_works_by_its_own_names_through_the_console_and_the_scaled_front(up: UpStack) -> None:
    console = up.urls["console"]
    for host in ("localhost", "127.0.0.1"):
        page = up.as_page_of(host, "console")
        assert httpx.put(f"{console}/api/faults/hotel-api", json={"latency_s": 0.01}, headers=page).status_code < 300
        assert up.faults()["latency_s"] == 0.01
        assert httpx.delete(f"{console}/api/faults/hotel-api", headers=page).status_code < 300
        assert up.faults()["latency_s"] == 0
        overview = httpx.get(f"{console}/api/overview", headers=page, timeout=10)
        assert overview.status_code == 200, overview.text
        assert {s["service"] for s in overview.json()["services"]} == set(DEFAULT_STACK) - {"console"}

    # a booking from the page: console → booking-agent → search-agent's front → a replica, payment-agent, providers
    page = up.as_page_of("localhost", "console")
    checkin = (dt.date.today() + dt.timedelta(days=46)).isoformat()
    accepted = httpx.post(
        f"{console}/api/bookings", json={"city": "Lisbon", "checkin": checkin, "nights": 2}, headers=page, timeout=30
    )
    assert accepted.status_code == 202, accepted.text
    booking_id = accepted.json()["booking_id"]
    final = httpx.get(f"{up.urls['booking-agent']}/bookings/{booking_id}", params={"wait": 30}, timeout=40).json()
    assert final["status"] == "confirmed", final

    # the buttons that drive the supervisor still work for the page itself
    stopped = httpx.post(f"{console}/api/services/recovery-worker/stop", headers=page, timeout=130)
    assert stopped.status_code == 200, stopped.text
    started = httpx.post(f"{console}/api/services/recovery-worker/start", headers=page, timeout=130)
    assert started.status_code == 200, started.text
    status = json.loads(concierge(up.env, "status", "--json").stdout)
    assert {i["status"] for i in status["instances"]} == {"up"}, status["instances"]


@pytest.mark.parametrize("service", list(DEFAULT_STACK))
def test_every_service_of_the_table_refuses_a_host_that_is_not_its_own(up: UpStack, service: str) -> None:
    url, port = up.urls[service], up.port(service)
    ready = SERVICES[service].ready_path
    for host in (f"{EVIL}:{port}", EVIL, f"{service}.{EVIL}:{port}", f"localhost.{EVIL}"):
        response = httpx.get(f"{url}{ready}", headers={"Host": host}, timeout=10)
        assert refused(response), (host, response.status_code, response.text)
        assert service in response.json()["error"]["message"]
    # its own name (compose, a Kubernetes Service), loopback names, the pod IP a kubelet's probe sends
    for host in (f"{service}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"10.1.2.3:{port}", None):
        headers = {"Host": host} if host else {}
        response = httpx.get(f"{url}{ready}", headers=headers, timeout=10)
        assert response.status_code == 200, (host, response.status_code, response.text)
