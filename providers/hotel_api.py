"""hotel-api: a simulated hotel provider (``providers.hotel_api:app``). All state lives in Redis.

::

    GET  /hotels?city=&checkin=&checkout=&guests=   offers that can host the party, cheapest first, each with the
                                                     stay's ``cancellation`` policy (``domain.cancellation``)
    GET  /hotels/{hotel_id}                          details; 404 unknown
    POST /reservations                               hold rooms → 201 {reservation_id, status: "held", ...};
                                                     409 {"error": "no_availability"}; 404 unknown hotel
    POST /reservations/{id}/confirm                  held → confirmed (again: unchanged); cancelled → 409
    POST /reservations/{id}/cancel                   held/confirmed → cancelled, rooms given back exactly once (the
                                                     policy is the booking's to apply: hotel-api gives rooms back)
    GET  /reservations/{id}
    GET  /admin/ledger · GET /admin/availability · PUT/GET/DELETE /admin/faults

Capacity: a hotel has ``rooms`` rooms every night; Redis keeps only rooms *taken* per hotel and night (one hash,
field ``<hotel_id>:<YYYY-MM-DD>``), so a night never booked has full capacity and nothing needs seeding. A party
takes ``ceil(guests / 2)`` rooms every night; ``available_rooms`` of a stay is the minimum over its nights;
``total_price = price_per_night × rooms × nights``. POSTs need ``Idempotency-Key`` (see ``idempotency.py``). Every
route above but ``/admin`` wants ``Authorization: Bearer <key>`` of booking-agent or search-agent, else 401
(``providers.base.ClientKeyGuard``).

Its faults (``providers.faults.HotelFaults``) add two to the providers' own: ``price_change_pct`` (a hold costs that
much more than search showed: the total of the hold, rounded to cents) and ``name_suffix`` (appended to every hotel
name answered: offers, details, holds). Both are read when the request comes: a hold keeps the price and the name
it was made with.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import date
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from pydantic import BaseModel, Field
from redis.asyncio import Redis

from domain.booking import nights_between
from infra.clients.wire import Cancellation, Offers, provider_error
from infra.service import get_redis
from infra.service.openapi import answers
from infra.service.openapi import provider_error as provider_answer
from providers.base import IDEMPOTENT_ANSWERS, IDEMPOTENT_ROUTE, REPLAYED, ProviderApiError, create_provider_app
from providers.faults import HotelFaults
from providers.idempotency import IdempotentScript, fingerprint, record_suffix, require_idempotency_key
from providers.inventory import Hotel, find_hotel, hotels_in
from providers.keys import provider_key
from providers.stays import Stay

__all__ = ["PROVIDER", "ReservationRequest", "SearchQuery", "app", "create_app"]

PROVIDER = "hotel-api"

RedisDep = Annotated[Redis, Depends(get_redis)]
IdempotencyKey = Annotated[str, Depends(require_idempotency_key)]


def _key(*parts: str) -> str:
    return provider_key(PROVIDER, *parts)


def _taken_key() -> str:
    return _key("taken")


def _ledger_key() -> str:
    return _key("reservations")


def _reservation_key(reservation_id: str) -> str:
    return _key("reservation", reservation_id)


def _record_key(idempotency_key: str) -> str:
    return _key("idempotency", record_suffix(idempotency_key))


def _night_field(hotel_id: str, night: date) -> str:
    return f"{hotel_id}:{night.isoformat()}"


# Capacity sent for a hotel that is not in the inventory: recorded as 404 like any other answer, so a replay
# of the key and a reuse with another body behave as for every other request.
_UNKNOWN_HOTEL = -1

# KEYS[2] reservation · KEYS[3] taken hash · KEYS[4] ledger list
# ARGV[3] capacity (-1: unknown hotel) · ARGV[4] rooms · ARGV[5] reservation JSON · ARGV[6] reservation id
# ARGV[7] refusal body (404 or 409) · ARGV[8..] the stay's night fields
_RESERVE = IdempotentScript("""
local capacity = tonumber(ARGV[3])
local rooms = tonumber(ARGV[4])
if capacity < 0 then
  return finish(404, ARGV[7])
