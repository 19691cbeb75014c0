-- name: park_lanes
-- Second half of parking: with the exclusive bucket locks held (taken by the statement
-- before), mark lanes inactive that have no CREATED job, and their keys with them (none
-- of them has one).  Index: jobs_ready_idx (one probe per lane), lanes pkey,
-- lane_keys_vtime_idx (a lane's active keys).  Locks: the lanes, then their active keys.
WITH parked AS (
    UPDATE lanes l SET active = false
    WHERE l.job_type = :job_type {{shards.l}} AND l.tenant_id IN (
          -- A lane an activator holds is busy, not empty: skip it rather than wait.
          SELECT x.tenant_id FROM lanes x
          WHERE x.job_type = :job_type AND x.tenant_id = ANY(:tenant_ids::text[]) AND x.active {{shards.x}}
          FOR NO KEY UPDATE SKIP LOCKED)
      AND NOT EXISTS (
          SELECT 1 FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id {{shards.j}})
    RETURNING l.tenant_id
),
keys_parked AS (
    UPDATE lane_keys k SET active = false
    WHERE k.job_type = :job_type AND k.tenant_id = ANY(ARRAY(SELECT tenant_id FROM parked))
      AND k.active {{shards.k}}
)
SELECT tenant_id FROM parked

-- name: park_keys
-- Parking one level down: with the exclusive bucket locks of their lanes held (taken by
-- the statement before), mark keys inactive (:tenant_ids, :keys: tenant and key pairs) that have no
-- CREATED job.  Index: lane_keys pkey, jobs_ready_idx (one probe per key).  Locks: the
-- keys' rows (one a charge holds is skipped: busy, not empty).
UPDATE lane_keys k SET active = false
FROM (SELECT x.tenant_id, x.fairness_key FROM lane_keys x
      JOIN unnest(:tenant_ids::text[], :keys::text[]) AS p(tenant_id, fairness_key)
        ON x.tenant_id = p.tenant_id AND x.fairness_key = p.fairness_key
      WHERE x.job_type = :job_type AND x.active {{shards.x}}
      ORDER BY x.tenant_id, x.fairness_key
      FOR NO KEY UPDATE OF x SKIP LOCKED) p
WHERE k.job_type = :job_type AND k.tenant_id = p.tenant_id AND k.fairness_key = p.fairness_key {{shards.k}}
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = k.tenant_id
        AND j.fairness_key = k.fairness_key {{shards.j}})
RETURNING k.tenant_id, k.fairness_key
