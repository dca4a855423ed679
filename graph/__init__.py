"""LangGraph layer: the node decorators (tracing, idempotency, fencing) and one graph builder per agent.

The builders live in their modules (``agents.booking.graph``, ``agents.search.graph``, ``agents.payment.graph``); this namespace
exports the decorators and their errors, which every graph and the run executor use, and the migrations a graph
declares for runs of its earlier shapes (``graph.migrations``).
"""

from graph.errors import (
    ClaimLostError,
    GraphError,
    IdempotencyError,
    IdempotencyStoreError,
    MigrationError,
    MissingThreadIdError,
    NodeResultError,
)
from graph.idempotency import (
    RedisProvider,
    derive_idempotency_key,
    fence_scope,
    fields_digest,
    idempotency_key,
    idempotent_node,
)
from graph.migrations import Migration, apply_migration
from graph.tracing import traced_node, use_tracer_provider

__all__ = [
    "ClaimLostError",
    "GraphError",
    "IdempotencyError",
    "IdempotencyStoreError",
    "Migration",
    "MigrationError",
    "MissingThreadIdError",
    "NodeResultError",
    "RedisProvider",
    "apply_migration",
    "derive_idempotency_key",
    "fence_scope",
    "fields_digest",
    "idempotency_key",
    "idempotent_node",
    "traced_node",
    "use_tracer_provider",
]
