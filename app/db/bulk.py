"""Bulk operations for operators: revive FAILED jobs, cancel a tenant's CREATED ones.

Each statement here works on one bounded batch and is its own transaction, so a bulk
operation over a million jobs never holds more than a batch of row locks, and what it
did stays done if a later batch fails.  The service (``app.browser``) repeats batches
up to the caller's limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.db import lanes, parking
from app.db.base import Queries, Sessions, retry_deadlock
from app.db.bounds import CANCELED, REVIVED
from app.db.history import log_cte
from app.domain import FailedFilter

# -- name: failed_batch
# FAILED jobs after key $1, in key order, up to $2, matching the filters ($3 tenant, $4
# type, $5 and $6 the creation range; NULL: any): a bulk retry's next batch.  Index:
# jobs_failed_idx (FAILED jobs by key), the filters applied to it: a batch reads the
# FAILED jobs up to its last match.  No locks (the revive re-checks the state).
FAILED_BATCH = """
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'FAILED' AND job_key > $1
  AND ($3::text IS NULL OR tenant_id = $3) AND ($4::text IS NULL OR job_type = $4)
  AND ($5::timestamptz IS NULL OR created_at >= $5)
  AND ($6::timestamptz IS NULL OR created_at < $6)
ORDER BY job_key LIMIT $2
"""

# -- name: revive_failed
# FAILED -> CREATED with $2 retries, due now ($3), at the back of its priority, as PATCH
# retries revives one (app.db.jobs, update_job); its history gets "revived".  Re-checks
# the state (a job revived or deleted meanwhile is passed by).  Index: jobs pkey.
# Locks: the caller holds the shared lane-bucket locks of the jobs' lanes (the protocol
# of app.db.lanes), then wakes them.
REVIVE_FAILED = f"""
WITH up AS (
    UPDATE jobs j
    SET state = 'CREATED', retries = $2, completed_at = NULL, queued_at = $3, run_at = $3
    WHERE j.job_key = ANY($1::bigint[]) AND j.state = 'FAILED'
    RETURNING j.job_key, j.job_type, j.tenant_id, j.activation_count, j.retries,
              j.fairness_key
),
{log_cte("logged", "up", step=REVIVED, event="'revived'", at="$3")}
SELECT job_type, tenant_id, fairness_key FROM up
"""

# -- name: cancel_ready
# Up to $3 ready jobs of one lane ($1 type, $2 tenant) -> CANCELED, key by key from the
# head of each key's queue; rows an activator holds are passed by (they are being
# activated).  Answers how many, and the keys they had (for parking those emptied).
# History: "canceled".  Index: jobs_ready_idx, in its order (each batch starts where the
# last left off: the index entries of jobs canceled before are dead and skipped).
# Locks: the batch's rows.
CANCEL_READY = f"""
WITH up AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = $4
    WHERE j.job_key = ANY(ARRAY(
        SELECT x.job_key FROM jobs x
        WHERE x.state = 'CREATED' AND x.job_type = $1 AND x.tenant_id = $2
        ORDER BY x.fairness_key, x.priority DESC, x.queued_at, x.job_key
        LIMIT $3
        FOR UPDATE SKIP LOCKED))
      AND j.state = 'CREATED'
    RETURNING j.job_key, j.activation_count, j.worker, j.retries, j.fairness_key
),
{log_cte("logged", "up", step=CANCELED, event="'canceled'", at="$4")}
SELECT count(*) AS n, ARRAY(SELECT DISTINCT fairness_key FROM up) AS keys FROM up
"""

# -- name: cancel_delayed
# Up to $3 delayed jobs (SCHEDULED: shown as CREATED) of tenant $1 (and type $2; NULL:
# any) -> CANCELED, soonest due first.  History: "canceled".  Index: jobs_scheduled_idx,
# filtered by tenant: a batch reads the delayed jobs due before its last match.  Locks:
# the batch's rows (the promoter's are passed by).
CANCEL_DELAYED = f"""
WITH up AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = $4
    WHERE j.job_key = ANY(ARRAY(
        SELECT x.job_key FROM jobs x
        WHERE x.state = 'SCHEDULED' AND x.tenant_id = $1
          AND ($2::text IS NULL OR x.job_type = $2)
        ORDER BY x.run_at
        LIMIT $3
        FOR UPDATE SKIP LOCKED))
      AND j.state = 'SCHEDULED'
    RETURNING j.job_key, j.activation_count, j.worker, j.retries
),
{log_cte("logged", "up", step=CANCELED, event="'canceled'", at="$4")}
SELECT count(*) FROM up
"""

# -- name: tenant_lanes
# The job types in which tenant $1 may have ready jobs: its active lanes (a lane with a
# ready job is active: app.db.lanes).  A sequential read of lanes.
TENANT_LANES = "SELECT job_type FROM lanes WHERE tenant_id = $1 AND active ORDER BY job_type"

# -- name: any_created
# Whether tenant $1 has a CREATED or delayed job of type $2 (NULL: any type).  Index:
# jobs_ready_idx per lane, jobs_scheduled_idx.
ANY_CREATED = """
SELECT EXISTS (
    SELECT 1 FROM jobs WHERE state = 'CREATED' AND tenant_id = $1
      AND ($2::text IS NULL OR job_type = $2)
) OR EXISTS (
    SELECT 1 FROM jobs WHERE state = 'SCHEDULED' AND tenant_id = $1
      AND ($2::text IS NULL OR job_type = $2)
)
"""


async def failed_batch(
    db: Queries, f: FailedFilter, after_key: int, limit: int
) -> list[tuple[int, str, str]]:
    """The next ``limit`` FAILED jobs after ``after_key`` matching ``f`` (failed_batch):
    (key, type, tenant)."""
    rows = await db.fetch(
        FAILED_BATCH, after_key, limit, f.tenant_id, f.job_type, f.created_after, f.created_before
    )
    return [(r["job_key"], r["job_type"], r["tenant_id"]) for r in rows]


@retry_deadlock
async def revive(
    db: Sessions, jobs: Sequence[tuple[int, str, str]], retries: int, now: datetime
) -> int:
    """Revive these FAILED jobs (revive_failed) in one transaction, their lanes woken
    (the protocol: the buckets' shared locks first, then the jobs, then the lanes); how
    many were still FAILED."""
    if not jobs:
        return 0
    async with db.transaction() as tx:
        await lanes.lock_to_wake(tx, [(t, n) for _, t, n in jobs])
        rows = await tx.fetch(REVIVE_FAILED, [k for k, _, _ in jobs], retries, now)
        await lanes.wake(tx, rows)
    return len(rows)


async def cancel_ready(
    db: Queries, job_type: str, tenant_id: str, limit: int, now: datetime
) -> tuple[int, list[str]]:
    """Cancel up to ``limit`` ready jobs of one lane (cancel_ready): how many, and the
    fairness keys they had."""
    row = await db.fetchrow(CANCEL_READY, job_type, tenant_id, limit, now)
    return row["n"], list(row["keys"])


async def cancel_delayed(
    db: Queries, tenant_id: str, job_type: str | None, limit: int, now: datetime
) -> int:
    """Cancel up to ``limit`` delayed jobs of a tenant (cancel_delayed)."""
    n: int = await db.fetchval(CANCEL_DELAYED, tenant_id, job_type, limit, now)
    return n


async def tenant_lanes(db: Queries, tenant_id: str) -> list[str]:
    """The job types of the tenant's active lanes (tenant_lanes)."""
    return [r["job_type"] for r in await db.fetch(TENANT_LANES, tenant_id)]


async def any_created(db: Queries, tenant_id: str, job_type: str | None) -> bool:
    """Whether the tenant has a CREATED (or delayed) job, of ``job_type`` if given."""
    found: bool = await db.fetchval(ANY_CREATED, tenant_id, job_type)
    return found


async def park(db: Sessions, job_type: str, tenant_id: str, keys: Sequence[str] = ()) -> None:
    """Park the lane if the cancels emptied it, else those of its ``keys`` they emptied
    (parking.park)."""
    await parking.park(db, job_type, [tenant_id], keys=[(tenant_id, k) for k in keys])
