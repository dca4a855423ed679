"""restaurant-agent (examples/restaurant, docs/new-agent.md) holds one table through kill -9, tested with the kit."""

from pathlib import Path

import pytest

from tests.kill_kit import assert_one_per_reference, kill_when_provider_has, wait_for_run
from tests.stack import Stack, fresh_database, stay

pytestmark = pytest.mark.e2e
ENV = {"DURABLE_AGENTS": "examples.restaurant", "RUN_LEASE_TTL": "1", "ORPHAN_SCAN_INTERVAL": "0.2"}


def test_a_table_is_held_once_when_its_agent_is_killed_after_the_provider_acted(tmp_path: Path, redis_url: str) -> None:
    with fresh_database() as database, Stack(tmp_path, redis_url, database_url=database, env=ENV) as stack:
        stack.start(("hotel-api", "restaurant-agent", "recovery-worker"))
        stack.fault("hotel-api", answer_delay_s=60)  # the table is held, the answer waits: kill -9 meanwhile
        table = {"hotel_id": "lisbon-01", "day": stay()[0], "guests": 2}
        run_id = stack.http.post(f"{stack.url('restaurant-agent')}/tables", json=table).json()["run_id"]
        kill_when_provider_has(stack, "restaurant-agent", "hotel-api", run_id)
        stack.fault("hotel-api")
        stack.serve("restaurant-agent")  # to read the run from: the recovery worker finishes it
        run = wait_for_run(stack, "restaurant-agent", run_id)
        assert run["status"] == "done" and run["fence"] >= 2 and run["checkpoint"]["next"] == [], run
        assert_one_per_reference(stack, "hotel-api", run_id)
