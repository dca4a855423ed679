"""The durable graphs of a deployment, each declared once beside its agent, found by name by the recovery worker.

An agent package lists what recovery needs of each of its graphs in ``DURABLE_GRAPHS`` of its ``durable`` module
(``DurableGraph``: name, builders, dependencies, how a run resumes and is given up on); ``DURABLE_AGENTS`` names the
packages. The worker imports them, so no agent's name or client is in its code (docs/new-agent.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from recovery.errors import RecoveryError

if TYPE_CHECKING:  # the consumer pulls in LangGraph: imported where a graph is built
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from redis.asyncio import Redis

    from graph.migrations import Migration
    from recovery.consumer import RecoverableGraph

__all__ = ["DURABLE_MODULE", "DurableGraph", "RegistryError", "load_durable_graphs"]

DURABLE_MODULE = "durable"
"""The module of an agent package that declares its durable graphs, as ``DURABLE_GRAPHS``."""


class RegistryError(RecoveryError):
    """An agent package named in ``DURABLE_AGENTS`` declares no durable graphs, or a name twice."""


@dataclass(frozen=True)
class DurableGraph:
    """One graph a run can be resumed on: its versions' builders (current first), the dependencies they are built
    with, and what the consumer needs to resume, and give up on, one of its runs."""

    name: str
    """What ``RunRecord.graph`` says: the one place this graph is named."""
    builders: Sequence[Callable[..., Any]]
    """``build(deps, checkpointer) -> CompiledStateGraph``, current first, then the earlier versions kept."""
    open_deps: Callable[[Redis], AbstractAsyncContextManager[Any]]
    """The dependencies the builders take, opened once per worker (graphs naming the same function share them)."""
    recoverable: Callable[[Any, Any], RecoverableGraph]
    """``recoverable(compiled graph, deps)``: how the consumer resumes its runs and gives up on them."""
    migrations: Sequence[Migration] = ()
    """The earlier versions whose runs the current builder takes over (``graph.migrations``)."""

    def versions(self, deps: Any, checkpointer: BaseCheckpointSaver[str]) -> list[RecoverableGraph]:
        """Every version this code runs, current first, the current one carrying the migrations."""
        built = [self.recoverable(build(deps, checkpointer), deps) for build in self.builders]
        return [replace(built[0], migrations=tuple(self.migrations)), *built[1:]]


def load_durable_graphs(packages: Sequence[str]) -> tuple[DurableGraph, ...]:
    """The graphs the ``durable`` module of each package declares, in order; ``RegistryError`` for a package with
    none (or not importable) and for a graph name declared twice."""
    graphs: dict[str, DurableGraph] = {}
    for package in packages:
        module_name = f"{package}.{DURABLE_MODULE}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                raise RegistryError(f"DURABLE_AGENTS names {package!r}, which has no module {module_name}") from exc
            raise
        declared = getattr(module, "DURABLE_GRAPHS", None)
        if not declared or not all(isinstance(graph, DurableGraph) for graph in declared):
            raise RegistryError(f"{module_name} declares no DURABLE_GRAPHS (a sequence of DurableGraph)")
        for graph in declared:
            if graph.name in graphs:
                raise RegistryError(f"graph {graph.name!r} is declared twice (again in {module_name})")
            graphs[graph.name] = graph
    return tuple(graphs.values())
