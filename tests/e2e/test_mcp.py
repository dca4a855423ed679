"""Book from any MCP client: concierge-agent's ``/mcp`` driven by the official SDK's client against real processes,
people's identities on (a local issuer).

No token is a 401 naming the RFC 9728 metadata; the tools are listed from the graph's records with both schemas;
a search then a booking whose elicitation names the exact terms, accepted: one booking, one hold, one charge, and
a second retry of the same accept changes nothing; a decline books nothing; another person's booking is neither
listed, read nor cancelled, and their request state is refused; kill -9 of concierge-agent between the question
and the answer, then the accept on the restarted process: booked exactly once. A handshake-era session gets the
same question through its elicitation. Bad input is a tool error naming the field.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from identity.people import LocalIssuer
from tests.stack import CORE, Stack, fresh_database, new_person, people_env, stay

pytestmark = pytest.mark.e2e

ISSUER = "https://issuer.concierge-mcp.test"
SERVICES = (*CORE, "llm-api", "concierge-agent")
MODERN = "2026-07-28"
START_S = 180.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> LocalIssuer:
    return LocalIssuer(tmp_path_factory.mktemp("issuer"), ISSUER)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str, issuer: LocalIssuer) -> Iterator[Stack]:
    env = {**people_env(issuer, ISSUER), "APPROVAL_TTL_S": "600", "MCP_WAIT_S": "40"}
    tmp: Path = tmp_path_factory.mktemp("concierge-mcp")
    with fresh_database() as database, Stack(tmp, redis_url, database_url=database, env=env) as stack:
        for proc in [stack.serve(service, wait=False) for service in SERVICES]:
            proc.wait_ready(START_S)
        yield stack


# --------------------------------------------------------------------------------------------------- helpers


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def mcp_url(stack: Stack) -> str:
    return f"{stack.url('concierge-agent')}/mcp"


@asynccontextmanager
async def client(
    stack: Stack, who: dict[str, str], *, mode: str = MODERN, elicit: Callable[..., Any] | None = None
) -> AsyncIterator[Client]:
    """The official SDK's client, presenting ``who``'s bearer token on every request."""
    http = httpx2.AsyncClient(headers=who, timeout=httpx2.Timeout(30, read=120))
    async with (
        http,
        Client(streamable_http_client(mcp_url(stack), http_client=http), mode=mode, elicitation_callback=elicit) as c,
    ):
        yield c


def stay_args() -> dict[str, Any]:
    checkin, checkout = stay(days_ahead=60)
    return {"city": "Lisbon", "checkin": checkin, "checkout": checkout, "guests": 2}


async def an_offer(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
    """search_hotels for a stay: the stay's arguments and the cheapest offer (structured content)."""
    args = stay_args()
    found = await c.call_tool("search_hotels", args)
    assert not found.is_error, found
    offers = found.structured_content["offers"]
    assert offers, found
    return args, offers[0]


async def ask_to_book(c: Client, args: dict[str, Any]) -> types.InputRequiredResult:
    asked = await c.session.call_tool("book_hotel", args, allow_input_required=True)
    assert isinstance(asked, types.InputRequiredResult), asked
    assert asked.request_state and asked.input_requests and set(asked.input_requests) == {"approval"}, asked
    return asked


def question(asked: types.InputRequiredResult) -> str:
    request = asked.input_requests["approval"]  # type: ignore[index]
    assert isinstance(request, types.ElicitRequest), request
    return str(request.params.message)


async def answer(
    c: Client, tool: str, args: dict[str, Any], asked: types.InputRequiredResult, action: str
) -> types.CallToolResult | types.InputRequiredResult:
    responses: dict[str, Any] = {"approval": types.ElicitResult(action=action)}  # type: ignore[arg-type]
    return await c.session.call_tool(
        tool, args, input_responses=responses, request_state=asked.request_state, allow_input_required=True
    )


def holds_and_charges(stack: Stack, booking_id: str) -> tuple[list[Any], list[Any]]:
    holds = [r for r in stack.ledger("hotel-api")["reservations"] if r.get("reference") == booking_id]
    charges = [c for c in stack.ledger("payment-api")["charges"] if c.get("reference") == booking_id]
    return holds, charges


def all_charges(stack: Stack) -> int:
    return len(stack.ledger("payment-api")["charges"])


def restart_concierge(stack: Stack) -> None:
    stack.services["concierge-agent"].kill()  # kill -9
    stack.services["concierge-agent"] = stack.procs.serve(
        "concierge-agent", port=stack.ports["concierge-agent"], timeout=START_S
    )


