-- fragment: leased
-- The finishing statements' test that job j is leased, for statements that find their
-- jobs by key.  Spelled IS TRUE so that no partial index on ACTIVATED rows matches it:
-- with "j.state = 'ACTIVATED'" the generic plan read every ACTIVATED job of the type
-- through jobs_active_type_idx instead of probing jobs_pkey (ADR 002,
-- tests/integration/test_claim.py).  The keys come from the unnest the statement joins,
-- probed one by one; an extra "j.job_key = ANY(:job_keys)" made the generic plan scan
-- jobs_pkey for all the keys and then rescan the unnest once per job (quadratic in the
-- batch; ADR 002).
(j.state = 'ACTIVATED') IS TRUE

-- fragment: credited
-- Appended to statements that end activations (RETURNING job_key, via_stream as
-- ``ended``): NOTIFYs carrying the keys of stream-activated jobs, so their streams get
-- their credit back, CREDIT_KEYS_PER_NOTIFY keys to a payload (a sweep or a batch ends
-- thousands in one statement; app.db.bounds).  A stream that misses one finds its credit
-- by its own periodic check.  Long-poll jobs cost nothing here.  The NOTIFY's void is
-- wrapped in a value (sent): Citus cannot carry a void column between the parts of a
-- statement ("column pg_notify has pseudo-type void"), and then refused every finish.
credited AS (
    SELECT (SELECT 1 FROM pg_notify('{{DONE_CHANNEL}}', string_agg(job_key::text, ','))) AS sent
    FROM (SELECT job_key, (row_number() OVER () - 1) / {{CREDIT_KEYS_PER_NOTIFY}} AS chunk
          FROM ended WHERE via_stream) s
    GROUP BY chunk
)

-- fragment: freed
-- Appended to statements that end activations (``ended``: job_type, tenant_id): a NOTIFY
-- per job type ended whose type or tenant has a cap, for their capacity was freed (the
-- NOTIFY's void wrapped in a value, as in credited).  Index: job_types pkey, tenants pkey.
freed AS (
    SELECT (SELECT 1 FROM pg_notify('{{NOTIFY_CHANNEL}}', job_type)) AS sent FROM (
        SELECT DISTINCT e.job_type FROM ended e
        WHERE EXISTS (SELECT 1 FROM job_types t WHERE t.job_type = e.job_type
                        AND t.max_active_jobs IS NOT NULL)
           OR EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = e.tenant_id
                        AND t.max_active_jobs IS NOT NULL)) capped
)

-- fragment: unheld
-- Releases the held lanes of the capped tenants whose jobs ``ended`` had, for they have
-- room again (jobfair_release_holds, alembic 0004; ADR 016), then the held keys of the
-- capped keys they had, under the keys' cap locks (jobfair_release_key_holds, alembic
-- 0016; ADR 040): takes the release gate
-- shared, picks the capped tenants with a snapshot of its own, waits for their cap locks,
-- and holds the locks until the statement commits.  Appended to the statements that end
-- activations, referenced by their answer.
unheld AS (
    SELECT jobfair_release_holds({{TENANT_CAP_LOCK_CLASS}}, {{RELEASE_GATE_CLASS}},
        ARRAY(SELECT DISTINCT e.tenant_id FROM ended e), '{{NOTIFY_CHANNEL}}')
      + jobfair_release_key_holds({{KEY_CAP_LOCK_CLASS}}, {{RELEASE_GATE_CLASS}},
        ARRAY(SELECT e.tenant_id FROM ended e), ARRAY(SELECT e.fairness_key FROM ended e),
        ARRAY(SELECT e.job_type FROM ended e), '{{NOTIFY_CHANNEL}}') AS n
)

-- fragment: credited @citus
-- On Citus a statement's NOTIFY is heard only on the node that ran it: the store credits
-- the streams from the coordinator after the statement (app.db.holds.after_finish).
credited AS (SELECT 1 AS sent WHERE false)

-- fragment: freed @citus
-- As credited @citus: the capped types are told by app.db.holds.after_finish.
freed AS (SELECT 1 AS sent WHERE false)

