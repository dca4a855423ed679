"""Typed clients for hotel-api and payment-api, used by the agents' graph nodes.

Built on ``infra.http.create_http_client``: every request carries the remaining timeout budget (and is bounded by
it) and the W3C trace context. Mutations take the caller's ``idempotency_key`` (sent as ``Idempotency-Key``):
derive it from the operation, never from the attempt, so a retry is recognised as the same request.

Errors are converted here (see ``infra.clients.errors``): ``ProviderUnavailableError`` is worth a retry,
``ProviderRejectedError`` and its subclasses never are, and a timeout that used up the request's budget is a
``resilience.errors.BudgetExhaustedError`` (the provider may be fine; we are out of time).

The clients add no retry, breaker or bulkhead of their own; wrap calls in ``resilience.policy_for(...)``.

The business calls send the client's key (``Authorization: Bearer``, ``identity.auth.provider_api_key``): the key of
``client`` (default: this service), or ``HOTEL_API_KEY`` / ``PAYMENT_API_KEY`` when set; a refused key is a
``ProviderAuthError``. The admin methods (faults, ledger, availability) send ``CONCIERGE_ADMIN_TOKEN`` instead, when
it is set; neither credential goes anywhere else (no journal entry, span or error carries it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import date
from types import TracebackType
from typing import Any, ClassVar, NoReturn, Self

import httpx

from domain.booking import JournalKind
from identity.auth import admin_token, provider_api_key
from infra.clients.errors import (
    IdempotencyMismatchError,
    InvalidProviderRequestError,
    NoAvailabilityError,
    PaymentDeclinedError,
    ProviderAuthError,
    ProviderConflictError,
    ProviderError,
    ProviderNotFoundError,
    ProviderUnavailableError,
)
from infra.clients.wire import IDEMPOTENCY_HEADER, REPLAYED_HEADER, error_fields
from infra.http import create_http_client, never_connected
from infra.journal import note
from infra.metrics import count_duplicate_prevented
from infra.settings import get_settings
from resilience.budget import outgoing_budget_seconds
from resilience.errors import BudgetExhaustedError

__all__ = ["HotelApiClient", "PaymentApiClient"]

# Statuses that say "not now" rather than "no": retryable like a 5xx.
_RETRYABLE_4XX = frozenset({408, 425, 429})


def _iso(value: date | str) -> str:
    return value.isoformat() if isinstance(value, date) else value


class _ProviderClient:
    provider: ClassVar[str]

    def __init__(
        self, base_url: str | None = None, *, http: httpx.AsyncClient | None = None, client: str | None = None
    ) -> None:
        """``client``: whose key the business calls present (``identity.auth.PROVIDER_CLIENTS``); default this service's."""
        if http is not None and base_url is not None:
            raise ValueError("pass base_url or http (already pointed at the provider), not both")
        self._client = client
        self._owns_http = http is None
        self._http = http if http is not None else create_http_client(base_url or self._default_url())

    @classmethod
    def _default_url(cls) -> str:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it (a client passed in stays the caller's)."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, str | int | float] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        what = f"{self.provider} {method} {path}"
        headers = {IDEMPOTENCY_HEADER: idempotency_key} if idempotency_key is not None else {}
        settings = get_settings()
        token = (
            admin_token(settings)
            if path.startswith("/admin/")
            else provider_api_key(self.provider, self._client, settings)
        )
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        started = time.perf_counter()
        response: httpx.Response | None = None
        try:
            response = await self._http.request(method, path, json=json, params=params, headers=headers)
            response.raise_for_status()
            return response.json() if response.content else {}
        except httpx.HTTPStatusError as exc:
            self._raise_for_answer(what, exc.response, exc)
        except httpx.TimeoutException as exc:
            self._raise_if_budget_spent(what, exc)
            raise ProviderUnavailableError(
                f"{what}: timed out ({type(exc).__name__})", provider=self.provider, sent=not never_connected(exc)
            ) from exc
        except httpx.HTTPError as exc:
            raise ProviderUnavailableError(
                f"{what}: {type(exc).__name__}: {exc}", provider=self.provider, sent=not never_connected(exc)
            ) from exc
        except ValueError as exc:  # a 2xx whose body is not JSON: the provider is misbehaving
            raise ProviderUnavailableError(f"{what}: answer is not JSON", provider=self.provider) from exc
        finally:
            if not path.startswith("/admin/"):
                self._journal(method, path, idempotency_key, response, started)

    def _journal(
        self, method: str, path: str, idempotency_key: str | None, response: httpx.Response | None, started: float
    ) -> None:
        # a call entry in the booking's journal (when one is at hand): replayed = the provider answered from its
        # idempotency record, the duplicate that did not happen
        replayed = response is not None and response.headers.get(REPLAYED_HEADER, "").lower() == "true"
        if replayed:
            count_duplicate_prevented(self.provider)
        note(
            JournalKind.CALL,
            dependency=self.provider,
            operation=f"{method} {path}",
            outcome="no answer" if response is None else str(response.status_code),
            idempotency_key=idempotency_key,
            replayed=replayed,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
        )

    @staticmethod
    def _raise_if_budget_spent(what: str, exc: httpx.TimeoutException) -> None:
        # The request's timeout is the outgoing budget. If another call could not even start now, the budget is
        # what ran out, not the provider's patience.
        try:
            outgoing_budget_seconds()
        except BudgetExhaustedError:
            raise BudgetExhaustedError(f"{what}: the timeout budget ran out while waiting for the answer") from exc

    def _raise_for_answer(self, what: str, response: httpx.Response, exc: httpx.HTTPStatusError) -> NoReturn:
        status = response.status_code
        try:
            decoded = response.json()
        except ValueError:
            decoded = None
        body: Mapping[str, Any] = decoded if isinstance(decoded, Mapping) else {}
        code, message = error_fields(body)
        text = f"{what}: {status} {code or response.reason_phrase}" + (f": {message}" if message else "")
        fields: dict[str, Any] = {"provider": self.provider, "status_code": status, "code": code, "body": body}
        error: ProviderError
        if status >= 500 or status in _RETRYABLE_4XX:
            error = ProviderUnavailableError(text, **fields)
        elif status == 402:
            reason, payment_id = body.get("reason"), body.get("payment_id")
            error = PaymentDeclinedError(
                text + (f" ({reason})" if reason else ""),
                reason=reason if isinstance(reason, str) else None,
                payment_id=payment_id if isinstance(payment_id, str) else None,
                **fields,
            )
        elif status in (401, 403):
            error = ProviderAuthError(text, **fields)
        elif status == 404:
            error = ProviderNotFoundError(text, **fields)
        elif status == 409:
            kind = NoAvailabilityError if code == "no_availability" else ProviderConflictError
            error = kind(text, **fields)
        elif status == 422 and code == "idempotency_key_reused":
            error = IdempotencyMismatchError(text, **fields)
        else:
            error = InvalidProviderRequestError(text, **fields)
        raise error from exc

    # faults: the same admin API on both providers

    async def faults(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", "/admin/faults")
        return result

    async def set_faults(
        self, *, latency_s: float = 0.0, error_rate: float = 0.0, hang: bool = False
    ) -> dict[str, Any]:
        """Replace the provider's faults (fields not given are reset to "no fault")."""
        body = {"latency_s": latency_s, "error_rate": error_rate, "hang": hang}
        result: dict[str, Any] = await self._request("PUT", "/admin/faults", json=body)
        return result

    async def clear_faults(self) -> None:
        await self._request("DELETE", "/admin/faults")


class HotelApiClient(_ProviderClient):
    """hotel-api. ``base_url`` defaults to ``HOTEL_API_URL``."""

    provider = "hotel-api"

    @classmethod
    def _default_url(cls) -> str:
        return get_settings().hotel_api_url

    async def search(self, city: str, checkin: date | str, checkout: date | str, guests: int) -> list[dict[str, Any]]:
        """Offers ``{hotel_id, name, city, stars, price_per_night, currency, available_rooms}``, cheapest first."""
        params: dict[str, str | int] = {
            "city": city,
            "checkin": _iso(checkin),
            "checkout": _iso(checkout),
            "guests": guests,
        }
        result = await self._request("GET", "/hotels", params=params)
        offers: list[dict[str, Any]] = result["offers"]
        return offers

    async def hotel(self, hotel_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/hotels/{hotel_id}")
        return result

    async def reserve(
        self,
        *,
        hotel_id: str,
        checkin: date | str,
        checkout: date | str,
        guests: int,
        reference: str,
        idempotency_key: str,
    ) -> dict[str, Any]:
        """Hold the rooms: ``{reservation_id, status: "held", total_price, currency, ...}``."""
        body = {
            "hotel_id": hotel_id,
            "checkin": _iso(checkin),
            "checkout": _iso(checkout),
            "guests": guests,
            "reference": reference,
        }
        result: dict[str, Any] = await self._request(
            "POST", "/reservations", json=body, idempotency_key=idempotency_key
        )
        return result

    async def confirm(self, reservation_id: str, *, idempotency_key: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request(
            "POST", f"/reservations/{reservation_id}/confirm", idempotency_key=idempotency_key
        )
        return result

    async def cancel(self, reservation_id: str, *, idempotency_key: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request(
            "POST", f"/reservations/{reservation_id}/cancel", idempotency_key=idempotency_key
        )
        return result

    async def reservation(self, reservation_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/reservations/{reservation_id}")
        return result

    async def ledger(self) -> list[dict[str, Any]]:
        """Every reservation ``{reservation_id, reference, hotel_id, checkin, checkout, guests, status}``."""
        result = await self._request("GET", "/admin/ledger")
        reservations: list[dict[str, Any]] = result["reservations"]
        return reservations

    async def availability(self, hotel_id: str, checkin: date | str, checkout: date | str) -> dict[str, Any]:
        params = {"hotel_id": hotel_id, "checkin": _iso(checkin), "checkout": _iso(checkout)}
        result: dict[str, Any] = await self._request("GET", "/admin/availability", params=params)
        return result


class PaymentApiClient(_ProviderClient):
    """payment-api. ``base_url`` defaults to ``PAYMENT_API_URL``."""

    provider = "payment-api"

    @classmethod
    def _default_url(cls) -> str:
        return get_settings().payment_api_url

    async def charge(
        self, *, amount: float, currency: str, payment_token: str, reference: str, idempotency_key: str
    ) -> dict[str, Any]:
        """Capture: ``{payment_id, status: "captured", amount, currency, reference}``; ``PaymentDeclinedError``."""
        body = {"amount": amount, "currency": currency, "payment_token": payment_token, "reference": reference}
        result: dict[str, Any] = await self._request("POST", "/charges", json=body, idempotency_key=idempotency_key)
        return result

    async def refund(self, payment_id: str, *, idempotency_key: str, amount: float | None = None) -> dict[str, Any]:
        """The charge, ``refunded`` or ``partially_refunded``, with the ``refund`` made (``amount``, default what is
        left); with nothing left, the charge unchanged. More than is left: ``ProviderError`` 409."""
        body = None if amount is None else {"amount": amount}
        result: dict[str, Any] = await self._request(
            "POST", f"/charges/{payment_id}/refund", json=body, idempotency_key=idempotency_key
        )
        return result

    async def get_charge(self, payment_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/charges/{payment_id}")
        return result

    async def find_charges(self, *, reference: str) -> list[dict[str, Any]]:
        """Every charge made for ``reference`` (captured, declined or refunded), oldest first, each with its
        ``refunds``: what a caller checks before sending again a refund that may have left."""
        result = await self._request("GET", "/charges", params={"reference": reference})
        charges: list[dict[str, Any]] = result["charges"]
        return charges

    async def ledger(self) -> list[dict[str, Any]]:
        """Every charge ``{payment_id, reference, amount, currency, status}``."""
        result = await self._request("GET", "/admin/ledger")
        charges: list[dict[str, Any]] = result["charges"]
        return charges
