"""One root log handler per process, its lines tagged with the service name."""

from __future__ import annotations

import logging
import sys
from typing import TextIO


class _CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever ``sys.stderr`` is now, so a replaced (then closed) stream is never written to."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        return None


_logging_handler: list[logging.Handler] = []


_CHATTY_CLIENT_LOGGERS = ("httpx", "httpcore")


def configure_logging(service_name: str, level: str = "INFO") -> None:
    """One root handler per process, lines tagged with the service name; later calls only adjust the level."""
    root = logging.getLogger()
    root.setLevel(level.upper())
    # httpx logs every request it sends at INFO: about ten lines per booking in booking-agent alone, each formatted
    # and written on the event loop, saying what the client spans already say. Shown again at DEBUG.
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in _CHATTY_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
    if _logging_handler:
        return
    handler = _CurrentStderrHandler()
    escaped = service_name.replace("%", "%%")
    handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {escaped} %(name)s: %(message)s"))
    root.addHandler(handler)
    _logging_handler.append(handler)
