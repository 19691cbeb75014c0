"""Operators' reads and writes: tenant and job-type configuration, the stats view, job
search, and the database's health.  None is on a job's path; the stats and the search
may read the backlog (bounded where they count).
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from app.db.base import Queries, Sessions
from app.db.claims import EFFECTIVE_PRIORITY
from app.db.listen import NOTIFY_CHANNEL
from app.db.locks import RELEASE_GATE_CLASS, TENANT_CAP_LOCK_CLASS
from app.db.rows import (
    JobTypeRow,
    LaneStats,
    TenantRow,
    TypeConfig,
)
from app.scheduler import FairnessBy, RateLimit

# An upsert's rate limit columns (EXCLUDED: the new ones): a changed limit takes the new
# bucket (full, or none), an unchanged one keeps the bucket it has.
_RATE_SET = """rate_tokens = CASE
            WHEN ({table}.rate_per_s, {table}.rate_burst)
                 IS NOT DISTINCT FROM (EXCLUDED.rate_per_s, EXCLUDED.rate_burst)
            THEN {table}.rate_tokens ELSE EXCLUDED.rate_tokens END,
        rate_at = CASE
            WHEN ({table}.rate_per_s, {table}.rate_burst)
                 IS NOT DISTINCT FROM (EXCLUDED.rate_per_s, EXCLUDED.rate_burst)
            THEN {table}.rate_at ELSE EXCLUDED.rate_at END,
        rate_per_s = EXCLUDED.rate_per_s, rate_burst = EXCLUDED.rate_burst"""

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
# and its type's cap; and whether its tenant or type is paused.  Reads the backlog: an
# operator query, not hot path.  No locks.
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
       tn.paused IS TRUE AS tenant_paused, jt.paused IS TRUE AS type_paused,
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

# -- name: jobs_ahead
# For a ready job ($1), at $2 with its type's aging ($3 interval ms, $4 step): the ready
# jobs of its fairness key that the claim takes before it -- a greater effective
# priority, or the same one and queued before it (queued_at, job_key) -- and the ready
# jobs of its lane, each counted up to $5.  The effective priority is the claim's
# (app.db.claims.EFFECTIVE_PRIORITY, twin of app.scheduler.effective_priority).  Index:
# jobs_ready_idx, a range of the key's and of the lane's ready jobs.  An operator read
# (GET /v2/jobs/{jobKey}/explain); no locks.
JOBS_AHEAD = f"""
WITH me AS (
    SELECT job_type, tenant_id, shard, fairness_key, queued_at, job_key,
           {
    EFFECTIVE_PRIORITY.format(
        priority="priority", queued_at="queued_at", now="$2", step="$4", interval="$3"
    )
}
             AS eff
    FROM jobs WHERE job_key = $1 AND shard = jobfair_key_shard($1)
)
SELECT (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j, me
        WHERE j.state = 'CREATED' AND j.job_type = me.job_type AND j.tenant_id = me.tenant_id
          AND j.shard = me.shard AND j.fairness_key = me.fairness_key
          AND j.job_key <> me.job_key
          AND ({
    EFFECTIVE_PRIORITY.format(
        priority="j.priority", queued_at="j.queued_at", now="$2", step="$4", interval="$3"
    )
}, me.queued_at, me.job_key)
              > (me.eff, j.queued_at, j.job_key)
        LIMIT $5) c
) AS ahead_in_key, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j, me
        WHERE j.state = 'CREATED' AND j.job_type = me.job_type AND j.tenant_id = me.tenant_id
          AND j.shard = me.shard
        LIMIT $5) c
) AS ready_in_lane
"""

# -- name: lane_keys_of
# The fairness keys of one lane ($1 type, $2 tenant): each key's virtual time inside the
# lane, whether it is backlogged -- active, and with a ready job now (a key a claim
# emptied stays active until it is parked; the claim finds nothing there and takes from
# the next) -- and its weight.  Index: lane_keys pkey; per active key, one probe of
# jobs_ready_idx.  An operator read (explain); no locks.
LANE_KEYS_OF = """
SELECT k.fairness_key, k.vtime,
       k.active AND EXISTS (
           SELECT 1 FROM jobs j
           WHERE j.state = 'CREATED' AND j.job_type = k.job_type AND j.tenant_id = k.tenant_id
             AND j.shard = k.shard AND j.fairness_key = k.fairness_key) AS active,
       COALESCE(w.weight, 1) AS weight
