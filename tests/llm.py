"""What tests that talk to llm-api share: the concierge's four tools (as ``ChatOpenAI`` binds them), a client on the
simulator, a streamed answer put together, hotel-api's offers as search-agent answers them, and a scripted model.

    chat = chat_model(f"{url}/v1", KEY).bind_tools(TOOLS)
    answer = await streamed(chat, [HumanMessage("two nights in Lisbon from 10 March for two")])
    script_model(url, [{"tool_calls": [{"name": "cancel_booking", "arguments": {"booking_id": other}}]}],
                 admin_token=token)          # the next answer, whatever is asked (Stack.script_model in e2e)
"""

from __future__ import annotations

from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from domain.llm import PRIMARY_MODEL
from providers.inventory import hotels_in

__all__ = ["TOOLS", "chat_model", "clear_script", "offers", "script_model", "streamed"]


@tool
def search_hotels(
    city: str, checkin: str, checkout: str, guests: int, max_price_per_night: float | None = None
) -> dict[str, Any]:
    """Search hotel offers in a city for a stay."""
    raise NotImplementedError


@tool
def book_hotel(hotel_id: str, city: str, checkin: str, checkout: str, guests: int) -> dict[str, Any]:
    """Book a hotel for a stay (asks the person first)."""
    raise NotImplementedError


@tool
def get_booking(booking_id: str) -> dict[str, Any]:
    """A booking's status."""
    raise NotImplementedError


@tool
def cancel_booking(booking_id: str) -> dict[str, Any]:
    """Cancel a booking."""
    raise NotImplementedError


TOOLS = [search_hotels, book_hotel, get_booking, cancel_booking]


def chat_model(base_url: str, api_key: str, name: str = PRIMARY_MODEL, **kwargs: Any) -> ChatOpenAI:
    """``ChatOpenAI`` as the concierge makes it: its own retries off, usage asked for in streams."""
    options: dict[str, Any] = {"api_key": api_key, "max_retries": 0, "stream_usage": True, "timeout": 20}
    options.update(kwargs)
    return ChatOpenAI(model=name, base_url=base_url, **options)


async def streamed(chat: Any, messages: list[BaseMessage]) -> AIMessage:
    """The streamed answer, its chunks added up as LangChain adds them."""
    full = None
    async for chunk in chat.astream(messages):
        full = chunk if full is None else full + chunk
    assert full is not None, "an empty stream"
    return AIMessage(
        content=full.content,
        tool_calls=full.tool_calls,
        invalid_tool_calls=full.invalid_tool_calls,
        usage_metadata=full.usage_metadata,
        response_metadata=full.response_metadata,
    )


def offers(city: str = "Lisbon", max_price: float | None = None) -> list[dict[str, Any]]:
    """What search-agent answers for ``city``: bookable offers, cheapest first (among equal prices, more stars)."""
    found = [h.offer(3) for h in hotels_in(city) if max_price is None or h.price_per_night <= max_price]
    return sorted(found, key=lambda o: (o["price_per_night"], -o["stars"], o["hotel_id"]))


def script_model(
    llm_url: str, steps: list[dict[str, Any]], model: str | None = None, *, admin_token: str
) -> dict[str, Any]:
    """llm-api (at ``llm_url``, without ``/v1``) answers its next requests for ``model`` (any model when ``None``)
    with ``steps`` in order: ``{"tool_calls": [{"name", "arguments": object | raw string}]}`` or ``{"text"}``.
    Replaces any script; answers what is left of it (``model``, ``steps``, ``steps_left``). Synchronous: from an
    async test against an app served in the same loop, ``await asyncio.to_thread(script_model, ...)``."""
    response = httpx.put(
        f"{llm_url}/admin/script",
        json={"model": model, "steps": steps},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def clear_script(llm_url: str, *, admin_token: str) -> None:
    """No script: llm-api's rules answer again."""
    response = httpx.delete(f"{llm_url}/admin/script", headers={"Authorization": f"Bearer {admin_token}"}, timeout=10)
    assert response.status_code == 200, response.text
