-- name: expired_leases
-- ACTIVATED jobs whose lease ended before :now and not before :since (the earliest instant: any),
-- at most :limit, earliest first.  Index: jobs_lease_idx, from :since on: while a held
-- xmin horizon keeps every ended lease's entry, a sweep starts past those it swept
-- (LeaseSweeper, ADR 036).  No locks (the release re-checks state and deadline).
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'ACTIVATED' AND deadline < :now AND deadline >= :since
ORDER BY deadline LIMIT :limit

-- name: release_expired
-- Expired ACTIVATED -> CREATED (:job_keys, re-checked: still ACTIVATED, the lease still
-- ended before :now); retries and activationCount unchanged, so the stale holder is fenced
-- out as soon as the job is activated again.  Writes the activation's end into the job's
-- history, gives streams their credit back and releases the held lanes of tenants with
-- room again (finishing's parts).  Index: jobs pkey, job_events pkey.  Locks: the jobs'
-- rows (the caller holds the shared lane-bucket locks); as finishing's unheld.
WITH ended AS (
    UPDATE jobs j SET state = 'CREATED', deadline = NULL
    FROM jobs x
    WHERE j.job_key = ANY(:job_keys::bigint[]) AND j.state = 'ACTIVATED' AND j.deadline < :now
      {{shards.j}}
      AND x.job_key = j.job_key AND x.shard = j.shard {{shards.x}}
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream, j.activation_count,
              j.activated_at, j.worker, j.retries, j.fairness_key, j.charged, j.lane_charge,
              j.key_charge, x.deadline AS lease, {{END}} AS step, 'lease-expired' AS event,
              NULL::text AS error_code, NULL::text AS error_message
),
{{history.logged}}
{{finishing.credited}},
{{finishing.unheld}}
SELECT job_key, job_type, tenant_id, activation_count, worker, fairness_key, activated_at,
       charged, lane_charge, key_charge,
       (SELECT count(*) FROM credited) + (SELECT n FROM unheld) AS _n{{finishing.ended_via_stream}}{{history.ended}}
FROM ended

-- name: due_scheduled
-- Delayed jobs that are due by :now, at most :limit, earliest first.
-- Index: jobs_scheduled_idx.
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'SCHEDULED' AND run_at <= :now
ORDER BY run_at LIMIT :limit

-- name: promote_scheduled
-- Due delayed jobs (:job_keys) -> CREATED, re-checked (another sweeper may have been
-- first).  Index: jobs pkey.  Locks: the caller holds the shared lane-bucket locks.
UPDATE jobs j SET state = 'CREATED'
WHERE j.job_key = ANY(:job_keys::bigint[]) AND j.state = 'SCHEDULED' AND j.run_at <= :now
  {{shards.j}}
RETURNING j.job_key, j.job_type, j.tenant_id, j.fairness_key

-- name: prune_terminal
-- Deletes terminal jobs finished before :before, oldest first, at most :limit (a bounded
-- batch), with their history; answers how many jobs.  The states are app.domain's
-- terminal ones, but for the FAILED jobs of FIFO types: such a job blocks its key until
-- an operator revives or cancels it (ADR 041), and its age changes nothing.
-- Index: jobs_terminal_idx, job_events pkey, job_types pkey.
WITH gone AS (
    DELETE FROM jobs WHERE job_key IN (
        SELECT j.job_key FROM jobs j
        WHERE j.state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED')
          AND j.completed_at < :before
          AND NOT (j.state = 'FAILED' AND EXISTS (
                   SELECT 1 FROM job_types y
                   WHERE y.job_type = j.job_type AND y.key_ordering = 'fifo'))
        ORDER BY j.completed_at LIMIT :limit
    )
    RETURNING job_key
),
events AS (
    DELETE FROM job_events e WHERE e.job_key = ANY(ARRAY(SELECT job_key FROM gone))
)
SELECT count(*) FROM gone

-- name: prune_workers
-- Forgets worker names not seen since :before.  A sequential read of workers (one row
-- per job type and worker name).
DELETE FROM workers WHERE last_seen_at < :before

-- name: dead_rows
-- The job table's dead row versions as the statistics last counted them, and how many
-- vacuums of it (auto or not) have finished: a vacuum leaves the count at the versions it
-- could not remove, which a transaction holding the xmin horizon keeps (ClaimHints,
-- ADR 036).  A read of the statistics' shared memory, no table read.
SELECT COALESCE(s.n_dead_tup, 0) AS dead,
       COALESCE(s.vacuum_count + s.autovacuum_count, 0) AS vacuums
FROM (SELECT 1) one
LEFT JOIN pg_stat_user_tables s ON s.relid = 'jobs'::regclass

-- name: vacuum_settings
-- How often autovacuum looks at the tables (seconds), and whether it runs at all.
SELECT extract(epoch FROM current_setting('autovacuum_naptime')::interval)::float8 AS naptime_s,
       current_setting('autovacuum') = 'on' AS autovacuum

-- name: servers_connected
-- Connections of Jobfair servers and commands to this database (their application_name,
-- app.db.connect) other than this session's: `jobfair restored` runs before any server.
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND application_name LIKE 'jobfair/%'

-- name: restore_skip_keys
-- After a restore (`jobfair restored`, docs/backup.md): job keys drawn from :gap past the
-- last one the backup knew of, so that no key the lost cluster gave out after the backup
-- (to a job that is gone) names a new job.  Once, before any server starts; no locks
-- beyond the sequence's.
SELECT setval('job_key_seq', LEAST(last_value + :gap, {{JOB_KEY_MAX}})) AS next
FROM job_key_seq

-- name: restore_fence_counts
-- After a restore: every unfinished job's activationCount moved on by :gap, so that no
-- activation the lost cluster made after the backup fences as one the restored cluster
-- makes (a worker's late finish of it is 409, never a completion).  ACTIVATED jobs keep
-- their leases (their holders' finishes are 409 now: the jobs run again once the leases
-- end).  One statement over the unfinished jobs (jobs_live_idx's range); before any server
-- starts.
UPDATE jobs SET activation_count = activation_count + :gap
WHERE state IN ('CREATED', 'SCHEDULED', 'ACTIVATED', 'FAILED')
