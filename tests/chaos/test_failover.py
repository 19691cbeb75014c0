"""Issue 27 §2, and the proof of docs/scaling.md's "High availability": a failover on a
real HA engine under the chaos load.

pg_auto_failover (Debian's ``postgresql-15-auto-failover``; tests/chaos/auto_failover.py)
runs a monitor, a primary and a synchronous standby.  Two ``jobfair serve`` processes
are given the formation's multi-host URL as ``pg_autoctl show uri`` prints it
(``target_session_attrs=read-write``), with every background task on.  Once the load is
under way the primary's machine is lost: its keeper, postmaster and backends SIGKILLed at
once.  The monitor promotes the standby; every connection of each server -- the pool,
the LISTEN connection, the leader lock -- finds it through the URL; and the ledger
verifies.  A commit was acknowledged only once the standby had it, so nothing a client
was told survives only on the lost machine: every job created was completed exactly once
by an accepted finish, none is left ACTIVATED, caps held, no call answered 500.

The unavailability window, printed (``pytest -s``) for docs/reliability.md: from the kill
to the first call accepted on the new primary, and the monitor's part of it (the kill to
the standby's promotion); the ledger's own figure beside them.

And a server started while every host of its URL answers but none is a primary (in a
switchover, between the old primary's demotion and the standby's promotion) waits for
one, on a streaming standby of Debian's PostgreSQL 15 promoted by hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from app.db.locks import LEADER_LOCK_KEY
from tests.chaos.auto_failover import NOT_INSTALLED, PG_AUTOCTL, Formation, formation
from tests.chaos.external_pg import NOT_INSTALLED as PG15_NOT_INSTALLED
from tests.chaos.external_pg import (
    PG15,
    External,
    external_cluster,
    kill_postgres,
    streaming_standby,
)
from tests.chaos.ledger_load import LedgerLoad, Servers, start_servers, until_ready
from tests.chaos.silent_host import SilentHost
from tests.fixtures import ServerProcess

JOBS = 1_200
SILENT_JOBS = 500

# The leader lock (a one-bigint advisory lock) as pg_locks shows it: the key's high and
# low 32 bits, objsubid 1.
LEADER_LOCKS_HELD = """
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND objsubid = 1
   AND (classid::bigint << 32 | objid::bigint) = $1
