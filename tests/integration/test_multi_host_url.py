"""A database URL naming several hosts with ``target_session_attrs=read-write`` (how a
client finds the primary of a Patroni or pg_auto_failover cluster; docs/scaling.md) is
passed to the driver as written, by every connection Jobfair makes: the migration, the
pool, the LISTEN connection and the leader lock all skip a host that is down and reach
the primary, and a URL asking for a standby is refused by this primary."""

from __future__ import annotations

import asyncio
import urllib.parse

import asyncpg
import pytest

from app import migrations
from app.db import Database
from app.db.leader import LeaderLock
from app.db.listen import Notifier
from tests.fixtures import Postgres


def several_hosts(url: str, attrs: str) -> str:
    """``url`` (the embedded server's, on a Unix socket) with a host that does not exist
    listed before it, and ``target_session_attrs``."""
    base, _, query = url.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    params["host"] = "/nonexistent/jobfair," + params["host"]
    params["target_session_attrs"] = attrs
    return f"{base}?{urllib.parse.urlencode(params, safe='/,')}"


@pytest.fixture
def fresh_url(postgres: Postgres):
    name = "multi_host"
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')
    postgres.psql(f'CREATE DATABASE "{name}";')
    yield postgres.url(name)
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')


async def test_every_connection_finds_the_primary_past_a_host_that_is_down(fresh_url: str):
    url = several_hosts(fresh_url, "read-write")
    migrations.upgrade(url)
    db = await Database.connect(url, size=2)
    leader = LeaderLock(url)
    notifier = Notifier(url, lambda job_type, n: None, lambda keys: None, lambda: None)
    try:
        assert await db.fetchval("SELECT NOT pg_is_in_recovery()")
        assert await db.fetchval("SELECT count(*) FROM jobs") == 0  # migrated
        assert await leader.hold()
        await notifier.start()
        assert notifier.connected.is_set()
    finally:
        await notifier.stop()
        await leader.close()
        await db.close()


async def test_a_url_asking_for_a_standby_is_refused_by_a_primary(fresh_url: str):
    """The attribute is applied, not ignored (with the dead host listed too, the driver
    reports that host's error instead)."""
    with pytest.raises(asyncpg.exceptions.TargetServerAttributeNotMatched):
        await asyncio.wait_for(asyncpg.connect(f"{fresh_url}&target_session_attrs=standby"), 10)
