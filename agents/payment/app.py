"""payment-agent: charges and refunds through payment-api.

A2A skills ``charge_payment`` ({amount, currency, payment_token, reference} → {payment_id, status, ...}) and
``refund_payment`` ({reference, payment_id?} → {refunded: [...]}) and ``refund_cancellation`` ({reference} →
{refunded, amount, refund_id}) run the payment graph inside the
``payment_agent`` bulkhead, with a checkpointer and ``durability="sync"``. The thread id comes from the booking
reference, so a repeated call (a retry, a recovered booking) lands on the same idempotency keys: one charge, ever.

Money moves only for the right caller: both skills answer ``forbidden`` to any service but booking-agent and the
recovery worker (``MONEY_CALLERS``, checked by the A2A server from the caller's verified token), and a refund needs
a reference whose booking exists and is not ``confirmed`` (read from the booking records, never written here): a
confirmed stay keeps its charge whoever asks. A cancelled confirmed stay gets back what its record says, never what
a caller names: ``refund_cancellation`` takes the amount and the charge from the booking, while it is ``cancelling``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from agents.payment.graph import build_payment_graph, payment_thread_id, payment_token_scope
from domain.booking import BookingStatus
from domain.errors import ErrorCode
from infra.a2a import SkillFailure
from infra.a2a.server import Skill, mount_a2a
from infra.a2a.wire import A2A_PATH
from infra.bookings import BookingStore
from infra.checkpointer import checkpointer_ready, open_checkpointer
from infra.clients.providers import PaymentApiClient
from infra.error_table import skill_failure_from
from infra.journal import flush as journal_flush
from infra.journal import journal_scope
from infra.service import create_service_app
from infra.service.openapi import document_service_token
from infra.settings import get_settings

SERVICE = "payment-agent"
MONEY_CALLERS = frozenset({"booking-agent", "recovery-worker"})
"""The only services whose tokens may charge or refund: the ones running the booking saga."""


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    payments = PaymentApiClient(get_settings().payment_api_url, client=SERVICE)
    try:
        async with open_checkpointer() as saver:
            app.state.checkpointer = saver
            app.state.bookings = BookingStore(app.state.redis)
            app.state.payment_graph = build_payment_graph(lambda: app.state.redis, payments, saver)
            yield
    finally:
        await payments.aclose()


async def _checkpointer_ready() -> None:
    await checkpointer_ready(app.state.checkpointer)


app = create_service_app(SERVICE, lifespan=lifespan, ready_checks={"checkpointer": _checkpointer_ready})


def _require(data: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SkillFailure(ErrorCode.INVALID_REQUEST, f"{name}: required, got {value!r}")
    return value


async def _run(operation: str, state: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": payment_thread_id(state["reference"], operation)}}
    # the calls to payment-api go in the booking's journal (the reference is the booking id), written before we
    # answer so they come before the booking's next step: sent as they happen (eager), so the write overlaps the
    # node's own record and checkpoint and the flush below rarely waits; this graph's own steps are not the booking's
    try:
        with journal_scope(state["reference"], steps=False, eager=True):
            result: dict[str, Any] = await app.state.payment_graph.ainvoke(
                {**state, "operation": operation}, config, durability="sync"
            )
    except Exception as exc:
        raise skill_failure_from(exc) from exc
    finally:
        await journal_flush()
    error = result.get("error")
    if error:
        raise SkillFailure(error["code"], error["message"])
    return result


async def charge_payment(data: dict[str, Any]) -> dict[str, Any]:
    amount = _require(data, "amount", (int, float))
    if not math.isfinite(amount) or amount <= 0:
        raise SkillFailure(ErrorCode.INVALID_REQUEST, "amount: must be a positive, finite number")
    token = _require(data, "payment_token", str)
    state = {
        "amount": float(amount),
        "currency": _require(data, "currency", str),
        "reference": _require(data, "reference", str),
    }
    with payment_token_scope(token):  # to the charge, not into the checkpointed state
        result = await _run("charge", state)
    return {
        "payment_id": result["payment_id"],
        "status": result["status"],
        "amount": state["amount"],
        "currency": state["currency"],
        "reference": state["reference"],
    }


async def _check_refundable(reference: str) -> None:
    """A refund is compensation: only for a booking that exists and did not end ``confirmed``."""
    bookings: BookingStore = app.state.bookings
    status = await bookings.status(reference)
    if status is None:
        raise SkillFailure(ErrorCode.FORBIDDEN, f"no booking {reference!r}: nothing to refund for it")
    if status == BookingStatus.CONFIRMED:
        raise SkillFailure(ErrorCode.FORBIDDEN, f"booking {reference!r} is confirmed: its charge is not refunded")


async def refund_payment(data: dict[str, Any]) -> dict[str, Any]:
    payment_id = data.get("payment_id")
    if payment_id is not None and not isinstance(payment_id, str):
        raise SkillFailure(ErrorCode.INVALID_REQUEST, "payment_id: must be a string")
    reference = _require(data, "reference", str)
    await _check_refundable(reference)
    result = await _run("refund", {"reference": reference, "payment_id": payment_id})
    return {"refunded": result.get("refunded", []), "reference": reference}


async def refund_cancellation(data: dict[str, Any]) -> dict[str, Any]:
    """Give back ``refund.amount`` (total − fee) of a confirmed booking being cancelled, on its own charge."""
    reference = _require(data, "reference", str)
    booking = await app.state.bookings.get(reference)
    if booking is None:
        raise SkillFailure(ErrorCode.FORBIDDEN, f"no booking {reference!r}: nothing to refund for it")
    refund, payment_id = booking.get("refund"), booking.get("payment_id")
    if booking["status"] not in (BookingStatus.CANCELLING, BookingStatus.CANCELLED) or not refund or not payment_id:
        raise SkillFailure(ErrorCode.FORBIDDEN, f"booking {reference!r} is not a confirmed stay being cancelled")
    state = {"reference": reference, "payment_id": payment_id, "amount": float(refund["amount"])}
    result = await _run("cancel_refund", state)
    return {
        "reference": reference,
        "refunded": result.get("refunded", []),
        "amount": state["amount"],
        "refund_id": result.get("refund_id"),
    }


mount_a2a(
    app,
    name=SERVICE,
    description="Charges cards and refunds bookings through payment-api, exactly once.",
    url=get_settings().payment_agent_url,
    skills=[
        Skill(
            id="charge_payment",
            name="Charge payment",
            description="Capture {amount, currency} on {payment_token} for {reference}; idempotent per reference.",
            handler=charge_payment,
            tags=("payment",),
            callers=MONEY_CALLERS,
            inputs=("amount", "currency", "payment_token", "reference"),
        ),
        Skill(
            id="refund_payment",
            name="Refund payment",
            description="Refund {payment_id}, or every captured charge of {reference} when no id is given; "
            "only while the booking {reference} is not confirmed.",
            handler=refund_payment,
            tags=("payment",),
            callers=MONEY_CALLERS,
            inputs=("reference", "payment_id?"),
        ),
        Skill(
            id="refund_cancellation",
            name="Refund a cancelled stay",
            description="Refund what the cancelled confirmed booking {reference} gives back under its policy "
            "(total − fee, as its record says), on its charge; only while it is cancelling.",
            handler=refund_cancellation,
            tags=("payment",),
            callers=MONEY_CALLERS,
            inputs=("reference",),
        ),
    ],
    bulkhead="payment_agent",
)
document_service_token(app, A2A_PATH)
