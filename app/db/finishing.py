"""Finishing: the statements that end activations -- complete, fail, throw an error, or
give back jobs a caller never received -- each fenced by the activation count.

Every one of them, in the statement that ends the activations, writes the activation's
end into the job's history (``app.db.history``), gives streams their credit back
(``jobfair_done``), wakes activators of capped types or tenants (capacity freed) and
releases the held lanes of tenants that have room again (``jobfair_release_holds``; the
protocol is in ``app.db.lanes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.db import lanes, parking
from app.db.base import Queries, Sessions, retry_deadlock
from app.db.bounds import CANCELED
from app.db.history import ended_cte
from app.db.listen import CREDIT_KEYS_PER_NOTIFY, DONE_CHANNEL, NOTIFY_CHANNEL
from app.db.locks import RELEASE_GATE_CLASS, TENANT_CAP_LOCK_CLASS
from app.db.rows import Ended, JobRow
from app.domain import JobState, utcnow

# Releases the held lanes of the capped tenants whose jobs ``ended`` had, for they have
# room again (jobfair_release_holds, alembic 0004; ADR 016): takes the release gate
# shared, picks the capped tenants with a snapshot of its own, waits for their cap locks,
# and holds the locks until the statement commits.  Appended to the statements that end
# activations, referenced by their answer.
RELEASE_HOLDS = f"""unheld AS (
    SELECT jobfair_release_holds({TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS},
        ARRAY(SELECT DISTINCT e.tenant_id FROM ended e), '{NOTIFY_CHANNEL}') AS n
)"""

# Appended to statements that end activations (RETURNING job_key, via_stream as ``ended``):
# NOTIFYs carrying the keys of stream-activated jobs, so their streams get their credit
# back, CREDIT_KEYS_PER_NOTIFY keys to a payload (a sweep or a batch ends thousands in one
# statement).  A stream that misses one finds its credit by its own periodic check.
# Long-poll jobs cost nothing here.
CAPACITY_NOTIFY = f"""freed AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', job_type) FROM (
        SELECT DISTINCT e.job_type FROM ended e
        WHERE EXISTS (SELECT 1 FROM job_types t WHERE t.job_type = e.job_type
                        AND t.max_active_jobs IS NOT NULL)
           OR EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = e.tenant_id
                        AND t.max_active_jobs IS NOT NULL)) capped
)"""
CREDIT_NOTIFY = f"""credited AS (
    SELECT pg_notify('{DONE_CHANNEL}', string_agg(job_key::text, ','))
    FROM (SELECT job_key, (row_number() OVER () - 1) / {CREDIT_KEYS_PER_NOTIFY} AS chunk
          FROM ended WHERE via_stream) s
    GROUP BY chunk
)"""


# The finishing statements' test that job j is leased, for statements that find their
# jobs by key.  Spelled IS TRUE so that no partial index on ACTIVATED rows matches it:
# with "j.state = 'ACTIVATED'" the generic plan read every ACTIVATED job of the type
# through jobs_active_type_idx instead of probing jobs_pkey (ADR 002,
# tests/integration/test_claim.py).  The
# keys come from the unnest the statement joins, probed one by one; an extra
# "j.job_key = ANY($1)" made the generic plan scan jobs_pkey for all the keys and then
# rescan the unnest once per job (quadratic in the batch; ADR 002).
_LEASED = "(j.state = 'ACTIVATED') IS TRUE"

# -- name: complete_jobs
# ACTIVATED -> COMPLETED for (key, activationCount) pairs; fenced by the count.  Merges
# the result variables.  Notifies when a job type or tenant has a cap (capacity freed).
COMPLETE_JOBS = f"""
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::jsonb[])
                  AS i(job_key, activation_count, variables)
),
ended AS (
    UPDATE jobs j
    SET state = 'COMPLETED', completed_at = $4, deadline = NULL,
        variables = j.variables || COALESCE(i.variables, '{{}}'::jsonb)
    FROM input i
    WHERE j.job_key = i.job_key AND j.shard = jobfair_key_shard(i.job_key) AND {_LEASED}
      AND j.activation_count = i.activation_count
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.fairness_key, j.charged, j.lane_charge,
              j.key_charge
),
{ended_cte("ended", "$1::bigint[]", event="'completed'", at="$4")},
{CREDIT_NOTIFY},
{CAPACITY_NOTIFY},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""

