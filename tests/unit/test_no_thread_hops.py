"""No request of any service hops to a thread: every endpoint and every dependency FastAPI resolves is ``async``.

FastAPI runs a plain ``def`` endpoint or dependency on its thread pool. On a path that does no blocking work that
is pure cost (a queue hand-off, a GIL switch and a wake-up per request); a profile of hotel-api under load found
6% of its CPU there, for a dependency that only read ``app.state``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.dependencies.models import Dependant

from stack.services import SERVICES


def _app(import_string: str) -> Any:
    module, _, attribute = import_string.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _sync_callables(dependant: Dependant, path: str) -> Iterator[str]:
    call = dependant.call
    if call is not None:
        # a class instance used as a dependency (FaultInjector) is called through its __call__
        target = call if inspect.isroutine(call) else getattr(call, "__call__", call)  # noqa: B004
        if not (inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)):
            yield f"{path}: {getattr(call, '__qualname__', type(call).__qualname__)}"
    for sub in dependant.dependencies:
        yield from _sync_callables(sub, path)


def _dependants(routes: list[Any]) -> Iterator[tuple[str, Dependant]]:
    """(path, dependant) of every API route, router-level dependencies included.

    FastAPI 0.165 keeps an included router as one entry whose resolved routes come from
    ``effective_route_contexts()``; earlier releases copy each route into ``app.routes``. Both are walked.
    """
    for route in routes:
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:
            for context in contexts():
                if context.dependant is not None:
                    yield context.path, context.dependant
        elif isinstance(getattr(route, "dependant", None), Dependant):
            yield route.path, route.dependant


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_endpoint_and_dependency_is_async(service: str) -> None:
    app = _app(SERVICES[service].app)
    found = list(_dependants(app.routes))
    # the five health routes at least: a walk that finds nothing would pass whatever the code does
    assert len(found) >= 5, f"{service}: only {[path for path, _ in found]} found"
    offenders = [name for path, dependant in found for name in _sync_callables(dependant, path)]
    assert offenders == [], f"{service}: these run on FastAPI's thread pool: {offenders}"


def test_the_walk_sees_router_level_and_parameter_dependencies() -> None:
    """hotel-api's business routes carry the fault injector (router level) and Redis (a parameter)."""
    app = _app(SERVICES["hotel-api"].app)
    names: set[str] = set()

    def collect(dependant: Dependant) -> None:
        if dependant.call is not None:
            names.add(getattr(dependant.call, "__qualname__", type(dependant.call).__qualname__))
        for sub in dependant.dependencies:
            collect(sub)

    for path, dependant in _dependants(app.routes):
        if path == "/reservations":
            collect(dependant)
    assert {"FaultInjector", "get_redis", "require_idempotency_key"} <= names, names
