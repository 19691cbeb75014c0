-- name: lane_samples
-- Every lane: its running count of activations, whether it is backlogged (active) and
-- held at a cap, its virtual time, and its tenant's weight; its running count of units
-- served and what its type is fair by (NULL: activations; ADR 029), and how many times a
-- claim held it at its tenant's cap (alembic 0015); what the share
-- windows (app.shares) and the virtual-time lag are computed from.  A sequential read of
-- lanes joined to tenants and job types by hash; no locks.
SELECT l.job_type, l.tenant_id, l.activated_total, l.active, l.held, l.vtime,
       COALESCE(t.weight, 1) AS weight, l.units_total, jt.fairness_by, l.held_count
FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
LEFT JOIN job_types jt ON jt.job_type = l.job_type

-- name: capped_active
-- Per capped tenant or tenant with a minimum ('tenant') and capped job type ('type'): its
-- ACTIVATED jobs, counted up to its cap or 10,000, whichever is more (a cap lowered below
-- what is active shows what is), over jobs_lease_idx's range of active jobs.
-- Runs with lane_samples, every few seconds; no locks.
SELECT 'tenant' AS kind, t.tenant_id AS name, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = t.tenant_id
        LIMIT GREATEST(t.max_active_jobs, 10000)) c) AS active
FROM tenants t WHERE t.max_active_jobs IS NOT NULL OR t.min_active_jobs > 0
UNION ALL
SELECT 'type', jt.job_type, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.job_type = jt.job_type
        LIMIT GREATEST(jt.max_active_jobs, 10000)) c)
FROM job_types jt WHERE jt.max_active_jobs IS NOT NULL

-- name: capped_active @citus
-- capped_active on Citus (which refuses a subquery correlated to a reference table): the
-- ACTIVATED jobs of every capped tenant and type, counted on each node by tenant and by
-- type, summed on the coordinator (not bounded by the cap: the active jobs of capped
-- tenants and types, which their caps bound).  Index: jobs_active_tenant_idx and
-- jobs_active_type_idx on each shard.
WITH by_tenant AS (
    SELECT j.tenant_id, count(*) AS active FROM jobs j
    WHERE j.state = 'ACTIVATED'
      AND j.tenant_id IN (SELECT tenant_id FROM tenants WHERE max_active_jobs IS NOT NULL)
    GROUP BY j.tenant_id
),
by_type AS (
    SELECT j.job_type, count(*) AS active FROM jobs j
    WHERE j.state = 'ACTIVATED'
      AND j.job_type IN (SELECT job_type FROM job_types WHERE max_active_jobs IS NOT NULL)
    GROUP BY j.job_type
)
SELECT 'tenant' AS kind, t.tenant_id AS name, COALESCE(b.active, 0) AS active
FROM tenants t LEFT JOIN by_tenant b ON b.tenant_id = t.tenant_id
WHERE t.max_active_jobs IS NOT NULL
UNION ALL
SELECT 'type', jt.job_type, COALESCE(b.active, 0)
FROM job_types jt LEFT JOIN by_type b ON b.job_type = jt.job_type
WHERE jt.max_active_jobs IS NOT NULL

-- name: key_samples
-- The second level's sample (ADR 027): per lane, its :top keys with the most activations
-- ever, and the keys named in :job_types, :tenant_ids, :keys (type, tenant, key: those the share window
-- tracks), each with its running count of activations, whether it is backlogged
-- (active), its virtual time and weight; and per lane the sum of its keys' counts, the
-- total weight of its backlogged keys and the least of their virtual times; then each
-- key's running count of units served and its lane's sum of them.  A
-- sequential read of lane_keys joined to key_weights by hash, sorted per lane; no locks.
-- An operator read, every few seconds (app.stats.StatsService).
SELECT s.job_type, s.tenant_id, s.fairness_key, s.activated_total, s.active, s.vtime,
       s.weight, s.lane_total, s.backlogged_weight, s.least_vtime, s.units_total,
       s.lane_units
