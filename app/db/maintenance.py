"""Maintenance: what the leader's sweepers do -- expired leases back to the queue,
delayed jobs promoted when due, finished jobs pruned after their retention.

Each works in bounded batches (``limit``), so a sweep never holds locks on, or reads,
more than a batch.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from app.db import lanes
from app.db.base import Sessions, retry_deadlock
from app.db.finishing import CREDIT_NOTIFY, RELEASE_HOLDS
from app.db.history import ended_cte
from app.db.rows import ExpiredLease

# -- name: expired_leases
# ACTIVATED jobs whose lease ended.  Index: jobs_lease_idx.  No locks (the release
# re-checks state and deadline).
EXPIRED_LEASES = """
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'ACTIVATED' AND deadline < $1
ORDER BY deadline LIMIT $2
"""

# -- name: release_expired
# Expired ACTIVATED -> CREATED; retries and activationCount unchanged, so the stale
# holder is fenced out as soon as the job is activated again.
RELEASE_EXPIRED = f"""
WITH ended AS (
    UPDATE jobs SET state = 'CREATED', deadline = NULL
    WHERE job_key = ANY($1::bigint[]) AND state = 'ACTIVATED' AND deadline < $2
    RETURNING job_key, job_type, tenant_id, via_stream, activation_count, activated_at, worker,
              retries, fairness_key, charged, lane_charge, key_charge
),
{ended_cte("ended", "$1::bigint[]", event="'lease-expired'", at="$2")},
{CREDIT_NOTIFY},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, activation_count, worker, fairness_key, activated_at,
       charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT n FROM unheld) AS _n
FROM ended
"""


# -- name: due_scheduled
# Delayed jobs that are due.  Index: jobs_scheduled_idx.
DUE_SCHEDULED = """
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'SCHEDULED' AND run_at <= $1
ORDER BY run_at LIMIT $2
"""

# -- name: promote_scheduled
# Due delayed jobs -> CREATED, re-checked (another sweeper may have been first).
# Index: jobs pkey.  Locks: the caller holds the shared lane-bucket locks.
PROMOTE_SCHEDULED = """
UPDATE jobs SET state = 'CREATED'
WHERE job_key = ANY($1::bigint[]) AND state = 'SCHEDULED' AND run_at <= $2
RETURNING job_key, job_type, tenant_id, fairness_key
"""

# -- name: prune_terminal
# Deletes terminal jobs finished before $1, oldest first, in bounded batches, with their
# history; answers how many jobs.  Index: jobs_terminal_idx, job_events pkey.
PRUNE_TERMINAL = """
WITH gone AS (
    DELETE FROM jobs WHERE job_key IN (
        SELECT job_key FROM jobs
        WHERE state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED') AND completed_at < $1
        ORDER BY completed_at LIMIT $2
    )
    RETURNING job_key
),
events AS (
    DELETE FROM job_events e WHERE e.job_key = ANY(ARRAY(SELECT job_key FROM gone))
)
SELECT count(*) FROM gone
"""

# -- name: prune_workers
# Forgets worker names not seen since $1.  A sequential read of workers (one row per job
# type and worker name).
PRUNE_WORKERS = "DELETE FROM workers WHERE last_seen_at < $1"


@retry_deadlock
async def _ready_by_keys(
    db: Sessions,
    select_sql: str,
    select_args: tuple[Any, ...],
    update_sql: str,
    update_args: tuple[Any, ...],
) -> list[asyncpg.Record]:
    """Select candidates, take their lanes' shared bucket locks, then update them and
    wake their lanes; the rows updated."""
    async with db.connection() as conn:
        candidates = await conn.fetch(select_sql, *select_args)
        if not candidates:
            return []
        async with conn.transaction():
            await lanes.lock_to_wake(conn, [(r["job_type"], r["tenant_id"]) for r in candidates])
            rows = await conn.fetch(update_sql, [r["job_key"] for r in candidates], *update_args)
            await lanes.wake(conn, rows)
        return list(rows)


async def release_expired(db: Sessions, now: datetime, limit: int) -> list[ExpiredLease]:
    """Up to ``limit`` expired leases back to CREATED (release_expired): their jobs."""
    rows = await _ready_by_keys(db, EXPIRED_LEASES, (now, limit), RELEASE_EXPIRED, (now,))
    fields = (
        "job_key",
        "job_type",
        "tenant_id",
        "activation_count",
        "worker",
        "activated_at",
        "fairness_key",
        "charged",
        "lane_charge",
        "key_charge",
    )
    return [ExpiredLease(*(r[f] for f in fields)) for r in rows]


async def promote_scheduled(db: Sessions, now: datetime, limit: int) -> int:
    """Up to ``limit`` due delayed jobs to CREATED (promote_scheduled)."""
    return len(await _ready_by_keys(db, DUE_SCHEDULED, (now, limit), PROMOTE_SCHEDULED, (now,)))


async def prune_terminal(db: Sessions, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` jobs finished before ``before`` (prune_terminal)."""
    pruned: int = await db.fetchval(PRUNE_TERMINAL, before, limit)
    return pruned


async def prune_workers(db: Sessions, before: datetime) -> int:
    """Forget worker names last seen before ``before`` (prune_workers)."""
    status = await db.execute(PRUNE_WORKERS, before)
    return int(status.split()[-1])
