-- fragment: tenant_columns
-- A tenant's configuration as app.db.rows.TenantRow takes it, read at the statement's
-- instant (the database's clock, the one the rate limit's bucket is kept by).
tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
    statement_timestamp() AS read_at, min_active_jobs

-- fragment: job_type_columns
-- A job type's configuration as app.db.rows.JobTypeRow takes it (read_at as tenants').
job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s, rate_burst,
    rate_tokens, rate_at, statement_timestamp() AS read_at, fairness_by, max_active_per_key,
    key_ordering

-- fragment: rate_set
-- An upsert's rate limit columns of the row t (EXCLUDED: the new ones): a changed limit
-- takes the new bucket (full, or none), an unchanged one keeps the bucket it has.
rate_tokens = CASE
    WHEN (t.rate_per_s, t.rate_burst)
         IS NOT DISTINCT FROM (EXCLUDED.rate_per_s, EXCLUDED.rate_burst)
    THEN t.rate_tokens ELSE EXCLUDED.rate_tokens END,
rate_at = CASE
    WHEN (t.rate_per_s, t.rate_burst)
         IS NOT DISTINCT FROM (EXCLUDED.rate_per_s, EXCLUDED.rate_burst)
    THEN t.rate_at ELSE EXCLUDED.rate_at END,
rate_per_s = EXCLUDED.rate_per_s, rate_burst = EXCLUDED.rate_burst

-- fragment: release_holds
-- Tenant :tenant_id's held lanes released and their job types notified
-- (jobfair_release_holds, alembic 0004 and 0007): behind the release gate, shared, under
-- the tenant's cap lock.
jobfair_release_holds(
    {{TENANT_CAP_LOCK_CLASS}}, {{RELEASE_GATE_CLASS}}, ARRAY[:tenant_id::text],
    '{{NOTIFY_CHANNEL}}')

-- fragment: release_holds @citus
-- On Citus jobfair_release_holds cannot run (its statements join lanes of many nodes to
-- a reference table): the store runs its steps after the statement (app.db.holds).
0

-- fragment: tenant_stored
-- tenant_columns as a write returns them on Citus, which refuses a function that is not
-- immutable in RETURNING: the statement reads its instant outside.
tenant_id, weight, max_active_jobs, paused, rate_per_s, rate_burst, rate_tokens, rate_at,
    min_active_jobs

-- fragment: job_type_stored
-- As tenant_stored, of job_type_columns (read_at outside, fairness_by after it).
job_type, max_active_jobs, aging_interval_ms, aging_step, paused, rate_per_s, rate_burst,
    rate_tokens, rate_at, fairness_by, max_active_per_key, key_ordering

-- fragment: lane_counts
-- A lane's counts (jobs grouped by type and tenant): ready jobs, delayed ones, active
-- ones, and the oldest ready job's queued_at and key.
count(*) FILTER (WHERE state = 'CREATED') AS ready,
count(*) FILTER (WHERE state = 'SCHEDULED') AS delayed,
count(*) FILTER (WHERE state = 'ACTIVATED') AS active,
min(queued_at) FILTER (WHERE state = 'CREATED') AS oldest_ready_at,
-- The oldest ready job's key in the same pass: arrays compare element-wise.
(min(ARRAY[extract(epoch FROM queued_at), job_key])
   FILTER (WHERE state = 'CREATED'))[2]::bigint AS oldest_ready_key

-- fragment: lane_stats
-- The lanes of per_lane with what may hold them back: the tenant's cap and its active
-- jobs of every type (counted up to the cap, jobs_active_tenant_idx), the type's cap,
-- and the pauses.
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

-- fragment: by_shard
-- A grouping of jobs by lane: on Citus by shard too (the same groups: a tenant has one
-- shard), so that each node counts its own lanes whole (Citus cannot merge min() of
-- arrays from several nodes).

-- fragment: by_shard @citus
, shard

