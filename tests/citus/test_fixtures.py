"""Under make citus (JOBFAIR_TEST_CITUS=1) a test's database is the session's Citus
cluster, emptied for it: what lets the suites of one PostgreSQL run against Citus."""

from __future__ import annotations

import os

import asyncpg
import pytest

from tests.citus.cluster import installed

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not installed(), reason="Citus is not installed (make citus)"),
    pytest.mark.skipif(
        os.environ.get("JOBFAIR_TEST_CITUS") != "1", reason="make citus sets JOBFAIR_TEST_CITUS=1"
    ),
]


async def test_a_tests_database_is_the_clusters_and_starts_empty(citus, db_url: str) -> None:
    assert db_url == citus.url()
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM tenants") == 0
        await conn.execute("INSERT INTO tenants (tenant_id) VALUES ('left-behind')")
        citus.empty()
        assert await conn.fetchval("SELECT count(*) FROM tenants") == 0
        # The schema's own records stay: the server still sees a migrated database.
        assert await conn.fetchval("SELECT count(*) FROM alembic_version") == 1
    finally:
        await conn.close()
