"""The world outside the graphs: settings, Redis, telemetry, HTTP, A2A, the service shell, the providers."""

from infra.redis import create_redis, key
from infra.settings import Settings, get_settings
from infra.telemetry import configure_telemetry

__all__ = ["Settings", "configure_telemetry", "create_redis", "get_settings", "key"]
