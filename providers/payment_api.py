"""payment-api: a simulated card processor (``providers.payment_api:app``). All state lives in Redis.

::

    POST /charges                  {amount, currency, payment_token, reference} → 201 {payment_id,
                                   status: "captured", ...}; 402 {"error": "card_declined"[, "reason"]}
    POST /charges/{id}/refund      {amount?} (default: what is left) → 200 the charge, partially_refunded or
                                   refunded, with ``refund``; nothing left → unchanged; more than is left → 409
                                   refund_exceeds_capture; declined → 409 charge_not_captured; unknown → 404
    GET  /charges/{id} · GET /charges?reference=   one charge · every charge of a reference (with ``refunds``)
    GET  /admin/ledger · PUT/GET/DELETE /admin/faults   (the ledger: ``charges`` and ``refunds``)

Test tokens: ``tok_visa`` and any ``tok_ok_*`` are captured; ``tok_declined`` is declined; any other token is
declined with ``reason: "unknown test token"``. A declined charge is still a charge: it gets a ``payment_id``,
is in the ledger with status ``declined``, and replaying its key answers the same 402. POSTs need
``Idempotency-Key`` (see ``idempotency.py``). Every route above but ``/admin`` wants ``Authorization: Bearer <key>``
of payment-agent, its one client, else 401 (``providers.base.ClientKeyGuard``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Depends, FastAPI, Query, Response
from pydantic import BaseModel, Field
from redis.asyncio import Redis

from domain.booking import to_cents
from infra.clients.wire import provider_error
from infra.service import get_redis
from infra.service.openapi import answers
from infra.service.openapi import provider_error as provider_answer
from providers.base import IDEMPOTENT_ANSWERS, IDEMPOTENT_ROUTE, REPLAYED, ProviderApiError, create_provider_app
from providers.idempotency import IdempotentScript, fingerprint, record_suffix, require_idempotency_key
from providers.keys import provider_key

__all__ = ["PROVIDER", "ChargeRequest", "RefundRequest", "app", "create_app", "token_outcome"]

PROVIDER = "payment-api"
MAX_AMOUNT = 1_000_000

RedisDep = Annotated[Redis, Depends(get_redis)]
IdempotencyKey = Annotated[str, Depends(require_idempotency_key)]


def _key(*parts: str) -> str:
    return provider_key(PROVIDER, *parts)


def _ledger_key() -> str:
    return _key("charges")


def _reference_key(reference: str) -> str:
    return _key("by-reference", reference)


def _charge_key(payment_id: str) -> str:
    return _key("charge", payment_id)


def _refunds_key() -> str:
    return _key("refunds")


def _charge_refunds_key(payment_id: str) -> str:
    return _key("refunds-of", payment_id)


def _record_key(idempotency_key: str) -> str:
    return _key("idempotency", record_suffix(idempotency_key))


def token_outcome(payment_token: str) -> tuple[bool, str | None]:
    """``(captured, decline reason)`` for a test token."""
    if payment_token == "tok_visa" or payment_token.startswith("tok_ok_"):
        return True, None
    if payment_token == "tok_declined":
        return False, None
    return False, "unknown test token"


# KEYS[2] charge · KEYS[3] ledger list · KEYS[4] the reference's charges · ARGV[3] status code
# ARGV[4] charge JSON · ARGV[5] response body · ARGV[6] payment id
_CHARGE = IdempotentScript("""
redis.call('SET', KEYS[2], ARGV[4])
redis.call('RPUSH', KEYS[3], ARGV[6])
redis.call('RPUSH', KEYS[4], ARGV[6])
return finish(tonumber(ARGV[3]), ARGV[5])
""")

# KEYS[2] charge · KEYS[3] the ledger's refunds · KEYS[4] the charge's refunds · ARGV[3] 404 body
# ARGV[4] amount in cents ('' for what is left) · ARGV[5] refund id · ARGV[6] now (seconds)
# Amounts are counted in cents: a refund of exactly what is left leaves 0, never 1e-14.
_REFUND = IdempotentScript("""
local raw = redis.call('GET', KEYS[2])
if not raw then
  return finish(404, ARGV[3])
end
local c = cjson.decode(raw)
if c.status == 'declined' then
  return finish(409, cjson.encode({error = 'charge_not_captured', payment_id = c.payment_id,
    message = 'a declined charge has nothing to refund'}))
