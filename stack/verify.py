"""``concierge verify``: every booking against both ledgers; each disagreement printed, exit 1 if there is one.

The promise is: a confirmed booking has one confirmed reservation and one captured charge; a failed (or cancelled)
one holds no room and keeps no money, except a confirmed stay cancelled since, which keeps its fee: its one refund
is total − fee; and no money is held for a booking that does not exist. Bookings still in
flight are counted, not judged, unless no run will finish them (stranded: their run ended or was dead-lettered);
runs waiting for a graph version no process runs are named (docs/upgrades.md). Redis and the providers are the running stack's (``stack.target``) unless
``REDIS_URL``, ``--hotel-api``/``--payment-api`` and ``CONCIERGE_ADMIN_TOKEN`` name others.

    concierge verify [--json] [--hotel-api URL] [--payment-api URL]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import httpx
from redis.asyncio import Redis

from domain.booking import FINAL_BOOKING_STATUSES, BookingStatus, to_cents
from infra.bookings import BookingStore
from infra.redis import text
from runs.leases import RunStatus, RunStore
from stack.console import Subparsers
from stack.dlq import EXIT_FAILURE, EXIT_OK, CommandError, redis_command
from stack.runs import awaiting_runs, version_summary, waiting_lines
from stack.target import admin_token, provider_url

__all__ = ["Disagreement", "check_ledgers", "disagreements", "ledger_charges", "ledger_refunds", "register_verify"]

_SCAN_BATCH = 500
_HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Disagreement:
    reference: str
    status: str
    """The booking's status, or ``unknown`` for a ledger entry that names no booking."""
    problem: str


def disagreements(
    bookings: Mapping[str, str],
    reservations: Iterable[Mapping[str, Any]],
    charges: Iterable[Mapping[str, Any]],
    refunds: Iterable[Mapping[str, Any]] = (),
    owed: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Disagreement]:
    """What the ledgers say that a booking's status denies; ``bookings`` maps booking id → status, ``owed`` a
    confirmed booking cancelled since (its record's ``refund``) → what it gives back, held against ``refunds``."""
    holds: dict[str, Counter[str]] = {}
    money: dict[str, Counter[str]] = {}
    given: dict[str, list[int]] = {}
    for refund in refunds:
        given.setdefault(str(refund["reference"]), []).append(to_cents(float(refund["amount"])))
    owed = owed or {}
    for reservation in reservations:
        holds.setdefault(str(reservation["reference"]), Counter())[str(reservation["status"])] += 1
    for charge in charges:
        money.setdefault(str(charge["reference"]), Counter())[str(charge["status"])] += 1
    found: list[Disagreement] = []
    for booking_id, status in sorted(bookings.items()):
        rooms, paid = holds.get(booking_id, Counter()), money.get(booking_id, Counter())
        if status == BookingStatus.CONFIRMED:
            if rooms["confirmed"] != 1:
                found.append(Disagreement(booking_id, status, f"{rooms['confirmed']} confirmed reservations, not 1"))
            if rooms["held"]:
                found.append(Disagreement(booking_id, status, f"{rooms['held']} room(s) still held"))
            if paid["captured"] != 1:
                found.append(Disagreement(booking_id, status, f"{paid['captured']} captured charges, not 1"))
        elif status == BookingStatus.CANCELLED and booking_id in owed:
            # a confirmed stay cancelled under its policy: the room given back, total − fee refunded, once
            if rooms["held"] or rooms["confirmed"]:
                found.append(Disagreement(booking_id, status, f"reservations {dict(rooms)}: a room is kept"))
            charged = paid["captured"] + paid["partially_refunded"] + paid["refunded"]
            if charged != 1:
                found.append(Disagreement(booking_id, status, f"{charged} charges, not 1 (charges {dict(paid)})"))
            back, expected = given.get(booking_id, []), to_cents(float(owed[booking_id]["amount"]))
            if len(back) > (1 if expected else 0):
                found.append(Disagreement(booking_id, status, f"{len(back)} refunds: a second refund"))
            if sum(back) != expected:
                found.append(
                    Disagreement(booking_id, status, f"refunded {sum(back) / 100:.2f}, not {expected / 100:.2f}")
                )
        elif status in FINAL_BOOKING_STATUSES:
            if rooms["held"] or rooms["confirmed"]:
                found.append(Disagreement(booking_id, status, f"reservations {dict(rooms)}: a room is kept"))
            if paid["captured"]:
                found.append(Disagreement(booking_id, status, f"{paid['captured']} captured charge(s) not refunded"))
    for reference in sorted((set(holds) | set(money)) - set(bookings)):
        rooms, paid = holds.get(reference, Counter()), money.get(reference, Counter())
        if rooms["held"] or rooms["confirmed"] or paid["captured"]:
            found.append(
                Disagreement(
                    reference, "unknown", f"no such booking, yet reservations {dict(rooms)}, charges {dict(paid)}"
                )
            )
    return found


