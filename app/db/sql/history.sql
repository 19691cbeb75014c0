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

-- fragment: logged
-- The history row of each activation a statement's UPDATE of jobs (``ended``) ended, from
-- that UPDATE's own RETURNING rows: its step and event, the lease it ended (``lease``: the
-- job's deadline as the statement's snapshot had it, read by a join of the row to
-- itself; NULL for a job that had none, which gets no start or worker), its retries and
-- error.  The row is written from ``ended`` alone: on Citus, where a statement with an
-- INSERT is planned in parts, the UPDATE runs first and a part that read the job again
-- read it after -- every row lost its activation (issue 42) -- and this part, reading
-- only the UPDATE's rows, runs on the coordinator, whose connection setting ``on`` tests.
-- Index: job_events pkey.
logged AS (
    {{log_rows}}
    FROM ended s
    WHERE {{on}}
),

-- fragment: log_rows
-- The history rows of ended activations, from rows ``s`` (job_key, activation_count,
-- step, event, activated_at, lease, worker, retries, error_code, error_message) at :now:
-- a row names its activation's start and worker only if it had a lease.
INSERT INTO job_events (job_key, shard, activation_count, step, event, at, started_at,
                        worker, deadline, retries, error_code, error_message)
SELECT s.job_key, jobfair_key_shard(s.job_key), s.activation_count, s.step, s.event, :now,
       CASE WHEN s.lease IS NOT NULL THEN s.activated_at END,
       CASE WHEN s.lease IS NOT NULL THEN s.worker END, s.lease, s.retries,
       s.error_code, s.error_message

-- fragment: logged @citus
-- Nothing on Citus: a statement with an INSERT is not one Citus runs whole on a node (it
-- ran the UPDATE, then the INSERT through the coordinator, with shard locks: a batch of
-- completions took 250 ms, issue 42).  The statement answers the rows (``ended``) and
-- the store writes them after it, in its transaction (log_ended).

-- fragment: ended
-- Nothing on one PostgreSQL; on Citus what log_ended writes of each ended activation,
-- and the statement's :now (``ended_at``).

-- fragment: ended @citus
, activation_count, step, event, lease, worker, retries, error_code, error_message,
  :now::timestamptz AS ended_at

-- name: log_ended @citus
-- On Citus, the history rows of the activations a finishing statement ended (as
-- ``logged``), from its answer: one INSERT, its rows sent to their shards by the
-- coordinator, where ``on`` is tested.  Index: job_events pkey.
{{log_rows}}
FROM unnest(:job_keys::bigint[], :activation_counts::int[], :steps::int2[], :events::text[],
            :activated_at::timestamptz[], :leases::timestamptz[], :workers::text[],
            :retries::int[], :error_codes::text[], :error_messages::text[])
     AS s(job_key, activation_count, step, event, activated_at, lease, worker, retries,
          error_code, error_message)
WHERE {{on}}
