"""The pure pieces of concierge-agent's MCP door: a host's config from `concierge token --mcp`, the RFC 9728
metadata, and each tool record's result schema against what the tool answers."""

from __future__ import annotations

import json

import jsonschema

from agents.concierge.mcp_edge import protected_resource
from agents.concierge.tools import TOOL_RECORDS, TOOLS_BY_NAME
from agents.concierge.views import booking_view, offer_view
from stack.people import mcp_host_config


def test_a_hosts_config_names_the_mcp_url_and_the_persons_bearer_token() -> None:
    config = json.loads(mcp_host_config("eyJ.a.b", "http://127.0.0.1:8003/"))
    assert config == {
        "mcpServers": {
            "concierge": {
                "type": "http",
                "url": "http://127.0.0.1:8003/mcp",
                "headers": {"Authorization": "Bearer eyJ.a.b"},
            }
        }
    }


def test_the_metadata_names_the_resource_and_the_audience() -> None:
    document = protected_resource("http://127.0.0.1:8003")
    assert document["resource"] == "http://127.0.0.1:8003/mcp"
    assert document["bearer_methods_supported"] == ["header"] and document["audience"]


def test_every_tool_has_a_result_schema_its_results_meet() -> None:
    assert all(tool.output_schema is not None for tool in TOOL_RECORDS)
    offer = offer_view({"hotel_id": "lisbon-01", "name": "A", "price_per_night": 100, "currency": "EUR"}, 2, 2)
    booking = booking_view({"booking_id": "b1", "status": "confirmed", "hotel_id": "lisbon-01", "total_price": 1.0})
    results = {
        "search_hotels": {"offers": [offer], "found": 1},
        "list_bookings": {"bookings": [booking], "found": 1},
        "get_booking": booking,
        "book_hotel": {"approved": False, "status": "declined", "message": "the person declined: nothing was booked"},
        "cancel_booking": {"status": "pending", "booking_id": "b1", "message": "not final yet"},
    }
    for name, result in results.items():
        jsonschema.validate(result, TOOLS_BY_NAME[name].output_schema)  # type: ignore[arg-type]
