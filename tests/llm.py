"""What tests that talk to llm-api share: the concierge's four tools (as ``ChatOpenAI`` binds them), a client on the
simulator, a streamed answer put together, and hotel-api's offers as search-agent answers them.

    chat = chat_model(f"{url}/v1", KEY).bind_tools(TOOLS)
    answer = await streamed(chat, [HumanMessage("two nights in Lisbon from 10 March for two")])
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from domain.llm import PRIMARY_MODEL
from providers.inventory import hotels_in

__all__ = ["TOOLS", "chat_model", "offers", "streamed"]


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
