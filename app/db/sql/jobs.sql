-- fragment: input
-- The jobs to insert, as rows, from the JSON array :jobs, spelled as the API spells them
-- (validated by the caller).  Fields left out take the defaults :default_tenant,
-- :default_priority and :default_retries; the instant is :now.  A key carries its
-- tenant's shard (jobfair_job_key, alembic 0008); keys are drawn before the insert so
-- that results map back to input order.
input AS MATERIALIZED (
    SELECT x.ord, jobfair_job_key(t.shard, nextval('job_key_seq')) AS job_key, t.shard,
           x.e->>'type' AS job_type, t.tenant_id,
           COALESCE((x.e->>'priority')::int, :default_priority) AS priority,
           COALESCE((x.e->>'retries')::int, :default_retries) AS retries,
           COALESCE(x.e->'variables', '{}') AS variables,
           COALESCE(x.e->'customHeaders', '{}') AS custom_headers,
           x.e->>'idempotencyKey' AS idempotency_key,
           -- The default key is '' (domain.stored_key).
           COALESCE(NULLIF(x.e->>'fairnessKey', '<default>'), '') AS fairness_key,
           COALESCE((x.e->>'cost')::float8, 1) AS cost,
           CASE WHEN x.e->>'runAt' IS NOT NULL THEN (x.e->>'runAt')::timestamptz
                WHEN x.e->>'delay' IS NOT NULL
                  THEN :now::timestamptz + (x.e->>'delay')::float8 * interval '1 millisecond'
                ELSE :now::timestamptz END AS run_at
    FROM jsonb_array_elements(:jobs::jsonb) WITH ORDINALITY AS x(e, ord)
    CROSS JOIN LATERAL (
        SELECT u.tenant_id, jobfair_shard(u.tenant_id) AS shard
        FROM (SELECT COALESCE(x.e->>'tenantId', :default_tenant) AS tenant_id) u
    ) t
)

-- fragment: insert_input
-- The jobs of ``input``, as rows of jobs: SCHEDULED when they run later, else CREATED.
INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                      run_at, queued_at, variables, custom_headers, created_at, idempotency_key,
                      fairness_key, cost)
    SELECT job_key, shard, job_type, tenant_id,
           CASE WHEN run_at > :now THEN 'SCHEDULED' ELSE 'CREATED' END,
           priority, retries, run_at, GREATEST(run_at, :now), variables,
           custom_headers, :now, idempotency_key, fairness_key, cost
    FROM input

