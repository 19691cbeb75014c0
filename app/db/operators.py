"""Operators' reads and writes: tenant and job-type configuration, the stats view, job
search, and the database's health.  None is on a job's path; the stats and the search
may read the backlog (bounded where they count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from app.db.base import Queries, Sessions
from app.db.listen import NOTIFY_CHANNEL
from app.db.locks import RELEASE_GATE_CLASS, TENANT_CAP_LOCK_CLASS
from app.db.rows import (
    JOB_COLUMNS,
    JobRow,
    JobTypeRow,
    LaneStats,
    TenantRow,
    TypeConfig,
    job_row,
)

# -- name: type_config
# A job type's cap and aging settings (no row: the server's defaults).  Index: job_types
# pkey.
TYPE_CONFIG = """
SELECT max_active_jobs, aging_interval_ms, aging_step FROM job_types WHERE job_type = $1
"""

# -- name: stats
# Per lane (type, tenant): ready jobs (CREATED), delayed ones (SCHEDULED: a runAt or a
# retry back-off still ahead), active ones; the oldest ready job (by queued_at, when it
# became ready) and its key; and what may hold the lane back: its tenant's cap with the
# tenant's active jobs of every type (counted up to the cap, jobs_active_tenant_idx),
# and its type's cap.  Reads the backlog: an operator query, not hot path.  No locks.
_STATS = """
WITH per_lane AS (
    SELECT job_type, tenant_id,
           count(*) FILTER (WHERE state = 'CREATED') AS ready,
           count(*) FILTER (WHERE state = 'SCHEDULED') AS delayed,
           count(*) FILTER (WHERE state = 'ACTIVATED') AS active,
           min(queued_at) FILTER (WHERE state = 'CREATED') AS oldest_ready_at,
           -- The oldest ready job's key in the same pass: arrays compare element-wise.
           (min(ARRAY[extract(epoch FROM queued_at), job_key])
              FILTER (WHERE state = 'CREATED'))[2]::bigint AS oldest_ready_key
    FROM jobs WHERE state IN ('CREATED', 'SCHEDULED', 'ACTIVATED') {type}
    GROUP BY job_type, tenant_id
)
SELECT l.*, tn.max_active_jobs AS tenant_cap, jt.max_active_jobs AS type_cap,
       CASE WHEN tn.max_active_jobs IS NOT NULL THEN (
           SELECT count(*) FROM (
               SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = l.tenant_id
               LIMIT tn.max_active_jobs) capped
       ) END AS tenant_active
