"""booking-agent: the booking API (``app``) and its two durable graphs (``durable``: a booking, and the cancel of a
confirmed one), each module imported by its own path so the recovery worker loads the graphs without the service."""

__all__: list[str] = []
