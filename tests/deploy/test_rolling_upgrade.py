"""A rolling upgrade migrates first, then replaces the replicas: a server of the previous
version keeps serving a schema migrated past it, as long as the schema says it still
serves that version (``schema_compat``, alembic 0009), and is refused, in one line and by
/readyz, once it does not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import httpx
import pytest

from app import migrations
from tests.fixtures import ServerProcess, wait_ready

FUTURE = "from_the_future"


async def migrated_past_this_server(db_url: str, oldest_server: str | None) -> None:
    """What a newer version's migration leaves: a revision this server does not know,
    and the oldest server revision it serves."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("UPDATE alembic_version SET version_num = $1", FUTURE)
        await conn.execute("UPDATE schema_compat SET oldest_server = $1", oldest_server)
    finally:
        await conn.close()


@pytest.mark.parametrize("migrate_on_start", ["true", "false"])
async def test_a_server_serves_a_newer_schema_that_still_serves_its_version(
    spawn_server: Callable[..., ServerProcess], db_url: str, migrate_on_start: str
):
    await migrated_past_this_server(db_url, migrations.head_revision())
    server = spawn_server(JOBFAIR_MIGRATE_ON_START=migrate_on_start)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)
        ready = (await c.get("/readyz")).json()
        assert ready == {"status": "ready", "schema": FUTURE, "server": migrations.head_revision()}
        created = await c.post("/v2/jobs", json={"type": "upgrade", "tenantId": "t"})
        assert created.status_code == 201, created.text
        got = await c.post(
            "/v2/jobs/activate", json={"type": "upgrade", "maxJobs": 1, "timeout": 30_000}
        )
        assert got.status_code == 200, got.text
        assert [j["jobKey"] for j in got.json()["jobs"]] == [created.json()["jobKey"]], got.text
    assert "serving without migrating" in server.log.read_text()
    conn = await asyncpg.connect(db_url)
    try:  # nothing migrated back or over
        assert await conn.fetchval("SELECT version_num FROM alembic_version") == FUTURE
    finally:
        await conn.close()


@pytest.mark.parametrize("migrate_on_start", ["true", "false"])
async def test_a_newer_schema_that_no_longer_serves_the_version_refuses_it_in_one_line(
    spawn_server: Callable[..., ServerProcess], db_url: str, migrate_on_start: str
):
    await migrated_past_this_server(db_url, FUTURE)
    server = spawn_server(JOBFAIR_MIGRATE_ON_START=migrate_on_start)  # waits if behind
    assert await asyncio.to_thread(server.proc.wait, 30) == 1
    assert server.log.read_text().splitlines()[-1] == (
        f"the database's schema is at {FUTURE}, newer than this server's "
        f"{migrations.head_revision()}, and no longer serves it (servers from {FUTURE} on): "
        "run the newer version"
    )


async def test_a_running_server_is_ready_while_the_schema_serves_it_and_unready_after(
    live, db_url: str
):
    assert (await live.client.get("/readyz")).status_code == 200
    await migrated_past_this_server(db_url, migrations.head_revision())  # expand
    assert (await live.client.get("/readyz")).json()["schema"] == FUTURE
    await migrated_past_this_server(db_url, FUTURE)  # contract
    unready = await live.client.get("/readyz")
    assert unready.status_code == 503
    assert unready.headers["content-type"] == "application/problem+json"
    assert f"this server needs {migrations.head_revision()}" in unready.json()["detail"]