-- fragment: unheld @citus
-- On Citus jobfair_release_holds cannot run (its statements join lanes of many nodes to
-- a reference table): app.db.holds.release does its steps after the statement, in its
-- transaction.
unheld AS (SELECT 0 AS n)

-- fragment: ended_via_stream
-- Nothing on one PostgreSQL; on Citus each ended job's via_stream, for the credits the
-- store sends.

-- fragment: ended_via_stream @citus
, via_stream

-- fragment: finished
-- The end of a statement that ended activations (``ended``), once its history row is
-- written: their streams credited, their capped types told, their tenants' held lanes
-- released, and the jobs answered with what settles them (the count of side effects
-- makes PostgreSQL run the three CTEs).
{{credited}},
{{freed}},
{{unheld}}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n{{ended_via_stream}}{{history.ended}}
FROM ended

-- name: complete_jobs
-- ACTIVATED -> COMPLETED for (key, activationCount) pairs (:job_keys,
-- :activation_counts); fenced by the count.  Merges the result :variables.  Notifies when
-- a job type or tenant has a cap (capacity freed).  Index: jobs pkey (a probe per pair),
-- job_events pkey.  Locks: the jobs' rows; as unheld.
WITH input AS (
    SELECT * FROM unnest(:job_keys::bigint[], :activation_counts::int[], :variables::jsonb[])
                  AS i(job_key, activation_count, variables)
),
ended AS (
    UPDATE jobs j
    SET state = 'COMPLETED', completed_at = :now, deadline = NULL,
        variables = j.variables || COALESCE(i.variables, '{}'::jsonb)
    FROM input i, jobs x
    WHERE j.job_key = i.job_key AND j.shard = jobfair_key_shard(i.job_key) AND {{leased}}
      {{shards.j}}
      AND j.activation_count = i.activation_count
      AND x.job_key = j.job_key AND x.shard = j.shard {{shards.x}}
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.fairness_key, j.charged, j.lane_charge,
              j.key_charge, x.deadline AS lease, {{END}} AS step, 'completed' AS event,
              NULL::text AS error_code, NULL::text AS error_message
),
{{history.logged}}
{{finished}}

-- name: fail_job
-- ACTIVATED -> CREATED/SCHEDULED (retries left) or FAILED (none left); fenced by
-- :activation_count.  :retries is what is left (NULL: one less than now).  A retried job
-- rejoins the back of its priority when its back-off ends (queued_at = :run_at).  The
-- caller then wakes the lane (lock, then wake_lanes) if the job became CREATED.
-- Index: jobs pkey, job_events pkey.  Locks: the job's row; as unheld.
WITH ended AS (
    UPDATE jobs j
    SET state = CASE WHEN r.retries = 0 THEN 'FAILED'
                     WHEN :run_at::timestamptz > :now::timestamptz THEN 'SCHEDULED'
                     ELSE 'CREATED' END,
        retries = r.retries, error_message = :error_message, deadline = NULL,
        run_at = CASE WHEN r.retries = 0 THEN j.run_at ELSE :run_at END,
        queued_at = CASE WHEN r.retries = 0 THEN j.queued_at ELSE :run_at END,
        completed_at = CASE WHEN r.retries = 0 THEN :now ELSE NULL END,
        variables = j.variables || COALESCE(:variables::jsonb, '{}'::jsonb)
    FROM jobs cur
    CROSS JOIN LATERAL (SELECT COALESCE(:retries::int, GREATEST(0, cur.retries - 1)) AS retries) r
    WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key)
      AND cur.job_key = :job_key AND cur.shard = jobfair_key_shard(:job_key) AND {{leased}}
      AND j.activation_count = :activation_count
    RETURNING j.job_key, j.job_type, j.tenant_id, j.state, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.error_message, j.fairness_key, j.charged,
              j.lane_charge, j.key_charge, cur.deadline AS lease, {{END}} AS step,
              CASE WHEN j.state = 'FAILED' THEN 'failed' ELSE 'retried' END AS event,
              NULL::text AS error_code
),
{{history.logged}}
{{credited}},
{{freed}},
{{unheld}}
SELECT job_key, job_type, tenant_id, state, activated_at, fairness_key, charged, lane_charge,
       key_charge,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n{{ended_via_stream}}{{history.ended}}
