"""``REDIS_URL``'s three forms read into a ``RedisTarget``, and a bad one refused as a settings error naming
REDIS_URL (not a traceback from deep inside redis-py at the first command)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool

from infra.redis import BoundedConnectionPool, SentinelRedis, create_redis, create_sync_redis
from infra.redis_url import RedisTarget, parse_redis_url, redact_redis_url
from infra.settings import Settings, get_settings
from stack.dlq import redis_command
from stack.errors import RedisUnavailableError
from stack.redis_server import plan_redis


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisTarget("single", "redis://127.0.0.1:6379/0")),
        ("rediss://h:6380/2", RedisTarget("single", "rediss://h:6380/2")),
        (
            "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/3",
            RedisTarget(
                "sentinel",
                "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/3",
                (("10.0.0.1", 26379), ("10.0.0.2", 26380)),
                "mymaster",
                3,
            ),
        ),
        (
            "redis+sentinel://:s%40cret@s1/main",
            RedisTarget("sentinel", "redis+sentinel://:s%40cret@s1/main", (("s1", 26379),), "main", 0, None, "s@cret"),
        ),
        (
            "redis+cluster://app:pw@n1:7000,n2:7001,[::1]:7002/0",
            RedisTarget(
                "cluster",
                "redis+cluster://app:pw@n1:7000,n2:7001,[::1]:7002/0",
                (("n1", 7000), ("n2", 7001), ("::1", 7002)),
                None,
                0,
                "app",
                "pw",
            ),
        ),
        ("redis+cluster://n1", RedisTarget("cluster", "redis+cluster://n1", (("n1", 6379),))),
    ],
)
def test_each_form_is_read(url: str, expected: RedisTarget) -> None:
    assert parse_redis_url(url) == expected


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("127.0.0.1:6379", "not a URL"),
        ("http://h:1/0", "unknown scheme"),
        ("redis+sentinel://s1:26379", "needs the master name"),
        ("redis+sentinel://s1:26379/", "needs the master name"),
        ("redis+sentinel://s1:26379/m/0/extra", "takes /<master name>/<db>"),
        ("redis+sentinel://s1:26379/m/zero", "database must be a number"),
        ("redis+sentinel://s1:port/m", "port must be 1-65535"),
        ("redis+sentinel://s1:70000/m", "port must be 1-65535"),
        ("redis+cluster://n1:7000,,n2:7001/0", "empty host"),
        ("redis+cluster://n1:7000/1", "database 0 only"),
    ],
)
def test_a_bad_url_says_what_is_wrong(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_redis_url(url)


def test_the_settings_refuse_a_bad_url_naming_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis+cluster://n1:7000/5")
    with pytest.raises(ValidationError) as caught:
        Settings()
    (error,) = caught.value.errors()
    assert error["loc"] == ("REDIS_URL",) and "database 0 only" in error["msg"]


def test_the_factories_build_the_client_the_url_names() -> None:
    """No server is contacted: redis-py connects on the first command."""
    single = create_redis("redis://127.0.0.1:1/0")
    assert type(single) is Redis and isinstance(single.connection_pool, BoundedConnectionPool)
    sentinel = create_redis("redis+sentinel://127.0.0.1:1,127.0.0.1:2/main/4", max_connections=7)
    assert isinstance(sentinel, SentinelRedis)
    pool = sentinel.connection_pool
    assert isinstance(pool, BoundedConnectionPool) and isinstance(pool, SentinelConnectionPool)
    assert (pool.service_name, pool.max_connections, pool.connection_kwargs["db"]) == ("main", 7, 4)
    assert [c.connection_pool.connection_kwargs["port"] for c in sentinel.sentinel_manager.sentinels] == [1, 2]
    cluster = create_redis("redis+cluster://127.0.0.1:1,127.0.0.1:2/0")
    assert isinstance(cluster, RedisCluster)
    sync_sentinel = create_sync_redis("redis+sentinel://127.0.0.1:1/main/2")
    assert sync_sentinel.connection_pool.service_name == "main"


def test_redaction_hides_the_password_of_every_form() -> None:
    assert redact_redis_url("redis+sentinel://u:pw@h1:1,h2:2/m/0") == "redis+sentinel://u:***@h1:1,h2:2/m/0"
    assert redact_redis_url("redis+cluster://:pw@h1:1/0") == "redis+cluster://:***@h1:1/0"
    assert redact_redis_url("redis://h:1/0") == "redis://h:1/0"


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:1/main/0", "redis+cluster://127.0.0.1:1/0"])
async def test_concierge_up_does_not_stand_in_for_an_unreachable_sentinel_or_cluster(url: str) -> None:
    """A local redis-server in place of a high-availability deployment would hide the outage, and lose its data."""
    with pytest.raises(RedisUnavailableError, match="is unreachable: start it"):
        await plan_redis(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://127.0.0.1:26379", "invalid configuration: REDIS_URL: Value error, redis+sentinel:// needs"),
        ("redis+cluster://127.0.0.1:1/0", "Redis at redis+cluster://127.0.0.1:1/0 is unreachable or failing"),
        ("redis+sentinel://:pw@127.0.0.1:1/main/0", "Redis at redis+sentinel://:***@127.0.0.1:1/main/0 is unreachable"),
    ],
)
def test_an_operator_command_explains_a_bad_or_unreachable_url_in_one_line(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    get_settings.cache_clear()
    try:
        code = redis_command("dlq list", _never_called)(argparse.Namespace())
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("concierge dlq list: ") and says in err, err


async def _never_called(args: argparse.Namespace, redis: object, out: object) -> int:
    await redis.ping()  # type: ignore[attr-defined]
    raise AssertionError("the command ran against an unreachable Redis")