FROM lane_keys k
LEFT JOIN key_weights w ON w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key
WHERE k.job_type = $1 AND k.tenant_id = $2
"""

# -- name: last_asked
# When a named worker last asked for jobs of type $1 (a long poll, a stream), as the
# workers table has it.  Index: workers pkey (job_type, worker).
LAST_ASKED = "SELECT max(last_seen_at) FROM workers WHERE job_type = $1"

# -- name: upsert_tenant
# A tenant's weight, cap and rate limit set (a pause stays as it is); its held lanes are
# released (the cap that held them may be gone or higher; a claim holds them again if
# not), under its cap lock, which orders the change before or after every capped claim of
# the tenant (jobfair_release_holds).  A rate limit ($4, $5: a second, burst; NULL: none)
# that changes starts with a full bucket at the statement's instant (the database's
# clock, the one claims take tokens by); the same limit set again keeps its bucket.  Run
# after lock_tenant (ADR 028: a rate-limited claim writes this row under that lock).
UPSERT_TENANT = f"""
WITH up AS (
    INSERT INTO tenants AS t (tenant_id, weight, max_active_jobs, rate_per_s, rate_burst,
                              rate_tokens, rate_at)
    VALUES ($1, $2, $3, $4::float8, $5::float8, $5::float8,
            CASE WHEN $4::float8 IS NOT NULL THEN statement_timestamp() END)
    ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight,
        max_active_jobs = EXCLUDED.max_active_jobs,
        {_RATE_SET.format(table="t")}
    RETURNING tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst,
              rate_tokens, rate_at, statement_timestamp() AS read_at
),
unheld AS (
    SELECT jobfair_release_holds(
        {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM unheld) = 1
"""

# -- name: lock_tenant
# A tenant's cap lock, taken before its row is written (upsert_tenant, delete_tenant), in
# the order a rate-limited claim takes them (the lock, then the row it takes tokens
# from): the other order deadlocks with it.  jobfair_lock_tenant_caps is alembic 0003's.
LOCK_TENANT = f"SELECT jobfair_lock_tenant_caps({TENANT_CAP_LOCK_CLASS}, ARRAY[$1::text])"

# -- name: get_tenant
# A tenant's configuration (no row: weight 1, no cap).  Index: tenants pkey.
GET_TENANT = """
SELECT tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
       statement_timestamp() AS read_at
FROM tenants WHERE tenant_id = $1
"""

# -- name: list_tenants
# Every configured tenant, by id.
LIST_TENANTS = """
SELECT tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
       statement_timestamp() AS read_at
FROM tenants ORDER BY tenant_id
"""

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

# -- name: upsert_key_weight
# A fairness key's weight inside its tenant (alembic 0010).  Nothing else need change:
# every key read and lead claim reads the weights as they are, so the next activation of
# any process uses it, for the backlog already there (ADR 027).  Index: key_weights pkey.
UPSERT_KEY_WEIGHT = """
INSERT INTO key_weights (tenant_id, fairness_key, shard, weight)
VALUES ($1, $2, jobfair_shard($1), $3)
ON CONFLICT (tenant_id, fairness_key, shard) DO UPDATE SET weight = EXCLUDED.weight
RETURNING weight
"""

# -- name: get_key_weight
# A fairness key's weight (no row: 1).  Index: key_weights pkey.
GET_KEY_WEIGHT = """
SELECT weight FROM key_weights
WHERE tenant_id = $1 AND fairness_key = $2 AND shard = jobfair_shard($1)
"""

# -- name: delete_key_weight
# A fairness key back to weight 1; whether it had a weight.  Index: key_weights pkey.
DELETE_KEY_WEIGHT = """
DELETE FROM key_weights
WHERE tenant_id = $1 AND fairness_key = $2 AND shard = jobfair_shard($1)
RETURNING weight
"""

# -- name: upsert_job_type
# A job type's cap, aging, rate limit and what its lanes are charged by set (NULL: the
# server's default, no limit, by activations; a pause stays as it is).  The rate limit's
# bucket as upsert_tenant's.  Index: job_types pkey.  Locks: the row, which a
# rate-limited claim writes under the type's cap lock; a claim that read the bucket
# before this committed finds it changed and leaves it.
UPSERT_JOB_TYPE = f"""
INSERT INTO job_types AS t (job_type, max_active_jobs, aging_interval_ms, aging_step,
                            rate_per_s, rate_burst, rate_tokens, rate_at, fairness_by)
VALUES ($1, $2, $3, $4, $5::float8, $6::float8, $6::float8,
        CASE WHEN $5::float8 IS NOT NULL THEN statement_timestamp() END, $7)
ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs,
    aging_interval_ms = EXCLUDED.aging_interval_ms, aging_step = EXCLUDED.aging_step,
    fairness_by = EXCLUDED.fairness_by,
    {_RATE_SET.format(table="t")}
RETURNING job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s,
       rate_burst, rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by
"""

# -- name: get_job_type
# A job type's configuration.  Index: job_types pkey.
GET_JOB_TYPE = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s,
       rate_burst, rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by
FROM job_types WHERE job_type = $1
"""

# -- name: list_job_types
# Every configured job type, by name.
LIST_JOB_TYPES = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s,
       rate_burst, rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by
FROM job_types ORDER BY job_type
"""


# -- name: pause_tenant
# Marks a tenant paused, its configuration made with the defaults if it had none; the
# lanes are held by hold_paused_lanes once this committed.  Index: tenants pkey.
PAUSE_TENANT = """
INSERT INTO tenants (tenant_id, paused) VALUES ($1, true)
ON CONFLICT (tenant_id) DO UPDATE SET paused = true
RETURNING tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
       statement_timestamp() AS read_at
"""

# -- name: wait_for_finishes
# The release gate, exclusively, until the transaction ends: waits for every finishing
# statement in flight (each holds it shared), so that a statement after this one sees
# what they released.  Locks: the gate.
WAIT_FOR_FINISHES = f"SELECT pg_advisory_xact_lock({RELEASE_GATE_CLASS}, 0)"

# -- name: hold_paused_lanes
# After a pause committed, behind wait_for_finishes (a finish that began before the
# pause may have released the tenant's lanes without seeing it): holds the paused
# tenant's lanes out of the reads, as a cap holds them (ADR 016), every job type's.
# Finishes after the pause see it and release none of them (jobfair_release_holds,
# alembic 0007), and new lanes of the tenant are made held (app.db.lanes, WAKE).  A
# sequential read of lanes: a pause is rare.  Locks: the lane rows.
HOLD_PAUSED_LANES = """
UPDATE lanes SET held = true
WHERE tenant_id = $1 AND NOT held
  AND EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = $1 AND t.paused)
"""

# -- name: resume_tenant
# Marks a tenant no longer paused (no row: it never was).  Its lanes are released by
# release_resumed once this committed.  Index: tenants pkey.
RESUME_TENANT = """
UPDATE tenants SET paused = false WHERE tenant_id = $1
RETURNING tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
       statement_timestamp() AS read_at
"""

# -- name: release_resumed
# After a resume committed: as release_after_finishes, the tenant's held lanes released
# (each re-enters at the type's virtual time if it fell behind it: a pause banks no
# credit, and a lane ahead keeps its place, ADR 016), and every job type with an active
# lane of the tenant notified, so that waiters read again at once (a lane that a pause
# missed was not held, and its release notifies nothing).  Locks: the gate, then as
# jobfair_release_holds.  A sequential read of lanes.
RELEASE_RESUMED = f"""
WITH released AS (
    SELECT pg_advisory_xact_lock({RELEASE_GATE_CLASS}, 0),
           jobfair_release_holds(
               {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text],
               '{NOTIFY_CHANNEL}') AS n
),
notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', job_type)
    FROM (SELECT DISTINCT job_type FROM lanes WHERE tenant_id = $1 AND active) d
    WHERE (SELECT n FROM released) IS NOT NULL
)
SELECT (SELECT n FROM released), (SELECT count(*) FROM notified)
"""

# -- name: pause_job_type
# Marks a job type paused (configured with the defaults if it was not): a lane read of
# the type answers nothing to claim (read_lanes), nor does a lead claim.  Index:
# job_types pkey.
PAUSE_JOB_TYPE = """
INSERT INTO job_types (job_type, paused) VALUES ($1, true)
ON CONFLICT (job_type) DO UPDATE SET paused = true
RETURNING job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s,
       rate_burst, rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by