FROM ended

-- name: throw_error
-- ACTIVATED -> ERROR_THROWN (terminal); fenced by :activation_count.  Index: jobs pkey,
-- job_events pkey.  Locks: the job's row; as unheld.
WITH ended AS (
    UPDATE jobs j
    SET state = 'ERROR_THROWN', error_code = :error_code, error_message = :error_message,
        deadline = NULL, completed_at = :now,
        variables = j.variables || COALESCE(:variables::jsonb, '{}'::jsonb)
    FROM jobs cur
    WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key) AND {{leased}}
      AND j.activation_count = :activation_count
      AND cur.job_key = j.job_key AND cur.shard = j.shard
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.error_code, j.error_message, j.fairness_key,
              j.charged, j.lane_charge, j.key_charge, cur.deadline AS lease, {{END}} AS step,
              'error-thrown' AS event
),
{{history.logged}}
{{finished}}

-- name: release_jobs
-- ACTIVATED -> CREATED at once, for activations whose caller never got them (:job_keys,
-- :activation_counts); fenced.  No credit back: no stream received them.  Index: jobs
-- pkey (a probe per pair), job_events pkey.  Locks: the jobs' rows; as unheld.
WITH ended AS (
    UPDATE jobs j SET state = 'CREATED', deadline = NULL
    FROM unnest(:job_keys::bigint[], :activation_counts::int[]) AS r(job_key, activation_count),
         jobs x
    WHERE j.job_key = r.job_key AND j.shard = jobfair_key_shard(r.job_key) AND {{leased}}
      {{shards.j}}
      AND j.activation_count = r.activation_count
      AND x.job_key = j.job_key AND x.shard = j.shard {{shards.x}}
    RETURNING j.job_key, j.job_type, j.tenant_id, j.activation_count, j.activated_at, j.worker,
              j.retries, j.fairness_key, j.charged, j.lane_charge, j.key_charge,
              x.deadline AS lease, {{END}} AS step, 'released' AS event,
              NULL::text AS error_code, NULL::text AS error_message
),
{{history.logged}}
{{unheld}}
SELECT job_key, job_type, tenant_id, activated_at, fairness_key, charged, lane_charge, key_charge,
       (SELECT n FROM unheld) AS _n{{history.ended}}
FROM ended

-- name: cancel_job
-- CREATED, SCHEDULED, ACTIVATED or FAILED -> CANCELED (a FAILED job: an incident an
-- operator resolves by giving up on it, which lets its FIFO key go on, ADR 041).  An ACTIVATED job's activation ends as a
-- finish ends it: its stream gets its credit back, a capped type or tenant its capacity
-- (its worker's later finish is fenced out: the job is not ACTIVATED), and by worker time
-- its lane is settled for the time it held (``charged``, NULL unless it was ACTIVATED:
-- RETURNING gives the new row, so the state it was in is read first, its row locked).
-- The notifications and the release also run for a job that was not ACTIVATED; for one
-- job they cost a probe each.  Its history row is the CANCELED step (with no start,
-- worker or lease for a job that had none).  Index: jobs pkey, job_events pkey.
-- Locks: the job's row; as unheld.
WITH was AS (
    SELECT j.state, j.deadline FROM jobs j
    WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key)
    FOR NO KEY UPDATE
),
ended AS (
    UPDATE jobs j SET state = 'CANCELED', completed_at = :now, deadline = NULL
    -- An InitPlan, run as the row is first looked at, before the update: the lock and
    -- the state read come first.
    WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key)
      AND (SELECT state FROM was) IN ('CREATED', 'SCHEDULED', 'ACTIVATED', 'FAILED')
      AND j.state IN ('CREATED', 'SCHEDULED', 'ACTIVATED', 'FAILED')
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.fairness_key,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.charged END AS charged,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.lane_charge END
                AS lane_charge,
              CASE WHEN (SELECT state FROM was) = 'ACTIVATED' THEN j.key_charge END
                AS key_charge,
              (SELECT deadline FROM was) AS lease, {{CANCELED}} AS step, 'canceled' AS event,
              NULL::text AS error_code, NULL::text AS error_message
),
{{history.logged}}
{{finished}}