# --------------------------------------------------------------------------------------------------- tests


def test_without_a_token_the_answer_is_401_naming_where_to_get_one(stack: Stack) -> None:
    base = stack.url("concierge-agent")
    refused = httpx.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)
    assert refused.status_code == 401, refused.text
    metadata_url = f"{base}/.well-known/oauth-protected-resource"
    assert refused.headers["www-authenticate"] == f'Bearer resource_metadata="{metadata_url}"'
    bad = httpx.post(f"{base}/mcp", json={}, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert bad.status_code == 401 and 'error="invalid_token"' in bad.headers["www-authenticate"], bad.text
    metadata = httpx.get(metadata_url, timeout=30).json()
    assert metadata["resource"] == f"{base}/mcp"
    assert metadata["authorization_servers"] == [ISSUER] and metadata["audience"] == "concierge", metadata
    operator = httpx.post(f"{base}/mcp", json={}, headers={"Authorization": f"Bearer {stack.admin_token}"}, timeout=30)
    assert operator.status_code == 403, operator.text


def test_the_tools_are_the_graphs_records_with_their_schemas(stack: Stack, issuer: LocalIssuer) -> None:
    async def listed() -> list[types.Tool]:
        async with client(stack, new_person(issuer)) as c:
            return (await c.list_tools()).tools

    tools = {tool.name: tool for tool in run(listed())}
    assert set(tools) == {"search_hotels", "book_hotel", "list_bookings", "get_booking", "cancel_booking"}
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object", tool
        assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool
    book = tools["book_hotel"].input_schema
    assert set(book["properties"]) == {"city", "checkin", "checkout", "guests", "hotel_id"}, book
    assert book["additionalProperties"] is False  # no card, no price, no person, no approval
    assert tools["search_hotels"].annotations.read_only_hint is True  # type: ignore[union-attr]
    assert tools["book_hotel"].annotations.read_only_hint is False  # type: ignore[union-attr]


def test_search_then_book_the_person_approves_the_exact_terms_and_it_books_once(
    stack: Stack, issuer: LocalIssuer
) -> None:
    who = new_person(issuer)

    async def story() -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any], dict[str, Any]]:
        async with client(stack, who) as c:
            args, offer = await an_offer(c)
            args = {**args, "hotel_id": offer["hotel_id"]}
            asked = await ask_to_book(c, args)
            progress: list[Any] = []

            async def heard(step: float, total: float | None, message: str | None) -> None:
                progress.append(message)

            responses: dict[str, Any] = {"approval": types.ElicitResult(action="accept")}
            booked = await c.session.call_tool(
                "book_hotel",
                args,
                input_responses=responses,
                request_state=asked.request_state,
                allow_input_required=True,
                progress_callback=heard,
            )
            assert isinstance(booked, types.CallToolResult) and not booked.is_error, booked
            again = await answer(c, "book_hotel", args, asked, "accept")  # the same accept, retried
            assert isinstance(again, types.CallToolResult) and not again.is_error, again
            listed = await c.call_tool("list_bookings", {})
            return (
                offer,
                args,
                question(asked),
                booked.structured_content,
                {**again.structured_content, "listed": listed.structured_content},
            )

    offer, args, words, booked, again = run(story())
    total = f"{offer['total_price']:.2f}"
    for term in (args["checkin"], args["checkout"], "2 guest(s)", total, offer["currency"], offer["hotel_id"]):
        assert term in words, (term, words)
    assert booked["status"] == "confirmed", booked
    booking_id = booked["booking_id"]
    assert again["booking_id"] == booking_id and again["status"] == "confirmed", again
    assert [b["booking_id"] for b in again["listed"]["bookings"]] == [booking_id]
    holds, charges = holds_and_charges(stack, booking_id)
    assert len(holds) == 1 and len(charges) == 1, (holds, charges)


def test_a_decline_books_nothing(stack: Stack, issuer: LocalIssuer) -> None:
    before = all_charges(stack)

    async def story() -> tuple[dict[str, Any], dict[str, Any]]:
        async with client(stack, new_person(issuer)) as c:
            args, offer = await an_offer(c)
            args = {**args, "hotel_id": offer["hotel_id"]}
            asked = await ask_to_book(c, args)
            declined = await answer(c, "book_hotel", args, asked, "decline")
            assert isinstance(declined, types.CallToolResult) and not declined.is_error, declined
            listed = await c.call_tool("list_bookings", {})
            return declined.structured_content, listed.structured_content

    declined, listed = run(story())
    assert declined["status"] == "declined" and "nothing was booked" in declined["message"], declined
    assert listed["bookings"] == [], listed
    assert all_charges(stack) == before


