"""The simulated outside world: hotel-api and payment-api, with fault injection and idempotency keys.

Beside the agents, never imported by them (``make lint`` checks it): agents reach these apps over HTTP through
``infra.clients``, and the two sides share only the wire contract (``infra.clients.wire``). The apps are served by
import string (``providers.hotel_api:app``, ``providers.payment_api:app``), so importing this package builds none.
"""

__all__: list[str] = []