end
for i = 8, #ARGV do
  local taken = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '0')
  if taken + rooms > capacity then
    return finish(409, ARGV[7])
  end
end
for i = 8, #ARGV do
  redis.call('HINCRBY', KEYS[3], ARGV[i], rooms)
end
redis.call('SET', KEYS[2], ARGV[5])
redis.call('RPUSH', KEYS[4], ARGV[6])
return finish(201, ARGV[5])
""")

# KEYS[2] reservation · ARGV[3] 404 body
_CONFIRM = IdempotentScript("""
local raw = redis.call('GET', KEYS[2])
if not raw then
  return finish(404, ARGV[3])
end
local r = cjson.decode(raw)
if r.status == 'cancelled' then
  return finish(409, cjson.encode({error = 'reservation_cancelled', reservation_id = r.reservation_id,
    message = 'a cancelled reservation cannot be confirmed'}))
end
if r.status == 'confirmed' then
  return finish(200, raw)
end
r.status = 'confirmed'
local out = cjson.encode(r)
redis.call('SET', KEYS[2], out)
return finish(200, out)
""")

# KEYS[2] reservation · KEYS[3] taken hash · ARGV[3] 404 body
_CANCEL = IdempotentScript("""
local raw = redis.call('GET', KEYS[2])
if not raw then
  return finish(404, ARGV[3])
end
local r = cjson.decode(raw)
if r.status == 'cancelled' then
  return finish(200, raw)
end
for _, night in ipairs(r.nights) do
  redis.call('HINCRBY', KEYS[3], r.hotel_id .. ':' .. night, -r.rooms)
end
r.status = 'cancelled'
local out = cjson.encode(r)
redis.call('SET', KEYS[2], out)
return finish(200, out)
""")


class SearchQuery(Stay):
    city: str = Field(min_length=1, max_length=80)


class ReservationRequest(Stay):
    hotel_id: str = Field(min_length=1, max_length=64)
    reference: str = Field(min_length=1, max_length=200)


async def _available(redis: Redis, hotels: tuple[Hotel, ...], nights: list[date]) -> dict[str, int]:
    """Rooms free for the whole stay, per hotel: capacity minus the most taken on any night."""
    fields = [_night_field(h.hotel_id, n) for h in hotels for n in nights]
    taken = await redis.hmget(_taken_key(), fields) if fields else []
    free: dict[str, int] = {}
    for index, hotel in enumerate(hotels):
        chunk = taken[index * len(nights) : (index + 1) * len(nights)]
        most_taken = max((int(t or 0) for t in chunk), default=0)
        free[hotel.hotel_id] = max(0, hotel.rooms - most_taken)
    return free


def _faults(request: Request) -> HotelFaults:
    """The request's faults, as the injector read them (no second Redis read)."""
    faults = getattr(request.state, "faults", None)
    return faults if isinstance(faults, HotelFaults) else HotelFaults()


def _not_found(reservation_id: str) -> str:
    return json.dumps(provider_error("reservation_not_found", reservation_id=reservation_id))


# ----------------------------------------------------------------------- OpenAPI documentation (changes nothing)


class Reservation(BaseModel):
    reservation_id: str
    status: Literal["held", "confirmed", "cancelled"]
    hotel_id: str
    hotel_name: str
    checkin: str
    checkout: str
    guests: int
    rooms: int
    nights: list[str]
    total_price: float
    currency: str
    reference: str
    created_at: float
    cancellation: Cancellation


_HOTEL_NOT_FOUND = provider_answer(404, "hotel_not_found", description="No hotel with this id.")
_RESERVATION_NOT_FOUND = provider_answer(
    404, "reservation_not_found", description="No reservation with this id.", headers=REPLAYED
)


def _recorded(status: int, description: str) -> dict[str, Any]:
    """A success an idempotency record may replay."""
    return {"model": Reservation, "description": description, "headers": REPLAYED}


