-- name: record_workers
-- Upserts (type, worker, last seen, last activated: NULL if it got nothing) rows, each
-- time only moving forward (a slower process's older sighting changes nothing; GREATEST
-- ignores NULLs).  In key order, so that two processes' flushes lock rows in one order.
-- Index: workers pkey.  Locks: the rows.
INSERT INTO workers AS w (job_type, worker, last_seen_at, last_activated_at)
SELECT * FROM unnest(:job_types::text[], :workers::text[], :seen::timestamptz[],
                     :activated::timestamptz[])
ORDER BY 1, 2
ON CONFLICT (job_type, worker) DO UPDATE
SET last_seen_at = GREATEST(w.last_seen_at, EXCLUDED.last_seen_at),
    last_activated_at = GREATEST(w.last_activated_at, EXCLUDED.last_activated_at)

-- name: list_workers
-- Workers seen since :since, by type, the latest first; at most :limit.  A sequential
-- read of workers (one row per type and worker name, pruned by the retention sweep).
SELECT job_type, worker, last_seen_at, last_activated_at FROM workers
WHERE last_seen_at >= :since
ORDER BY job_type, last_seen_at DESC, worker LIMIT :limit

-- name: list_workers_of_type
-- As list_workers, for job type :job_type only.  Index: workers pkey.
SELECT job_type, worker, last_seen_at, last_activated_at FROM workers
WHERE job_type = :job_type AND last_seen_at >= :since
ORDER BY last_seen_at DESC, worker LIMIT :limit
