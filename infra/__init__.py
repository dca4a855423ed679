"""The world outside the graphs: settings, Redis, telemetry, HTTP, A2A, the service shell, the providers.

Import the heavier pieces from their modules: ``infra.service`` (``create_service_app``), ``infra.a2a``,
``infra.checkpointer``, ``infra.providers``; this package namespace keeps only what every process needs.
"""

from infra.bookings import BookingStore
from infra.http import create_http_client
from infra.redis import create_redis, key
from infra.settings import Settings, get_settings
from infra.telemetry import configure_telemetry

__all__ = [
    "BookingStore",
    "Settings",
    "configure_telemetry",
    "create_http_client",
    "create_redis",
    "get_settings",
    "key",
]
