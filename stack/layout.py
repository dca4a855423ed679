"""Which processes ``concierge up`` runs and on which ports: the service table, scaled and shifted.

Ports: each service keeps its table port shifted by ``port_base - 8000`` (so ``--port-base 18000`` puts
booking-agent on 18000 and hotel-api on 18010), unless ``--port NAME=PORT`` names it. With ``--scale NAME=N`` the
first replica keeps the service's port and the others take consecutive ports after the highest port of the stack
(``--scale booking-agent=2``: 8000 and 8091), so adding replicas never moves a service someone already uses.

Instances are named after their service, or ``service:N`` when a service runs more than one replica.

A scaled service also gets a front (``plan_fronts``): one more port, after every instance's, where the supervisor
spreads connections over the replicas that are up (``stack.balancer``), as a Kubernetes Service does. The peers'
``*_URL`` name the front, so every replica of search-agent takes work, and losing one costs its connections only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from stack.errors import UsageError
from stack.services import SERVICES, ServiceSpec, UnknownServiceError, get_service

__all__ = [
    "DEFAULT_PORT_BASE",
    "MAX_REPLICAS",
    "Front",
    "Instance",
    "connect_host",
    "parse_assignments",
    "plan_fronts",
    "plan_instances",
    "select_instances",
]

DEFAULT_PORT_BASE = min(spec.port for spec in SERVICES.values())
MAX_REPLICAS = 8


@dataclass(frozen=True)
class Instance:
    """One process of the stack: a service of the table, which replica it is, and its port."""

    spec: ServiceSpec
    replica: int
    """1-based."""
    replicas: int
    port: int

    @property
    def name(self) -> str:
        return self.spec.name if self.replicas == 1 else f"{self.spec.name}:{self.replica}"

    @property
    def service(self) -> str:
        return self.spec.name

    def url(self, host: str = "127.0.0.1") -> str:
        return self.spec.url(host, self.port)


@dataclass(frozen=True)
class Front:
    """The one address of a scaled service: connections to ``port`` go to its replicas in turn."""

    spec: ServiceSpec
    port: int

    @property
    def service(self) -> str:
        return self.spec.name

    def url(self, host: str = "127.0.0.1") -> str:
        return self.spec.url(host, self.port)


def connect_host(bind: str) -> str:
    """Where to reach a service bound to ``bind``: a wildcard address is reached on loopback."""
    return "127.0.0.1" if bind in ("", "0.0.0.0", "::") else bind


def parse_assignments(items: Iterable[str], *, option: str) -> dict[str, int]:
    """``["booking-agent=2", ...]`` → ``{"booking-agent": 2}``; names are checked against the table."""
    parsed: dict[str, int] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name or not raw.strip():
            raise UsageError(f"{option} expects NAME=NUMBER, got {item!r}")
        try:
            get_service(name)
        except UnknownServiceError as exc:
            raise UsageError(f"{option} {item!r}: {exc}") from None
        try:
            parsed[name] = int(raw)
        except ValueError:
            raise UsageError(f"{option} {item!r}: {raw.strip()!r} is not a whole number") from None
    return parsed


def _check_port(port: int, what: str) -> int:
    if not 0 < port < 65536:
        raise UsageError(f"{what}: port {port} is out of range (1-65535)")
    return port


def plan_instances(
    *,
    scale: Mapping[str, int] | None = None,
    port_base: int | None = None,
    ports: Mapping[str, int] | None = None,
    with_services: Iterable[str] = (),
) -> tuple[Instance, ...]:
    """Every instance of the stack in table order (dependencies first), replicas of a service together; an
    ``optional`` row only when ``with_services`` names it."""
    scale = dict(scale or {})
    ports = dict(ports or {})
    named = set(with_services)
    for name in named:
        get_service(name)
    table = [spec for spec in SERVICES.values() if not spec.optional or spec.name in named]
    for name, count in scale.items():
        get_service(name)
        if not 1 <= count <= MAX_REPLICAS:
            raise UsageError(f"--scale {name}={count}: replicas must be between 1 and {MAX_REPLICAS}")
    base = DEFAULT_PORT_BASE if port_base is None else port_base
    shift = base - DEFAULT_PORT_BASE
    first: dict[str, int] = {}
    for spec in table:
        if spec.name in ports:
            first[spec.name] = _check_port(ports[spec.name], f"--port {spec.name}")
        else:
            first[spec.name] = _check_port(spec.port + shift, f"--port-base {base} ({spec.name})")
    next_extra = max(first.values()) + 1
    instances: list[Instance] = []
    for spec in table:
        count = scale.get(spec.name, 1)
        instances.append(Instance(spec, 1, count, first[spec.name]))
        for replica in range(2, count + 1):
            instances.append(Instance(spec, replica, count, _check_port(next_extra, f"--scale {spec.name}")))
            next_extra += 1
    _check_unique(instances)
    return tuple(instances)


def plan_fronts(instances: Sequence[Instance]) -> tuple[Front, ...]:
    """A front per service that runs more than one replica, in table order, on ports after every instance's."""
    next_port = max(i.port for i in instances) + 1
    fronts: list[Front] = []
    for instance in instances:
        if instance.replicas > 1 and instance.replica == 1:
            fronts.append(Front(instance.spec, _check_port(next_port, f"the front of {instance.service}")))
            next_port += 1
    return tuple(fronts)


def _check_unique(instances: Sequence[Instance]) -> None:
    owner: dict[int, str] = {}
    for instance in instances:
        if instance.port in owner:
            raise UsageError(f"{instance.name} and {owner[instance.port]} would both use port {instance.port}")
        owner[instance.port] = instance.name


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def service(self) -> str: ...


_N = TypeVar("_N", bound=_Named)


def select_instances(instances: Sequence[_N], target: str) -> list[_N]:
    """``booking-agent`` → all its replicas; ``booking-agent:2`` → that one (planned ``Instance``s, or a running
    stack's ``InstanceState``s). Unknown names raise."""
    service, _, replica = target.partition(":")
    get_service(service)  # UnknownServiceError names the valid services
    chosen = [i for i in instances if i.service == service and (not replica or i.name == target)]
    if not chosen:
        names = ", ".join(i.name for i in instances if i.service == service)
        raise UsageError(f"no instance {target!r}; {service} runs as {names}")
    return chosen
