-- fragment: log_canceled
-- History (app.db.history): a "canceled" row at :now for each job of up (its job_key,
-- activation_count and retries), unless the connection turned history off.  Index:
-- job_events pkey.  PostgreSQL runs a data-modifying CTE whether or not the statement
-- reads it.
logged AS (
    INSERT INTO job_events (job_key, shard, activation_count, step, event, at, started_at,
                            worker, deadline, retries, error_code, error_message)
    SELECT s.job_key, jobfair_key_shard(s.job_key), s.activation_count, {{CANCELED}},
           'canceled', :now,
           NULL::timestamptz, NULL::text, NULL::timestamptz, s.retries, NULL::text, NULL::text
    FROM up s
    WHERE {{history.on}}
)

-- name: failed_batch
-- FAILED jobs after key :after_key, in key order, up to :limit, matching the filters
-- (:tenant_id, :job_type, :created_after and :created_before the creation range; NULL:
-- any): a bulk retry's next batch.  Index: jobs_failed_idx (FAILED jobs by key), the
-- filters applied to it: a batch reads the FAILED jobs up to its last match.  No locks
-- (the revive re-checks the state).
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'FAILED' AND job_key > :after_key
  AND (:tenant_id::text IS NULL OR tenant_id = :tenant_id)
  AND (:job_type::text IS NULL OR job_type = :job_type)
  AND (:created_after::timestamptz IS NULL OR created_at >= :created_after)
  AND (:created_before::timestamptz IS NULL OR created_at < :created_before)
ORDER BY job_key LIMIT :limit

-- name: revive_failed
-- The jobs :job_keys FAILED -> CREATED with :retries retries, due :now, at the back of
-- their priority, as PATCH retries revives one (app.db.job_rows, update_job); the history of
-- each gets "revived" (step REVIVED, app.db.history), unless the connection turned
-- history off.  Re-checks the state (a job revived or deleted meanwhile is passed by).
-- Index: jobs pkey, job_events pkey.  Locks: the caller holds the shared lane-bucket
-- locks of the jobs' lanes (the protocol of app.db.lanes), then wakes them.
WITH up AS (
    UPDATE jobs j
    SET state = 'CREATED', retries = :retries, completed_at = NULL, queued_at = :now,
        run_at = :now
    WHERE j.job_key = ANY(:job_keys::bigint[]) AND j.state = 'FAILED' {{shards.j}}
    RETURNING j.job_key, j.job_type, j.tenant_id, j.activation_count, j.retries,
              j.fairness_key
),
logged AS (
    INSERT INTO job_events (job_key, shard, activation_count, step, event, at, started_at,
                            worker, deadline, retries, error_code, error_message)
    SELECT s.job_key, jobfair_key_shard(s.job_key), s.activation_count, {{REVIVED}},
           'revived', :now,
           NULL::timestamptz, NULL::text, NULL::timestamptz, s.retries, NULL::text, NULL::text
    FROM up s
    WHERE {{history.on}}
)
SELECT job_type, tenant_id, fairness_key FROM up

-- name: cancel_ready
-- Up to :limit ready jobs of one lane (:job_type, :tenant_id) -> CANCELED at :now, key
-- by key from the head of each key's queue; rows an activator holds are passed by (they
-- are being activated).  Answers how many, and the keys they had (for parking those
-- emptied).  History: "canceled" (logged).  Index: jobs_ready_idx, in its order
-- (each batch starts where the last left off: the index entries of jobs canceled before
-- are dead and skipped).  Locks: the batch's rows.
WITH up AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = :now
    WHERE j.job_key = ANY(ARRAY(
        SELECT x.job_key FROM jobs x
        WHERE x.state = 'CREATED' AND x.job_type = :job_type AND x.tenant_id = :tenant_id
          {{shards.x}}
        ORDER BY x.fairness_key, x.priority DESC, x.queued_at, x.job_key
        LIMIT :limit
        FOR UPDATE SKIP LOCKED))
      AND j.state = 'CREATED' {{shards.j}}
    RETURNING j.job_key, j.activation_count, j.worker, j.retries, j.fairness_key
),
{{log_canceled}}
SELECT count(*) AS n, ARRAY(SELECT DISTINCT fairness_key FROM up) AS keys FROM up

-- name: cancel_delayed
-- Up to :limit delayed jobs (SCHEDULED: shown as CREATED) of tenant :tenant_id (and
-- type :job_type; NULL: any) -> CANCELED at :now, soonest due first.  History:
-- "canceled" (logged).  Index: jobs_scheduled_idx, filtered by tenant: a batch
-- reads the delayed jobs due before its last match.  Locks: the batch's rows (the
-- promoter's are passed by).
WITH up AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = :now
    WHERE j.job_key = ANY(ARRAY(
        SELECT x.job_key FROM jobs x
        WHERE x.state = 'SCHEDULED' AND x.tenant_id = :tenant_id
          AND (:job_type::text IS NULL OR x.job_type = :job_type) {{shards.x}}
        ORDER BY x.run_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED))
      AND j.state = 'SCHEDULED' {{shards.j}}
    RETURNING j.job_key, j.activation_count, j.worker, j.retries
),
{{log_canceled}}
SELECT count(*) FROM up

-- name: tenant_lanes
-- The job types in which tenant :tenant_id may have ready jobs: its active lanes (a lane
-- with a ready job is active: app.db.lanes).  A sequential read of lanes.
SELECT job_type FROM lanes WHERE tenant_id = :tenant_id AND active ORDER BY job_type

-- name: any_created
-- Whether tenant :tenant_id has a CREATED or delayed job of type :job_type (NULL: any
-- type).  Index: jobs_ready_idx per lane, jobs_scheduled_idx.
SELECT EXISTS (
    SELECT 1 FROM jobs WHERE state = 'CREATED' AND tenant_id = :tenant_id
      AND (:job_type::text IS NULL OR job_type = :job_type)
) OR EXISTS (
    SELECT 1 FROM jobs WHERE state = 'SCHEDULED' AND tenant_id = :tenant_id
      AND (:job_type::text IS NULL OR job_type = :job_type)
)
