"""Bulkhead: slot wait vs execution bound, the budget, cancellation, slot release, the registry.

Real (short) times: the bounds are what is under test. Assertions on elapsed time only prove "did not wait" or
"was cut short" with generous margins.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import pytest

from resilience import (
    BULKHEAD_CONFIGS,
    DEFAULT_BULKHEAD_CONFIG,
    BudgetExhaustedError,
    Bulkhead,
    BulkheadConfig,
    BulkheadFullError,
    BulkheadTimeoutError,
    budget_scope,
    bulkhead_registry,
    remaining_budget,
    run_within_budget,
    wait_for_slots,
)


class Boom(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    bulkhead_registry.clear()
    yield
    bulkhead_registry.clear()


async def hold(gate: asyncio.Event, started: asyncio.Event | None = None) -> str:
    if started is not None:
        started.set()
    await gate.wait()
    return "released"


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


# ------------------------------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_concurrent": 0, "timeout": 1.0}, "max_concurrent"),
        ({"max_concurrent": -1, "timeout": 1.0}, "max_concurrent"),
        ({"max_concurrent": 2.5, "timeout": 1.0}, "max_concurrent"),
        ({"max_concurrent": True, "timeout": 1.0}, "max_concurrent"),
        ({"max_concurrent": 1, "timeout": 0}, "timeout"),
        ({"max_concurrent": 1, "timeout": -1.0}, "timeout"),
        ({"max_concurrent": 1, "timeout": math.nan}, "timeout"),
        ({"max_concurrent": 1, "timeout": 1.0, "acquire_timeout": -0.1}, "acquire_timeout"),
        ({"max_concurrent": 1, "timeout": 1.0, "acquire_timeout": math.nan}, "acquire_timeout"),
    ],
)
def test_invalid_config_raises_value_error_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BulkheadConfig(**kwargs)  # type: ignore[arg-type]


def test_service_configs() -> None:
    assert {name: (c.max_concurrent, c.timeout, c.acquire_timeout) for name, c in BULKHEAD_CONFIGS.items()} == {
        "booking_agent": (10, 30.0, 2.0),
        "search_agent": (20, 10.0, math.inf),
        "payment_agent": (5, 15.0, math.inf),
        "recovery_worker": (3, 120.0, 2.0),
        "concierge_agent": (100, 180.0, 2.0),
    }


# ------------------------------------------------------------------------------------------------ slots vs execution


async def test_a_call_longer_than_the_slot_wait_succeeds() -> None:
    # the scaled-down "20 s call in a 30 s bulkhead with a 2 s slot wait"
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=2, timeout=1.0, acquire_timeout=0.05))

    async def long_call() -> str:
        await asyncio.sleep(0.4)
        return "booked"

    assert await bulkhead.run(long_call) == "booked"
    assert bulkhead.stats()["timed_out"] == 0


async def test_no_slot_within_acquire_timeout_is_bulkhead_full_and_fn_is_not_called() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0.05))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    called = False

    async def never() -> None:
        nonlocal called
        called = True

    with pytest.raises(BulkheadFullError) as info:
        await bulkhead.run(never)
    assert not holder.done(), "refused while the slot was still held, not once it freed"
    assert not called
    assert info.value.max_concurrent == 1
    assert info.value.waited >= 0.04
    assert bulkhead.stats()["rejected"] == 1
    gate.set()
    assert await holder == "released"


async def test_zero_acquire_timeout_refuses_at_once_when_full() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    with pytest.raises(BulkheadFullError):
        await bulkhead.run(hold, gate)
    gate.set()
    await holder


async def test_a_waiter_gets_the_slot_freed_during_its_wait() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=2.0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    waiter = asyncio.create_task(bulkhead.run(asyncio.sleep, 0, "second"))
    await settle()
    assert bulkhead.stats()["waiting"] == 1
    gate.set()
    assert await holder == "released"
    assert await waiter == "second"
    assert bulkhead.in_use == 0


async def test_execution_past_the_timeout_is_cancelled_as_bulkhead_timeout() -> None:
    bulkhead = Bulkhead("search", BulkheadConfig(max_concurrent=2, timeout=0.1, acquire_timeout=1.0))
    cancelled = False

    async def stuck() -> None:
        nonlocal cancelled
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled = True
            raise

    with pytest.raises(BulkheadTimeoutError) as info:
        await bulkhead.run(stuck)
    assert cancelled, "cut at its 0.1 s timeout rather than left to sleep out its 30 s"
    assert info.value.timeout == pytest.approx(0.1)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert bulkhead.stats()["timed_out"] == 1
    assert bulkhead.in_use == 0
    # the task is left with no cancellation pending: it can keep awaiting
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)


async def test_execution_is_bounded_by_the_remaining_budget_when_it_is_smaller() -> None:
    cfg = BulkheadConfig(max_concurrent=2, timeout=5.0, acquire_timeout=1.0)
    bulkhead = Bulkhead("search", cfg)
    with budget_scope(0.1), pytest.raises(BulkheadTimeoutError) as info:
        await bulkhead.run(asyncio.sleep, 30)  # a 30 s sleep that ran out would raise nothing
    assert info.value.timeout <= 0.1
    assert bulkhead.cfg is cfg and cfg.timeout == 5.0  # the shared config is never touched


async def test_inner_code_sees_the_bulkhead_bound_as_its_budget() -> None:
    bulkhead = Bulkhead("search", BulkheadConfig(max_concurrent=1, timeout=0.5))

    async def budget_inside() -> float:
        return remaining_budget()

    with budget_scope(20):
        assert await bulkhead.run(budget_inside) <= 0.5
        assert remaining_budget() > 19


async def test_a_spent_budget_refuses_before_taking_a_slot() -> None:
    bulkhead = Bulkhead("search", BulkheadConfig(max_concurrent=1, timeout=5.0))
    called = False

    async def never() -> None:
        nonlocal called
        called = True

    with budget_scope(0.01):
        await asyncio.sleep(0.02)
        with pytest.raises(BudgetExhaustedError):
            await bulkhead.run(never)
    assert not called
    assert bulkhead.in_use == 0


async def test_the_slot_wait_is_bounded_by_the_budget_too() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=2.0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    with budget_scope(0.05), pytest.raises(BudgetExhaustedError):
        await bulkhead.run(hold, gate)
    assert not holder.done(), "gave up at the budget while the slot was still held"
    gate.set()
    await holder


async def test_an_earlier_deadline_registered_later_still_fires_on_time() -> None:
    long = Bulkhead("long", BulkheadConfig(max_concurrent=1, timeout=3.0))
    short = Bulkhead("short", BulkheadConfig(max_concurrent=1, timeout=0.05))
    slow = asyncio.create_task(long.run(asyncio.sleep, 0.3, "long done"))
    await settle()
    with pytest.raises(BulkheadTimeoutError):
        await short.run(asyncio.sleep, 30)
    assert not slow.done(), "the 0.05 s deadline fired before the 0.3 s call it was registered after"
    assert await slow == "long done"


async def test_many_deadlines_each_fire_for_their_own_call() -> None:
    bulkhead = Bulkhead("fan", BulkheadConfig(max_concurrent=20, timeout=0.2))

    async def nap(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    results = await asyncio.gather(
        *(bulkhead.run(nap, d) for d in (0.01, 0.5, 0.02, 0.6, 0.05)), return_exceptions=True
    )
    assert [type(r) for r in results] == [float, BulkheadTimeoutError, float, BulkheadTimeoutError, float]
    assert bulkhead.stats()["timed_out"] == 2
    assert bulkhead.in_use == 0


# ------------------------------------------------------------------------------------------------ cancellation


async def test_outer_cancellation_propagates_as_cancelled_error_and_frees_the_slot() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0))
    gate = asyncio.Event()
    task = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    assert bulkhead.in_use == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert bulkhead.in_use == 0
    assert bulkhead.stats()["timed_out"] == 0


async def test_outer_cancellation_at_the_deadline_is_still_a_cancellation() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=0.05))

    async def outer() -> None:
        await bulkhead.run(asyncio.sleep, 30)

    task = asyncio.create_task(outer())
    loop = asyncio.get_running_loop()
    # request the outer cancellation right when our own deadline fires
    loop.call_later(0.05, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert bulkhead.in_use == 0


async def test_outer_cancellation_while_waiting_for_a_slot() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=5.0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    waiter = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bulkhead.stats()["waiting"] == 0
    assert bulkhead.stats()["rejected"] == 0
    gate.set()
    await holder
    assert bulkhead.in_use == 0
    assert bulkhead.available_slots == 1


async def test_a_call_that_swallows_the_deadline_keeps_its_result_and_leaves_no_cancellation() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=0.05))

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"
        return "unreachable"

    assert await bulkhead.run(stubborn) == "finished anyway"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_the_slot_is_released_when_fn_raises() -> None:
    bulkhead = Bulkhead("booking", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0))

    async def boom() -> None:
        raise Boom("provider exploded")

    for _ in range(3):
        with pytest.raises(Boom):
            await bulkhead.run(boom)
    assert bulkhead.in_use == 0
    assert await bulkhead.run(asyncio.sleep, 0, "still usable") == "still usable"


async def test_nested_calls_in_one_task_hold_separate_slots() -> None:
    bulkhead = Bulkhead("recovery", BulkheadConfig(max_concurrent=2, timeout=5.0, acquire_timeout=0))

    async def inner() -> int:
        return bulkhead.in_use

    async def outer() -> int:
        return await bulkhead.run(inner)

    assert await bulkhead.run(outer) == 2
    assert bulkhead.in_use == 0


# ------------------------------------------------------------------------------------------------ without a bulkhead


async def test_run_within_budget_cancels_at_the_budget() -> None:
    with budget_scope(0.05), pytest.raises(BudgetExhaustedError):
        await run_within_budget("hotel_api", asyncio.sleep, 30)  # a 30 s sleep that ran out would raise nothing
    with budget_scope(1):
        assert await run_within_budget("hotel_api", asyncio.sleep, 0, "fine") == "fine"


async def test_run_within_budget_lets_outer_cancellation_through() -> None:
    task = asyncio.create_task(run_within_budget("hotel_api", asyncio.sleep, 30))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


# ------------------------------------------------------------------------------------------------ promised work


async def test_inside_wait_for_slots_a_full_bulkhead_is_waited_out_past_acquire_timeout() -> None:
    bulkhead = Bulkhead("outbound:search_agent", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0.05))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    asyncio.get_running_loop().call_later(0.3, gate.set)  # six acquire_timeouts later
    with wait_for_slots():
        waiter = asyncio.create_task(bulkhead.run(asyncio.sleep, 0, "ran"))  # a child task inherits the scope
    assert await waiter == "ran"
    assert await holder == "released"
    assert bulkhead.stats()["rejected"] == 0
    # outside the block the same bulkhead still refuses fast
    gate.clear()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    with pytest.raises(BulkheadFullError):
        await bulkhead.run(asyncio.sleep, 0)
    gate.set()
    await holder


async def test_inside_wait_for_slots_the_budget_still_bounds_the_wait() -> None:
    bulkhead = Bulkhead("outbound:payment_api", BulkheadConfig(max_concurrent=1, timeout=5.0, acquire_timeout=0))
    gate = asyncio.Event()
    holder = asyncio.create_task(bulkhead.run(hold, gate))
    await settle()
    started = time.monotonic()
    with wait_for_slots(), budget_scope(0.2), pytest.raises(BudgetExhaustedError, match="waiting for a slot"):
        await bulkhead.run(asyncio.sleep, 0)
    assert time.monotonic() - started > 0.15, "waited for a slot until the budget ran out"
    assert not holder.done(), "and gave up while the slot was still held"
    gate.set()
    await holder


async def test_within_budget_config_waits_as_long_as_the_callers_budget() -> None:
    bulkhead = Bulkhead("search_agent", BULKHEAD_CONFIGS["search_agent"])
    gate = asyncio.Event()
    holders = [asyncio.create_task(bulkhead.run(hold, gate)) for _ in range(20)]
    await settle()
    with budget_scope(0.1), pytest.raises(BudgetExhaustedError, match="waiting for a slot"):
        await bulkhead.run(asyncio.sleep, 0)
    asyncio.get_running_loop().call_later(0.3, gate.set)
    with budget_scope(5):
        assert await bulkhead.run(asyncio.sleep, 0, "served") == "served"
    await asyncio.gather(*holders)


async def test_try_hold_keeps_a_slot_until_released_and_never_waits() -> None:
    bulkhead = Bulkhead("booking_runs", BulkheadConfig(max_concurrent=2, timeout=60.0, acquire_timeout=0))
    first, second = bulkhead.try_hold(), bulkhead.try_hold()
    assert first is not None and second is not None
    assert bulkhead.try_hold() is None
    assert bulkhead.stats() == {
        "available": 0,
        "in_use": 2,
        "max": 2,
        "waiting": 0,
        "rejected": 1,
        "timed_out": 0,
    }
    first.release()
    first.release()  # idempotent
    assert bulkhead.in_use == 1
    bulkhead.reset()  # a slot held across a reset goes back to the limiter it came from
    second.release()
    assert bulkhead.in_use == 0
    assert bulkhead.try_hold() is not None


# ------------------------------------------------------------------------------------------------ registry


def test_registry_uses_service_configs_and_a_default() -> None:
    search = bulkhead_registry.get("search_agent")
    assert bulkhead_registry.get("search_agent") is search
    assert search.cfg == BULKHEAD_CONFIGS["search_agent"]
    assert bulkhead_registry.get("somewhere").cfg == DEFAULT_BULKHEAD_CONFIG
    assert bulkhead_registry.stats() == {
        "search_agent": {"available": 20, "in_use": 0, "max": 20, "waiting": 0, "rejected": 0, "timed_out": 0},
        "somewhere": {"available": 10, "in_use": 0, "max": 10, "waiting": 0, "rejected": 0, "timed_out": 0},
    }


def test_configure_with_fields_or_a_config_resets_in_place() -> None:
    search = bulkhead_registry.get("search_agent")
    assert bulkhead_registry.configure("search_agent", max_concurrent=2, acquire_timeout=0.1) is search
    assert search.cfg == BulkheadConfig(max_concurrent=2, timeout=10.0, acquire_timeout=0.1)
    assert search.available_slots == 2
    fresh = bulkhead_registry.configure("payment_agent", BulkheadConfig(max_concurrent=1, timeout=1.0))
    assert bulkhead_registry.get("payment_agent") is fresh
    assert fresh.cfg.max_concurrent == 1
    bulkhead_registry.clear()
    assert bulkhead_registry.get("payment_agent").cfg == BULKHEAD_CONFIGS["payment_agent"]
