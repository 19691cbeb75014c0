-- name: job_history
-- A job's rows, oldest first, each with the job's creation, state and current activation
-- (a first row with NULL events for a job without any).  Index: jobs pkey, job_events
-- pkey.
SELECT j.created_at, j.state, j.activation_count AS activations, j.activated_at AS running_since,
       j.worker AS running_worker, j.deadline AS running_deadline, j.tenant_id, j.job_type,
       e.activation_count, e.step, e.event, e.at, e.started_at, e.worker, e.deadline,
       e.retries, e.error_code, e.error_message
FROM jobs j
LEFT JOIN job_events e ON e.job_key = j.job_key AND e.shard = j.shard
WHERE j.job_key = :job_key AND j.shard = jobfair_key_shard(:job_key)
ORDER BY e.activation_count NULLS FIRST, e.step

-- fragment: on
-- Whether the connection writes history: every write of job_events tests it, so
-- JOBFAIR_JOB_HISTORY=false (the pool's connection setting, app.db.bounds) turns them off
-- and the statements stay the same.
current_setting('{{HISTORY_SETTING}}', true) IS DISTINCT FROM 'off'

-- fragment: leases
-- The leases of the jobs :job_keys, for the row of each activation a statement's UPDATE of
-- jobs (``ended``) ended, as the statement's snapshot has them: before the UPDATE cleared
-- their deadline (every part of a statement sees that snapshot).  The statement's
-- ``logged`` joins them: a job that had no lease (a cancel of a job not activated) gets
-- no start, worker or lease.  Index: jobs pkey.
leases AS (
    SELECT job_key, deadline FROM jobs WHERE job_key = ANY(:job_keys::bigint[]) AND {{on}}
)

-- fragment: lease
-- The same for a statement that ends one job's activation, :job_key.
leases AS (
    SELECT job_key, deadline FROM jobs WHERE job_key = ANY(ARRAY[:job_key::bigint]) AND {{on}}
)
