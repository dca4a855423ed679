"""The one table of services: read by ``concierge serve``, ``concierge up``, the tests, and scripts/deploy_files.py,
which writes the service-derived parts of docker-compose.yml, deploy/k8s and the Prometheus config from it.

Apps are named by import string (uvicorn's ``module:attribute``) so that ``infra`` never imports ``agents`` or
``recovery``: the table describes services, it does not load them. Adding a service is one row here, then
``make deploy-files`` (docs/development.md, "Adding a service"). A service's resilience layers (breaker, bulkheads,
retry, budget share) are its row in the dependency table, ``infra/dependencies.py``, which infra can import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = [
    "DEFAULT_STACK",
    "DEPLOYED",
    "SERVICES",
    "ServiceKind",
    "ServiceSpec",
    "UnknownServiceError",
    "deployed",
    "get_service",
]

ServiceKind = Literal["provider", "agent", "worker", "tooling"]
"""provider: a simulated outside world (one replica, host's loopback only); agent: a durable A2A agent; worker: durable,
serves no A2A skill (the recovery worker); tooling: the operator's (one replica, loopback only, no test-stack port)."""


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
    kind: ServiceKind = field(default="agent", kw_only=True)
    depends_on: tuple[str, ...] = field(default=(), kw_only=True)
    """The peers of this table it waits for, healthy, in docker-compose (Redis, Postgres and the issuer follow the kind
    and ``mounts_issuer``)."""
    mounts_issuer: bool = field(default=False, kw_only=True)
    """Takes people's tokens, or runs people's commands: the local issuer is mounted at /issuer (compose and k8s)."""
    deployed: bool = field(default=True, kw_only=True)
    """False: ``serve`` and ``up`` run it, but compose, Kubernetes and Prometheus leave it out."""
    metrics: bool = field(default=True, kw_only=True)
    """Serves /metrics: Prometheus scrapes it."""
    optional: bool = field(default=False, kw_only=True)
    """Outside the default stack (an example of examples/): ``up`` runs it only when ``--with NAME`` names it."""

    @property
    def package(self) -> str:
        """The package of its app's module (``examples.restaurant`` for ``examples.restaurant.app:app``)."""
        return self.app.partition(":")[0].rpartition(".")[0]

    @property
    def durable(self) -> bool:
        """Runs graphs: checkpoints in Postgres, loads LangGraph, runs replicated."""
        return self.kind in ("agent", "worker")

    @property
    def loopback_only(self) -> bool:
        """Published on the host's loopback only: the outside world's stand-ins and the operator's tools."""
        return self.kind in ("provider", "tooling")

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
            ServiceSpec("hotel-api", "providers.hotel_api:app", 8010, "HOTEL_API_URL", kind="provider"),
            ServiceSpec("payment-api", "providers.payment_api:app", 8011, "PAYMENT_API_URL", kind="provider"),
            ServiceSpec("llm-api", "providers.llm_api:app", 8012, "LLM_API_URL", kind="provider"),
            ServiceSpec("search-agent", "agents.search.app:app", 8001, "SEARCH_AGENT_URL", depends_on=("hotel-api",)),
            ServiceSpec(
                "payment-agent", "agents.payment.app:app", 8002, "PAYMENT_AGENT_URL", depends_on=("payment-api",)
            ),
            ServiceSpec(
                "booking-agent",
                "agents.booking.app:app",
                8000,
                "BOOKING_AGENT_URL",
                depends_on=("hotel-api", "search-agent", "payment-agent"),
                mounts_issuer=True,
            ),
            ServiceSpec(
                "recovery-worker",
                "agents.recovery_worker:app",
                8020,
                "RECOVERY_WORKER_URL",
                kind="worker",
                depends_on=("hotel-api", "search-agent", "payment-agent"),
                mounts_issuer=True,
            ),
            ServiceSpec(
                "concierge-agent",
                "agents.concierge.app:app",
                8003,
                "CONCIERGE_AGENT_URL",
                depends_on=("llm-api", "search-agent", "booking-agent"),
                mounts_issuer=True,
            ),
            # docs/new-agent.md's worked example: `concierge up --with restaurant-agent` (or `concierge serve`) runs it
            ServiceSpec(
                "restaurant-agent",
                "examples.restaurant.app:app",
                8004,
                "RESTAURANT_AGENT_URL",
                depends_on=("hotel-api",),
                mounts_issuer=True,
                deployed=False,
                optional=True,
            ),
            # last: it watches the others (and drives them through the supervisor when ``concierge up`` runs it)
            ServiceSpec("console", "stack.webconsole:app", 8090, "CONSOLE_URL", kind="tooling"),
        )
    }
)


def deployed(services: Mapping[str, ServiceSpec] = SERVICES) -> Mapping[str, ServiceSpec]:
    """The rows compose, Kubernetes and Prometheus run (``deployed``), in the table's order."""
    return MappingProxyType({name: spec for name, spec in services.items() if spec.deployed})


DEPLOYED = deployed()
DEFAULT_STACK: Mapping[str, ServiceSpec] = MappingProxyType({n: s for n, s in SERVICES.items() if not s.optional})
"""What ``concierge up`` runs unless ``--with`` names an optional row too."""


def get_service(name: str) -> ServiceSpec:
    try:
        return SERVICES[name]
    except KeyError:
        raise UnknownServiceError(name) from None