def test_another_persons_booking_is_invisible_and_cannot_be_cancelled(stack: Stack, issuer: LocalIssuer) -> None:
    owner, stranger = new_person(issuer), new_person(issuer)

    async def story() -> dict[str, Any]:
        async with client(stack, owner) as mine:
            args, offer = await an_offer(mine)
            args = {**args, "hotel_id": offer["hotel_id"]}
            booked = await answer(mine, "book_hotel", args, await ask_to_book(mine, args), "accept")
            assert isinstance(booked, types.CallToolResult) and booked.structured_content["status"] == "confirmed"
            booking_id = booked.structured_content["booking_id"]
            other_args, other_offer = await an_offer(mine)
            pending = await ask_to_book(mine, {**other_args, "hotel_id": other_offer["hotel_id"]})
        async with client(stack, stranger) as theirs:
            listed = await theirs.call_tool("list_bookings", {})
            read = await theirs.call_tool("get_booking", {"booking_id": booking_id})
            cancel = await theirs.session.call_tool(
                "cancel_booking", {"booking_id": booking_id}, allow_input_required=True
            )
            with pytest.raises(MCPError):  # the owner's request state, replayed by someone else
                await answer(
                    theirs, "book_hotel", {**other_args, "hotel_id": other_offer["hotel_id"]}, pending, "accept"
                )
            return {"id": booking_id, "listed": listed, "read": read, "cancel": cancel}

    seen = run(story())
    assert seen["listed"].structured_content["bookings"] == []
    assert seen["read"].is_error and seen["read"].structured_content["error"]["code"] == "unknown_booking"
    cancel = seen["cancel"]
    assert isinstance(cancel, types.CallToolResult) and cancel.is_error, cancel
    assert cancel.structured_content["error"]["code"] == "unknown_booking", cancel
    holds, charges = holds_and_charges(stack, seen["id"])
    assert len(holds) == 1 and len(charges) == 1


def test_kill_9_between_the_question_and_the_answer_the_accept_still_books_once(
    stack: Stack, issuer: LocalIssuer
) -> None:
    who = new_person(issuer)

    async def asking() -> tuple[dict[str, Any], types.InputRequiredResult]:
        async with client(stack, who) as c:
            args, offer = await an_offer(c)
            args = {**args, "hotel_id": offer["hotel_id"]}
            return args, await ask_to_book(c, args)

    args, asked = run(asking())
    restart_concierge(stack)

    async def accepting() -> list[dict[str, Any]]:
        async with client(stack, who) as c:
            first = await answer(c, "book_hotel", args, asked, "accept")
            second = await answer(c, "book_hotel", args, asked, "accept")
            results = [first, second]
            assert all(isinstance(r, types.CallToolResult) and not r.is_error for r in results), results
            return [r.structured_content for r in results]  # type: ignore[union-attr]

    first, second = run(accepting())
    assert first["status"] == "confirmed" and second["booking_id"] == first["booking_id"], (first, second)
    holds, charges = holds_and_charges(stack, first["booking_id"])
    assert len(holds) == 1 and len(charges) == 1, (holds, charges)


def test_a_tampered_request_state_or_other_terms_are_refused(stack: Stack, issuer: LocalIssuer) -> None:
    before = all_charges(stack)

    async def story() -> None:
        async with client(stack, new_person(issuer)) as c:
            args, offer = await an_offer(c)
            args = {**args, "hotel_id": offer["hotel_id"]}
            asked = await ask_to_book(c, args)
            tampered = asked.model_copy(update={"request_state": asked.request_state[:-4] + "AAAA"})  # type: ignore[index]
            with pytest.raises(MCPError):
                await answer(c, "book_hotel", args, tampered, "accept")
            with pytest.raises(MCPError):  # the same state for another stay
                await answer(c, "book_hotel", {**args, "guests": 1}, asked, "accept")
            cancelled = await answer(c, "book_hotel", args, asked, "cancel")  # dismissed: nothing
            assert isinstance(cancelled, types.CallToolResult), cancelled
            assert cancelled.structured_content["status"] == "declined", cancelled

    run(story())
    assert all_charges(stack) == before