FROM (
    SELECT k.job_type, k.tenant_id, k.fairness_key, k.activated_total, k.active, k.vtime,
           k.units_total, sum(k.units_total) OVER lane AS lane_units,
           COALESCE(w.weight, 1) AS weight,
           row_number() OVER (PARTITION BY {{shards.k_shard}} k.job_type, k.tenant_id
                              ORDER BY k.activated_total DESC, k.fairness_key) AS rank,
           (sum(k.activated_total) OVER lane)::bigint AS lane_total,
           COALESCE(sum(COALESCE(w.weight, 1)) FILTER (WHERE k.active) OVER lane, 0)
             AS backlogged_weight,
           min(k.vtime) FILTER (WHERE k.active) OVER lane AS least_vtime
    FROM lane_keys k
    LEFT JOIN key_weights w ON w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key
      {{shards.w_of_k}}
    WINDOW lane AS (PARTITION BY {{shards.k_shard}} k.job_type, k.tenant_id)
) s
LEFT JOIN unnest(:job_types::text[], :tenant_ids::text[], :keys::text[]) AS t(job_type, tenant_id, fairness_key)
  ON t.job_type = s.job_type AND t.tenant_id = s.tenant_id
 AND t.fairness_key = s.fairness_key
WHERE s.rank <= :top OR t.fairness_key IS NOT NULL

-- name: lane_counts
-- Per lane: ready jobs and the oldest one's queued_at, delayed jobs, active jobs -- the
-- stats view's counts without its oldest job keys or its caps (the caller joins those),
-- each counted over its own partial index: jobs_ready_idx (index only), then
-- jobs_scheduled_idx and jobs_lease_idx.  Finished jobs, however many retention keeps,
-- are never read.  Reads the backlog: an operator query.  No locks.
SELECT job_type, tenant_id, count(*) AS ready, 0::bigint AS delayed, 0::bigint AS active,
       min(queued_at) AS oldest_ready_at
FROM jobs WHERE state = 'CREATED' GROUP BY job_type, tenant_id
UNION ALL
SELECT job_type, tenant_id, 0, count(*), 0, NULL
FROM jobs WHERE state = 'SCHEDULED' GROUP BY job_type, tenant_id
UNION ALL
SELECT job_type, tenant_id, 0, 0, count(*), NULL
FROM jobs WHERE state = 'ACTIVATED' GROUP BY job_type, tenant_id

-- name: metric_tenant_sets
-- The sets of tenants labelled by name, oldest first: the newest one whose effective_at
-- has come is in force, later ones are coming.  A few rows (pruned below).
SELECT effective_at, tenants FROM metric_tenant_sets ORDER BY effective_at

-- name: publish_metric_tenants
-- A new set of labelled tenants, in force from :effective_at (a set already published for that
-- instant stays).  Index: metric_tenant_sets pkey.
INSERT INTO metric_tenant_sets (effective_at, tenants) VALUES (:effective_at, :tenants::text[])
ON CONFLICT (effective_at) DO NOTHING

-- name: prune_metric_tenants
-- Drops the sets superseded at :now: older than the newest one in force then.
DELETE FROM metric_tenant_sets
WHERE effective_at < (SELECT max(effective_at) FROM metric_tenant_sets WHERE effective_at <= :now)

-- name: failed_fifo_heads
-- Per FIFO job type (ADR 041), its fairness keys stopped behind a FAILED head: a FAILED
-- job with no earlier job in its key that is not done (CREATED, SCHEDULED, FAILED or
-- ACTIVATED), which waits for an operator's cancel or retry (the metrics).  Reads the
-- FAILED jobs (jobs_failed_idx: incidents, few), each checked by one probe of
-- jobs_waiting_key_idx and the tenant's ACTIVATED jobs (jobs_active_tenant_idx); counted up to 10,000 per type.  Not on Citus, which refuses
-- FIFO types.
SELECT jt.job_type, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j
        WHERE j.state = 'FAILED' AND j.job_type = jt.job_type
          AND j.job_key = (  -- the first waiting job of its key (a min: one probe)
              SELECT min(e.job_key) FROM jobs e
              WHERE (e.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE
                AND e.job_type = j.job_type AND e.tenant_id = j.tenant_id
                AND e.fairness_key = j.fairness_key)
          AND NOT EXISTS (
              SELECT 1 FROM jobs a
              WHERE a.state = 'ACTIVATED' AND a.tenant_id = j.tenant_id
                AND a.job_type = j.job_type AND a.fairness_key = j.fairness_key
                AND a.job_key < j.job_key)
        LIMIT 10000) c) AS n
FROM job_types jt WHERE jt.key_ordering = 'fifo'