business = APIRouter(tags=["hotel-api"])
admin = APIRouter(prefix="/admin", tags=["admin"])


@business.get(
    "/hotels", responses={200: {"model": Offers, "description": "Offers with rooms for the party, cheapest first."}}
)
async def search_hotels(query: Annotated[SearchQuery, Query()], redis: RedisDep, request: Request) -> dict[str, Any]:
    """Offers in ``city`` with enough rooms for the party on every night, cheapest first."""
    hotels = hotels_in(query.city)
    free = await _available(redis, hotels, query.nights)
    faults = _faults(request)
    offers = [
        h.offer(free[h.hotel_id], query.checkin, query.rooms) | {"name": faults.hotel_name(h.name)}
        for h in hotels
        if free[h.hotel_id] >= query.rooms
    ]
    offers.sort(key=lambda o: (o["price_per_night"], o["hotel_id"]))
    return {"offers": offers}


@business.get("/hotels/{hotel_id}", responses=answers(_HOTEL_NOT_FOUND))
async def get_hotel(hotel_id: str, request: Request) -> dict[str, object]:
    hotel = find_hotel(hotel_id)
    if hotel is None:
        raise ProviderApiError(404, "hotel_not_found", hotel_id=hotel_id)
    return hotel.describe() | {"name": _faults(request).hotel_name(hotel.name)}


def _new_reservation(
    reservation_id: str, hotel: Hotel, request: ReservationRequest, faults: HotelFaults
) -> dict[str, Any]:
    nights = request.nights
    offered_total = round(hotel.price_per_night * request.rooms * len(nights), 2)
    total = faults.held_total(offered_total)
    policy = hotel.policy(request.checkin, total / len(nights))  # the first night of the stay as held
    return {
        "reservation_id": reservation_id,
        "status": "held",
        "hotel_id": hotel.hotel_id,
        "hotel_name": faults.hotel_name(hotel.name),
        "checkin": request.checkin.isoformat(),
        "checkout": request.checkout.isoformat(),
        "guests": request.guests,
        "rooms": request.rooms,
        "nights": [n.isoformat() for n in nights],
        "total_price": total,
        "currency": hotel.currency,
        "reference": request.reference,
        "created_at": time.time(),
        "cancellation": policy.to_wire(),
    }


@business.post(
    "/reservations",
    status_code=201,
    response_model=None,
    openapi_extra=IDEMPOTENT_ROUTE,
    responses={
        201: _recorded(201, "Rooms held."),
        **answers(
            *IDEMPOTENT_ANSWERS,
            provider_answer(404, "hotel_not_found", description="No hotel with this id.", headers=REPLAYED),
            provider_answer(
                409, "no_availability", description="Not enough rooms on every night of the stay.", headers=REPLAYED
            ),
        ),
    },
)
async def create_reservation(
    body: ReservationRequest, idempotency_key: IdempotencyKey, redis: RedisDep, request: Request
) -> Response:
    hotel = find_hotel(body.hotel_id)
    reservation_id = f"res_{uuid.uuid4().hex}"
    if hotel is None:
        capacity, record = _UNKNOWN_HOTEL, ""
        refusal = provider_error("hotel_not_found", hotel_id=body.hotel_id)
    else:
        capacity, record = hotel.rooms, json.dumps(_new_reservation(reservation_id, hotel, body, _faults(request)))
        refusal = provider_error("no_availability", "not enough rooms on every night", hotel_id=body.hotel_id)
    outcome = await _RESERVE.run(
        redis,
        record_key=_record_key(idempotency_key),
        request_fingerprint=fingerprint("POST /reservations", body.model_dump(mode="json")),
        keys=[_reservation_key(reservation_id), _taken_key(), _ledger_key()],
        args=[
            capacity,
            body.rooms,
            record,
            reservation_id,
            json.dumps(refusal),
            *(_night_field(body.hotel_id, n) for n in body.nights),
        ],
    )
    return outcome.to_response()


