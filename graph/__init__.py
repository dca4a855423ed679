"""LangGraph layer: node decorators (tracing, idempotency, fencing) and, per agent, a graph builder.

Public names are re-exported here once; add a module's names to the imports and to ``__all__``.
"""

from graph.errors import (
    ClaimLostError,
    GraphError,
    IdempotencyError,
    IdempotencyStoreError,
    MissingThreadIdError,
    NodeResultError,
)
from graph.nodes import (
    RedisProvider,
    derive_idempotency_key,
    fence_scope,
    fields_digest,
    idempotency_key,
    idempotent_node,
    traced_node,
    use_tracer_provider,
)

__all__ = [
    "ClaimLostError",
    "GraphError",
    "IdempotencyError",
    "IdempotencyStoreError",
    "MissingThreadIdError",
    "NodeResultError",
    "RedisProvider",
    "derive_idempotency_key",
    "fence_scope",
    "fields_digest",
    "idempotency_key",
    "idempotent_node",
    "traced_node",
    "use_tracer_provider",
]
