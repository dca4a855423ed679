"""The simulated outside world (hotel-api, payment-api) and the typed clients our agents use to reach it.

The apps are served by import string (``infra.providers.hotel_api:app``, ``infra.providers.payment_api:app``)
and are not imported here, so importing the clients builds no app.
"""

from infra.providers.clients import HotelApiClient, PaymentApiClient
from infra.providers.errors import (
    IdempotencyMismatchError,
    InvalidProviderRequestError,
    NoAvailabilityError,
    PaymentDeclinedError,
    ProviderConflictError,
    ProviderError,
    ProviderNotFoundError,
    ProviderRejectedError,
    ProviderUnavailableError,
)

__all__ = [
    "HotelApiClient",
    "IdempotencyMismatchError",
    "InvalidProviderRequestError",
    "NoAvailabilityError",
    "PaymentApiClient",
    "PaymentDeclinedError",
    "ProviderConflictError",
    "ProviderError",
    "ProviderNotFoundError",
    "ProviderRejectedError",
    "ProviderUnavailableError",
]
