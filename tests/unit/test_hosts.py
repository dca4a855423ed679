"""The DNS-rebinding guard's matcher (``identity.hosts``) and ``CONCIERGE_ALLOWED_HOSTS`` as the settings read it."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from identity.hosts import AllowedHosts, host_name, parse_allowed_hosts
from infra.service import middleware
from infra.service.middleware import deployment_hosts
from infra.settings import Settings

OURS = AllowedHosts.of({"booking-agent"}, parse_allowed_hosts(".corp.example, *.apps.example, concierge.example.com"))


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("booking-agent", "booking-agent"),
        ("Booking-Agent:8000", "booking-agent"),
        ("booking-agent.:8000", "booking-agent"),
        ("127.0.0.1:8090", "127.0.0.1"),
        ("[::1]:8090", "[::1]"),
        ("[0:0:0:0:0:0:0:1]", "[::1]"),
        ("example.com:", "example.com"),
        ("compose_booking-agent_1", "compose_booking-agent_1"),
        ("", None),
        ("evil.example:80a", None),
        ("evil.example:123456", None),
        ("::1", None),  # IPv6 without brackets is not a Host
        ("[::1]x", None),
        ("[::1", None),
        ("[nope]:80", None),
        ("ev il.example", None),
        ("evil..example", None),
        ("-evil.example", None),
        ("a" * 254, None),
    ],
)
def test_host_name_of_a_header(header: str, name: str | None) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    "host",
    [
        None,  # no Host at all: no browser sends that
        "booking-agent",
        "booking-agent:8000",
        "BOOKING-AGENT.",
        "localhost",
        "localhost:23090",
        "console.localhost:8090",
        "127.0.0.1:8000",
        "127.1.2.3",
        "[::1]:8000",
        "10.244.3.7:8000",  # the kubelet's probe: the pod IP
        "0.0.0.0:8090",
        "[fd00::12]:8000",
        "corp.example",  # .corp.example: the name itself
        "a.corp.example",
        "a.b.corp.example:443",
        "x.apps.example",  # *.apps.example: names under it
        "concierge.example.com",
    ],
)
def test_allowed(host: str | None) -> None:
    assert OURS.allows(host)


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8090",
        "search-agent",  # another service's name is not this one's (unless a *_URL names it)
        "booking-agent.evil.example",
        "localhost.evil.example",
        "127.0.0.1.evil.example",
        "evilcorp.example",  # a suffix match is on a label boundary
        "apps.example",  # *.apps.example: not the name itself
        "concierge.example.com.evil.example",
        "evil.example:8090:1",
        "",
        "a" * 300,
    ],
)
def test_refused(host: str) -> None:
    assert not OURS.allows(host)


def test_a_star_allows_any_host() -> None:
    assert AllowedHosts.of({"booking-agent"}, ("*",)).allows("evil.example")


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("", ()),
        (" , ", ()),
        ("Booking.Example.COM", ("booking.example.com",)),
        (".corp.example,*.apps.example", (".corp.example", "*.apps.example")),
        ("a.example, a.example", ("a.example",)),
        ("*", ("*",)),
        ("[::1], 10.0.0.1", ("[::1]", "10.0.0.1")),
    ],
)
def test_parse_allowed_hosts(text: str, entries: tuple[str, ...]) -> None:
    assert parse_allowed_hosts(text) == entries


@pytest.mark.parametrize(
    "text", ["booking.example.com:8000", "http://booking.example.com", "*.", ".", "a.*.example", "*example.com", "a b"]
)
def test_a_bad_entry_is_a_settings_error_naming_the_variable(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        parse_allowed_hosts(text)
    monkeypatch.setenv("CONCIERGE_ALLOWED_HOSTS", f"ok.example,{text}")
    with pytest.raises(ValidationError, match="CONCIERGE_ALLOWED_HOSTS"):
        Settings()


def test_the_settings_read_the_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCIERGE_ALLOWED_HOSTS", "concierge.example.com,.svc.cluster.local")
    assert Settings().allowed_hosts == ("concierge.example.com", ".svc.cluster.local")
    monkeypatch.delenv("CONCIERGE_ALLOWED_HOSTS")
    assert Settings().allowed_hosts == ()


def test_deployment_hosts_are_the_hosts_of_the_http_url_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCH_AGENT_URL", "http://search-agent:8001")
    monkeypatch.setenv("BOOKING_AGENT_URL", "https://bookings.internal")
    monkeypatch.setenv("REDIS_URL", "redis://redis-host:6379/0")  # not HTTP: not a name anyone browses
    hosts = deployment_hosts(Settings())
    assert {"search-agent", "bookings.internal", "127.0.0.1"} <= hosts
    assert "redis-host" not in hosts


def test_refused_hosts_are_logged_once_each_and_a_flood_of_them_in_one_more_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(middleware, "_REFUSED_HOSTS_LOGGED", 2)
    served: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        served.append(scope["path"])

    guard = middleware.HostCheckMiddleware(app, "booking-agent")
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request"}

    async def request(host: str) -> None:
        scope = {"type": "http", "path": "/bookings", "headers": [(b"host", host.encode())]}
        await guard(scope, receive, send)

    async def flood() -> None:
        for host in ("a.example", "a.example:1", "b.example", "c.example", "d.example", "booking-agent:8000"):
            await request(host)

    with caplog.at_level("WARNING", logger="infra.service"):
        asyncio.run(flood())
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and "'a.example'" in lines[0] and "'b.example'" in lines[1], lines
    assert "further ones are not logged" in lines[2]
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [421] * 5
    assert served == ["/bookings"]  # only its own name reached the app