-- fragment: inserted
-- A batch inserted (input, then the jobs, with and without an idempotency key) and the
-- lanes and keys of its ready jobs woken (lanes.wake); the statement says who is told.
{{input}},
-- Jobs without an idempotency key are inserted apart: ON CONFLICT makes every row a
-- speculative insertion (a lock and an extra WAL record each).
ins_plain AS (
    {{insert_input}} WHERE idempotency_key IS NULL ORDER BY ord
    RETURNING job_key, job_type, tenant_id, fairness_key, state
),
ins_keyed AS (
    {{insert_input}} WHERE idempotency_key IS NOT NULL
      {{before_0008}}
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
{{lanes.wake}}

-- fragment: before_0008
-- A job made before alembic 0008 is in the shard its key names, not its tenant's, out of
-- reach of the unique index's (tenant, key, shard): found here, while such a job with an
-- idempotency key may remain (:keys_before_0008, job_rows.KeysBefore0008; none can come
-- back once none is left).
AND (NOT :keys_before_0008
     OR NOT EXISTS (SELECT 1 FROM jobs o
                    WHERE o.tenant_id = input.tenant_id
                      AND o.idempotency_key = input.idempotency_key
                      AND o.shard <> input.shard))

-- fragment: before_0008 @citus
-- None on Citus: the tables are distributed only once every job is in its tenant's
-- shard (docs/scaling.md).

-- fragment: inserted_answer
-- One row: every job's key in input order, and the (1-based) positions of jobs not
-- inserted because their idempotency key was taken.
SELECT ARRAY(SELECT job_key FROM input ORDER BY ord) AS job_keys,
       ARRAY(SELECT i.ord FROM input i LEFT JOIN ins ON ins.job_key = i.job_key
             WHERE ins.job_key IS NULL ORDER BY i.ord) AS not_inserted,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
         + (SELECT count(*) FROM woken) AS _side_effects

-- name: insert_jobs
-- Inserts a batch of jobs in one round trip, marks their lanes backlogged and notifies
-- once per job type.  Idempotency: jobs_idempotency_idx, ON CONFLICT DO NOTHING (and one
-- probe of it per keyed job for a job of the tenant in another shard: made before
-- alembic 0008).  The batch travels as one JSON array (:jobs) parsed by PostgreSQL: one
-- parameter to encode instead of thousands of array elements, which asyncpg encodes one
-- by one (ADR 007).  Answers one row: every job's key in input order, and the (1-based)
-- positions of jobs not inserted because their idempotency key was taken.
-- Locks: the caller holds the shared lane-bucket locks (app.db.lanes, the protocol).
WITH {{inserted}}
{{lanes.notified}}
{{inserted_answer}}

-- name: insert_job_quiet
-- insert_jobs without its NOTIFY, for a hand-off (claims.insert_and_claim_lead, ADR 012):
-- the job may go to a waiter in the same transaction, and then nobody need be woken.
WITH {{inserted}}
notified AS (SELECT WHERE false)
{{inserted_answer}}

-- name: insert_job
-- insert_jobs for one job without an idempotency key, answering its record (with its
-- type's aging settings, as get_job): POST /v2/jobs in one statement instead of an insert
-- and a read.  Locks: the caller holds the shared lane-bucket locks if it is ready.
WITH {{input}},
ins AS (
    {{insert_input}}
    RETURNING {{JOB_COLUMNS}}
),
{{one_answered}}

-- name: insert_job_keyed
-- insert_job for one job with an idempotency key: its record in one statement when the
-- key is new, no row when it is taken (the caller then answers the job holding it, as
-- insert_jobs does).  Index: jobs_idempotency_idx (ON CONFLICT; and the probe for a job
-- made before alembic 0008).  Locks: as insert_job.
WITH {{input}},
ins AS (
    {{insert_input}}
    WHERE true
      {{before_0008}}
    ON CONFLICT (tenant_id, idempotency_key, shard) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING {{JOB_COLUMNS}}
),
{{one_answered}}

-- fragment: one_answered
-- The end of insert_job and insert_job_keyed: the job's lane woken if it is ready, and its
-- record with its type's aging settings.
ready_lanes AS (
    SELECT job_type, tenant_id, fairness_key, count(*) AS n FROM ins WHERE state = 'CREATED'
    GROUP BY job_type, tenant_id, fairness_key
),
{{lanes.wake}}
{{lanes.notified}}
SELECT ins.*,  -- the columns insert returned: a job record's
       t.aging_interval_ms AS type_aging_interval_ms, t.aging_step AS type_aging_step,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
         + (SELECT count(*) FROM woken) AS _side_effects
FROM ins LEFT JOIN job_types t ON t.job_type = ins.job_type

-- name: notify_ready
-- A job type's jobs that became activatable (:payload, "type n"), announced by hand.
SELECT pg_notify('{{NOTIFY_CHANNEL}}', :payload)

-- name: keys_before_0008
-- Whether a job made before alembic 0008 with an idempotency key is left outside its
-- tenant's shard.  Index: jobs_pkey (keys made before 0008 are below 2**52, every key
-- made since is above 2**62).
SELECT EXISTS (SELECT 1 FROM jobs
               WHERE job_key < 4503599627370496  -- 2**52
                 AND idempotency_key IS NOT NULL
                 AND shard <> jobfair_shard(tenant_id))

-- name: find_idempotent
-- The existing job for (:tenant_ids, :idempotency_keys) pairs.  Index:
-- jobs_idempotency_idx.
SELECT k.tenant_id, k.idempotency_key, j.job_key
FROM unnest(:tenant_ids::text[], :idempotency_keys::text[]) AS k(tenant_id, idempotency_key)
JOIN jobs j ON j.tenant_id = k.tenant_id AND j.idempotency_key = k.idempotency_key

-- name: get_job
-- With the job type's aging settings, so a record renders in one round trip.
-- Index: jobs pkey, job_types pkey.
SELECT {{J_JOB_COLUMNS}},
       t.aging_interval_ms AS type_aging_interval_ms, t.aging_step AS type_aging_step
FROM jobs j LEFT JOIN job_types t ON t.job_type = j.job_type
WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key)

-- name: job_states
-- Each job's state and current activation, by key (what a finish is judged by).
-- Index: jobs pkey.
SELECT job_key, state, activation_count FROM jobs WHERE job_key = ANY(:job_keys::bigint[])

-- name: job_scopes
-- Each job's tenant and type, by key: what an API key's scope is checked against (they
-- never change, so app.keys keeps what it read).  Index: jobs pkey.
SELECT job_key, tenant_id, job_type FROM jobs WHERE job_key = ANY(:job_keys::bigint[])

-- name: lock_job
-- The job's row, locked for an update that reads before it writes (PATCH).
-- Index: jobs pkey.  Locks: the row, until the transaction ends.
SELECT {{JOB_COLUMNS}} FROM jobs
WHERE job_key = :job_key AND shard = jobfair_key_shard(:job_key) FOR UPDATE

-- name: update_job
-- PATCH: :retries, lease (:deadline) and :priority, and the :state decided; revives
-- FAILED when retries > 0 (queued again at :now), and then (:revived) writes the revive
-- into the job's history.  Index: jobs pkey, job_events pkey.
WITH up AS (
    UPDATE jobs
    SET retries = :retries, deadline = :deadline, priority = :priority, state = :state,
        completed_at = CASE WHEN :state = 'FAILED' THEN completed_at ELSE NULL END,
        queued_at = CASE WHEN state = 'FAILED' AND :state <> 'FAILED' THEN :now ELSE queued_at END,
        run_at = CASE WHEN state = 'FAILED' AND :state <> 'FAILED' THEN :now ELSE run_at END
    WHERE job_key = :job_key AND shard = jobfair_key_shard(:job_key)
    RETURNING job_key, activation_count, retries
),
logged AS (
    INSERT INTO job_events (job_key, shard, activation_count, step, event, at, started_at,
                            worker, deadline, retries, error_code, error_message)
    SELECT s.job_key, jobfair_key_shard(s.job_key), s.activation_count, {{REVIVED}}, 'revived',
           :now, NULL::timestamptz, NULL::text, NULL::timestamptz, s.retries, NULL::text,
           NULL::text
    FROM up s
    WHERE {{history.on}} AND :revived::bool
)
SELECT job_key FROM up