-- fragment: lane_stats @citus
-- lane_stats on Citus (which refuses a subquery correlated to a CTE): the capped
-- tenants' active jobs counted on each node by tenant and summed, then joined (at most
-- the cap, as the plain count stops there).
, tenant_active AS (
    SELECT j.tenant_id, count(*) AS active FROM jobs j
    WHERE j.state = 'ACTIVATED'
      AND j.tenant_id IN (SELECT tenant_id FROM tenants WHERE max_active_jobs IS NOT NULL)
    GROUP BY j.tenant_id
)
SELECT l.*, tn.max_active_jobs AS tenant_cap, jt.max_active_jobs AS type_cap,
       tn.paused IS TRUE AS tenant_paused, jt.paused IS TRUE AS type_paused,
       CASE WHEN tn.max_active_jobs IS NOT NULL
            THEN LEAST(COALESCE(a.active, 0), tn.max_active_jobs) END AS tenant_active
FROM per_lane l
LEFT JOIN tenants tn ON tn.tenant_id = l.tenant_id
LEFT JOIN job_types jt ON jt.job_type = l.job_type
LEFT JOIN tenant_active a ON a.tenant_id = l.tenant_id
ORDER BY l.job_type, l.tenant_id

-- name: type_config
-- A job type's cap and aging settings (no row: the server's defaults).  Index: job_types
-- pkey.
SELECT max_active_jobs, aging_interval_ms, aging_step FROM job_types WHERE job_type = :job_type

-- name: stats
-- Per lane (type, tenant): ready jobs (CREATED), delayed ones (SCHEDULED: a runAt or a
-- retry back-off still ahead), active ones; the oldest ready job (by queued_at, when it
-- became ready) and its key; and what may hold the lane back: its tenant's cap with the
-- tenant's active jobs of every type (counted up to the cap, jobs_active_tenant_idx),
-- and its type's cap; and whether its tenant or type is paused.  Reads the backlog: an
-- operator query, not hot path.  No locks.
WITH per_lane AS (
    SELECT job_type, tenant_id,
           {{lane_counts}}
    FROM jobs WHERE state IN ('CREATED', 'SCHEDULED', 'ACTIVATED')
    GROUP BY job_type, tenant_id {{by_shard}}
)
{{lane_stats}}

-- name: stats_of_type
-- As stats, for job type :job_type only.
WITH per_lane AS (
    SELECT job_type, tenant_id,
           {{lane_counts}}
    FROM jobs WHERE state IN ('CREATED', 'SCHEDULED', 'ACTIVATED') AND job_type = :job_type
    GROUP BY job_type, tenant_id {{by_shard}}
)
{{lane_stats}}

-- name: jobs_ahead
-- For a ready job (:job_key), at :now with its type's aging (:interval_ms, :step): the
-- ready jobs of its fairness key that the claim takes before it -- a greater effective
-- priority, or the same one and queued before it (queued_at, job_key) -- and the ready
-- jobs of its lane, each counted up to :bound.  The effective priority is the claim's own
-- fragment (claims.effective_priority, of the row u; twin of
-- app.scheduler.effective_priority).  Index: jobs_ready_idx, a range of the key's and of
-- the lane's ready jobs.  An operator read (GET /v2/jobs/{jobKey}/explain); no locks.
WITH aging AS (SELECT :step::int AS step, :interval_ms::int AS interval_ms),
me AS (
    SELECT job_type, tenant_id, shard, fairness_key, queued_at, job_key,
           {{claims.effective_priority}} AS eff
    FROM jobs u WHERE u.job_key = :job_key AND u.shard = jobfair_key_shard(:job_key)
)
SELECT (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs u, me
        WHERE u.state = 'CREATED' AND u.job_type = me.job_type AND u.tenant_id = me.tenant_id
          AND u.shard = me.shard AND u.fairness_key = me.fairness_key
          AND u.job_key <> me.job_key
          AND ({{claims.effective_priority}}, me.queued_at, me.job_key)
              > (me.eff, u.queued_at, u.job_key)
        LIMIT :bound) c
) AS ahead_in_key, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j, me
        WHERE j.state = 'CREATED' AND j.job_type = me.job_type AND j.tenant_id = me.tenant_id
          AND j.shard = me.shard
        LIMIT :bound) c
) AS ready_in_lane

