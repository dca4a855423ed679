"""The typed clients our agents reach the providers with (hotel-api, payment-api), their errors and the wire
contract both sides share (``infra.clients.wire``)."""

from typing import TYPE_CHECKING, Any

from infra.clients.errors import (
    IdempotencyMismatchError,
    InvalidProviderRequestError,
    NoAvailabilityError,
    PaymentDeclinedError,
    ProviderAuthError,
    ProviderConflictError,
    ProviderError,
    ProviderNotFoundError,
    ProviderRejectedError,
    ProviderUnavailableError,
)

if TYPE_CHECKING:
    from infra.clients.providers import HotelApiClient, PaymentApiClient


def __getattr__(name: str) -> Any:
    # the clients load httpx; the errors and the wire contract do not, and the providers and every service's error
    # table import those: the clients only for who asks (PEP 562, docs/benchmarks.md#start-up)
    if name in ("HotelApiClient", "PaymentApiClient"):
        from infra.clients import providers

        return getattr(providers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HotelApiClient",
    "IdempotencyMismatchError",
    "InvalidProviderRequestError",
    "NoAvailabilityError",
    "PaymentApiClient",
    "PaymentDeclinedError",
    "ProviderAuthError",
    "ProviderConflictError",
    "ProviderError",
    "ProviderNotFoundError",
    "ProviderRejectedError",
    "ProviderUnavailableError",
]
