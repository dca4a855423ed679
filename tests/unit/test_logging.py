"""``configure_logging``: httpx's per-request INFO lines stay out of service logs unless the level is DEBUG."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from infra.service import configure_logging


@pytest.fixture(autouse=True)
def restore_levels() -> Iterator[None]:
    names = ("", "httpx", "httpcore")
    before = {name: logging.getLogger(name).level for name in names}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def test_httpx_request_lines_are_hidden_at_info(caplog: pytest.LogCaptureFixture) -> None:
    configure_logging("test-service", "INFO")
    with caplog.at_level(logging.INFO):
        logging.getLogger("httpx").info('HTTP Request: GET http://x "HTTP/1.1 200 OK"')
        logging.getLogger("httpx").warning("a retry the user should see")
        logging.getLogger("concierge.test").info("our own line")
    messages = [record.getMessage() for record in caplog.records]
    assert messages == ["a retry the user should see", "our own line"]


def test_httpx_request_lines_come_back_at_debug() -> None:
    configure_logging("test-service", "DEBUG")
    assert logging.getLogger("httpx").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("httpcore").isEnabledFor(logging.DEBUG)
