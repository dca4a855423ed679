"""An approval in words, for a person to consent to: the server's own terms first (stay, guests, total, refund),
then the hotel as hotel-api names it, quoted (``domain.third_party``), so a name cannot pose as the terms. One
function for every surface that asks: the CLI, the console's chat, an MCP host's elicitation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from domain.cancellation import describe_cancellation
from domain.third_party import currency_code, hotel_named, quoted

__all__ = ["describe_approval"]


def describe_approval(approval: Mapping[str, Any]) -> str:
    """The terms as the server holds them first, then the hotel as hotel-api names it, quoted
    (``domain.third_party``): a name cannot pose as the terms."""
    price = approval.get("total_price")
    currency = currency_code(approval.get("currency"))
    total = f"{price:.2f}" if isinstance(price, int | float) else quoted(price)
    stay = (
        f"{approval.get('checkin')} → {approval.get('checkout')}, {approval.get('guests')} guest(s), "
        f"total {total} {currency}"
    )
    hotel = hotel_named(approval.get("hotel_id"), approval.get("hotel_name"))
    if approval.get("action") == "cancel":
        refund = approval.get("refund")
        back = (
            f"refund {refund['amount']:.2f} {currency} (fee {refund['fee']:.2f} {currency})"
            if isinstance(refund, Mapping)
            else "not confirmed yet: anything charged is refunded"
        )
        return (
            f"approval {approval.get('approval_id')}: cancel booking {approval.get('booking_id')}, {stay}: {back}, "
            f"expires {approval.get('expires_at')}; {hotel}"
        )
    return (
        f"approval {approval.get('approval_id')}: book {stay}, {describe_cancellation(approval.get('cancellation'))}, "
        f"expires {approval.get('expires_at')}; {hotel}"
    )