"""


@pytest.fixture
def cluster() -> Iterator[Formation]:
    if not PG_AUTOCTL.exists() or not (PG15 / "initdb").exists():
        pytest.skip(NOT_INSTALLED)
    with formation() as f:
        yield f


def log_lines(path: Path, text: str) -> int:
    return sum(text in line for line in path.read_text().splitlines())


async def first_accepted_call(servers: list[ServerProcess]) -> float:
    """When a creation sent from now on is first accepted: a write, so committed on the
    new primary.  Sent to each server in turn, every 50 ms, as a client would."""
    async with httpx.AsyncClient(timeout=10) as http:
        for n in itertools.count():
            body = {"type": "failover-probe", "idempotencyKey": f"probe-{n}"}
            with contextlib.suppress(httpx.TransportError):
                r = await http.post(f"{servers[n % len(servers)].url}/v2/jobs", json=body)
                if r.status_code == 201:
                    return time.monotonic()
                assert r.status_code == 503, r.text
            await asyncio.sleep(0.05)
    raise AssertionError("itertools.count() ended")


# In `make chaos`: the formation alone takes 13 to 25 s to come up on this two-core
# machine (three initdb, a base backup, the monitor's checks), the load 20 s to a minute.
@pytest.mark.chaos
async def test_a_primary_lost_under_load_fails_over_and_jobfair_follows_losing_nothing(
    spawn_server: Callable[..., ServerProcess], cluster: Formation
) -> None:
    url = cluster.uri()
    servers = await start_servers(spawn_server, 2, JOBFAIR_DATABASE_URL=url)
    load = LedgerLoad(Servers([s.url for s in servers]), lambda: url, jobs=JOBS)
    old = cluster.primary()
    (new,) = [n for n in cluster.nodes if n is not old]
    times: dict[str, float] = {}

    async def lose_the_primary(load: LedgerLoad) -> None:
        await load.until_created(JOBS // 3)
        await load.until_finished(JOBS // 6)
        await asyncio.to_thread(cluster.kill, old)
        times["killed"] = time.monotonic()
        probe = asyncio.create_task(first_accepted_call(servers))
        await asyncio.to_thread(cluster.until_states, {new.name: "wait_primary"})
        times["promoted"] = time.monotonic()
        times["accepted"] = await probe

    await load.run(lose_the_primary)
    figures = await load.verify("failover: primary lost, synchronous standby promoted")
    print(
        f"primary lost to the first call accepted on the new primary "
        f"{times['accepted'] - times['killed']:.2f} s (to its promotion, as the monitor "
        f"reports it, {times['promoted'] - times['killed']:.2f} s); longest stretch "
        f"without an accepted finish {figures.unavailability_s:.2f} s"
    )
    assert cluster.primary() is new
    for s in servers:
        assert s.proc.poll() is None, s.log.read_text()  # followed without a restart
        # Its LISTEN connection found the new primary (a second connection, on it).
        assert log_lines(s.log, "LISTEN connection re-established") >= 1, s.log.read_text()
    # The leader lock too: contended again, held by one server, on the new primary.
    leads = sum(log_lines(s.log, "this process leads the background work") for s in servers)
    assert leads >= 2, [s.log.read_text() for s in servers]
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == new.port
        assert await conn.fetchval(LEADER_LOCKS_HELD, LEADER_LOCK_KEY) == 1
    finally:
        await conn.close()


@pytest.fixture
def primary_and_standby() -> Iterator[tuple[External, External]]:
    """A primary of Debian's PostgreSQL 15 with a database ``jobfair``, and its standby,
    streaming and synchronous (``synchronous_standby_names = '*'``)."""
    if not (PG15 / "initdb").exists():
        pytest.skip(PG15_NOT_INSTALLED)
    with external_cluster() as primary, streaming_standby(primary) as standby:
        primary.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        primary.psql("SELECT pg_reload_conf()")
        primary.psql("CREATE DATABASE jobfair")  # waits for the standby: it is synchronous
        yield primary, standby


async def test_a_server_started_while_no_host_is_a_primary_comes_up_once_one_is_promoted(
    spawn_server: Callable[..., ServerProcess], primary_and_standby: tuple[External, External]
) -> None:
    """Every host the URL names answers, and none is a primary (in a switchover, the old
    primary is demoted before the standby is promoted): a server started then waits, as
    for a database not up yet, and comes up on the promoted one."""
    _, standby = primary_and_standby
    url = standby.url("jobfair") + "?target_session_attrs=read-write"
    server = spawn_server(JOBFAIR_DATABASE_URL=url, JOBFAIR_DB_STARTUP_WAIT_S="60")
    deadline = time.monotonic() + 30
    while "waiting up to 60 s" not in server.log.read_text():
        assert server.proc.poll() is None, server.log.read_text()
        assert time.monotonic() < deadline, server.log.read_text()
        await asyncio.sleep(0.1)
    await asyncio.to_thread(standby.pg_ctl, "-w", "promote")
    await until_ready(server)


@pytest.mark.chaos  # 15 s of the suite's time (issue 39 section 3)
async def test_a_primary_gone_silent_under_load_is_left_for_the_promoted_standby(
    spawn_server: Callable[..., ServerProcess], primary_and_standby: tuple[External, External]
) -> None:
    """The primary's host is lost without a word (``SilentHost``: its connections hang,
    a new one is never answered) and the standby is promoted by hand (``pg_ctl
    promote``).  The URL lists the silent host first, as it did the primary.  What an HA
    deployment sets (docs/scaling.md): each host 2 s to answer a new connection
    (``connect_timeout``), a pooled statement 5 s (``JOBFAIR_DB_STATEMENT_TIMEOUT_MS``);
    LISTEN's and the leader lock's checks give up within 5 s by themselves."""
    primary, standby = primary_and_standby
    silent = SilentHost(primary.port)
    await silent.start()
    hosts = f"127.0.0.1:{silent.port},127.0.0.1:{standby.port}"
    url = f"postgresql://postgres@{hosts}/jobfair?target_session_attrs=read-write&connect_timeout=2"
    servers = await start_servers(
        spawn_server, 2, JOBFAIR_DATABASE_URL=url, JOBFAIR_DB_STATEMENT_TIMEOUT_MS="5000"
    )
    # The ledger's sampler and verdict read the primary of the moment, directly.
    direct = {"url": primary.url("jobfair")}
    load = LedgerLoad(Servers([s.url for s in servers]), lambda: direct["url"], jobs=SILENT_JOBS)
    times: dict[str, float] = {}

    async def lose_the_primary_silently(load: LedgerLoad) -> None:
        await load.until_created(SILENT_JOBS // 3)
        await load.until_finished(SILENT_JOBS // 6)
        silent.silence()
        await asyncio.to_thread(kill_postgres, primary.pgdata)
        times["lost"] = time.monotonic()
        probe = asyncio.create_task(first_accepted_call(servers))
        await asyncio.to_thread(standby.pg_ctl, "-w", "promote")
        direct["url"] = standby.url("jobfair")
        times["promoted"] = time.monotonic()
        times["accepted"] = await probe

    try:
        await load.run(lose_the_primary_silently)
    finally:
        await silent.close()
    figures = await load.verify("primary gone silent, standby promoted by hand")
    print(
        f"primary gone silent to the first call accepted on the promoted standby "
        f"{times['accepted'] - times['lost']:.2f} s (promotion "
        f"{times['promoted'] - times['lost']:.2f} s of it); longest stretch without an "
        f"accepted finish {figures.unavailability_s:.2f} s"
    )
    for s in servers:
        assert s.proc.poll() is None, s.log.read_text()
        assert log_lines(s.log, "LISTEN connection re-established") >= 1, s.log.read_text()
    conn = await asyncpg.connect(direct["url"])
    try:
        assert await conn.fetchval(LEADER_LOCKS_HELD, LEADER_LOCK_KEY) == 1
    finally:
        await conn.close()
