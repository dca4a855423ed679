"""The recorded chat turn and MCP approved call (tests/data/checkpoints, ``tests.checkpoints``), parked at their
approval, resumed on their own shape in a real Postgres checkpointer against real Redis: a yes books once through
booking-agent, a no books nothing. What a deploy finds most often, answered after it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langgraph.types import Command

from agents.concierge.approved_call import APPROVED_CALL_BUILDERS, APPROVED_CALL_GRAPH
from agents.concierge.graph import CONCIERGE_BUILDERS, CONCIERGE_GRAPH
from domain.llm import BOOK_HOTEL
from infra.checkpointer import open_checkpointer
from resilience import budget_scope, bulkhead_registry, circuit_registry, set_testing
from runs.runner import run_config
from runs.versions import graph_fingerprint
from tests.checkpoints import BookingAgentPeer, ScriptedModel, concierge_deps, load, persons_chat, read

BUILDERS = {CONCIERGE_GRAPH: CONCIERGE_BUILDERS, APPROVED_CALL_GRAPH: APPROVED_CALL_BUILDERS}


@pytest.fixture(autouse=True)
def fresh_layers() -> Any:
    circuit_registry.clear()
    bulkhead_registry.clear()
    with set_testing(True):
        yield
    circuit_registry.clear()
    bulkhead_registry.clear()


class Parked:
    """A recorded run loaded as the last checkpoint of a chat of the person's, their card on it, and the concierge's
    peers as fakes: booking-agent counts the bookings it is asked for."""

    def __init__(self, redis: Any, saver: Any) -> None:
        self.saver = saver
        self.booking_agent = BookingAgentPeer(redis)
        self.model = ScriptedModel([])
        self.deps = concierge_deps(redis, self.model, self.booking_agent)

    async def loaded(self, name: str, chat_id: str) -> tuple[Any, dict[str, Any]]:
        """The graph of the recorded run's shape, and the call that waits for its approval (under ``chat_id``)."""
        graph = BUILDERS[name][0](self.deps, self.saver)
        fixture = read(name, graph_fingerprint(graph))
        fixture["checkpoint"]["channel_values"]["chat_id"] = {"json": chat_id}
        await load(self.saver, fixture, chat_id)
        await persons_chat(self.deps, chat_id)
        snapshot = await graph.aget_state(run_config(chat_id))
        assert snapshot.next == ("approval",), "parked at its approval, as recorded"
        pending: dict[str, Any] = snapshot.values["pending"]
        assert pending["tool"] == BOOK_HOTEL and pending["approval"]["action"] == "book"
        return graph, pending

    async def decide(self, graph: Any, chat_id: str, approve: bool) -> dict[str, Any]:
        """The person's answer, as ``RunStore.decide`` resumes the run with it."""
        with budget_scope(30.0):
            state: dict[str, Any] = await graph.ainvoke(
                Command(resume={"approve": approve}), run_config(chat_id, graph_fingerprint(graph)), durability="sync"
            )
        return state


@pytest.fixture
async def parked(redis: Any, postgres_url: str) -> AsyncIterator[Parked]:
    async with open_checkpointer(postgres_url) as saver:
        yield Parked(redis, saver)


def answer_to(name: str, state: dict[str, Any], pending: dict[str, Any]) -> Any:
    """What the approved call was answered: the turn's tool result for it (the model reads it), or the MCP call's
    recorded result (its host is answered it)."""
    if name == APPROVED_CALL_GRAPH:
        return json.loads(state["done"]["content"])
    call_id = pending["tool_call_id"]
    [result] = [m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id == call_id]
    return json.loads(str(result.content))


@pytest.mark.parametrize("name", [CONCIERGE_GRAPH, APPROVED_CALL_GRAPH])
async def test_a_recorded_approval_said_yes_to_books_once_on_its_own_shape(parked: Parked, name: str) -> None:
    graph, pending = await parked.loaded(name, f"{name}-yes")
    approval = pending["approval"]

    state = await parked.decide(graph, f"{name}-yes", approve=True)

    assert state["outcome"] == "answered"
    [booked] = parked.booking_agent.bookings
    assert booked["hotel_id"] == approval["hotel_id"] and booked["max_total_price"] == approval["total_price"]
    assert booked["payment_token"] == "tok_visa", "the card on the chat, never one in the checkpoint"
    assert answer_to(name, state, pending)["booking_id"] == "bk-1"
    assert parked.model.calls == (1 if name == CONCIERGE_GRAPH else 0), "a turn's model reads the result, once"
    chat = await parked.deps.chats.get(f"{name}-yes")
    assert chat is not None and chat["bookings"] == ["bk-1"] and chat["last_turn"]["outcome"] == "answered"
    assert await parked.deps.chats.token(f"{name}-yes") is None, "charged: the card token is dropped"
    assert (await graph.aget_state(run_config(f"{name}-yes"))).next == ()


@pytest.mark.parametrize("name", [CONCIERGE_GRAPH, APPROVED_CALL_GRAPH])
async def test_a_recorded_approval_said_no_to_books_nothing(parked: Parked, name: str) -> None:
    graph, pending = await parked.loaded(name, f"{name}-no")

    state = await parked.decide(graph, f"{name}-no", approve=False)

    assert state["outcome"] == "answered"
    assert parked.booking_agent.calls == [], "booking-agent never asked"
    assert answer_to(name, state, pending)["status"] == "declined"
    chat = await parked.deps.chats.get(f"{name}-no")
    assert chat is not None and chat["bookings"] == []
    assert await parked.deps.chats.token(f"{name}-no") == "tok_visa", "nothing charged: the card stays on the chat"


async def test_a_booking_agent_that_refuses_before_making_a_booking_ends_the_step_with_its_refusal(
    parked: Parked,
) -> None:
    """Its relay looks for a booking the refusal never made: the step stops it and answers, it never waits on it."""
    from infra.a2a.errors import A2ASkillError

    async def refuse(skill: str, data: dict[str, Any]) -> dict[str, Any]:
        parked.booking_agent.calls.append((skill, data))
        await asyncio.sleep(0.1)  # the relay is looking meanwhile
        raise A2ASkillError("no_availability", "no room left at the approved terms")

    async def no_booking_and_a_lost_cancel(*args: Any) -> None:
        # the relay's time is spent here, so its cancel lands here, and is lost, as a Redis call under load lost one
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.5)

    parked.booking_agent.call = refuse  # type: ignore[method-assign]
    parked.deps.bookings.booking_for_key = no_booking_and_a_lost_cancel
    graph, pending = await parked.loaded(CONCIERGE_GRAPH, "refused")

    state = await asyncio.wait_for(parked.decide(graph, "refused", approve=True), timeout=60)

    assert state["outcome"] == "answered"
    assert [skill for skill, _ in parked.booking_agent.calls] == ["book_hotel"]
    assert answer_to(CONCIERGE_GRAPH, state, pending)["error"]["code"] == "no_availability"
    chat = await parked.deps.chats.get("refused")
    assert chat is not None and chat["bookings"] == []