# -- name: fail_job
# ACTIVATED -> CREATED/SCHEDULED (retries left) or FAILED (none left); fenced.  A retried
# job rejoins the back of its priority when its back-off ends (queued_at = run_at).
# The caller then wakes the lane (lock, then wake_lanes) if the job became CREATED.
FAIL_JOB = f"""
WITH ended AS (
    UPDATE jobs j
    SET state = CASE WHEN r.retries = 0 THEN 'FAILED'
                     WHEN $5::timestamptz > $7::timestamptz THEN 'SCHEDULED'
                     ELSE 'CREATED' END,
        retries = r.retries, error_message = $4, deadline = NULL,
        run_at = CASE WHEN r.retries = 0 THEN j.run_at ELSE $5 END,
        queued_at = CASE WHEN r.retries = 0 THEN j.queued_at ELSE $5 END,
        completed_at = CASE WHEN r.retries = 0 THEN $7 ELSE NULL END,
        variables = j.variables || COALESCE($6::jsonb, '{{}}'::jsonb)
    FROM jobs cur
    CROSS JOIN LATERAL (SELECT COALESCE($3::int, GREATEST(0, cur.retries - 1)) AS retries) r
    WHERE j.job_key = $1 AND j.shard = jobfair_key_shard($1)
      AND cur.job_key = $1 AND cur.shard = jobfair_key_shard($1) AND {_LEASED}
      AND j.activation_count = $2
    RETURNING j.job_key, j.job_type, j.tenant_id, j.state, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.error_message, j.fairness_key, j.charged,
              j.lane_charge, j.key_charge
),
{
    ended_cte(
        "ended",
        "ARRAY[$1::bigint]",
        event="CASE WHEN s.state = 'FAILED' THEN 'failed' ELSE 'retried' END",
        at="$7",
        error_message="s.error_message",
    )
},
{CREDIT_NOTIFY},
{CAPACITY_NOTIFY},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, state, activated_at, fairness_key, charged, lane_charge,
       key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""

# -- name: throw_error
# ACTIVATED -> ERROR_THROWN (terminal); fenced.
THROW_ERROR = f"""
WITH ended AS (
    UPDATE jobs j
    SET state = 'ERROR_THROWN', error_code = $3, error_message = $4, deadline = NULL,
        completed_at = $6, variables = j.variables || COALESCE($5::jsonb, '{{}}'::jsonb)
    WHERE j.job_key = $1 AND j.shard = jobfair_key_shard($1) AND {_LEASED}
      AND j.activation_count = $2
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.error_code, j.error_message, j.fairness_key,
              j.charged, j.lane_charge, j.key_charge
),
{
    ended_cte(
        "ended",
        "ARRAY[$1::bigint]",
        event="'error-thrown'",
        at="$6",
        error_code="s.error_code",
        error_message="s.error_message",
    )
},
{CREDIT_NOTIFY},
{CAPACITY_NOTIFY},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""


# -- name: release_jobs
# ACTIVATED -> CREATED at once, for activations whose caller never got them; fenced.
RELEASE_JOBS = f"""
WITH ended AS (
    UPDATE jobs j SET state = 'CREATED', deadline = NULL
    FROM unnest($1::bigint[], $2::int[]) AS r(job_key, activation_count)
    WHERE j.job_key = r.job_key AND j.shard = jobfair_key_shard(r.job_key) AND {_LEASED}
      AND j.activation_count = r.activation_count
    RETURNING j.job_key, j.job_type, j.tenant_id, j.activation_count, j.activated_at, j.worker,
              j.retries, j.fairness_key, j.charged, j.lane_charge, j.key_charge
),
{ended_cte("ended", "$1::bigint[]", event="'released'", at="$3")},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT n FROM unheld) AS _n
FROM ended
"""