def register_verify(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("verify", help="check every booking against the hotel and payment ledgers")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--hotel-api", default=None, metavar="URL", help="hotel-api (default: the running stack's)")
    parser.add_argument("--payment-api", default=None, metavar="URL", help="payment-api (default: the stack's)")
    parser.set_defaults(handler=redis_command("verify", _verify))


async def _booking_statuses(redis: Redis) -> dict[str, str]:
    prefix = BookingStore.record_prefix()
    ids = [text(raw)[len(prefix) :] async for raw in redis.scan_iter(match=f"{prefix}*", count=_SCAN_BATCH)]
    store = BookingStore(redis)
    statuses: dict[str, str] = {}
    for booking_id in ids:
        status = await store.status(booking_id)
        if status is not None:
            statuses[booking_id] = status
    return statuses


async def _refunds_owed(redis: Redis, bookings: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The cancelled bookings that were confirmed before (their record keeps the ``refund`` of that cancel)."""
    store = BookingStore(redis)
    owed: dict[str, dict[str, Any]] = {}
    for booking_id, status in bookings.items():
        if status == BookingStatus.CANCELLED and await store.cancel_thread(booking_id) is not None:
            record = await store.get(booking_id)
            if record is not None and isinstance(record.get("refund"), dict):
                owed[booking_id] = record["refund"]
    return owed


async def _ledger(http: httpx.AsyncClient, service: str, explicit: str | None, entries: str) -> list[dict[str, Any]]:
    base, _guess = provider_url(service, explicit)
    token = admin_token(explicit_url=explicit is not None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = await http.get(f"{base}/admin/ledger", headers=headers)
    except httpx.HTTPError as exc:
        raise CommandError(f"{service} at {base} is unreachable: {exc}") from exc
    if response.status_code in (401, 404):
        raise CommandError(
            f"{service} at {base} refused its ledger ({response.status_code}): "
            "it needs the stack's admin token (CONCIERGE_ADMIN_TOKEN)"
        )
    if response.status_code != 200:
        raise CommandError(f"{service} at {base} answered {response.status_code} for its ledger")
    return list(response.json()[entries])


async def check_ledgers(
    redis: Redis, hotel_api: str | None = None, payment_api: str | None = None
) -> tuple[dict[str, str], list[Disagreement]]:
    """Every booking's status and what the ledgers say against them (``CommandError`` for a ledger out of reach)."""
    bookings = await _booking_statuses(redis)
    owed = await _refunds_owed(redis, bookings)
    async with httpx.AsyncClient(timeout=_HTTP_TIMEOUT_S) as http:
        reservations = await _ledger(http, "hotel-api", hotel_api, "reservations")
        charges = await _ledger(http, "payment-api", payment_api, "charges")
        refunds = await _ledger(http, "payment-api", payment_api, "refunds") if owed else []
    return bookings, disagreements(bookings, reservations, charges, refunds, owed)


async def ledger_charges(payment_api: str | None = None) -> list[dict[str, Any]]:
    """payment-api's every charge (``reference``, ``amount``, ``currency``, ``status``): ``concierge chaos`` holds them
    against the totals its conversations approved."""
    async with httpx.AsyncClient(timeout=_HTTP_TIMEOUT_S) as http:
        return await _ledger(http, "payment-api", payment_api, "charges")


async def ledger_refunds(payment_api: str | None = None) -> list[dict[str, Any]]:
    """payment-api's every refund (``reference``, ``amount``, ``currency``): ``concierge chaos`` holds the stays it
    cancelled to one refund of total − fee each."""
    async with httpx.AsyncClient(timeout=_HTTP_TIMEOUT_S) as http:
        return await _ledger(http, "payment-api", payment_api, "refunds")


async def stranded(redis: Redis, bookings: Mapping[str, str]) -> list[Disagreement]:
    """Bookings not final that no run will finish: their run ended (``done`` with the booking half-way is what a
    graph of another shape did before versions), is missing, or waits in the DLQ for an operator."""
    store = RunStore(redis)
    records = BookingStore(redis)
    found = []
    for booking_id, status in sorted(bookings.items()):
        if status in FINAL_BOOKING_STATUSES:
            continue
        # a confirmed booking being cancelled is its cancel's run's to finish (``agents.booking.cancellation``)
        thread = await records.cancel_thread(booking_id) if status == BookingStatus.CANCELLING else None
        run = await store.get(thread or booking_id)
        if run is None:
            found.append(Disagreement(booking_id, status, "stranded: not final, and no run record"))
        elif run.status is RunStatus.DEAD_LETTERED:
            found.append(Disagreement(booking_id, status, "stranded: its run is in the DLQ (concierge dlq requeue)"))
        elif run.is_final:
            found.append(Disagreement(booking_id, status, f"stranded: not final, yet its run ended {run.status}"))
    return found


async def _verify(args: argparse.Namespace, redis: Redis, out: TextIO) -> int:
    bookings, found = await check_ledgers(redis, args.hotel_api, args.payment_api)
    found += await stranded(redis, bookings)
    waiting = waiting_lines(version_summary(await awaiting_runs(redis)))
    counts = Counter(status if status in FINAL_BOOKING_STATUSES else "in flight" for status in bookings.values())
    if args.json:
        result = {"bookings": dict(counts), "disagreements": [asdict(d) for d in found], "waiting": waiting}
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        for item in found:
            out.write(f"{item.reference}  {item.status:<10}  {item.problem}\n")
        out.writelines(line + "\n" for line in waiting)
        summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no bookings"
        out.write(f"{len(bookings)} bookings ({summary}); {len(found)} disagreement(s) with the ledgers\n")
    return EXIT_FAILURE if found else EXIT_OK
