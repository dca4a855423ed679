"""The typed clients our agents reach the providers with (hotel-api, payment-api), their errors and the wire
contract both sides share (``infra.clients.wire``)."""

from infra.clients.errors import (
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
from infra.clients.providers import HotelApiClient, PaymentApiClient

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
