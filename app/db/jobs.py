"""Jobs: inserting them (with their lanes woken), reading them, and the read-modify-write
of a PATCH (the service decides, under the row lock it holds).  Canceling ends an
activation too, so it is ``app.db.finishing``'s.

Statements that answer job records list ``JOB_COLUMNS`` (``app.db.rows``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from app.db import lanes
from app.db.base import Queries, Sessions, retry_deadlock, transaction_on
from app.db.bounds import REVIVED
from app.db.history import log_cte
from app.db.lanes import QUIET_WAKE_CTES, WAKE_CTES
from app.db.listen import NOTIFY_CHANNEL
from app.db.locks import buckets_of, share_buckets_sql
from app.db.rows import (
    JOB_COLUMNS,
    Inserted,
    JobFence,
    JobRow,
    StoredJob,
    TypeConfig,
    job_columns,
    job_row,
)
from app.domain import DEFAULT_PRIORITY, DEFAULT_RETRIES, DEFAULT_TENANT, JobState, tenant_of

# The jobs of insert_jobs' input CTE, as rows of jobs.
_INSERT_INPUT = """INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                      run_at, queued_at, variables, custom_headers, created_at, idempotency_key,
                      fairness_key, cost)
    SELECT job_key, shard, job_type, tenant_id,
           CASE WHEN run_at > $2 THEN 'SCHEDULED' ELSE 'CREATED' END,
           priority, retries, run_at, GREATEST(run_at, $2), variables,
           custom_headers, $2, idempotency_key, fairness_key, cost
    FROM input"""

# The jobs to insert, as rows, from the JSON array $1 (a str.format template: its braces
# are doubled).  A key carries its tenant's shard (jobfair_job_key, alembic 0008).
_INPUT_CTE = """input AS MATERIALIZED (
    SELECT x.ord, jobfair_job_key(t.shard, nextval('job_key_seq')) AS job_key, t.shard,
           x.e->>'type' AS job_type, t.tenant_id,
           COALESCE((x.e->>'priority')::int, $4) AS priority,
           COALESCE((x.e->>'retries')::int, $5) AS retries,
           COALESCE(x.e->'variables', '{{}}') AS variables,
           COALESCE(x.e->'customHeaders', '{{}}') AS custom_headers,
           x.e->>'idempotencyKey' AS idempotency_key,
           -- The default key is '' (domain.stored_key).
           COALESCE(NULLIF(x.e->>'fairnessKey', '<default>'), '') AS fairness_key,
           COALESCE((x.e->>'cost')::float8, 1) AS cost,
           CASE WHEN x.e->>'runAt' IS NOT NULL THEN (x.e->>'runAt')::timestamptz
                WHEN x.e->>'delay' IS NOT NULL
                  THEN $2::timestamptz + (x.e->>'delay')::float8 * interval '1 millisecond'
                ELSE $2::timestamptz END AS run_at
    FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(e, ord)
    CROSS JOIN LATERAL (
        SELECT u.tenant_id, jobfair_shard(u.tenant_id) AS shard
        FROM (SELECT COALESCE(x.e->>'tenantId', $3) AS tenant_id) u
    ) t
)"""

# -- name: insert_jobs
# Inserts a batch of jobs in one round trip, marks their lanes backlogged and notifies
# once per job type.  Keys are drawn before the insert so that results map back to input
# order.  Idempotency: jobs_idempotency_idx, ON CONFLICT DO NOTHING (and one probe of it
# per keyed job for a job of the tenant in another shard: made before alembic 0008).
# The batch travels as one JSON array of jobs spelled as the API spells them (validated
# by the caller), parsed by PostgreSQL: one parameter to encode instead of thousands of
# array elements, which asyncpg encodes one by one (ADR 007).  Fields left out take the defaults
# $3 (tenantId), $4 (priority), $5 (retries).  Answers one row: every job's key in input
# order, and the (1-based) positions of jobs not inserted because their idempotency key
# was taken.
# Locks: the caller holds the shared lane-bucket locks (app.db.lanes, the protocol).
_INSERT_JOBS = f"""
WITH {_INPUT_CTE},
-- Jobs without an idempotency key are inserted apart: ON CONFLICT makes every row a
-- speculative insertion (a lock and an extra WAL record each).
ins_plain AS (
    {_INSERT_INPUT} WHERE idempotency_key IS NULL ORDER BY ord
    RETURNING job_key, job_type, tenant_id, fairness_key, state
),
ins_keyed AS (
    {_INSERT_INPUT} WHERE idempotency_key IS NOT NULL
      -- A job made before alembic 0008 is in the shard its key names, not its tenant's,
      -- out of reach of the unique index's (tenant, key, shard): found here.
      AND NOT EXISTS (SELECT 1 FROM jobs o
                      WHERE o.tenant_id = input.tenant_id
                        AND o.idempotency_key = input.idempotency_key
                        AND o.shard <> input.shard)
    ORDER BY ord
    ON CONFLICT (tenant_id, idempotency_key, shard) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING job_key, job_type, tenant_id, fairness_key, state
),
ins AS (
    SELECT * FROM ins_plain UNION ALL SELECT * FROM ins_keyed
),
ready_lanes AS (
    SELECT job_type, tenant_id, fairness_key, count(*) AS n FROM ins WHERE state = 'CREATED'
    GROUP BY job_type, tenant_id, fairness_key
),
{{wake}}SELECT ARRAY(SELECT job_key FROM input ORDER BY ord) AS job_keys,
       ARRAY(SELECT i.ord FROM input i LEFT JOIN ins ON ins.job_key = i.job_key
             WHERE ins.job_key IS NULL ORDER BY i.ord) AS not_inserted,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
         + (SELECT count(*) FROM woken) AS _side_effects
