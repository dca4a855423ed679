"""The FastAPI service shell shared by the agents, the providers and the recovery worker."""

from infra.error_table import error_body
from infra.service.app import Lifespan, create_service_app
from infra.service.health import READY_CHECK_TIMEOUT_S, ReadyCheck
from infra.service.logs import configure_logging
from infra.service.middleware import MAX_BODY_BYTES
from infra.service.state import ServiceInfo, get_redis
from infra.service.streams import STREAM_ID_PATTERN, journal_response, shutting_down_event

__all__ = [
    "MAX_BODY_BYTES",
    "READY_CHECK_TIMEOUT_S",
    "STREAM_ID_PATTERN",
    "Lifespan",
    "ReadyCheck",
    "ServiceInfo",
    "configure_logging",
    "create_service_app",
    "error_body",
    "get_redis",
    "journal_response",
    "shutting_down_event",
]
