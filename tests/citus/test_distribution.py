"""`jobfair migrate` on a Citus coordinator distributes the tables, once; `jobfair serve`
refuses a coordinator whose tables are not (make citus)."""

from __future__ import annotations

import os
import subprocess
import sys

import asyncpg
import pytest

from app import migrations
from app.db import citus
from tests.citus.cluster import citus_cluster, installed

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not installed(), reason="Citus is not installed (make citus)"),
]


def _cli(*args: str, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        env={**os.environ, "JOBFAIR_DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def _shard_counts(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT logicalrelid::text AS t, count(*)::int AS n FROM pg_dist_shard"
            " WHERE logicalrelid::text = ANY($1::text[]) GROUP BY 1",
            list(citus.DISTRIBUTED),
        )
    finally:
        await conn.close()
    return {r["t"]: r["n"] for r in rows}


async def test_migrate_distributes_the_tables_once_and_serve_checks_them() -> None:
    with citus_cluster() as cluster:
        url = cluster.url()
        # Migrated by Alembic alone, as the previous release left it: local tables.
        migrations.upgrade(url)
        assert await citus.problems_at(url)
        refused = _cli("serve", "--port", "0", url=url, JOBFAIR_MIGRATE_ON_START="false")
        assert refused.returncode == 1, refused.stderr
        assert "Citus coordinator" in refused.stderr
        assert "run `jobfair migrate`" in refused.stderr

        first = _cli("migrate", url=url)
        assert first.returncode == 0, first.stderr
        assert "citus: jobs: distributed by shard" in first.stderr
        assert await citus.problems_at(url) == []
        placed = {t: p.method for t, p in (await citus.placements_at(url)).items()}
        assert placed == {
            **dict.fromkeys(citus.DISTRIBUTED, "h"),
            **dict.fromkeys(citus.REFERENCE, "n"),
        }

        # Two Citus shards per worker node (ADR 035), the colocated tables with them.
        counts = await _shard_counts(url)
        assert counts == dict.fromkeys(citus.DISTRIBUTED, 2 * len(cluster.workers)), counts

        again = _cli("migrate", url=url)
        assert again.returncode == 0, again.stderr
        assert "citus:" not in again.stderr  # nothing left to do


async def test_migrate_takes_the_shard_count_it_is_given() -> None:
    """JOBFAIR_CITUS_SHARD_COUNT: the Citus shards of the job tables, whatever the nodes."""
    with citus_cluster() as cluster:
        url = cluster.url()
        done = _cli("migrate", url=url, JOBFAIR_CITUS_SHARD_COUNT="6")
        assert done.returncode == 0, done.stderr
        assert "citus: jobs: distributed by shard in 6 Citus shards" in done.stderr
        assert await _shard_counts(url) == dict.fromkeys(citus.DISTRIBUTED, 6)
        assert await citus.problems_at(url) == []