-- name: lane_keys_of
-- The fairness keys of one lane (:job_type, :tenant_id): each key's virtual time inside
-- the lane, whether it is backlogged -- active, and with a ready job now (a key a claim
-- emptied stays active until it is parked; the claim finds nothing there and takes from
-- the next) -- and its weight.  Index: lane_keys pkey; per active key, one probe of
-- jobs_ready_idx.  An operator read (explain); no locks.
SELECT k.fairness_key, k.vtime,
       k.active AND EXISTS (
           SELECT 1 FROM jobs j
           WHERE j.state = 'CREATED' AND j.job_type = k.job_type AND j.tenant_id = k.tenant_id
             AND j.shard = k.shard AND j.fairness_key = k.fairness_key) AS active,
       COALESCE(w.weight, 1) AS weight
FROM lane_keys k
LEFT JOIN key_weights w ON w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key
  {{shards.w_of_k}}
WHERE k.job_type = :job_type AND k.tenant_id = :tenant_id {{shards.k}}

-- name: last_asked
-- When a named worker last asked for jobs of type :job_type (a long poll, a stream), as
-- the workers table has it.  Index: workers pkey (job_type, worker).
SELECT max(last_seen_at) FROM workers WHERE job_type = :job_type

-- name: upsert_tenant
-- A tenant's weight, cap, minimum and rate limit set (a pause stays as it is); its held lanes are
-- released (the cap that held them may be gone or higher; a claim holds them again if
-- not), under its cap lock, which orders the change before or after every capped claim of
-- the tenant (jobfair_release_holds).  A rate limit (:rate_per_s a second, :rate_burst;
-- NULL: none) that changes starts with a full bucket at the statement's instant (the
-- database's clock, the one claims take tokens by); the same limit set again keeps its
-- bucket.  Run after lock_tenant (ADR 028: a rate-limited claim writes this row under
-- that lock).
WITH up AS (
    INSERT INTO tenants AS t (tenant_id, weight, max_active_jobs, rate_per_s, rate_burst,
                              rate_tokens, rate_at, min_active_jobs)
    VALUES (:tenant_id, :weight, :cap, :rate_per_s::float8, :rate_burst::float8,
            :rate_burst::float8,
            CASE WHEN :rate_per_s::float8 IS NOT NULL THEN statement_timestamp() END,
            :minimum::int)
    ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight,
        max_active_jobs = EXCLUDED.max_active_jobs, min_active_jobs = EXCLUDED.min_active_jobs,
        {{rate_set}}
    RETURNING {{tenant_columns}}
),
unheld AS (
    SELECT {{release_holds}}
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM unheld) = 1

-- name: upsert_tenant @citus
-- upsert_tenant on Citus: the tenant's instant read outside the write (tenant_stored),
-- its held lanes released by the store after it (app.db.holds).
WITH up AS (
    INSERT INTO tenants AS t (tenant_id, weight, max_active_jobs, rate_per_s, rate_burst,
                              rate_tokens, rate_at, min_active_jobs)
    VALUES (:tenant_id, :weight, :cap, :rate_per_s::float8, :rate_burst::float8,
            :rate_burst::float8,
            CASE WHEN :rate_per_s::float8 IS NOT NULL THEN statement_timestamp() END,
            :minimum::int)
    ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight,
        max_active_jobs = EXCLUDED.max_active_jobs, min_active_jobs = EXCLUDED.min_active_jobs,
        {{rate_set}}
    RETURNING {{tenant_stored}}
)
SELECT up.*, statement_timestamp() AS read_at FROM up

-- name: lock_tenant
-- A tenant's cap lock, taken before its row is written (upsert_tenant, delete_tenant), in
-- the order a rate-limited claim takes them (the lock, then the row it takes tokens
-- from): the other order deadlocks with it.  jobfair_lock_tenant_caps is alembic 0003's.
SELECT jobfair_lock_tenant_caps({{TENANT_CAP_LOCK_CLASS}}, ARRAY[:tenant_id::text])

