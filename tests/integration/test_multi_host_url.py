"""A database URL naming several hosts with ``target_session_attrs=read-write`` (how a
client finds the primary of a Patroni or pg_auto_failover cluster; docs/scaling.md) is
followed by every connection Jobfair makes: the migration, the pool, the LISTEN
connection and the leader lock all skip a host that is down and reach the primary, and a
URL asking for a standby is refused by this primary.

A host that accepts a connection and never answers (a machine lost without a word, or
cut off by the network) is given its own time, ``connect_timeout`` (app.db.connect),
and then passed over; a connection already open to it is given up by the LISTEN
connection's and the leader lock's checks within seconds, and both go on to the next
host.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.parse
from collections.abc import Iterator

import asyncpg
import pytest

from app import migrations
from app.db import Database
from app.db.leader import LeaderLock
from app.db.listen import Notifier
from app.errors import StoreUnavailable
from tests.chaos.silent_host import SilentHost
from tests.fixtures import Postgres


def several_hosts(url: str, attrs: str) -> str:
    """``url`` (the embedded server's, on a Unix socket) with a host that does not exist
    listed before it, and ``target_session_attrs``."""
    base, _, query = url.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    params["host"] = "/nonexistent/jobfair," + params["host"]
    params["target_session_attrs"] = attrs
    return f"{base}?{urllib.parse.urlencode(params, safe='/,')}"


def behind(url: str, port: int, attrs: str = "read-write") -> str:
    """``url`` (the embedded server's) with 127.0.0.1:``port`` listed before it, each
    host given 1 s to answer."""
    base, _, query = url.partition("?")
    params = dict(urllib.parse.parse_qsl(query))
    params["host"] = "127.0.0.1," + params["host"]
    params["port"] = f"{port},{params.get('port', '5432')}"
    params["target_session_attrs"] = attrs
    params["connect_timeout"] = "1"
    return f"{base}?{urllib.parse.urlencode(params, safe='/,')}"


@contextlib.contextmanager
def never_answering() -> Iterator[int]:
    """A port whose connections are accepted (by the kernel: it listens) and never
    answered."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def socket_path(url: str) -> str:
    params = dict(urllib.parse.parse_qsl(url.partition("?")[2]))
    return f"{params['host']}/.s.PGSQL.{params.get('port', '5432')}"


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


async def test_every_connection_finds_the_primary_past_a_host_that_never_answers(fresh_url: str):
    """asyncpg alone gives all the hosts one time limit, spent on the first: the primary
    after it would never be reached."""
    with never_answering() as port:
        url = behind(fresh_url, port)
        started = time.monotonic()
        await asyncio.to_thread(migrations.upgrade, url)
        db = await asyncio.wait_for(Database.connect(url, size=2), 10)
        leader = LeaderLock(url)
        notifier = Notifier(url, lambda job_type, n: None, lambda keys: None, lambda: None)
        try:
            assert await db.fetchval("SELECT count(*) FROM jobs") == 0  # migrated
            assert await asyncio.wait_for(leader.hold(), 5)
            await notifier.start()
            assert notifier.connected.is_set()
            # A second for the silent host, each time: migration, pool, leader, LISTEN.
            assert time.monotonic() - started < 30
        finally:
            await notifier.stop()
            await leader.close()
            await db.close()


async def test_the_leader_lock_and_listen_leave_a_host_that_falls_silent(fresh_url: str):
    """Both hold a connection open for as long as they live; once its host stops
    answering, each notices within seconds and reconnects, to the next host."""
    silent = SilentHost(socket_path(fresh_url))
    await silent.start()
    url = behind(fresh_url, silent.port)
    leader = LeaderLock(url)
    reconnected = asyncio.Event()
    notifier = Notifier(url, lambda job_type, n: None, lambda keys: None, reconnected.set)
    try:
        assert await leader.hold()
        await notifier.start()
        assert notifier.connected.is_set()
        silent.silence()
        with pytest.raises(StoreUnavailable):  # not a wait for as long as TCP waits
            await asyncio.wait_for(leader.hold(), 10)
        deadline = time.monotonic() + 10
        while not await leader.hold():  # the old session's lock goes with its backend
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        await asyncio.wait_for(reconnected.wait(), 15)
        assert notifier.connections == 2
    finally:
        await notifier.stop()
        await leader.close()
        await silent.close()
