"""The harness itself talks to real services: a broken fixture would make every other test meaningless."""

import psycopg

from infra.redis import key


async def test_redis_fixture_isolates_keys_by_prefix(redis, key_prefix):
    k = key("probe")
    assert k.startswith(f"{key_prefix}:")
    await redis.set(k, "1")
    assert await redis.get(k) == "1"


def test_postgres_fixture_gives_an_empty_fresh_database(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        tables = conn.execute("select count(*) from information_schema.tables where table_schema = 'public'").fetchone()
        assert tables == (0,)