"""

# -- name: resume_job_type
# Marks a job type no longer paused and notifies it (at commit), so that its waiters
# read at once.  Index: job_types pkey.
RESUME_JOB_TYPE = f"""
WITH up AS (
    UPDATE job_types SET paused = false WHERE job_type = $1
    RETURNING job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s,
       rate_burst, rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by
),
notified AS (SELECT pg_notify('{NOTIFY_CHANNEL}', $1))
SELECT up.* FROM up WHERE (SELECT count(*) FROM notified) = 1
"""


async def type_config(db: Queries, job_type: str) -> TypeConfig:
    row = await db.fetchrow(TYPE_CONFIG, job_type)
    if row is None:
        return TypeConfig(None, None, None)
    return TypeConfig(row["max_active_jobs"], row["aging_interval_ms"], row["aging_step"])


async def upsert_tenant(
    db: Sessions, tenant_id: str, weight: int, cap: int | None, rate: RateLimit | None = None
) -> TenantRow:
    async with db.transaction() as tx:
        await tx.execute(LOCK_TENANT, tenant_id)
        row = await tx.fetchrow(
            UPSERT_TENANT,
            tenant_id,
            weight,
            cap,
            None if rate is None else rate.per_s,
            None if rate is None else rate.burst,
        )
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
    async with db.transaction() as tx:
        await tx.execute(LOCK_TENANT, tenant_id)
        deleted = await tx.fetchval(DELETE_TENANT, tenant_id) is not None
    await _release_after_finishes(db, tenant_id)
    return deleted


async def upsert_key_weight(db: Queries, tenant_id: str, fairness_key: str, weight: int) -> int:
    """Set a key's weight (``fairness_key`` as stored: '' for the default key)."""
    got: int = await db.fetchval(UPSERT_KEY_WEIGHT, tenant_id, fairness_key, weight)
    return got