# -- name: cancel_job
# CREATED, SCHEDULED or ACTIVATED -> CANCELED.  An ACTIVATED job's activation ends as a
# finish ends it: its stream gets its credit back, a capped type or tenant its capacity
# (its worker's later finish is fenced out: the job is not ACTIVATED), and by worker time
# its lane is settled for the time it held (``charged``, NULL unless it was ACTIVATED:
# RETURNING gives the new row, so the state it was in is read first, its row locked).
# The notifications and the release also run for a job that was not ACTIVATED; for one
# job they cost a probe each.  Index: jobs pkey.  Locks: the job's row; as RELEASE_HOLDS.
CANCEL_JOB = f"""
WITH was AS (
    SELECT j.state FROM jobs j
    WHERE j.job_key = $1 AND j.shard = jobfair_key_shard($1)
    FOR NO KEY UPDATE
),
ended AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = $2, deadline = NULL
    -- An InitPlan, run as the row is first looked at, before the update: the lock and
    -- the state read come first.
    WHERE j.job_key = $1 AND j.shard = jobfair_key_shard($1)
      AND (SELECT state FROM was) IN ('CREATED', 'SCHEDULED', 'ACTIVATED')
      AND j.state IN ('CREATED', 'SCHEDULED', 'ACTIVATED')
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.fairness_key,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.charged END AS charged,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.lane_charge END
                AS lane_charge,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.key_charge END
                AS key_charge
),
{ended_cte("ended", "ARRAY[$1::bigint]", step=CANCELED, event="'canceled'", at="$2")},
{CREDIT_NOTIFY},
{CAPACITY_NOTIFY},
{RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""


def _ended(row: Any, state: JobState) -> Ended:
    return Ended(
        row["job_key"],
        row["job_type"],
        row["tenant_id"],
        state,
        row["activated_at"],
        row["fairness_key"],
        row["charged"],
        row["lane_charge"],
        row["key_charge"],
    )


@retry_deadlock
async def complete(
    db: Queries, items: Sequence[tuple[int, int, str | None]], now: datetime
) -> list[Ended]:
    """Complete (key, activationCount, variables JSON or None) items in one statement
    (complete_jobs); the jobs completed.  Its release of held lanes can deadlock with
    another completion's (a fresh clone's test_held_lanes race hit it: eight activators
    completing over 30 tenants at cap 1); the statement is its own transaction, rolled
    back whole, so it is sent again.  A key named twice is judged once: callers
    that may name a job twice send the namings in separate statements."""
    rows = await db.fetch(
        COMPLETE_JOBS,
        [i[0] for i in items],
        [i[1] for i in items],
        [i[2] for i in items],
        now,
    )
    return [_ended(r, JobState.COMPLETED) for r in rows]


@retry_deadlock
async def fail(
    db: Sessions,
    job_key: int,
    activation_count: int,
    *,
    retries: int | None,
    error_message: str | None,
    run_at: datetime,
    variables: str | None,
    now: datetime,
) -> Ended | None:
    """Fail the job's activation (fail_job): retried (CREATED, or SCHEDULED until
    ``run_at``) while retries are left, else FAILED.  A job made ready again wakes its
    lane in the same transaction.  None when the fence did not match."""
    async with db.transaction() as tx:
        row = await tx.fetchrow(
            FAIL_JOB, job_key, activation_count, retries, error_message, run_at, variables, now
        )
        if row is None:
            return None
        ended = _ended(row, JobState(row["state"]))
        if ended.state is JobState.CREATED:
            await lanes.lock_to_wake(tx, [(ended.job_type, ended.tenant_id)])
            await lanes.wake(tx, [row])
        return ended


@retry_deadlock  # as complete: one statement, its own transaction
async def throw_error(
    db: Queries,
    job_key: int,
    activation_count: int,
    error_code: str,
    error_message: str | None,
    variables: str | None,
    now: datetime,
) -> Ended | None:
    """ACTIVATED -> ERROR_THROWN (throw_error); the job, or None if the fence did not
    match."""
    row = await db.fetchrow(
        THROW_ERROR, job_key, activation_count, error_code, error_message, variables, now
    )
    if row is None:
        return None
    return _ended(row, JobState.ERROR_THROWN)


@retry_deadlock
async def release(db: Sessions, jobs: Sequence[JobRow]) -> list[Ended]:
    """Give back activations their caller never received (release_jobs), fenced by their
    activationCount, their lanes woken; the jobs that went back."""
    if not jobs:
        return []
    async with db.transaction() as tx:
        await lanes.lock_to_wake(tx, [(j.job_type, j.tenant_id) for j in jobs])
        rows = await tx.fetch(
            RELEASE_JOBS, [j.job_key for j in jobs], [j.activation_count for j in jobs], utcnow()
        )
        await lanes.wake(tx, rows)
    return [_ended(r, JobState.CREATED) for r in rows]


async def cancel(db: Sessions, job_key: int, now: datetime) -> Ended | None:
    """Cancel a CREATED, SCHEDULED or ACTIVATED job (cancel_job); then park its lane if
    that emptied it (an empty lane left active would keep its idle vtime, ADR 014).  The
    job (its ``charged`` None unless an activation by worker time ended), or None if it
    was in none of those states."""
    row = await db.fetchrow(CANCEL_JOB, job_key, now)
    if row is None:
        return None
    tenant = row["tenant_id"]
    await parking.park(db, row["job_type"], [tenant], keys=[(tenant, row["fairness_key"])])
    return _ended(row, JobState.CANCELED)