-- name: get_tenant
-- A tenant's configuration (no row: weight 1, no cap).  Index: tenants pkey.
SELECT {{tenant_columns}}
FROM tenants WHERE tenant_id = :tenant_id

-- name: list_tenants
-- Every configured tenant, by id.
SELECT {{tenant_columns}}
FROM tenants ORDER BY tenant_id

-- name: release_after_finishes
-- After a tenant's configuration change committed: waits, on the release gate taken
-- exclusively, for every finishing statement in flight (one that began before the change
-- chose the capped tenants it releases without seeing it), then releases the tenant's
-- held lanes again, so that none stays held by a claim that counted those finishes'
-- jobs as active (ADR 016).  Locks: the gate, then as jobfair_release_holds.
SELECT pg_advisory_xact_lock({{RELEASE_GATE_CLASS}}, 0),
       {{release_holds}}

-- name: delete_tenant
-- As upsert_tenant: the tenant's held lanes are released.
WITH gone AS (DELETE FROM tenants WHERE tenant_id = :tenant_id RETURNING tenant_id),
unheld AS (
    SELECT {{release_holds}}
)
SELECT gone.tenant_id FROM gone WHERE (SELECT count(*) FROM unheld) = 1

-- name: upsert_key_weight
-- A fairness key's weight inside its tenant (alembic 0010) and its cap (:cap, NULL: none;
-- alembic 0016: the caller then releases its held keys, release_key_holds).  For the
-- weight nothing else need change:
-- every key read and lead claim reads the weights as they are, so the next activation of
-- any process uses it, for the backlog already there (ADR 027).  Index: key_weights pkey.
INSERT INTO key_weights (tenant_id, fairness_key, shard, weight, max_active_jobs)
VALUES (:tenant_id, :fairness_key, jobfair_shard(:tenant_id), :weight, :cap::int)
ON CONFLICT (tenant_id, fairness_key, shard) DO UPDATE SET weight = EXCLUDED.weight,
    max_active_jobs = EXCLUDED.max_active_jobs
RETURNING weight, max_active_jobs

-- name: get_key_weight
-- A fairness key's weight (no row: 1) and cap.  Index: key_weights pkey.
SELECT weight, max_active_jobs FROM key_weights
WHERE tenant_id = :tenant_id AND fairness_key = :fairness_key
  AND shard = jobfair_shard(:tenant_id)

-- name: delete_key_weight
-- A fairness key back to weight 1 and no cap; whether it had a row.  Index: key_weights
-- pkey.
DELETE FROM key_weights
WHERE tenant_id = :tenant_id AND fairness_key = :fairness_key
  AND shard = jobfair_shard(:tenant_id)
RETURNING weight

-- name: upsert_job_type
-- A job type's cap, aging, rate limit and what its lanes are charged by set (NULL: the
-- server's default, no limit, by activations; a pause stays as it is).  The rate limit's
-- bucket as upsert_tenant's.  Index: job_types pkey.  Locks: the row, which a
-- rate-limited claim writes under the type's cap lock; a claim that read the bucket
-- before this committed finds it changed and leaves it.
INSERT INTO job_types AS t (job_type, max_active_jobs, aging_interval_ms, aging_step,
                            rate_per_s, rate_burst, rate_tokens, rate_at, fairness_by,
                            max_active_per_key, key_ordering)
VALUES (:job_type, :cap, :interval_ms, :step, :rate_per_s::float8, :rate_burst::float8,
        :rate_burst::float8,
        CASE WHEN :rate_per_s::float8 IS NOT NULL THEN statement_timestamp() END, :fairness_by,
        :per_key::int, :key_ordering::text)
ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs,
    max_active_per_key = EXCLUDED.max_active_per_key, key_ordering = EXCLUDED.key_ordering,
    aging_interval_ms = EXCLUDED.aging_interval_ms, aging_step = EXCLUDED.aging_step,
    fairness_by = EXCLUDED.fairness_by,
    {{rate_set}}
RETURNING {{job_type_columns}}

