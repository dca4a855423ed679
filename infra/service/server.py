"""How every service is served: uvicorn on h11, with the bounds a client must not be able to outgrow.

A header block over ``MAX_HEADER_BYTES`` is answered 431 and its connection closed, before more of it is buffered
(h11's ``max_incomplete_event_size``; httptools has no such bound); headers that take longer than
``HEADER_READ_TIMEOUT_S`` are answered 408; connections beyond ``SERVER_MAX_CONNECTIONS`` are answered 503 at once;
an idle keep-alive connection is closed after ``KEEP_ALIVE_IDLE_S``. The body's own deadline is the shell's
(``BodyLimitMiddleware``), where a 408 can be answered in our error shape. docs/people.md has the table.

``python -m infra.service.server module:app --port N`` serves an app that is not in the service table (the tests'
and benches' own apps) the same way ``concierge serve`` serves those that are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from domain.errors import ErrorCode
from infra.error_table import error_body
from infra.service.middleware import MAX_HEADER_BYTES
from infra.settings import Settings, get_settings

__all__ = ["MAX_HEADER_BYTES", "BoundedH11Protocol", "run_server", "server_options"]


def _raw_error(status: int, reason: bytes, code: ErrorCode, message: str) -> bytes:
    payload = json.dumps(error_body(code, message)).encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status,
        reason,
        len(payload),
    )
    return head + payload


_HEADERS_TOO_LARGE = _raw_error(
    431,
    b"Request Header Fields Too Large",
    ErrorCode.HEADERS_TOO_LARGE,
    f"the request line and headers exceed {MAX_HEADER_BYTES} bytes",
)
_HEADERS_TIMEOUT = _raw_error(
    408, b"Request Timeout", ErrorCode.REQUEST_TIMEOUT, "the request's headers did not arrive in time"
)


class _Connection(h11.Connection):
    """h11's connection, remembering why it refused the client's bytes (its ``error_status_hint``)."""

    refused_with: int | None = None

    def next_event(self) -> Any:
        try:
            return super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused_with = exc.error_status_hint
            raise


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request's headers and a 431 for a header block too large."""

    header_read_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = self._bounded = _Connection(
            h11.SERVER, self.config.h11_max_incomplete_event_size or MAX_HEADER_BYTES
        )
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()  # a connection that never sends a byte is held no longer than a slow one

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm_header_timer()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_header_timer()  # the headers are in (or refused)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_header_timer()  # a pipelined request's first bytes are already here

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        if self._bounded.refused_with != 431:
            super().send_400_response(msg)
            return
        self.logger.warning("A request's headers exceeded %d bytes: refused.", MAX_HEADER_BYTES)
        self.transport.write(_HEADERS_TOO_LARGE)
        self.transport.close()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_read_timeout_s, self._headers_too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # a request begun and not finished; a silent connection is just closed
            self.transport.write(_HEADERS_TIMEOUT)
        self.transport.close()


def _protocol(settings: Settings) -> type[BoundedH11Protocol]:
    """The protocol class with this process's header deadline (uvicorn builds one instance per connection)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"header_read_timeout_s": settings.header_read_timeout_s})


def server_options(settings: Settings | None = None) -> dict[str, Any]:
    """The uvicorn options every service runs with (``uvicorn.run(app, **server_options(), ...)``)."""
    settings = settings or get_settings()
    return {
        "http": _protocol(settings),
        "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
        "limit_concurrency": settings.server_max_connections,
        "timeout_keep_alive": settings.keep_alive_idle_s,
        "lifespan": "on",
    }


def run_server(
    app: str,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    access_log: bool = False,
    factory: bool = False,
    timeout_graceful_shutdown: int | None = None,
) -> None:
    """Serve ``app`` (``module:attribute``) until SIGTERM/SIGINT, which uvicorn turns into a graceful stop."""
    import uvicorn  # only a serving process needs it

    uvicorn.run(
        app,
        host=host,
        port=port,
        factory=factory,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=timeout_graceful_shutdown,
        **server_options(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.service.server", description=__doc__)
    parser.add_argument("app", help="the ASGI app as module:attribute")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--factory", action="store_true", help="app names a function that returns the app")
    parser.add_argument("--no-access-log", dest="access_log", action="store_false")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--app-dir", default=None, help="put this directory first on sys.path (as uvicorn's option)")
    args = parser.parse_args(argv)
    if args.app_dir is not None:
        sys.path.insert(0, args.app_dir)
    run_server(
        args.app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        factory=args.factory,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
