"""Payment graph: charge a card or refund a booking's charges.

::

    START ─operation=charge─────────▶ charge ─────────▶ END
          ├operation=refund─────────▶ refund ─────────▶ END
          └operation=cancel_refund──▶ cancel_refund ──▶ END

Both nodes are ``@traced_node(@idempotent_node(...))`` and send ``idempotency_key()`` to payment-api, so a retried
A2A call, a recovered booking or a restarted payment-agent never charges or refunds twice. Thread ids are derived
from the booking reference (``<reference>:charge``, ``<reference>:refund``). Runs with ``durability="sync"``.

A refund without a ``payment_id`` refunds every captured charge of the reference: that is how a booking whose charge
timed out (outcome unknown) makes sure no money stays captured.

``cancel_refund`` gives back part of a confirmed booking's charge when it is cancelled (``amount``: total − fee,
never chosen by the caller: payment-agent reads it from the booking record). It first asks payment-api what the
charge has refunded already, so a refund that may have left before a crash is confirmed, not sent again, even after
payment-api forgot its idempotency key; then sends it with the node's key.

The card token is not part of the state (the state is checkpointed and kept): the caller hands it to the charge in
``payment_token_scope(token)``, around the graph call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Literal, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from domain.booking import to_cents
from graph.idempotency import RedisProvider, idempotency_key, idempotent_node
from graph.tracing import traced_node
from infra.clients.errors import PaymentDeclinedError
from infra.clients.providers import PaymentApiClient
from infra.error_table import answer_for
from resilience import policy_for


class PaymentState(TypedDict, total=False):
    operation: Literal["charge", "refund", "cancel_refund"]
    reference: str
    amount: float
    currency: str
    payment_id: str | None
    status: str
    refunded: list[str]
    refund_id: str | None
    error: dict[str, str] | None


REFUNDABLE = frozenset({"captured", "partially_refunded"})
"""The charges a refund of a whole booking refunds (what is left of each): compensation returns everything."""

_payment_token: ContextVar[str | None] = ContextVar("concierge_payment_token", default=None)


@contextmanager
def payment_token_scope(token: str) -> Iterator[None]:
    """The card token for a charge run inside this block (LangGraph's node tasks inherit the context)."""
    reset = _payment_token.set(token)
    try:
        yield
    finally:
        _payment_token.reset(reset)


def _token() -> str:
    token = _payment_token.get()
    if token is None:
        raise RuntimeError("a charge needs its card token: run the graph inside payment_token_scope(token)")
    return token


def payment_thread_id(reference: str, operation: str) -> str:
    return f"{reference}:{operation}"


def build_payment_graph(
    redis: RedisProvider,
    payments: PaymentApiClient,
    checkpointer: BaseCheckpointSaver[str] | None = None,
) -> CompiledStateGraph[PaymentState, None, PaymentState, PaymentState]:
    policy = policy_for("payment_api")

    @traced_node("charge")
    @idempotent_node(redis, "charge", key_fields=["reference", "amount", "currency"])
    async def charge(state: PaymentState, config: RunnableConfig) -> dict[str, Any]:
        try:
            result = await policy.call(
                payments.charge,
                amount=state["amount"],
                currency=state["currency"],
                payment_token=_token(),
                reference=state["reference"],
                idempotency_key=idempotency_key(),
            )
        except PaymentDeclinedError as exc:
            # A decline is an answer, not a failure: stored like a success so a replay gives the same answer.
            answer = answer_for(exc)
            return {"status": "declined", "error": {"code": answer.code, "message": answer.message}}
        return {"payment_id": result["payment_id"], "status": result["status"], "error": None}

    @traced_node("refund")
    @idempotent_node(redis, "refund", key_fields=["reference", "payment_id"])
    async def refund(state: PaymentState, config: RunnableConfig) -> dict[str, Any]:
        if state.get("payment_id"):
            payment_ids = [str(state["payment_id"])]
        else:
            charges = await policy.call(payments.find_charges, reference=state["reference"])
            payment_ids = [c["payment_id"] for c in charges if c["status"] in REFUNDABLE]
        base_key = idempotency_key()
        for payment_id in payment_ids:
            await policy.call(payments.refund, payment_id, idempotency_key=f"{base_key}:{payment_id}")
        return {"refunded": payment_ids, "status": "refunded", "error": None}

    @traced_node("cancel_refund")
    @idempotent_node(redis, "cancel_refund", key_fields=["reference", "payment_id", "amount"])
    async def cancel_refund(state: PaymentState, config: RunnableConfig) -> dict[str, Any]:
        payment_id, amount = str(state["payment_id"]), state["amount"]
        if to_cents(amount) <= 0:  # the fee took it all: nothing to give back
            return {"refunded": [], "refund_id": None, "status": "captured", "error": None}
        charge = await policy.call(payments.get_charge, payment_id)
        if to_cents(charge.get("refunded_amount") or 0) >= to_cents(amount):
            # sent before (the process died before it stored the answer): payment-api has it, nothing goes again
            refunds = charge.get("refunds") or [{}]
            found = {"refunded": [payment_id], "refund_id": refunds[-1].get("refund_id"), "status": charge["status"]}
            return {**found, "error": None}
        result = await policy.call(payments.refund, payment_id, idempotency_key=idempotency_key(), amount=amount)
        return {
            "refunded": [payment_id],
            "refund_id": (result.get("refund") or {}).get("refund_id"),
            "status": result.get("status", "partially_refunded"),
            "error": None,
        }

    # async on purpose: LangGraph runs a plain function on a thread pool, a round trip for a dict lookup
    async def route(state: PaymentState) -> str:
        return state["operation"]

    builder = StateGraph(PaymentState)
    builder.add_node("charge", charge)
    builder.add_node("refund", refund)
    builder.add_node("cancel_refund", cancel_refund)
    operations = ["charge", "refund", "cancel_refund"]
    builder.add_conditional_edges(START, route, operations)
    for operation in operations:
        builder.add_edge(operation, END)
    return builder.compile(checkpointer=checkpointer, name="payment")