async def get_key_weight(db: Queries, tenant_id: str, fairness_key: str) -> int | None:
    """A key's weight, None when it has none of its own (it weighs 1)."""
    got: int | None = await db.fetchval(GET_KEY_WEIGHT, tenant_id, fairness_key)
    return got


async def delete_key_weight(db: Queries, tenant_id: str, fairness_key: str) -> bool:
    """Back to weight 1; whether it had a weight of its own."""
    return await db.fetchval(DELETE_KEY_WEIGHT, tenant_id, fairness_key) is not None


async def pause_tenant(db: Sessions, tenant_id: str) -> TenantRow:
    """Pause a tenant (pause_tenant), then hold its lanes behind the finishes in flight
    (wait_for_finishes, hold_paused_lanes)."""
    row = TenantRow(*await db.fetchrow(PAUSE_TENANT, tenant_id))
    async with db.transaction() as tx:
        await tx.execute(WAIT_FOR_FINISHES)
        await tx.execute(HOLD_PAUSED_LANES, tenant_id)
    return row


async def resume_tenant(db: Sessions, tenant_id: str) -> TenantRow | None:
    """Resume a tenant (resume_tenant), then release its lanes (release_resumed); None
    if it has no configuration (it was never paused)."""
    row = await db.fetchrow(RESUME_TENANT, tenant_id)
    if row is None:
        return None
    async with db.transaction() as tx:
        await tx.execute(RELEASE_RESUMED, tenant_id)
    return TenantRow(*row)


