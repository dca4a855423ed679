"""``concierge serve`` as a real process: state survives ``kill -9``, SIGTERM shuts down cleanly, bad names exit 2."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stack import SERVICES
from tests.conftest import TEST_ADMIN_TOKEN, TEST_SERVICE_SECRET
from tests.procs import HOST, Processes, concierge_command, free_port
from tests.stack import ProviderAuth

pytestmark = pytest.mark.e2e

STAY = {"hotel_id": "lisbon-02", "checkin": "2033-06-01", "checkout": "2033-06-04", "guests": 3, "reference": "bk-e2e"}
# ``redis`` (through ``settings_env``) gives the processes the test secret and this admin token
ADMIN = {"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}
BOOKING_AGENT = ProviderAuth("hotel-api", TEST_SERVICE_SECRET)  # the key hotel-api issued booking-agent


@pytest.fixture
def procs(tmp_path: Path, redis: object, redis_url: str, key_prefix: str) -> Iterator[Processes]:
    # ``redis`` (the fixture) removes this test's keys afterwards.
    with Processes(tmp_path, env={"REDIS_URL": redis_url, "CONCIERGE_KEY_PREFIX": key_prefix}) as procs:
        yield procs


def availability(url: str) -> int:
    params = {"hotel_id": STAY["hotel_id"], "checkin": STAY["checkin"], "checkout": STAY["checkout"]}
    return int(httpx.get(f"{url}/admin/availability", params=params, headers=ADMIN).json()["available_rooms"])


def test_reservation_survives_kill_9(procs: Processes) -> None:
    hotel = procs.serve("hotel-api")
    before = availability(hotel.url)
    held = httpx.post(f"{hotel.url}/reservations", json=STAY, headers={"Idempotency-Key": "e2e-1"}, auth=BOOKING_AGENT)
    assert held.status_code == 201, held.text
    reservation = held.json()
    assert availability(hotel.url) == before - 2

    hotel.kill()
    assert hotel.returncode == -9
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{hotel.url}/health")

    hotel = procs.serve("hotel-api", port=hotel.port)
    fetched = httpx.get(f"{hotel.url}/reservations/{reservation['reservation_id']}", auth=BOOKING_AGENT)
    assert fetched.json() == reservation
    assert availability(hotel.url) == before - 2
    # the idempotency record survived too: the same request is answered, not executed again
    replay = httpx.post(
        f"{hotel.url}/reservations", json=STAY, headers={"Idempotency-Key": "e2e-1"}, auth=BOOKING_AGENT
    )
    assert (replay.status_code, replay.json()) == (201, reservation)
    assert availability(hotel.url) == before - 2


def test_sigterm_runs_the_lifespan_shutdown(procs: Processes) -> None:
    payment = procs.serve("payment-api")
    assert httpx.get(f"{payment.url}/health").json()["service"] == "payment-api"
    # uvicorn re-raises the signal once shut down, so a supervisor sees "ended by SIGTERM"
    assert payment.terminate() in (0, -15)
    log = payment.log_text()
    assert "payment-api stopped" in log
    assert "Application shutdown complete" in log
    assert "Traceback" not in log


def test_unknown_service_exits_2_with_one_line() -> None:
    result = subprocess.run([*concierge_command(), "serve", "nope"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "nope" in lines[0]
    assert all(name in lines[0] for name in SERVICES)
    assert result.stdout == ""


def _requests_logged(procs: Processes, name: str, *, env: dict[str, str], args: tuple[str, ...] = ()) -> bool:
    port = free_port()
    argv = [*concierge_command(), "serve", "payment-api", "--host", HOST, "--port", str(port), *args]
    service = procs.start(name, argv, port=port, env=env)
    assert httpx.get(f"{service.url}/admin/ledger", headers=ADMIN).status_code == 200
    service.terminate()
    return '"GET /admin/ledger HTTP/1.1" 200' in service.log_text()


def test_access_log_is_off_by_default_and_switched_by_env_or_flag(procs: Processes) -> None:
    assert not _requests_logged(procs, "default", env={})
    assert _requests_logged(procs, "env-on", env={"CONCIERGE_ACCESS_LOG": "true"})
    # the flag wins over the environment, both ways
    assert not _requests_logged(procs, "flag-off", env={"CONCIERGE_ACCESS_LOG": "true"}, args=("--no-access-log",))
    assert _requests_logged(procs, "flag-on", env={}, args=("--access-log",))
