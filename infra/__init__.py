"""Adapters to the world outside the graphs: settings, Redis, HTTP, telemetry, the checkpointer, the service shell
(``infra.service``), A2A (``infra.a2a``), the provider clients and their wire contract (``infra.clients``), the
booking record store (``infra.bookings``), every booking's journal (``infra.journal``), per-person quotas
(``infra.quotas``) and the one error table (``infra.error_table``). Who is calling (``identity``), a process's life
(``process``) and what an exception says (``errors``) are the floor below.

Import from the modules: each is small and says what it is for; this namespace re-exports nothing.
"""

__all__: list[str] = []
