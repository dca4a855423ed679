"""What one client can hold of a service, over raw sockets against real processes (infra/service/server.py).

A header block over 32 KiB is refused (431) and its connection closed, however it arrives, and ten 16 MB headers
sent at once leave the service's memory where it was; headers or a body that dribble in are cut (408); a service
at its connection cap answers the next request 503 at once; an idle keep-alive connection is closed. No
credential is needed for any of this, so none is sent.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import HOST, ServiceProcess
from tests.stack import CORE, Stack

BOUNDS = {"HEADER_READ_TIMEOUT_S": "1", "BODY_READ_TIMEOUT_S": "2", "KEEP_ALIVE_IDLE_S": "1"}
DEADLINE_S = 60.0
"""How long a test waits for a service to act (never a measure of how fast it did)."""


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    """The five services, their header and body deadlines short enough for a test to wait out."""
    with Stack(tmp_path_factory.mktemp("server-bounds"), redis_url, env=BOUNDS) as stack:
        stack.start(CORE)
        yield stack


def _connect(url: str) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection((HOST, port), timeout=DEADLINE_S)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes, bool]:
    """The status, headers and body of the answer on ``sock``, and whether the server closed it afterwards."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed without an answer (had {data[:200]!r})")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body, _closed(sock)


def _closed(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (EOF or a reset), waiting up to the deadline for it."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _rss_mib(proc: ServiceProcess) -> float:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _error_code(body: bytes) -> str:
    return str(json.loads(body)["error"]["code"])


@pytest.mark.parametrize("service", CORE)
def test_a_whole_header_block_over_32_kib_is_refused_with_431_and_the_connection_closed(
    bounded: Stack, service: str
) -> None:
    with _connect(bounded.url(service)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 40_000 + b"\r\n\r\n")
        status, headers, body, closed = _answer(sock)
    assert status == 431, body
    assert _error_code(body) == "headers_too_large"
    assert headers.get("connection") == "close"
    assert closed


def test_a_header_block_just_under_the_bound_is_served(bounded: Stack) -> None:
    with _connect(bounded.url("booking-agent")) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 30_000 + b"\r\n\r\n")
        status, _, body, _ = _answer(sock)
    assert status == 200, body


def test_ten_16_mb_headers_at_once_are_refused_early_and_memory_stays_flat(bounded: Stack) -> None:
    booking = bounded.services["booking-agent"]
    before = _rss_mib(booking)
    socks = [_connect(bounded.url("booking-agent")) for _ in range(10)]
    try:
        for sock in socks:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ")
        refused = [False] * len(socks)
        chunk = b"a" * 65536
        for _ in range(16 * 1024 * 1024 // len(chunk)):  # 16 MB each, interleaved, never finished
            for i, sock in enumerate(socks):
                if refused[i]:
                    continue
                try:
                    sock.sendall(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    refused[i] = True
            if all(refused):
                break
        during = _rss_mib(booking)
        answers = []
        for sock in socks:
            with contextlib.suppress(ConnectionResetError):
                answers.append(_answer(sock)[0])
    finally:
        for sock in socks:
            sock.close()
    assert all(refused), "a 16 MB header was read to its end"
    assert answers and set(answers) == {431}, answers  # those whose answer was not lost to the reset
    assert during - before < 32, f"RSS grew from {before:.0f} to {during:.0f} MiB"
    assert bounded.http.get(f"{bounded.url('booking-agent')}/health").status_code == 200


def test_headers_that_dribble_in_are_cut_with_408(bounded: Stack) -> None:
    socks = [_connect(bounded.url("booking-agent")) for _ in range(20)]
    try:
        for sock in socks:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        cut: set[int] = set()
        deadline = time.monotonic() + DEADLINE_S
        while len(cut) < len(socks) and time.monotonic() < deadline:
            for i, sock in enumerate(socks):  # one header line each every 0.2 s: never a whole block
                if i not in cut:
                    try:
                        sock.sendall(b"X-Slow: 1\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        cut.add(i)
            time.sleep(0.2)
        assert len(cut) == len(socks), f"{len(socks) - len(cut)} slow header blocks still open"
    finally:
        for sock in socks:
            sock.close()


def test_a_slow_header_is_answered_408_before_it_is_closed(bounded: Stack) -> None:
    with _connect(bounded.url("hotel-api")) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        status, _, body, closed = _answer(sock)
    assert status == 408
    assert _error_code(body) == "request_timeout"
    assert closed


def test_a_connection_that_never_sends_a_byte_is_closed(bounded: Stack) -> None:
    with _connect(bounded.url("payment-api")) as sock:
        assert _closed(sock)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_that_dribbles_in_is_cut_with_408(bounded: Stack, chunked: bool) -> None:
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: 1000\r\n"
    with _connect(bounded.url("booking-agent")) as sock:
        sock.sendall(b"POST /bookings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + framing)
        sock.sendall(b"\r\n" + (b"1\r\n{\r\n" if chunked else b"{"))
        sock.settimeout(0.3)
        answer = b""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:  # one byte every 0.3 s: the body keeps coming and never ends
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"1\r\n \r\n" if chunked else b" ")
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                continue
            break
        sock.settimeout(DEADLINE_S)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        rest = answer
        while not rest.endswith(b"}"):
            more = sock.recv(65536)
            if not more:
                break
            rest += more
        assert _error_code(rest.partition(b"\r\n\r\n")[2]) == "request_timeout"
        assert b"connection: close" in rest.lower()
        assert _closed(sock)


def test_an_idle_keep_alive_connection_is_closed(bounded: Stack) -> None:
    with _connect(bounded.url("search-agent")) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, headers, _, closed = _answer(sock)  # _answer waits for the close that comes after the idle second
    assert status == 200
    assert headers.get("connection") != "close"
    assert closed


def test_beyond_its_connection_cap_a_service_answers_503_at_once(bounded: Stack) -> None:
    hotel = bounded.procs.serve(
        "hotel-api", env={"SERVER_MAX_CONNECTIONS": "10", "HEADER_READ_TIMEOUT_S": "600", "KEEP_ALIVE_IDLE_S": "600"}
    )
    held = [_connect(hotel.url) for _ in range(10)]
    try:
        for sock in held:  # ten connections that hold their slot (each between two requests)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        for sock in held:
            sock.settimeout(DEADLINE_S)
            data = b""
            while b"\r\n\r\n" not in data:
                data += sock.recv(65536)
        with _connect(hotel.url) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, _, _, _ = _answer(extra)
        assert status == 503
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:  # the slots come back as the held connections go
        if bounded.http.get(f"{hotel.url}/health").status_code == 200:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("hotel-api never took a request again")
