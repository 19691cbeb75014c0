"""JOBFAIR_DATABASE_SESSION_URL: the two connections that hold a session (LISTEN and the
leader lock) use it, and the pool does not; a NOTIFY on it still wakes a long poll.
Behind PgBouncer in transaction mode, the pool's URL names PgBouncer and this one
PostgreSQL (docs/scaling.md)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from app.config import Settings
from app.db import Database, job_rows
from app.domain import utcnow
from tests.acceptance.test_long_polling import until_waiting
from tests.fixtures import quiet_settings

SESSION_APP = "jobfair-session"


def with_application_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


@pytest.fixture
def background() -> bool:
    return True  # the leader lock is taken by the background work


@pytest.fixture
def settings(db_url: str) -> Settings:
    # A backup poll a minute apart: within the test only a NOTIFY can wake a waiter.
    return quiet_settings(
        database_session_url=with_application_name(db_url, SESSION_APP), backup_poll_ms=60_000
    )


async def sessions(url: str) -> dict[str, list[int]]:
    """The pids of this database's other connections, by application name."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT application_name, pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    found: dict[str, list[int]] = {}
    for r in rows:
        found.setdefault(r["application_name"], []).append(r["pid"])
    return found


async def advisory_holders(url: str) -> set[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted")
    finally:
        await conn.close()
    return {r["pid"] for r in rows}


async def test_listen_and_the_leader_lock_use_the_session_url_and_the_pool_does_not(live, db_url):
    deadline = time.monotonic() + 10
    while len((await sessions(db_url)).get(SESSION_APP, [])) < 2:
        assert time.monotonic() < deadline, await sessions(db_url)
        await asyncio.sleep(0.1)
    found = await sessions(db_url)
    session_pids = found.pop(SESSION_APP)
    assert len(session_pids) == 2  # LISTEN and the leader lock, nothing else
    assert sum(len(pids) for pids in found.values()) >= 2  # the pool's, named otherwise
    # The leader lock is held on one of the session connections.
    assert await advisory_holders(db_url) & set(session_pids)

    # A job made by another process (its NOTIFY sent by its insert) wakes a waiting
    # long poll through the LISTEN connection.
    poll = asyncio.create_task(
        live.client.post(
            "/v2/jobs/activate",
            json={"type": "woken", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 20_000},
        )
    )
    await until_waiting(live.client, 1)
    other = await Database.connect(db_url, size=1)
    try:
        [made] = await job_rows.insert(other, [{"type": "woken"}], utcnow())
    finally:
        await other.close()
    started = time.monotonic()
    r = await asyncio.wait_for(poll, timeout=10)
    assert [j["jobKey"] for j in r.json()["jobs"]] == [str(made.job_key)]
    assert time.monotonic() - started < 5  # not the backup poll's minute
