"""An exception chain that loops is walked once: ``answer_for`` on such an error answered nothing and spun the event
loop (a payment-agent at 100% CPU under a Redis Sentinel failover)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError

from errors.causes import causes
from errors.connection_errors import never_connected
from infra.error_table import answer_for


def looped() -> tuple[Exception, Exception]:
    outer, inner = RuntimeError("wrapper"), ValueError("underneath")
    outer.__cause__, inner.__cause__ = inner, outer
    return outer, inner


def test_a_chain_that_loops_is_walked_once() -> None:
    outer, inner = looped()
    assert list(causes(outer)) == [inner]
    assert list(causes(inner)) == [outer]


def test_causes_follow_the_context_only_when_asked() -> None:
    try:
        try:
            raise KeyError("first")
        except KeyError:
            raise OSError("second")  # noqa: B904 - raised during, not from: a __context__
    except OSError as exc:
        assert list(causes(exc)) == []
        assert [type(e) for e in causes(exc, context=True)] == [KeyError]


def test_the_error_table_answers_an_error_whose_chain_loops() -> None:
    outer, _ = looped()
    assert answer_for(outer).code == "internal"
    assert never_connected(outer) is False
    redis_down, wrapper = RedisConnectionError("gone"), RuntimeError("store")
    wrapper.__cause__, redis_down.__cause__ = redis_down, wrapper
    assert answer_for(wrapper).code == "dependency_unavailable"  # still named through the loop
