"""JOBFAIR_MIGRATE_ON_START=false (the image's default): `jobfair serve` leaves the schema
to `jobfair migrate`, waits for it up to JOBFAIR_DB_STARTUP_WAIT_S, and refuses a schema
that is behind after that in one line.  A newer schema: tests/deploy/test_rolling_upgrade.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import asyncpg
import httpx
import pytest

from app import migrations
from tests.fixtures import Postgres, ServerProcess, wait_ready

APART = {"JOBFAIR_MIGRATE_ON_START": "false"}


@pytest.fixture
def empty_db(postgres: Postgres, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"apart_{request.node.name[-40:]}"
    postgres.psql(f'CREATE DATABASE "{name}";')
    yield postgres.url(name)
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')


async def test_a_server_waits_for_the_migration_then_serves(
    spawn_server: Callable[..., ServerProcess], empty_db: str
):
    server = spawn_server(JOBFAIR_DATABASE_URL=empty_db, **APART)
    while "for `jobfair migrate`" not in server.log.read_text():
        assert server.proc.poll() is None, server.log.read_text()
        await asyncio.sleep(0.1)  # another process's log: no event to await
    conn = await asyncpg.connect(empty_db)
    try:
        assert await conn.fetchval("SELECT to_regclass('jobs')") is None  # it migrated nothing
    finally:
        await conn.close()
    await asyncio.to_thread(migrations.upgrade, empty_db)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)


@pytest.mark.extended
async def test_a_schema_still_behind_after_the_wait_fails_in_one_line(
    spawn_server: Callable[..., ServerProcess], empty_db: str
):
    server = spawn_server(JOBFAIR_DATABASE_URL=empty_db, JOBFAIR_DB_STARTUP_WAIT_S="1", **APART)
    assert await asyncio.to_thread(server.proc.wait, 60) == 1
    assert server.log.read_text().splitlines()[-1] == (
        f"the database's schema is at nothing, this server needs {migrations.head_revision()}: "
        "run `jobfair migrate` (JOBFAIR_MIGRATE_ON_START=false leaves it to you)"
    )
