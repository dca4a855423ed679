"""concierge-agent: the chat API (``app``) and its durable graph (``durable``: a chat turn), each module imported by
its own path so the recovery worker loads the graph without the service."""

__all__: list[str] = []
