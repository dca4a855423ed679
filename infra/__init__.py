"""Adapters to the world outside the graphs: settings, Redis, HTTP, telemetry, the checkpointer, the service shell
(``infra.service``), A2A (``infra.a2a``), the provider clients and their wire contract (``infra.clients``), the
booking record store (``infra.bookings``), every booking's journal (``infra.journal``) and the one error table
(``infra.error_table``).

Import from the modules: each is small and says what it is for; this namespace re-exports nothing.
"""

__all__: list[str] = []
