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
