import asyncio
import math

import pytest

from resilience import (
    BUDGET_HEADER,
    BudgetExhaustedError,
    budget_scope,
    configure_budget,
    init_budget,
    outgoing_budget_headers,
    parse_budget_header,
    remaining_budget,
)
from tests.fakes import FakeClock


@pytest.fixture
def clock():
    fake = FakeClock()
    with configure_budget(clock=fake, default=30.0, margin=0.05, minimum_call=0.05):
        yield fake


def test_default_budget_outside_any_scope(clock):
    assert remaining_budget() == 30.0
    clock.now += 100
    assert remaining_budget() == 30.0


def test_init_budget_counts_down_and_never_goes_negative(clock):
    async def run():
        init_budget(5)
        clock.now += 2
        assert remaining_budget() == pytest.approx(3)
        clock.now += 10
        assert remaining_budget() == 0.0

    asyncio.run(run())


def test_nested_scope_shrinks_but_never_extends(clock):
    with budget_scope(10):
        with budget_scope(3) as available:
            assert available == pytest.approx(3)
            assert remaining_budget() == pytest.approx(3)
        with budget_scope(60) as available:
            assert available == pytest.approx(10)
            assert remaining_budget() == pytest.approx(10)
        assert remaining_budget() == pytest.approx(10)
    assert remaining_budget() == 30.0


def test_scope_restores_on_exception(clock):
    with pytest.raises(RuntimeError), budget_scope(1):
        raise RuntimeError("boom")
    assert remaining_budget() == 30.0


async def test_child_tasks_inherit_the_deadline(clock):
    with budget_scope(4):
        clock.now += 1

        async def child() -> float:
            return remaining_budget()

        assert await asyncio.create_task(child()) == pytest.approx(3)


@pytest.mark.parametrize("value", ["abc", "nan", "NaN", "inf", "-inf", "0", "-1", "1e999"])
def test_parse_rejects_nonsense(value):
    with pytest.raises(ValueError, match=BUDGET_HEADER):
        parse_budget_header(value, default=10, maximum=60)


def test_parse_default_and_cap():
    assert parse_budget_header(None, default=10, maximum=60) == 10
    assert parse_budget_header("", default=10, maximum=60) == 10
    assert parse_budget_header("2.5", default=10, maximum=60) == 2.5
    assert parse_budget_header("600", default=10, maximum=60) == 60


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf])
def test_scope_rejects_bad_seconds(bad):
    with pytest.raises(ValueError), budget_scope(bad):
        pass


def test_outgoing_headers_subtract_margin_and_refuse_when_spent(clock):
    with budget_scope(2):
        clock.now += 1
        headers = outgoing_budget_headers()
        assert float(headers[BUDGET_HEADER]) == pytest.approx(0.95)
        clock.now += 0.92
        with pytest.raises(BudgetExhaustedError):
            outgoing_budget_headers()
        assert isinstance(BudgetExhaustedError("x"), TimeoutError)


def test_detached_budget_ignores_the_enclosing_deadline(clock):
    from resilience.budget import detached_budget

    with budget_scope(1):
        clock.now += 0.99
        with detached_budget(5) as seconds:
            assert seconds == 5
            assert remaining_budget() == pytest.approx(5)
        assert remaining_budget() == pytest.approx(0.01)