"""
INSERT_JOBS = _INSERT_JOBS.format(wake=WAKE_CTES)

# -- name: insert_job_quiet
# insert_jobs without its NOTIFY, for a hand-off (claims.insert_and_claim_lead, ADR 012):
# the job may go to a waiter in the same transaction, and then nobody need be woken.
INSERT_JOB_QUIET = _INSERT_JOBS.format(wake=QUIET_WAKE_CTES)

# -- name: insert_job
# insert_jobs for one job without an idempotency key, answering its record (with its
# type's aging settings, as get_job): POST /v2/jobs in one statement instead of an insert
# and a read.  Locks: the caller holds the shared lane-bucket locks if it is ready.
INSERT_JOB = f"""
WITH {_INPUT_CTE},
ins AS (
    {_INSERT_INPUT}
    RETURNING {JOB_COLUMNS}
),
ready_lanes AS (
    SELECT job_type, tenant_id, fairness_key, count(*) AS n FROM ins WHERE state = 'CREATED'
    GROUP BY job_type, tenant_id, fairness_key
),
{{wake}}SELECT {job_columns("ins")},
       t.aging_interval_ms AS type_aging_interval_ms, t.aging_step AS type_aging_step,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
         + (SELECT count(*) FROM woken) AS _side_effects
FROM ins LEFT JOIN job_types t ON t.job_type = ins.job_type
""".format(wake=WAKE_CTES)

# -- name: notify_ready
# A job type's jobs that became activatable ("type n"), announced by hand.
NOTIFY_READY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', $1)"

# -- name: find_idempotent
# The existing job for (tenant, idempotency key) pairs.  Index: jobs_idempotency_idx.
FIND_IDEMPOTENT = """
SELECT k.tenant_id, k.idempotency_key, j.job_key
FROM unnest($1::text[], $2::text[]) AS k(tenant_id, idempotency_key)
JOIN jobs j ON j.tenant_id = k.tenant_id AND j.idempotency_key = k.idempotency_key
"""


# -- name: get_job
# With the job type's aging settings, so a record renders in one round trip.
GET_JOB = f"""
SELECT {job_columns("j")},
       t.aging_interval_ms AS type_aging_interval_ms, t.aging_step AS type_aging_step