def test_a_handshake_era_session_asks_through_its_elicitation(stack: Stack, issuer: LocalIssuer) -> None:
    asked: list[str] = []

    async def accept(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept")

    async def story() -> dict[str, Any]:
        async with client(stack, new_person(issuer), mode="legacy", elicit=accept) as c:
            args, offer = await an_offer(c)
            booked = await c.call_tool("book_hotel", {**args, "hotel_id": offer["hotel_id"]})
            assert not booked.is_error, booked
            return dict(booked.structured_content)

    booked = run(story())
    assert len(asked) == 1 and "Approve this?" in asked[0], asked
    assert booked["status"] == "confirmed", booked
    holds, charges = holds_and_charges(stack, booked["booking_id"])
    assert len(holds) == 1 and len(charges) == 1


def test_bad_input_is_a_tool_error_naming_the_field(stack: Stack, issuer: LocalIssuer) -> None:
    past, after = ((dt.date.today() - dt.timedelta(days=days)).isoformat() for days in (3, 1))

    async def story() -> list[types.CallToolResult]:
        async with client(stack, new_person(issuer)) as c:
            args = stay_args()
            return [
                await c.call_tool("search_hotels", {**args, "checkin": past, "checkout": after}),
                await c.call_tool("book_hotel", {**args, "hotel_id": "lisbon-01", "payment_token": "tok_visa"}),
                await c.call_tool("book_hotel", {**args, "hotel_id": "nowhere-99"}),
                await c.call_tool("search_hotels", {**args, "guests": "two"}),
            ]

    past_stay, card, unknown, guests = run(story())
    for result, field in ((past_stay, "checkin"), (card, "payment_token"), (unknown, "hotel_id"), (guests, "guests")):
        assert result.is_error, result
        assert result.structured_content["error"]["message"].startswith(field), result.structured_content
    assert unknown.structured_content["error"]["code"] == "not_offered"


def test_an_approval_no_session_can_ask_is_kept_for_the_console_or_the_cli(stack: Stack, issuer: LocalIssuer) -> None:
    who = new_person(issuer)

    async def story() -> dict[str, Any]:
        async with client(stack, who, mode="legacy") as c:  # no elicitation: the question has nowhere to go
            args, offer = await an_offer(c)
            waiting = await c.call_tool("book_hotel", {**args, "hotel_id": offer["hotel_id"]})
            assert not waiting.is_error, waiting
            return dict(waiting.structured_content)

    waiting = run(story())
    assert waiting["status"] == "awaiting_approval" and "concierge chat --chat" in waiting["message"], waiting
    chat_id, approval = waiting["chat_id"], waiting["approval"]
    base = stack.url("concierge-agent")
    listed = httpx.get(f"{base}/chats", headers=who, timeout=30).json()["chats"]
    assert [c["status"] for c in listed if c["chat_id"] == chat_id] == ["awaiting_approval"], listed
    shown = httpx.get(f"{base}/chats/{chat_id}", headers=who, timeout=30).json()
    assert shown["pending_approval"]["approval_id"] == approval["approval_id"], shown
    # what the console's approve button and `concierge chat --chat ID` send
    decided = httpx.post(
        f"{base}/chats/{chat_id}/approvals/{approval['approval_id']}", json={"approve": True}, headers=who, timeout=30
    )
    assert decided.status_code == 202, decided.text
    view = httpx.get(f"{base}/chats/{chat_id}", params={"wait": 30}, headers=who, timeout=60).json()
    assert view["status"] == "idle" and len(view["bookings"]) == 1, view
    holds, charges = holds_and_charges(stack, view["bookings"][0])
    assert len(holds) == 1 and len(charges) == 1


def test_a_cancel_is_approved_with_its_refund_and_fee_named(stack: Stack, issuer: LocalIssuer) -> None:
    who = new_person(issuer)

    async def story() -> tuple[str, str, dict[str, Any]]:
        async with client(stack, who) as c:
            args, offer = await an_offer(c)
            args = {**args, "hotel_id": offer["hotel_id"]}
            booked = await answer(c, "book_hotel", args, await ask_to_book(c, args), "accept")
            assert isinstance(booked, types.CallToolResult) and booked.structured_content["status"] == "confirmed"
            booking_id = booked.structured_content["booking_id"]
            cancel = {"booking_id": booking_id}
            asked = await c.session.call_tool("cancel_booking", cancel, allow_input_required=True)
            assert isinstance(asked, types.InputRequiredResult), asked
            cancelled = await answer(c, "cancel_booking", cancel, asked, "accept")
            assert isinstance(cancelled, types.CallToolResult) and not cancelled.is_error, cancelled
            return booking_id, question(asked), dict(cancelled.structured_content)

    booking_id, words, cancelled = run(story())
    assert f"cancel booking {booking_id}" in words and "refund" in words and "fee" in words, words
    assert cancelled["status"] == "cancelled" and cancelled["booking_id"] == booking_id, cancelled
