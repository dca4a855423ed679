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
from infra.lazy import lazy_exports

# The graph builders pull in the A2A SDK and the provider clients; resolve them on first use so importing the
# decorators (as the recovery CLI does) stays cheap.
_LAZY = {
    "BookingState": "graph.booking",
    "build_booking_graph": "graph.booking",
    "PaymentState": "graph.payment",
    "build_payment_graph": "graph.payment",
    "SearchState": "graph.search",
    "build_search_graph": "graph.search",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "BookingState",
    "ClaimLostError",
    "GraphError",
    "IdempotencyError",
    "IdempotencyStoreError",
    "MissingThreadIdError",
    "NodeResultError",
    "PaymentState",
    "RedisProvider",
    "SearchState",
    "build_booking_graph",
    "build_payment_graph",
    "build_search_graph",
    "derive_idempotency_key",
    "fence_scope",
    "fields_digest",
    "idempotency_key",
    "idempotent_node",
    "traced_node",
    "use_tracer_provider",
]