async def pause_job_type(db: Queries, job_type: str) -> JobTypeRow:
    return JobTypeRow(*await db.fetchrow(PAUSE_JOB_TYPE, job_type))


async def resume_job_type(db: Queries, job_type: str) -> JobTypeRow | None:
    row = await db.fetchrow(RESUME_JOB_TYPE, job_type)
    return None if row is None else JobTypeRow(*row)


async def upsert_job_type(
    db: Queries,
    job_type: str,
    cap: int | None,
    interval_ms: int | None,
    step: int | None,
    rate: RateLimit | None = None,
    fairness_by: FairnessBy = FairnessBy.ACTIVATIONS,
) -> JobTypeRow:
    row = await db.fetchrow(
        UPSERT_JOB_TYPE,
        job_type,
        cap,
        interval_ms,
        step,
        None if rate is None else rate.per_s,
        None if rate is None else rate.burst,
        None if fairness_by is FairnessBy.ACTIVATIONS else fairness_by.value,
    )
    return JobTypeRow(*row)


async def get_job_type(db: Queries, job_type: str) -> JobTypeRow | None:
    row = await db.fetchrow(GET_JOB_TYPE, job_type)
    return None if row is None else JobTypeRow(*row)


async def list_job_types(db: Queries) -> list[JobTypeRow]:
    return [JobTypeRow(*r) for r in await db.fetch(LIST_JOB_TYPES)]


async def stats(db: Queries, job_type: str | None = None) -> list[LaneStats]:
    rows = await (db.fetch(STATS) if job_type is None else db.fetch(STATS_OF_TYPE, job_type))
    return [LaneStats.of(r) for r in rows]


async def ping(db: Queries) -> None:
    await db.fetchval("SELECT 1")


async def schema_revision(db: Queries) -> tuple[str | None, str | None]:
    """The migration the database is at (None: never migrated), and the oldest revision
    whose servers it still serves (None: before alembic 0009, which records it)."""
    try:
        revision: str | None = await db.fetchval("SELECT version_num FROM alembic_version")
    except asyncpg.UndefinedTableError:
        return None, None
    try:
        oldest: str | None = await db.fetchval("SELECT oldest_server FROM schema_compat")
    except asyncpg.UndefinedTableError:
        return revision, None
    return revision, oldest


async def jobs_ahead(
    db: Queries, job_key: int, now: datetime, interval_ms: int, step: int, bound: int
) -> tuple[int, int]:
    """A ready job's jobs ahead in its key, and its lane's ready jobs (jobs_ahead), each
    counted up to ``bound``."""
    row = await db.fetchrow(JOBS_AHEAD, job_key, now, interval_ms, step, bound)
    return (0, 0) if row is None else (row["ahead_in_key"], row["ready_in_lane"])


async def lane_keys_of(
    db: Queries, job_type: str, tenant_id: str
) -> list[tuple[str, float, bool, int]]:
    """A lane's keys (lane_keys_of): (key as stored, vtime, active, weight)."""
    rows = await db.fetch(LANE_KEYS_OF, job_type, tenant_id)
    return [(r["fairness_key"], r["vtime"], r["active"], r["weight"]) for r in rows]


async def last_asked(db: Queries, job_type: str) -> datetime | None:
    """When a named worker last asked for jobs of ``job_type`` (None: none in a day)."""
    at: datetime | None = await db.fetchval(LAST_ASKED, job_type)
    return at
