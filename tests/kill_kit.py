"""The kill -9 test kit: a provider that acts and then holds its answer, the agent killed once the provider has the
run's reference, one ledger entry per reference, and the run read back through ``GET /runs/{id}``.

    stack.fault("hotel-api", answer_delay_s=60)              # acts, then holds the answer (providers/faults.py)
    run_id = ...                                             # a run accepted by the agent (its 202)
    kill_when_provider_has(stack, "restaurant-agent", "hotel-api", run_id)
    stack.fault("hotel-api")                                 # the retry is answered at once
    assert wait_for_run(stack, "restaurant-agent", run_id)["status"] == "done"
    assert_one_per_reference(stack, "hotel-api", run_id)

docs/new-agent.md shows a whole test (tests/e2e/test_restaurant_agent.py).
"""

from __future__ import annotations

import time
from typing import Any

from runs.leases import FINAL_RUN_STATUSES
from tests.stack import Stack

__all__ = ["LEDGERS", "assert_one_per_reference", "kill_when_provider_has", "ledger_entries", "run_of", "wait_for_run"]

LEDGERS = {"hotel-api": "reservations", "payment-api": "charges"}
"""Where each simulated provider's ``GET /admin/ledger`` lists what it did, each entry naming its ``reference``."""
FINAL = {str(status) for status in FINAL_RUN_STATUSES}


def ledger_entries(stack: Stack, provider: str, reference: str) -> list[dict[str, Any]]:
    """What ``provider`` did for ``reference``, oldest first."""
    return [entry for entry in stack.ledger(provider)[LEDGERS[provider]] if entry["reference"] == reference]


def kill_when_provider_has(stack: Stack, service: str, provider: str, reference: str, timeout: float = 60) -> None:
    """``kill -9`` ``service`` as soon as ``provider``'s ledger has ``reference``: the side effect is done, and with
    ``answer_delay_s`` set the agent has not heard of it yet."""
    deadline = time.monotonic() + timeout
    while not ledger_entries(stack, provider, reference):
        assert time.monotonic() < deadline, f"{provider} never had {reference}\n{stack.services[service].log_tail()}"
        time.sleep(0.02)
    assert stack.services[service].alive, f"{service} died before the kill\n{stack.services[service].log_tail()}"
    stack.services[service].kill()


def assert_one_per_reference(stack: Stack, provider: str, reference: str) -> dict[str, Any]:
    """Exactly one entry (reservation, charge) for ``reference`` at ``provider``; returns it."""
    entries = ledger_entries(stack, provider, reference)
    assert len(entries) == 1, f"{provider} did {len(entries)} for {reference}: {entries}"
    return entries[0]


def run_of(stack: Stack, service: str, run_id: str) -> dict[str, Any]:
    """``GET /runs/{run_id}`` of ``service`` as the operator: the run's record and its last checkpoint."""
    headers = {"Authorization": f"Bearer {stack.admin_token}"}
    response = stack.http.get(f"{stack.url(service)}/runs/{run_id}", headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def wait_for_run(stack: Stack, service: str, run_id: str, timeout: float = 120) -> dict[str, Any]:
    """The run once it is final (``done``, ``failed``, ``dead_lettered``), read from ``service``."""
    deadline = time.monotonic() + timeout
    while (run := run_of(stack, service, run_id))["status"] not in FINAL:
        assert time.monotonic() < deadline, f"run {run_id} not final: {run}"
        time.sleep(0.1)
    return run
