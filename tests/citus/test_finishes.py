"""The finishes on Citus (make citus): completions of jobs that lie on different worker
nodes, in one statement, fenced by activationCount, each writing its history row."""

from __future__ import annotations

import os

import asyncpg
import pytest

from app.db import finishing
from app.domain import JobState, utcnow
from app.shards import shard_of
from tests.citus.cluster import installed

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not installed(), reason="Citus is not installed (make citus)"),
    pytest.mark.skipif(
        os.environ.get("JOBFAIR_TEST_CITUS") != "1", reason="make citus sets JOBFAIR_TEST_CITUS=1"
    ),
]


async def _tenants_on_two_nodes(conn: asyncpg.Connection) -> list[str]:
    """Two tenants whose shards Citus placed on different worker nodes."""
    by_node: dict[str, str] = {}
    for i in range(200):
        tenant = f"t{i}"
        node = await conn.fetchval(
            "SELECT nodeport::text FROM pg_dist_shard_placement"
            " WHERE shardid = get_shard_id_for_distribution_column('jobs', $1::smallint)",
            shard_of(tenant),
        )
        by_node.setdefault(node, tenant)
        if len(by_node) == 2:
            return list(by_node.values())
    raise AssertionError("every shard on one node")


async def _activated(conn: asyncpg.Connection, tenant: str) -> int:
    """A job of ``tenant`` at its first activation, written as the claim leaves one (the
    claim does not run on Citus yet)."""
    now = utcnow()
    key: int = await conn.fetchval(
        "INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,"
        " run_at, queued_at, variables, custom_headers, created_at, fairness_key, cost,"
        " activation_count, worker, deadline, activated_at, via_stream)"
        " VALUES (jobfair_job_key($1::smallint, nextval('job_key_seq')), $1, 'pay', $2,"
        " 'ACTIVATED', 50, 3, $3::timestamptz, $3, '{}', '{}', $3, '', 1, 1, 'w',"
        " $3::timestamptz + interval '1 min',"
        " $3, false) RETURNING job_key",
        shard_of(tenant),
        tenant,
        now,
    )
    return key


async def test_completions_on_two_nodes_in_one_statement_are_fenced(citus, db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        a, b = await _tenants_on_two_nodes(conn)
        ka, kb = await _activated(conn, a), await _activated(conn, b)
        done = await finishing.complete(conn, [(ka, 1, None), (kb, 1, '{"paid": true}')], utcnow())
        assert sorted(e.job_key for e in done) == sorted([ka, kb])
        rows = await conn.fetch(
            "SELECT job_key, state, variables FROM jobs WHERE job_key = ANY($1::bigint[])",
            [ka, kb],
        )
        done_state = JobState.COMPLETED.value
        assert {r["job_key"]: r["state"] for r in rows} == {ka: done_state, kb: done_state}
        assert next(r["variables"] for r in rows if r["job_key"] == kb) == '{"paid": true}'
        events = await conn.fetch(
            "SELECT job_key, event FROM job_events WHERE job_key = ANY($1::bigint[])", [ka, kb]
        )
        assert sorted((e["job_key"], e["event"]) for e in events) == sorted(
            [(ka, "completed"), (kb, "completed")]
        )
        # Fenced: the same activation again, or a stale one, finishes nothing twice.
        assert await finishing.complete(conn, [(ka, 1, None), (kb, 0, None)], utcnow()) == []
    finally:
        await conn.close()
