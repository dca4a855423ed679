"""The exceptions the graph layer raises.

::

    Exception
     └── GraphError                         base of everything raised by ``graph``
          ├── MissingThreadIdError          a node that must know its run got no ``thread_id`` (also ``ValueError``)
          ├── MigrationError                a declared migration leaves a checkpoint the new graph cannot resume
          └── IdempotencyError              an idempotent node could not guarantee "at most one result"
               ├── IdempotencyStoreError    Redis failed while claiming / completing (the library error is the cause)
               ├── ClaimLostError           our claim lapsed while the body ran and another live owner holds it now
               └── NodeResultError          the node returned something that cannot be stored (not a JSON dict;
                                            also ``TypeError``)

Control-flow exceptions of LangGraph (``GraphBubbleUp``: interrupts, parent commands) and ``asyncio.CancelledError``
are never wrapped: they pass through the decorators unchanged.
"""

from __future__ import annotations


class GraphError(Exception):
    """Base class of every error the graph layer raises."""


class MissingThreadIdError(GraphError, ValueError):
    def __init__(self, node: str) -> None:
        super().__init__(
            f"node {node!r} is idempotent and needs config['configurable']['thread_id'] to know which run it "
            "belongs to; invoke the graph with a thread id"
        )
        self.node = node


class MigrationError(GraphError):
    """A checkpoint migrated as declared still names what the new graph lacks (a node, a state key): the migration
    is incomplete, and the checkpoint is left as it was."""

    def __init__(self, thread_id: str, unknown: list[str]) -> None:
        super().__init__(
            f"the migrated checkpoint of run {thread_id!r} names what the new graph lacks: {', '.join(unknown)}"
        )
        self.thread_id = thread_id
        self.unknown = unknown


class IdempotencyError(GraphError):
    """An idempotent node could not record or look up its result safely."""


class IdempotencyStoreError(IdempotencyError):
    """The idempotency store (Redis) failed; the original error is ``__cause__``."""

    def __init__(self, node: str, operation: str) -> None:
        super().__init__(f"idempotency store failed during {operation} of node {node!r}")
        self.node = node
        self.operation = operation


class ClaimLostError(IdempotencyError):
    """Our lease lapsed while the body ran and another owner claimed the node; its outcome is unknown.

    The body's result was NOT stored (storing it would overwrite the live owner's work). A retry of the node
    returns the other owner's result once it completes, or runs again if it fails.
    """

    def __init__(self, node: str, key: str, other_owner: str) -> None:
        super().__init__(
            f"node {node!r} lost its idempotency claim on {key!r} while running; owner is now {other_owner!r}, "
            "so this result was discarded"
        )
        self.node = node
        self.key = key
        self.other_owner = other_owner


class NodeResultError(IdempotencyError, TypeError):
    """An idempotent node returned something other than a JSON-serialisable ``dict``."""

    def __init__(self, node: str, detail: str) -> None:
        super().__init__(f"idempotent node {node!r} must return a JSON-serialisable dict: {detail}")
        self.node = node