FROM per_lane l
LEFT JOIN tenants tn ON tn.tenant_id = l.tenant_id
LEFT JOIN job_types jt ON jt.job_type = l.job_type
ORDER BY l.job_type, l.tenant_id
"""
STATS = _STATS.format(type="")

# -- name: stats_of_type
# As stats, for job type $1 only.
STATS_OF_TYPE = _STATS.format(type="AND job_type = $1")

# -- name: upsert_tenant
# A tenant's configuration set; its held lanes are released (the cap that held them may
# be gone or higher; a claim holds them again if not), under its cap lock, which orders
# the change before or after every capped claim of the tenant (jobfair_release_holds).
UPSERT_TENANT = f"""
WITH up AS (
    INSERT INTO tenants (tenant_id, weight, max_active_jobs) VALUES ($1, $2, $3)
    ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight,
                                          max_active_jobs = EXCLUDED.max_active_jobs
    RETURNING tenant_id, weight, max_active_jobs
),
unheld AS (
    SELECT jobfair_release_holds(
        {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM unheld) = 1
"""

# -- name: get_tenant
# A tenant's configuration (no row: weight 1, no cap).  Index: tenants pkey.
GET_TENANT = "SELECT tenant_id, weight, max_active_jobs FROM tenants WHERE tenant_id = $1"

# -- name: list_tenants
# Every configured tenant, by id.
LIST_TENANTS = "SELECT tenant_id, weight, max_active_jobs FROM tenants ORDER BY tenant_id"

# -- name: release_after_finishes
# After a tenant's configuration change committed: waits, on the release gate taken
# exclusively, for every finishing statement in flight (one that began before the change
# chose the capped tenants it releases without seeing it), then releases the tenant's
# held lanes again, so that none stays held by a claim that counted those finishes'
# jobs as active (ADR 016).  Locks: the gate, then as jobfair_release_holds.
RELEASE_AFTER_FINISHES = f"""
SELECT pg_advisory_xact_lock({RELEASE_GATE_CLASS}, 0),
       jobfair_release_holds(
           {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
"""

# -- name: delete_tenant
# As upsert_tenant: the tenant's held lanes are released.
DELETE_TENANT = f"""
WITH gone AS (DELETE FROM tenants WHERE tenant_id = $1 RETURNING tenant_id),
unheld AS (
    SELECT jobfair_release_holds(
        {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
)
SELECT gone.tenant_id FROM gone WHERE (SELECT count(*) FROM unheld) = 1
"""

# -- name: upsert_job_type
# A job type's cap and aging set (NULL: the server's default).  Index: job_types pkey.
UPSERT_JOB_TYPE = """
INSERT INTO job_types (job_type, max_active_jobs, aging_interval_ms, aging_step)
VALUES ($1, $2, $3, $4)
ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs,
    aging_interval_ms = EXCLUDED.aging_interval_ms, aging_step = EXCLUDED.aging_step
RETURNING job_type, max_active_jobs, aging_interval_ms, aging_step
"""

# -- name: get_job_type
# A job type's configuration.  Index: job_types pkey.
GET_JOB_TYPE = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step FROM job_types WHERE job_type = $1
"""

# -- name: list_job_types
# Every configured job type, by name.
LIST_JOB_TYPES = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step FROM job_types ORDER BY job_type
"""


# Job search, assembled per call by search_jobs below (so not in docs/sql):
# Job search (Camunda's POST /v2/jobs/search): equality/IN filters on whitelisted
# columns, one sort key, offset paging.  An operator query: it may scan; the count is
# bounded (SEARCH_COUNT_LIMIT) so a huge table costs a bounded count.
SEARCH_COLUMNS = {
    "jobKey": "job_key",
    "type": "job_type",
    "tenantId": "tenant_id",
    "state": "state",
    "worker": "worker",
    "retries": "retries",
    "priority": "priority",
    "deadline": "deadline",
    "creationTime": "created_at",
    "endTime": "completed_at",
}
SEARCH_COUNT_LIMIT = 10_000


async def type_config(db: Queries, job_type: str) -> TypeConfig:
    row = await db.fetchrow(TYPE_CONFIG, job_type)
    if row is None:
        return TypeConfig(None, None, None)
    return TypeConfig(row["max_active_jobs"], row["aging_interval_ms"], row["aging_step"])


async def upsert_tenant(db: Sessions, tenant_id: str, weight: int, cap: int | None) -> TenantRow:
    row = await db.fetchrow(UPSERT_TENANT, tenant_id, weight, cap)
    await _release_after_finishes(db, tenant_id)
    return TenantRow(*row)


async def _release_after_finishes(db: Sessions, tenant_id: str) -> None:
    """After a tenant's change committed (release_after_finishes)."""
    async with db.transaction() as tx:
        await tx.execute(RELEASE_AFTER_FINISHES, tenant_id)


async def get_tenant(db: Queries, tenant_id: str) -> TenantRow | None:
    row = await db.fetchrow(GET_TENANT, tenant_id)
    return None if row is None else TenantRow(*row)


async def list_tenants(db: Queries) -> list[TenantRow]:
    return [TenantRow(*r) for r in await db.fetch(LIST_TENANTS)]


async def delete_tenant(db: Sessions, tenant_id: str) -> bool:
    deleted = await db.fetchval(DELETE_TENANT, tenant_id) is not None
    await _release_after_finishes(db, tenant_id)
    return deleted


async def upsert_job_type(
    db: Queries, job_type: str, cap: int | None, interval_ms: int | None, step: int | None
) -> JobTypeRow:
    return JobTypeRow(*await db.fetchrow(UPSERT_JOB_TYPE, job_type, cap, interval_ms, step))


async def get_job_type(db: Queries, job_type: str) -> JobTypeRow | None:
    row = await db.fetchrow(GET_JOB_TYPE, job_type)
    return None if row is None else JobTypeRow(*row)


async def list_job_types(db: Queries) -> list[JobTypeRow]:
    return [JobTypeRow(*r) for r in await db.fetch(LIST_JOB_TYPES)]


async def search_jobs(
    db: Queries,
    filters: dict[str, list[Any]],
    sort: Sequence[tuple[str, bool]],
    limit: int,
    offset: int,
) -> tuple[list[JobRow], int, bool]:
    """``filters``: API field -> accepted values; ``sort``: (API field, descending).
    Returns (jobs, total counted up to SEARCH_COUNT_LIMIT, more than that)."""
    where, args = [], []
    for field, values in filters.items():
        args.append(values)
        cast = "bigint[]" if field == "jobKey" else ("int[]" if field == "retries" else "text[]")
        where.append(f"{SEARCH_COLUMNS[field]} = ANY(${len(args)}::{cast})")
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    order = ", ".join(
        f"{SEARCH_COLUMNS[f]} {'DESC' if desc else 'ASC'} NULLS LAST" for f, desc in sort
    )
    order = f"ORDER BY {order + ', ' if order else ''}job_key"
    rows = await db.fetch(
        f"SELECT {JOB_COLUMNS} FROM jobs {clause} {order} "
        f"LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
        *args,
        limit,
        offset,
    )
    total = await db.fetchval(
        f"SELECT count(*) FROM (SELECT 1 FROM jobs {clause} "
        f"LIMIT {SEARCH_COUNT_LIMIT + 1}) bounded",
        *args,
    )
    return [job_row(r) for r in rows], min(total, SEARCH_COUNT_LIMIT), total > SEARCH_COUNT_LIMIT


async def stats(db: Queries, job_type: str | None = None) -> list[LaneStats]:
    rows = await (db.fetch(STATS) if job_type is None else db.fetch(STATS_OF_TYPE, job_type))
    return [LaneStats.of(r) for r in rows]


async def ping(db: Queries) -> None:
    await db.fetchval("SELECT 1")


async def schema_revision(db: Queries) -> str | None:
    """The migration the database is at (None: never migrated)."""
    try:
        revision: str | None = await db.fetchval("SELECT version_num FROM alembic_version")
    except asyncpg.UndefinedTableError:
        return None
    return revision