end
local function cents(x) return math.floor(x * 100 + 0.5) end
local captured = cents(c.amount)
local refunded = cents(c.refunded_amount or (c.status == 'refunded' and c.amount or 0))
local left = captured - refunded
local wanted = left
if ARGV[4] ~= '' then wanted = tonumber(ARGV[4]) end
if wanted > left then
  return finish(409, cjson.encode({error = 'refund_exceeds_capture', payment_id = c.payment_id,
    left = left / 100, message = 'a refund cannot exceed what is left of the charge'}))
end
if wanted == 0 then
  return finish(200, raw)
end
refunded = refunded + wanted
c.refunded_amount = refunded / 100
if refunded == captured then c.status = 'refunded' else c.status = 'partially_refunded' end
local refund = cjson.encode({refund_id = ARGV[5], payment_id = c.payment_id, reference = c.reference,
  amount = wanted / 100, currency = c.currency, created_at = tonumber(ARGV[6])})
local out = cjson.encode(c)
redis.call('SET', KEYS[2], out)
redis.call('RPUSH', KEYS[3], refund)
redis.call('RPUSH', KEYS[4], refund)
return finish(200, string.sub(out, 1, -2) .. ',"refund":' .. refund .. '}')
""")


class ChargeRequest(BaseModel):
    amount: float = Field(gt=0, le=MAX_AMOUNT, allow_inf_nan=False)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    payment_token: str = Field(min_length=1, max_length=128)
    reference: str = Field(min_length=1, max_length=200)


class RefundRequest(BaseModel):
    amount: float | None = Field(None, ge=0.01, le=MAX_AMOUNT, allow_inf_nan=False)
    """What to refund, rounded to the nearest cent (at least one); ``None``: whatever is left of the capture."""


# ----------------------------------------------------------------------- OpenAPI documentation (changes nothing)


class Refund(BaseModel):
    refund_id: str
    payment_id: str
    reference: str
    amount: float
    currency: str
    created_at: float


class Charge(BaseModel):
    payment_id: str
    status: Literal["captured", "declined", "partially_refunded", "refunded"]
    amount: float
    currency: str
    reference: str
    created_at: float
    refunded_amount: float = 0.0
    """What its refunds sum to (a ``refunded`` charge: all of it)."""


class Refunded(Charge):
    refund: Refund | None = None
    """The refund this request made; absent when it refunded nothing (nothing was left)."""


class ChargeWithRefunds(Charge):
    refunds: list[Refund]


class Charges(BaseModel):
    charges: list[ChargeWithRefunds]


_CHARGE_NOT_FOUND = provider_answer(404, "charge_not_found", description="No charge with this id.")


business = APIRouter(tags=["payment-api"])
admin = APIRouter(prefix="/admin", tags=["admin"])


@business.post(
    "/charges",
    status_code=201,
    response_model=None,
    openapi_extra=IDEMPOTENT_ROUTE,
    responses={
        201: {"model": Charge, "description": "Captured.", "headers": REPLAYED},
        **answers(
            *IDEMPOTENT_ANSWERS,
            provider_answer(
                402,
                "card_declined",
                description="Declined (`tok_declined`; any other token not `tok_visa` or `tok_ok_*`, with "
                "`reason`): still a charge, with its `payment_id`.",
                headers=REPLAYED,
            ),
        ),
    },
)
async def create_charge(body: ChargeRequest, idempotency_key: IdempotencyKey, redis: RedisDep) -> Response:
    captured, reason = token_outcome(body.payment_token)
    payment_id = f"pay_{uuid.uuid4().hex}"
    charge = {
        "payment_id": payment_id,
        "status": "captured" if captured else "declined",
        "amount": body.amount,
        "currency": body.currency,
        "reference": body.reference,
        "created_at": time.time(),
    }
    if captured:
        status, answer = 201, charge
    else:
        extra = {} if reason is None else {"reason": reason}
        status, answer = 402, provider_error("card_declined", payment_id=payment_id, **extra)
    outcome = await _CHARGE.run(
        redis,
        record_key=_record_key(idempotency_key),
        request_fingerprint=fingerprint("POST /charges", body.model_dump(mode="json")),
        keys=[_charge_key(payment_id), _ledger_key(), _reference_key(body.reference)],
        args=[status, json.dumps(charge), json.dumps(answer), payment_id],
    )
    return outcome.to_response()


@business.post(
    "/charges/{payment_id}/refund",
    response_model=None,
    openapi_extra=IDEMPOTENT_ROUTE,
    responses={
        200: {
            "model": Refunded,
            "description": "Refunded (``amount``, or whatever was left); nothing left: the charge, unchanged.",
            "headers": REPLAYED,
        },
        **answers(
            *IDEMPOTENT_ANSWERS,
            provider_answer(404, "charge_not_found", description="No charge with this id.", headers=REPLAYED),
            provider_answer(
                409,
                "charge_not_captured",
                description="A declined charge has nothing to refund; ``refund_exceeds_capture``: more than is "
                "left of it (``left``).",
                headers=REPLAYED,
            ),
        ),
    },
)
async def refund_charge(
    payment_id: str, idempotency_key: IdempotencyKey, redis: RedisDep, body: RefundRequest | None = None
) -> Response:
    amount = None if body is None else body.amount
    outcome = await _REFUND.run(
        redis,
        record_key=_record_key(idempotency_key),
        request_fingerprint=fingerprint("POST /charges/{id}/refund", {"payment_id": payment_id, "amount": amount}),
        keys=[_charge_key(payment_id), _refunds_key(), _charge_refunds_key(payment_id)],
        args=[
            json.dumps(provider_error("charge_not_found", payment_id=payment_id)),
            "" if amount is None else str(to_cents(amount)),
            f"re_{uuid.uuid4().hex}",
            time.time(),
        ],
    )
    return outcome.to_response()


@business.get(
    "/charges/{payment_id}",
    responses={
        200: {"model": ChargeWithRefunds, "description": "The charge, its refunds."},
        **answers(_CHARGE_NOT_FOUND),
    },
)
async def get_charge(payment_id: str, redis: RedisDep) -> dict[str, Any]:
    raw = await redis.get(_charge_key(payment_id))
    if raw is None:
        raise ProviderApiError(404, "charge_not_found", payment_id=payment_id)
    charge: dict[str, Any] = json.loads(raw)
    return await _with_refunds(redis, charge)


async def _with_refunds(redis: Redis, charge: dict[str, Any]) -> dict[str, Any]:
    """The charge as its routes answer it: what its refunds sum to, and each of them (a confirming caller's check)."""
    raws = cast(list[str], await redis.lrange(_charge_refunds_key(charge["payment_id"]), 0, -1))
    refunded = charge.get("refunded_amount", charge["amount"] if charge["status"] == "refunded" else 0.0)
    return {**charge, "refunded_amount": refunded, "refunds": [json.loads(raw) for raw in raws]}


async def _charges(redis: Redis, list_key: str) -> list[dict[str, Any]]:
    ids = cast(list[str], await redis.lrange(list_key, 0, -1))
    raws = await redis.mget([_charge_key(i) for i in ids]) if ids else []
    return [json.loads(raw) for raw in raws if raw is not None]


@business.get("/charges", responses={200: {"model": Charges, "description": "Every charge of the reference."}})
async def find_charges(
    reference: Annotated[str, Query(min_length=1, max_length=200)], redis: RedisDep
) -> dict[str, Any]:
    """Every charge (captured, declined, refunded) made for ``reference``, oldest first, with its refunds."""
    return {"charges": [await _with_refunds(redis, c) for c in await _charges(redis, _reference_key(reference))]}


_LEDGER_FIELDS = ("payment_id", "reference", "amount", "currency", "status")
_REFUND_FIELDS = ("refund_id", "payment_id", "reference", "amount", "currency")


@admin.get("/ledger")
async def ledger(redis: RedisDep) -> dict[str, Any]:
    """Every charge ever attempted and every refund made, oldest first."""
    refunds = [json.loads(raw) for raw in cast(list[str], await redis.lrange(_refunds_key(), 0, -1))]
    return {
        "charges": [{f: c.get(f) for f in _LEDGER_FIELDS} for c in await _charges(redis, _ledger_key())],
        "refunds": [{f: r.get(f) for f in _REFUND_FIELDS} for r in refunds],
    }


def create_app() -> FastAPI:
    return create_provider_app(PROVIDER, business, admin, client_keys=True)


app = create_app()