-- name: upsert_job_type @citus
-- upsert_job_type on Citus: the instant read outside the write (job_type_stored).
WITH up AS (
    INSERT INTO job_types AS t (job_type, max_active_jobs, aging_interval_ms, aging_step,
                                rate_per_s, rate_burst, rate_tokens, rate_at, fairness_by,
                                max_active_per_key, key_ordering)
    VALUES (:job_type, :cap, :interval_ms, :step, :rate_per_s::float8, :rate_burst::float8,
            :rate_burst::float8,
            CASE WHEN :rate_per_s::float8 IS NOT NULL THEN statement_timestamp() END,
            :fairness_by, :per_key::int, :key_ordering::text)
    ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs,
        max_active_per_key = EXCLUDED.max_active_per_key, key_ordering = EXCLUDED.key_ordering,
        aging_interval_ms = EXCLUDED.aging_interval_ms, aging_step = EXCLUDED.aging_step,
        fairness_by = EXCLUDED.fairness_by,
        {{rate_set}}
    RETURNING {{job_type_stored}}
)
SELECT up.job_type, up.max_active_jobs, up.aging_interval_ms, up.aging_step, up.paused,
       up.rate_per_s, up.rate_burst, up.rate_tokens, up.rate_at,
       statement_timestamp() AS read_at, up.fairness_by, up.max_active_per_key,
       up.key_ordering
FROM up

-- name: get_job_type
-- A job type's configuration.  Index: job_types pkey.
SELECT {{job_type_columns}}
FROM job_types WHERE job_type = :job_type

-- name: list_job_types
-- Every configured job type, by name.
SELECT {{job_type_columns}}
FROM job_types ORDER BY job_type

-- name: pause_tenant
-- Marks a tenant paused, its configuration made with the defaults if it had none; the
-- lanes are held by hold_paused_lanes once this committed.  Index: tenants pkey.
INSERT INTO tenants (tenant_id, paused) VALUES (:tenant_id, true)
ON CONFLICT (tenant_id) DO UPDATE SET paused = true
RETURNING {{tenant_columns}}

-- name: wait_for_finishes
-- The release gate, exclusively, until the transaction ends: waits for every finishing
-- statement in flight (each holds it shared), so that a statement after this one sees
-- what they released.  Locks: the gate.
SELECT pg_advisory_xact_lock({{RELEASE_GATE_CLASS}}, 0)

-- name: hold_paused_lanes
-- After a pause committed, behind wait_for_finishes (a finish that began before the
-- pause may have released the tenant's lanes without seeing it): holds the paused
-- tenant's lanes out of the reads, as a cap holds them (ADR 016), every job type's.
-- Finishes after the pause see it and release none of them (jobfair_release_holds,
-- alembic 0007), and new lanes of the tenant are made held (app.db.lanes, WAKE).  A
-- sequential read of lanes: a pause is rare.  Locks: the lane rows.
UPDATE lanes l SET held = true
WHERE l.tenant_id = :tenant_id AND NOT l.held {{shards.l}}
  AND EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = :tenant_id AND t.paused)

-- name: resume_tenant
-- Marks a tenant no longer paused (no row: it never was).  Its lanes are released by
-- release_resumed once this committed.  Index: tenants pkey.
UPDATE tenants SET paused = false WHERE tenant_id = :tenant_id
RETURNING {{tenant_columns}}

-- name: release_resumed
-- After a resume committed: as release_after_finishes, the tenant's held lanes released
-- (each re-enters at the type's virtual time if it fell behind it: a pause banks no
-- credit, and a lane ahead keeps its place, ADR 016), and every job type with an active
-- lane of the tenant notified, so that waiters read again at once (a lane that a pause
-- missed was not held, and its release notifies nothing).  Locks: the gate, then as
-- jobfair_release_holds.  A sequential read of lanes.
WITH released AS (
    SELECT pg_advisory_xact_lock({{RELEASE_GATE_CLASS}}, 0),
           {{release_holds}} AS n
),
notified AS (
    SELECT pg_notify('{{NOTIFY_CHANNEL}}', job_type)
    FROM (SELECT DISTINCT job_type FROM lanes WHERE tenant_id = :tenant_id AND active) d
    WHERE (SELECT n FROM released) IS NOT NULL
)
SELECT (SELECT n FROM released), (SELECT count(*) FROM notified)

