"""Backlogs loaded straight through SQL: set-up, not what is measured.  Jobs, their lanes
and each lane's default fairness key (alembic 0010), as the server would have made them."""

from __future__ import annotations

import asyncpg


async def preload(url: str, job_type: str, per_tenant: dict[str, int]) -> None:
    """Fill the backlog straight through SQL (set-up, not what is measured)."""
    conn = await asyncpg.connect(url)
    try:
        for tenant, n in per_tenant.items():
            await conn.execute(
                """
                INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                                  run_at, queued_at, created_at, variables)
                SELECT jobfair_job_key(jobfair_shard($2), nextval('job_key_seq')),
                       jobfair_shard($2), $1, $2, 'CREATED', (g % 3) * 25, 3, now(),
                       now() + g * interval '1 us', now(), '{"n": 1}'::jsonb
                FROM generate_series(1, $3) g
                """,
                job_type,
                tenant,
                n,
            )
        await conn.executemany(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
            " VALUES ($1, $2, jobfair_shard($2), 0, true)",
            [(job_type, t) for t in per_tenant],
        )
        # Each lane's one fairness key, the default '' (ADR 027): without it the key read
        # finds nothing ready and the lane gives no job.
        await conn.executemany(
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
            " VALUES ($1, $2, '', jobfair_shard($2), 0, true)",
            [(job_type, t) for t in per_tenant],
        )
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute("VACUUM ANALYZE lanes")
    finally:
        await conn.close()


async def preload_many_tenants(url: str, job_type: str, tenants: int, per_tenant: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables)
            SELECT jobfair_job_key(jobfair_shard('t' || t), nextval('job_key_seq')),
                   jobfair_shard('t' || t), $1, 't' || t, 'CREATED', 50, 3, now(),
                   now() + g * interval '1 us', now(), '{"n": 1}'::jsonb
            FROM generate_series(1, $2) t, generate_series(1, $3) g
            """,
            job_type,
            tenants,
            per_tenant,
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active) "
            "SELECT $1, 't' || t, jobfair_shard('t' || t), 0, true FROM generate_series(1, $2) t",
            job_type,
            tenants,
        )
        await conn.execute(
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active) "
            "SELECT $1, 't' || t, '', jobfair_shard('t' || t), 0, true"
            " FROM generate_series(1, $2) t",
            job_type,
            tenants,
        )
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute("VACUUM ANALYZE lanes")
    finally:
        await conn.close()