@business.post(
    "/reservations/{reservation_id}/confirm",
    response_model=None,
    openapi_extra=IDEMPOTENT_ROUTE,
    responses={
        200: _recorded(200, "Confirmed (again: unchanged)."),
        **answers(
            *IDEMPOTENT_ANSWERS,
            _RESERVATION_NOT_FOUND,
            provider_answer(
                409,
                "reservation_cancelled",
                description="A cancelled reservation cannot be confirmed.",
                headers=REPLAYED,
            ),
        ),
    },
)
async def confirm_reservation(reservation_id: str, idempotency_key: IdempotencyKey, redis: RedisDep) -> Response:
    outcome = await _CONFIRM.run(
        redis,
        record_key=_record_key(idempotency_key),
        request_fingerprint=fingerprint("POST /reservations/{id}/confirm", {"reservation_id": reservation_id}),
        keys=[_reservation_key(reservation_id)],
        args=[_not_found(reservation_id)],
    )
    return outcome.to_response()


@business.post(
    "/reservations/{reservation_id}/cancel",
    response_model=None,
    openapi_extra=IDEMPOTENT_ROUTE,
    responses={
        200: _recorded(200, "Cancelled, its rooms given back (again: unchanged)."),
        **answers(*IDEMPOTENT_ANSWERS, _RESERVATION_NOT_FOUND),
    },
)
async def cancel_reservation(reservation_id: str, idempotency_key: IdempotencyKey, redis: RedisDep) -> Response:
    outcome = await _CANCEL.run(
        redis,
        record_key=_record_key(idempotency_key),
        request_fingerprint=fingerprint("POST /reservations/{id}/cancel", {"reservation_id": reservation_id}),
        keys=[_reservation_key(reservation_id), _taken_key()],
        args=[_not_found(reservation_id)],
    )
    return outcome.to_response()


@business.get(
    "/reservations/{reservation_id}",
    responses={
        200: {"model": Reservation, "description": "The reservation."},
        **answers(provider_answer(404, "reservation_not_found", description="No reservation with this id.")),
    },
)
async def get_reservation(reservation_id: str, redis: RedisDep) -> dict[str, Any]:
    raw = await redis.get(_reservation_key(reservation_id))
    if raw is None:
        raise ProviderApiError(404, "reservation_not_found", reservation_id=reservation_id)
    reservation: dict[str, Any] = json.loads(raw)
    return reservation


_LEDGER_FIELDS = ("reservation_id", "reference", "hotel_id", "checkin", "checkout", "guests", "status")


@admin.get("/ledger")
async def ledger(redis: RedisDep) -> dict[str, Any]:
    """Every reservation ever held, oldest first."""
    ids = cast(list[str], await redis.lrange(_ledger_key(), 0, -1))
    raws = await redis.mget([_reservation_key(i) for i in ids]) if ids else []
    reservations = [json.loads(raw) for raw in raws if raw is not None]
    return {"reservations": [{f: r.get(f) for f in _LEDGER_FIELDS} for r in reservations]}


class AvailabilityQuery(Stay):
    hotel_id: str
    guests: int = 1


@admin.get("/availability", responses=answers(_HOTEL_NOT_FOUND))
async def availability(query: Annotated[AvailabilityQuery, Query()], redis: RedisDep) -> dict[str, Any]:
    """Rooms free per night of a stay at one hotel (``guests`` is ignored)."""
    hotel = find_hotel(query.hotel_id)
    if hotel is None:
        raise ProviderApiError(404, "hotel_not_found", hotel_id=query.hotel_id)
    nights = nights_between(query.checkin, query.checkout)
    taken = await redis.hmget(_taken_key(), [_night_field(hotel.hotel_id, n) for n in nights])
    per_night = {n.isoformat(): hotel.rooms - int(t or 0) for n, t in zip(nights, taken, strict=True)}
    return {
        "hotel_id": hotel.hotel_id,
        "capacity": hotel.rooms,
        "nights": per_night,
        "available_rooms": min(per_night.values()),
    }


def create_app() -> FastAPI:
    return create_provider_app(PROVIDER, business, admin, faults_model=HotelFaults, client_keys=True)


app = create_app()