-- name: pause_job_type
-- Marks a job type paused (configured with the defaults if it was not): a lane read of
-- the type answers nothing to claim (read_lanes), nor does a lead claim.  Index:
-- job_types pkey.
INSERT INTO job_types (job_type, paused) VALUES (:job_type, true)
ON CONFLICT (job_type) DO UPDATE SET paused = true
RETURNING {{job_type_columns}}

-- name: resume_job_type
-- Marks a job type no longer paused and notifies it (at commit), so that its waiters
-- read at once.  Index: job_types pkey.
WITH up AS (
    UPDATE job_types SET paused = false WHERE job_type = :job_type
    RETURNING {{job_type_columns}}
),
notified AS (SELECT pg_notify('{{NOTIFY_CHANNEL}}', :job_type))
SELECT up.* FROM up WHERE (SELECT count(*) FROM notified) = 1

-- name: pause_tenant @citus
-- pause_tenant on Citus: the instant read outside the write (tenant_stored).
WITH up AS (
    INSERT INTO tenants (tenant_id, paused) VALUES (:tenant_id, true)
    ON CONFLICT (tenant_id) DO UPDATE SET paused = true
    RETURNING {{tenant_stored}}
)
SELECT up.*, statement_timestamp() AS read_at FROM up

-- name: resume_tenant @citus
-- resume_tenant on Citus: the instant read outside the write (tenant_stored).
WITH up AS (
    UPDATE tenants SET paused = false WHERE tenant_id = :tenant_id
    RETURNING {{tenant_stored}}
)
SELECT up.*, statement_timestamp() AS read_at FROM up

-- name: release_resumed @citus
-- release_resumed's first step on Citus: the gate, exclusively (the store then releases
-- the tenant's lanes, app.db.holds, and notifies the types of its active lanes,
-- active_types_of).
SELECT pg_advisory_xact_lock({{RELEASE_GATE_CLASS}}, 0)

-- name: active_types_of @citus
-- The job types of the active lanes of :tenant_id (in its :shards), to notify after a
-- resume.  A read of the tenant's lanes on its node.
SELECT DISTINCT l.job_type FROM lanes l
WHERE l.tenant_id = :tenant_id AND l.active {{shards.l}}

-- name: pause_job_type @citus
-- pause_job_type on Citus: the instant read outside the write (job_type_stored).
WITH up AS (
    INSERT INTO job_types (job_type, paused) VALUES (:job_type, true)
    ON CONFLICT (job_type) DO UPDATE SET paused = true
    RETURNING {{job_type_stored}}
)
SELECT up.job_type, up.max_active_jobs, up.aging_interval_ms, up.aging_step, up.paused,
       up.rate_per_s, up.rate_burst, up.rate_tokens, up.rate_at,
       statement_timestamp() AS read_at, up.fairness_by, up.max_active_per_key,
       up.key_ordering
FROM up

-- name: resume_job_type @citus
-- resume_job_type on Citus: the instant read outside the write; the store notifies the
-- type from the coordinator.
WITH up AS (
    UPDATE job_types SET paused = false WHERE job_type = :job_type
    RETURNING {{job_type_stored}}
)
SELECT up.job_type, up.max_active_jobs, up.aging_interval_ms, up.aging_step, up.paused,
       up.rate_per_s, up.rate_burst, up.rate_tokens, up.rate_at,
       statement_timestamp() AS read_at, up.fairness_by, up.max_active_per_key,
       up.key_ordering
FROM up

-- name: ping
-- The database answers (a health check).
SELECT 1

