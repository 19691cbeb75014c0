"""Issue 27 §2: Debian's PostgreSQL 15, external to Jobfair, restarted and crashed under
the chaos load (tests/chaos/ledger_load.py: long-poll and stream workers, producers, caps)
with every background task on (lease sweeper, promoter, retention, on the leader).  Two
``jobfair serve`` processes share it; neither is restarted.  Afterwards the ledger
verifies: every job created was completed exactly once by an accepted finish, none is
left ACTIVATED, caps held in every sample, no call answered 500.

A fast restart (``pg_ctl restart -m fast``) ends every session (57P01) and refuses new
ones while it starts (57P03).  A crash (SIGKILL of the postmaster and of every backend
at once, as the loss of its host would) loses the sessions without a word, and the
server is started again 1 s later, as a service manager would, to recover from its WAL.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from tests.chaos.external_pg import (
    NOT_INSTALLED,
    PG15,
    External,
    external_cluster,
    kill_postgres,
    postmaster_pid,
)
from tests.chaos.ledger_load import LedgerLoad, Servers, start_servers
from tests.fixtures import ServerProcess, free_port

# `make chaos` runs each scenario on 500 and on 5,000 jobs.  (`make test` ran the 500s,
# 10 s each: a PostgreSQL crash stays there, in test_crashes.py and
# test_database_outage_load.py; issue 39 section 3.)
SIZES = [pytest.param(500, marks=pytest.mark.chaos), pytest.param(5_000, marks=pytest.mark.chaos)]


@pytest.fixture(scope="module")
def pg15() -> Iterator[External]:
    if not (PG15 / "initdb").exists():
        pytest.skip(NOT_INSTALLED)
    with external_cluster() as ext:
        yield ext


@pytest.fixture
def database(pg15: External) -> str:
    name = f"chaos_{free_port()}"
    pg15.psql(f'CREATE DATABASE "{name}"')
    return pg15.url(name)


async def under_load(
    spawn_server: Callable[..., ServerProcess],
    database: str,
    jobs: int,
    fault: Callable[[], None],
) -> LedgerLoad:
    """The load on two servers, and ``fault`` (in a thread) once it is under way."""
    servers = await start_servers(spawn_server, 2, JOBFAIR_DATABASE_URL=database)
    load = LedgerLoad(Servers([s.url for s in servers]), lambda: database, jobs=jobs)

    async def once_under_way(load: LedgerLoad) -> None:
        await load.until_created(jobs // 3)
        await load.until_finished(jobs // 6)
        await asyncio.to_thread(fault)

    await load.run(once_under_way)
    for s in servers:
        assert s.proc.poll() is None, s.log.read_text()  # survived without a restart
    return load


@pytest.mark.parametrize("jobs", SIZES)
async def test_a_fast_restart_of_postgres_under_load_loses_nothing_and_finishes_each_job_once(
    spawn_server: Callable[..., ServerProcess], pg15: External, database: str, jobs: int
) -> None:
    def restart() -> None:
        pg15.pg_ctl("-w", "-m", "fast", "restart")

    load = await under_load(spawn_server, database, jobs, restart)
    await load.verify("PostgreSQL 15 restarted (`pg_ctl restart -m fast`), 2 servers")


@pytest.mark.parametrize("jobs", SIZES)
async def test_a_crash_of_postgres_under_load_loses_nothing_and_finishes_each_job_once(
    spawn_server: Callable[..., ServerProcess], pg15: External, database: str, jobs: int
) -> None:
    def crash() -> None:
        killed = kill_postgres(pg15.pgdata)
        time.sleep(1)  # the outage's length, not a wait for an event
        pg15.start_until_up()
        assert postmaster_pid(pg15.pgdata) != killed

    load = await under_load(spawn_server, database, jobs, crash)
    await load.verify("PostgreSQL 15 crashed (SIGKILL, started 1 s later), 2 servers")
