"""The dependency table's row type and the table installed at start-up: resilience names no dependency itself.

An app hands its rows in once (``install_dependencies``; this app's rows: ``infra/dependencies.py``). The layers'
config maps (``CIRCUIT_CONFIGS``, ``BULKHEAD_CONFIGS``, ``OUTBOUND_BULKHEAD_CONFIGS``, ``RETRY_CONFIGS``,
``CALL_SHARES``) are read-only views of it, so a new dependency is one row (docs/patterns.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Generic, TypeVar

from resilience.switches import Restore

if TYPE_CHECKING:
    from resilience.bulkhead import BulkheadConfig
    from resilience.circuit_breaker import CircuitBreakerConfig
    from resilience.retry import RetryConfig

__all__ = [
    "Dependency",
    "DependencyTableMissingError",
    "LayerView",
    "install_dependencies",
    "installed_dependencies",
    "table_generation",
]

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Dependency:
    """One name's layers in one row; a layer left ``None`` is that layer's default (as for a name in no row).

    ``breaker``, ``bulkhead`` (``outbound:<name>``), ``retry`` and ``share`` are what callers of the dependency go
    through (``policy_for``); ``inbound`` is the bulkhead guarding the door of a service of that name.
    """

    name: str
    breaker: CircuitBreakerConfig | None = None
    """The breaker every caller in the process shares (``circuit_registry``, ``/health/circuits``)."""
    bulkhead: BulkheadConfig | None = None
    """Callers' slots and execution timeout (``outbound:<name>``); ``None``: ``DEFAULT_OUTBOUND_BULKHEAD_CONFIG``."""
    retry: RetryConfig | None = None
    """``None``: ``RetryConfig()``, three attempts."""
    share: float | None = None
    """The fraction of an accepted run's remaining budget one attempt may use; ``None``: the whole budget."""
    inbound: BulkheadConfig | None = None
    """The bulkhead named ``name`` that a service serving this name's requests runs them in."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a dependency needs a name")
        if self.share is not None and not 0 < self.share <= 1:
            raise ValueError(f"dependency {self.name!r}: share must be in (0, 1], got {self.share!r}")


class DependencyTableMissingError(LookupError):
    """A dependency was asked for before any table was installed: its layers would silently be the defaults."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"dependency {name!r}: no dependency table is installed; install one at start-up "
            "(resilience.install_dependencies(rows); this app: infra.dependencies.install(), which the service "
            "shell's lifespan calls)"
        )
        self.name = name


_table: Mapping[str, Dependency] | None = None
_generation = 0


def install_dependencies(rows: Iterable[Dependency]) -> Restore[Mapping[str, Dependency] | None]:
    """Make ``rows`` the process's dependency table (start-up, or a test); ``restore()`` puts the previous one back.

    Breakers and bulkheads already created keep their config (``registry.clear()`` rebuilds them); cached policies
    are rebuilt. Installing an equal table again changes nothing, so every service lifespan may call it.
    """
    table: dict[str, Dependency] = {}
    for row in rows:
        if row.name in table:
            raise ValueError(f"dependency {row.name!r} has two rows")
        table[row.name] = row
    previous = _table
    if previous is None or dict(previous) != table:
        _put(MappingProxyType(table))
    return Restore(previous, _put)


def _put(table: Mapping[str, Dependency] | None) -> None:
    global _table, _generation
    _table = table
    _generation += 1


def installed_dependencies() -> Mapping[str, Dependency] | None:
    """The table installed, by name (``None``: none yet)."""
    return _table


def table_generation() -> int:
    """Bumped by every change of table: whoever caches what a row said (``policy_for``) looks it up again."""
    return _generation


class LayerView(Mapping[str, V], Generic[V]):
    """One layer's column of the installed table: the names whose row sets it (empty before an install)."""

    __slots__ = ("_column",)

    def __init__(self, column: Callable[[Dependency], V | None]) -> None:
        self._column = column

    def _items(self) -> dict[str, V]:
        if _table is None:
            return {}
        return {name: value for name, row in _table.items() if (value := self._column(row)) is not None}

    def __getitem__(self, name: str) -> V:
        row = None if _table is None else _table.get(name)
        value = None if row is None else self._column(row)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __repr__(self) -> str:
        return f"LayerView({self._items()!r})"
