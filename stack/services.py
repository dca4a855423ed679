"""The one table of services: read by ``concierge serve``, ``concierge up`` and the docker-compose test.

Apps are named by import string (uvicorn's ``module:attribute``) so that ``infra`` never imports ``agents`` or
``recovery``: the table describes services, it does not load them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["SERVICES", "ServiceSpec", "UnknownServiceError", "get_service"]


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    app: str
    """ASGI app as ``module:attribute``."""
    port: int
    """Default port (docker-compose and ``concierge up`` use it too)."""
    url_env: str
    """The environment variable through which other services find this one."""
    health_path: str = "/health"
    ready_path: str = "/health/ready"

    def url(self, host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"http://{host}:{port or self.port}"


class UnknownServiceError(LookupError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown service {name!r}; valid names: {', '.join(SERVICES)}")
        self.name = name


# Order matters: dependencies first (``up`` starts them in this order, ``down`` stops them in reverse).
SERVICES: Mapping[str, ServiceSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ServiceSpec("hotel-api", "providers.hotel_api:app", 8010, "HOTEL_API_URL"),
            ServiceSpec("payment-api", "providers.payment_api:app", 8011, "PAYMENT_API_URL"),
            ServiceSpec("llm-api", "providers.llm_api:app", 8012, "LLM_API_URL"),
            ServiceSpec("search-agent", "agents.search:app", 8001, "SEARCH_AGENT_URL"),
            ServiceSpec("payment-agent", "agents.payment:app", 8002, "PAYMENT_AGENT_URL"),
            ServiceSpec("booking-agent", "agents.booking.app:app", 8000, "BOOKING_AGENT_URL"),
            ServiceSpec("recovery-worker", "agents.recovery_worker:app", 8020, "RECOVERY_WORKER_URL"),
            ServiceSpec("concierge-agent", "agents.concierge.app:app", 8003, "CONCIERGE_AGENT_URL"),
            # last: it watches the others (and drives them through the supervisor when ``concierge up`` runs it)
            ServiceSpec("console", "stack.webconsole:app", 8090, "CONSOLE_URL"),
        )
    }
)


def get_service(name: str) -> ServiceSpec:
    try:
        return SERVICES[name]
    except KeyError:
        raise UnknownServiceError(name) from None