-- name: schema_version
-- The migration the database is at (alembic's table; none before the first migration).
SELECT version_num FROM alembic_version

-- name: oldest_server
-- The oldest revision whose servers the database still serves (alembic 0009's table).
SELECT oldest_server FROM schema_compat

-- name: release_key_holds
-- After a key's or a job type's cap changed and committed, behind wait_for_finishes (a
-- finish in flight may have judged by the cap before): the held keys of the pairs
-- (:tenants, :keys, with the job types :types whose per-key caps apply) released
-- (jobfair_release_key_holds, alembic 0016); how many.
SELECT jobfair_release_key_holds({{KEY_CAP_LOCK_CLASS}}, {{RELEASE_GATE_CLASS}},
    :tenants::text[], :keys::text[], :types::text[], '{{NOTIFY_CHANNEL}}')

-- name: held_keys
-- The held keys of :job_type after (:after_type, :after_tenant, :after_key), the next
-- :chunk of them in that order, as (type, tenant, key).  Index: lane_keys_held_idx.
SELECT job_type, tenant_id, fairness_key FROM lane_keys
WHERE held AND job_type = :job_type::text
  AND (job_type, tenant_id, fairness_key) > (:after_type::text, :after_tenant::text, :after_key::text)
ORDER BY job_type, tenant_id, fairness_key
LIMIT :chunk

-- name: held_keys_with_room
-- The held keys of every type that have room under their caps now --
-- a finish by a server older than alembic 0016 left them held, or a bug did: the
-- leader's sweep releases them -- after (:after_type, :after_tenant, :after_key), the next
-- :chunk in that order.  Each count stops at its cap; a key of a FIFO type has room only
-- while it has no job ACTIVATED (its per-key cap is 1) and its first job waiting is
-- CREATED (ADR 041).  Index: lane_keys_held_idx, key_weights pkey,
-- job_types pkey, jobs_active_key_idx, jobs_waiting_key_idx.
SELECT k.job_type, k.tenant_id, k.fairness_key FROM lane_keys k
LEFT JOIN key_weights w ON w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key
LEFT JOIN job_types t ON t.job_type = k.job_type
CROSS JOIN LATERAL (SELECT {{lanes.per_key}} AS max_active_per_key, t.key_ordering) y
WHERE k.held
  AND (k.job_type, k.tenant_id, k.fairness_key)
      > (:after_type::text, :after_tenant::text, :after_key::text)
  AND (w.max_active_jobs IS NULL OR (SELECT count(*) FROM (
         SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = k.tenant_id
           AND j.fairness_key = k.fairness_key LIMIT w.max_active_jobs) a) < w.max_active_jobs)
  AND (y.max_active_per_key IS NULL OR (SELECT count(*) FROM (
         SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = k.tenant_id
           AND j.fairness_key = k.fairness_key AND j.job_type = k.job_type
         LIMIT y.max_active_per_key) a) < y.max_active_per_key)
  AND (y.key_ordering IS NULL OR COALESCE((
         SELECT j.state FROM jobs j
         WHERE (j.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE
           AND j.job_type = k.job_type AND j.tenant_id = k.tenant_id
           AND j.fairness_key = k.fairness_key
         ORDER BY j.job_key LIMIT 1), 'CREATED') = 'CREATED')
ORDER BY k.job_type, k.tenant_id, k.fairness_key
LIMIT :chunk

-- name: key_caps_of
-- A fairness key's caps and what they count (explain, ADR 040): its own cap (NULL: none)
-- and its ACTIVATED jobs of every type, its :job_type's per-key cap and its ACTIVATED jobs
-- of that type.  Index: key_weights pkey, job_types pkey, jobs_active_key_idx.
SELECT w.max_active_jobs AS cap,
       (SELECT count(*) FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = :tenant_id
          AND j.fairness_key = :fairness_key) AS active,
       (SELECT y.max_active_per_key FROM job_types y WHERE y.job_type = :job_type) AS per_key,
       (SELECT count(*) FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = :tenant_id
          AND j.fairness_key = :fairness_key AND j.job_type = :job_type) AS type_active
FROM (SELECT 1) one
LEFT JOIN key_weights w ON w.tenant_id = :tenant_id AND w.fairness_key = :fairness_key

-- name: key_head
-- A fairness key's head in :job_type (ADR 041): its first job in key order that is not
-- done (CREATED, SCHEDULED, ACTIVATED or FAILED), with its state; none if it has no such
-- job.  Index: jobs_waiting_key_idx (the waiting ones), jobs_active_key_idx (the ACTIVATED
-- one, if any: a FIFO key has at most one).
SELECT job_key, state FROM (
    (SELECT j.job_key, j.state FROM jobs j
     WHERE (j.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE AND j.job_type = :job_type
       AND j.tenant_id = :tenant_id AND j.fairness_key = :fairness_key
     ORDER BY j.job_key LIMIT 1)
    UNION ALL
    (SELECT j.job_key, j.state FROM jobs j
     WHERE j.state = 'ACTIVATED' AND j.tenant_id = :tenant_id
       AND j.fairness_key = :fairness_key AND j.job_type = :job_type
     ORDER BY j.job_key LIMIT 1)) h
ORDER BY job_key
LIMIT 1

-- name: key_caps_listed
-- The caps of the keys a stats answer lists (:job_types, :tenant_ids, :keys: triples, ADR
-- 040): each key's own cap and its type's per-key cap, whether it is held at one now, and
-- -- only where a cap applies -- its ACTIVATED jobs of the type and of every type; in a FIFO
-- type, its head and the head's state (ADR 041).
-- Index: key_weights pkey, job_types pkey, lane_keys pkey, jobs_active_key_idx,
-- jobs_waiting_key_idx.  An operator read; no locks.
SELECT u.job_type, u.tenant_id, u.fairness_key, w.max_active_jobs AS cap,
       y.max_active_per_key AS per_key, COALESCE(k.held, false) AS held,
       CASE WHEN w.max_active_jobs IS NOT NULL OR y.max_active_per_key IS NOT NULL THEN
         (SELECT count(*) FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = u.tenant_id
            AND j.fairness_key = u.fairness_key AND j.job_type = u.job_type) END AS active,
       CASE WHEN w.max_active_jobs IS NOT NULL THEN
         (SELECT count(*) FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = u.tenant_id
            AND j.fairness_key = u.fairness_key) END AS active_all_types,
       h.job_key AS head, h.state AS head_state
FROM unnest(:job_types::text[], :tenant_ids::text[], :keys::text[])
     AS u(job_type, tenant_id, fairness_key)
LEFT JOIN key_weights w ON w.tenant_id = u.tenant_id AND w.fairness_key = u.fairness_key
LEFT JOIN job_types y ON y.job_type = u.job_type
LEFT JOIN LATERAL (
    SELECT x.job_key, x.state FROM (
        (SELECT j.job_key, j.state FROM jobs j
         WHERE (j.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE
           AND j.job_type = u.job_type AND j.tenant_id = u.tenant_id
           AND j.fairness_key = u.fairness_key
         ORDER BY j.job_key LIMIT 1)
        UNION ALL
        (SELECT j.job_key, j.state FROM jobs j
         WHERE j.state = 'ACTIVATED' AND j.tenant_id = u.tenant_id
           AND j.fairness_key = u.fairness_key AND j.job_type = u.job_type
         ORDER BY j.job_key LIMIT 1)) x
    WHERE y.key_ordering = 'fifo'
    ORDER BY x.job_key LIMIT 1) h ON true
LEFT JOIN lane_keys k ON k.job_type = u.job_type AND k.tenant_id = u.tenant_id
 AND k.fairness_key = u.fairness_key

-- name: held_key_counts
-- Per job type, its fairness keys held at their caps now (the metrics).  Index:
-- lane_keys_held_idx.
SELECT job_type, count(*) AS n FROM lane_keys WHERE held GROUP BY job_type

-- name: lock_type_keys
-- A change of :job_type's configuration, first in its transaction: the type's per-key
-- configuration lock, exclusively, so that the claims counting its keys under the old
-- maxActivePerKey (which hold it shared) have committed and those after read the new one
-- (ADR 040).
SELECT pg_advisory_xact_lock({{TYPE_KEYS_LOCK_CLASS}}, hashtext(:job_type::text))