FROM jobs j LEFT JOIN job_types t ON t.job_type = j.job_type
WHERE j.job_key = $1 AND j.shard = jobfair_key_shard($1)
"""

# -- name: job_states
# Each job's state and current activation, by key (what a finish is judged by).
# Index: jobs pkey.
JOB_STATES = "SELECT job_key, state, activation_count FROM jobs WHERE job_key = ANY($1::bigint[])"

# -- name: job_scopes
# Each job's tenant and type, by key: what an API key's scope is checked against (they
# never change, so app.keys keeps what it read).  Index: jobs pkey.
JOB_SCOPES = "SELECT job_key, tenant_id, job_type FROM jobs WHERE job_key = ANY($1::bigint[])"

# -- name: lock_job
# The job's row, locked for an update that reads before it writes (PATCH).
LOCK_JOB = f"""
SELECT {JOB_COLUMNS} FROM jobs WHERE job_key = $1 AND shard = jobfair_key_shard($1) FOR UPDATE
"""

# -- name: update_job
# PATCH: retries, lease (deadline) and priority; revives FAILED when retries > 0, and
# then ($7) writes the revive into the job's history.  Index: jobs pkey.
UPDATE_JOB = f"""
WITH up AS (
    UPDATE jobs
    SET retries = $2, deadline = $3, priority = $4, state = $5,
        completed_at = CASE WHEN $5 = 'FAILED' THEN completed_at ELSE NULL END,
        queued_at = CASE WHEN state = 'FAILED' AND $5 <> 'FAILED' THEN $6 ELSE queued_at END,
        run_at = CASE WHEN state = 'FAILED' AND $5 <> 'FAILED' THEN $6 ELSE run_at END
    WHERE job_key = $1 AND shard = jobfair_key_shard($1)
    RETURNING job_key, activation_count, retries
),
{
    log_cte(
        "logged",
        "up",
        step=REVIVED,
        event="'revived'",
        at="$6",
        where="$7::bool",
    )
}
SELECT job_key FROM up
"""


def ready_at_once(job: Mapping[str, Any], now: datetime) -> bool:
    """Whether a job to insert is CREATED (not SCHEDULED) at ``now`` (INSERT_JOBS decides
    the same in SQL)."""
    run_at = job.get("runAt")
    if run_at is not None:
        return datetime.fromisoformat(run_at) <= now
    return not job.get("delay")


def locks_for(jobs: Sequence[Mapping[str, Any]], now: datetime) -> str | None:
    """The statement taking the shared bucket locks of the lanes ``jobs`` make ready, if
    any (a transaction's ``first``)."""
    buckets = buckets_of((j["type"], tenant_of(j)) for j in jobs if ready_at_once(j, now))
    return share_buckets_sql(buckets) if buckets else None


async def insert_into(
    tx: Queries, statement: str, jobs: Sequence[Mapping[str, Any]], now: datetime
) -> tuple[list[int], list[int]]:
    """In the caller's transaction, which holds ``locks_for(jobs)``: ``statement``
    (INSERT_JOBS or INSERT_JOB_QUIET).  The keys in input order, and the 1-based
    positions not inserted (their idempotency key was taken)."""
    row = await tx.fetchrow(
        statement,
        orjson.dumps(jobs).decode(),
        now,
        DEFAULT_TENANT,
        DEFAULT_PRIORITY,
        DEFAULT_RETRIES,
    )
    return row["job_keys"], row["not_inserted"]


@retry_deadlock
async def insert(db: Sessions, jobs: Sequence[Mapping[str, Any]], now: datetime) -> list[Inserted]:
    """Insert jobs given as the API spells them (validated ``schemas.CreateJob`` dicts: a
    field left out takes its default here, in SQL)."""
    async with db.connection() as conn:
        locks = locks_for(jobs, now)
        if locks is None:  # only jobs for later: one statement is its own transaction
            keys, not_inserted = await insert_into(conn, INSERT_JOBS, jobs, now)
        else:
            async with transaction_on(conn, locks):
                keys, not_inserted = await insert_into(conn, INSERT_JOBS, jobs, now)
        out = [Inserted(key, True) for key in keys]
        if not_inserted:
            # Their idempotency key was taken: answer with the job that holds it.  A new
            # statement sees jobs committed concurrently under the same key.
            taken = [jobs[o - 1] for o in not_inserted]
            found = await conn.fetch(
                FIND_IDEMPOTENT,
                [tenant_of(j) for j in taken],
                [j["idempotencyKey"] for j in taken],
            )
            existing = {(f["tenant_id"], f["idempotency_key"]): f["job_key"] for f in found}
            for o, j in zip(not_inserted, taken, strict=True):
                out[o - 1] = Inserted(existing[(tenant_of(j), j["idempotencyKey"])], False)
    return out


@retry_deadlock
async def insert_one(db: Sessions, job: Mapping[str, Any], now: datetime) -> StoredJob:
    """One job without an idempotency key, and its record as stored: two round trips
    and a commit when it is ready at once (BEGIN with the locks, the insert, COMMIT),
    one when it is for later."""
    assert job.get("idempotencyKey") is None
    args = (orjson.dumps([job]).decode(), now, DEFAULT_TENANT, DEFAULT_PRIORITY, DEFAULT_RETRIES)
    locks = locks_for([job], now)
    if locks is None:
        row = await db.fetchrow(INSERT_JOB, *args)
    else:
        async with db.transaction(first=locks) as tx:
            row = await tx.fetchrow(INSERT_JOB, *args)
    config = TypeConfig(None, row["type_aging_interval_ms"], row["type_aging_step"])
    return StoredJob(job_row(row), config)


async def idempotent(db: Queries, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
    """The keys of jobs already created under the idempotency keys ``jobs`` carry."""
    named = [j for j in jobs if j.get("idempotencyKey") is not None]
    if not named:
        return []
    found = await db.fetch(
        FIND_IDEMPOTENT, [tenant_of(j) for j in named], [j["idempotencyKey"] for j in named]
    )
    return [f["job_key"] for f in found]


async def get(db: Queries, job_key: int) -> StoredJob | None:
    row = await db.fetchrow(GET_JOB, job_key)
    if row is None:
        return None
    config = TypeConfig(None, row["type_aging_interval_ms"], row["type_aging_step"])
    return StoredJob(job_row(row), config)


async def fences(db: Queries, job_keys: Sequence[int]) -> dict[int, JobFence]:
    """The state and activation count of each of ``job_keys`` that exists."""
    rows = await db.fetch(JOB_STATES, list(job_keys))
    return {
        r["job_key"]: JobFence(r["job_key"], JobState(r["state"]), r["activation_count"])
        for r in rows
    }


async def scopes(db: Queries, job_keys: Sequence[int]) -> dict[int, tuple[str, str]]:
    """The (tenant, type) of each of ``job_keys`` that exists."""
    rows = await db.fetch(JOB_SCOPES, list(job_keys))
    return {r["job_key"]: (r["tenant_id"], r["job_type"]) for r in rows}


async def lock(tx: Queries, job_key: int) -> JobRow | None:
    """The job, its row locked until the transaction ends (a PATCH reads, then writes)."""
    row = await tx.fetchrow(LOCK_JOB, job_key)
    return None if row is None else job_row(row)


async def update(
    tx: Queries,
    job: JobRow,
    *,
    retries: int,
    deadline: datetime | None,
    priority: int,
    state: JobState,
    now: datetime,
) -> None:
    """Write a PATCH's new values over ``job`` (locked by ``lock`` in this transaction),
    waking its lane when the job becomes ready again (a revived incident)."""
    revived = state is JobState.CREATED and job.state is not JobState.CREATED
    if revived:
        await lanes.lock_to_wake(tx, [(job.job_type, job.tenant_id)])
    await tx.execute(UPDATE_JOB, job.job_key, retries, deadline, priority, state, now, revived)
    if revived:
        await lanes.wake(tx, [job._asdict()])
