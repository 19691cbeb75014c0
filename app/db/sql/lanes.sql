-- fragment: wake
-- Marks the lanes and keys in ``ready_lanes`` (job_type, tenant_id, fairness_key, n: how
-- many of its jobs became ready, one row per lane and key; a CTE of the statement that
-- includes this) backlogged: creates missing lanes at the re-entry virtual time (held if
-- their tenant is paused: a probe of tenants pkey per new lane), wakes parked ones (a
-- lane already active matches nothing and is not written: no hot row), and does the same
-- for their keys inside their lanes.  The statement then says who is told: {{notified}}
-- (once per job type, with how many of its jobs became ready) or, for a hand-off's
-- insert, a ``notified`` that tells nobody (the job may go to its waiter in the same
-- transaction).  Lanes are locked before keys: the key CTEs are not read by the
-- statement, so they run after it (as every statement that locks both does).
-- A lane re-enters at the smallest vtime of the type's backlogged lanes not held at a cap
-- or, when there is none, the largest of all (scheduler.reentry_vtime;
-- jobfair_release_holds, alembic 0004, spells the same); a key, one level down (ADR 027),
-- at the smallest vtime of its lane's backlogged keys or, when there is none, the
-- largest of its keys (all parked then).  Index: lanes pkey, lane_keys pkey,
-- lanes_type_vtime_idx and lane_keys_vtime_idx (one descent per re-entry probe).
lanes_ready AS (
    SELECT job_type, tenant_id, sum(n) AS n FROM ready_lanes GROUP BY job_type, tenant_id
),
lanes_seen AS (
    -- Each lane's row as the statement's snapshot has it (active NULL: none yet), one
    -- lanes_pkey probe per lane.  Under a held xmin horizon a probe visits every version
    -- of the lane row, so each lane is probed once here, not once by each CTE below
    -- (issue 43).  The snapshot is enough: a lane is parked only under its bucket's
    -- exclusive lock, and the caller holds it shared, so no park commits after it.
    SELECT r.job_type, r.tenant_id, x.active FROM lanes_ready r
    LEFT JOIN lanes x ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
     AND x.shard = jobfair_shard(r.tenant_id) {{shards.x}}
),
new_lanes AS (
    INSERT INTO lanes (job_type, tenant_id, shard, vtime, active, held)
    SELECT r.job_type, r.tenant_id, jobfair_shard(r.tenant_id),
           {{floor_r}}, true,
           EXISTS (SELECT 1 FROM tenants p WHERE p.tenant_id = r.tenant_id AND p.paused)
    -- Only a lane not there yet computes its floor: the floor reads the type's lanes by
    -- vtime, and under a held xmin horizon every dead version of them.
    FROM lanes_seen r WHERE r.active IS NULL
    ORDER BY r.job_type, r.tenant_id
    ON CONFLICT (job_type, tenant_id, shard) DO NOTHING
    RETURNING 1
),
woken AS (
    UPDATE lanes l
    SET active = true, vtime = GREATEST(l.vtime, {{floor_l}})
    WHERE {{shards_of_l}} (l.job_type, l.tenant_id) IN (
        -- Parked lanes only (an active one is not written), locked in key order.
        SELECT x.job_type, x.tenant_id FROM lanes x JOIN lanes_seen r
          ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
        WHERE r.active IS FALSE AND NOT x.active {{shards.x}}
        ORDER BY x.job_type, x.tenant_id
        FOR NO KEY UPDATE OF x)
    RETURNING 1
),
keys_seen AS (
    -- As lanes_seen, for the keys: one lane_keys_pkey probe per key.
    SELECT r.job_type, r.tenant_id, r.fairness_key, x.active FROM ready_lanes r
    LEFT JOIN lane_keys x ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
     AND x.fairness_key = r.fairness_key AND x.shard = jobfair_shard(r.tenant_id) {{shards.x}}
),
new_keys AS (
    INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)
    SELECT r.job_type, r.tenant_id, r.fairness_key, jobfair_shard(r.tenant_id),
           COALESCE(
    (SELECT min(x.vtime) FROM lane_keys x
     WHERE x.job_type = r.job_type AND x.tenant_id = r.tenant_id AND x.active {{shards.x}}),
    (SELECT max(x.vtime) FROM lane_keys x
     WHERE x.job_type = r.job_type AND x.tenant_id = r.tenant_id AND NOT x.active {{shards.x}}),
    0), true
    FROM keys_seen r WHERE r.active IS NULL
    ORDER BY r.job_type, r.tenant_id, r.fairness_key
    ON CONFLICT (job_type, tenant_id, fairness_key, shard) DO NOTHING
),
woken_keys AS (
    UPDATE lane_keys k
    SET active = true,
        vtime = GREATEST(k.vtime, COALESCE(
    (SELECT min(x.vtime) FROM lane_keys x
     WHERE x.job_type = k.job_type AND x.tenant_id = k.tenant_id AND x.active {{shards.x}}),
    (SELECT max(x.vtime) FROM lane_keys x
     WHERE x.job_type = k.job_type AND x.tenant_id = k.tenant_id AND NOT x.active {{shards.x}}),
    0))
    WHERE {{shards_of_k}} (k.job_type, k.tenant_id, k.fairness_key) IN (
        SELECT x.job_type, x.tenant_id, x.fairness_key FROM lane_keys x JOIN keys_seen r
          ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
         AND x.fairness_key = r.fairness_key
        WHERE r.active IS FALSE AND NOT x.active {{shards.x}}
        ORDER BY x.job_type, x.tenant_id, x.fairness_key
        FOR NO KEY UPDATE OF x)
),

-- fragment: floor_r
-- The virtual time a lane of the type ``r.job_type`` re-enters at (the fragment wake):
-- the smallest of the type's backlogged lanes not held at a cap or, when there is none,
-- the largest of all.
COALESCE(
    (SELECT min(x.vtime) FROM lanes x WHERE x.job_type = r.job_type AND x.active AND NOT x.held),
    (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = r.job_type),
    0)

-- fragment: floor_r @citus
-- On Citus read before the statement, across every node, and passed in (:reentry_types,
-- :reentry_vtimes; lanes' reentry_floors): the statement itself runs on one node.
COALESCE((SELECT f.vtime FROM unnest(:reentry_types::text[], :reentry_vtimes::float8[])
                                AS f(job_type, vtime) WHERE f.job_type = r.job_type), 0)

-- fragment: floor_l
-- As floor_r, of the lane ``l``'s type.
COALESCE(
    (SELECT min(x.vtime) FROM lanes x WHERE x.job_type = l.job_type AND x.active AND NOT x.held),
    (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = l.job_type),
    0)

-- fragment: floor_l @citus
COALESCE((SELECT f.vtime FROM unnest(:reentry_types::text[], :reentry_vtimes::float8[])
                                AS f(job_type, vtime) WHERE f.job_type = l.job_type), 0)

-- fragment: shards_of_l
-- The shards condition first in a WHERE of the lane ``l`` (shards.l without its AND).

-- fragment: shards_of_l @citus
l.shard = ANY(:shards::int2[]) AND

-- fragment: shards_of_k
-- As shards_of_l, of the key ``k``.

-- fragment: shards_of_k @citus
k.shard = ANY(:shards::int2[]) AND

-- name: reentry_floors @citus
-- Where a lane of :job_type re-enters (floor_r): read across every node before a write
-- that may wake lanes, which on Citus runs on one node.  Index: lanes_type_vtime_idx on
-- each shard.
SELECT COALESCE(
    (SELECT min(x.vtime) FROM lanes x WHERE x.job_type = :job_type AND x.active AND NOT x.held),
    (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = :job_type),
    0) AS floor


-- fragment: notified
-- Once per job type of ``ready_lanes``, "type n": how many of its jobs became ready.
-- Bounded, as a job type is at most 128 ASCII characters (JOB_TYPE_RE).
notified AS (
    SELECT pg_notify('{{NOTIFY_CHANNEL}}', job_type || ' ' || sum(n))
    FROM ready_lanes GROUP BY job_type
)

-- fragment: notified @citus
-- On Citus a NOTIFY in a statement routed to a worker node is heard on that node only:
-- the statement tells nobody, and the store notifies from the coordinator, where every
-- server listens, in the same transaction (app.db.citus).
notified AS (SELECT job_type FROM ready_lanes WHERE false)

-- name: wake_lanes
-- Marks lanes and their keys backlogged after jobs became ready (retry, lease expiry,
-- promotion, revive; one (:job_types, :tenant_ids, :fairness_keys) triple per job) and
-- notifies their job types with how many (the fragment wake).  Writes only lanes and
-- keys that were parked.  Index: lanes pkey, lane_keys pkey.  Locks: caller holds the
-- shared lane-bucket locks.
WITH ready_lanes AS (
    SELECT job_type, tenant_id, fairness_key, count(*) AS n
    FROM unnest(:job_types::text[], :tenant_ids::text[], :fairness_keys::text[])
         AS r(job_type, tenant_id, fairness_key)
    GROUP BY job_type, tenant_id, fairness_key
),
{{wake}}
{{notified}}
SELECT (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
       + (SELECT count(*) FROM woken)

-- fragment: charge
-- Charges lanes of :job_type their claimed jobs x stride of virtual time, from the floor
-- a rate-limited lane was lifted to (scheduler.rate_floor; NULL: none), and their keys
-- their claimed jobs x key stride: the CTEs ``charge`` and ``charged`` (tenant_id and new
-- vtime of each lane charged; lanes :tenants, jobs :counts, :strides, :floors) and
-- ``key_charge`` and ``key_charged`` the same for keys (:key_tenants, :keys,
-- :key_counts, :key_strides).  :served and :key_served (aligned with :tenants and :keys)
-- are added to the running counts of units served (``units_total``: by cost, the jobs'
-- costs; else 0).  Locks: the lane rows, in tenant order (the sub-select's sort sits
-- below its row locking), then the key rows, in (tenant, key) order (key_charge reads
-- charge whole first), until the statement commits -- asynchronously
-- (synchronous_commit = off for its own transaction only, set only when a lane is
-- charged): a crash can forget the last few hundred milliseconds of charges, which
-- fences nothing; the claim it accounts for was durable before it ran.  A pick advances
-- a lane or key at least scheduler.VTIME_RESOLUTION of its virtual time or MIN_STRIDE
-- (scheduler.advance).
charge AS (
    -- Each charged lane found by key and locked, in tenant order.
    SELECT x.tenant_id, c.n, c.stride, c.floor, c.served
    FROM {{charged_lanes}}
    JOIN lanes x ON x.job_type = :job_type AND x.tenant_id = c.tenant_id {{shards.x}}
    ORDER BY x.tenant_id
    FOR NO KEY UPDATE OF x
),
charged AS (
    UPDATE lanes l
    -- GREATEST ignores a NULL floor: only rate-limited lanes are lifted (ADR 028).
    SET vtime = {{charged_vtime}},
        activated_total = l.activated_total + c.n,
        units_total = l.units_total + COALESCE(c.served, 0)
    FROM charge c
    -- ANY(ARRAY(...)) keeps the update to one lanes_pkey probe per charged lane, as in
    -- the claim.  (An IN (...) of the locked keys made the generic plan a semi join
    -- comparing every charged lane with every other, slower than by key.)
    WHERE l.job_type = :job_type AND l.tenant_id = ANY(ARRAY(SELECT tenant_id FROM charge))
      AND l.tenant_id = c.tenant_id {{shards.l}}
      {{shards.commit_async}}
    RETURNING l.tenant_id, l.vtime
),
key_charge AS (
    -- Each charged key found by key and locked, in (tenant, key) order, once every
    -- charged lane is locked (the count reads charge whole).
    SELECT x.tenant_id, x.fairness_key, c.n, c.stride, c.served
    FROM {{charged_keys}}
    JOIN lane_keys x ON x.job_type = :job_type AND x.tenant_id = c.tenant_id
     AND x.fairness_key = c.fairness_key {{shards.x}}
    WHERE (SELECT count(*) FROM charge) >= 0
    ORDER BY x.tenant_id, x.fairness_key
    FOR NO KEY UPDATE OF x
),
key_charged AS (
    UPDATE lane_keys k
    SET vtime = k.vtime + c.n * GREATEST(c.stride, abs(k.vtime) * {{VTIME_RESOLUTION}}::float8, {{MIN_STRIDE}}::float8),
        activated_total = k.activated_total + c.n,
        units_total = k.units_total + COALESCE(c.served, 0)
    FROM key_charge c
    -- One lane_keys_pkey probe per charged key, driven by key_charge.  (ANY(ARRAY(...))
    -- of the tenants and of the keys, as for lanes, put both arrays in every probe's
    -- condition: 177 ms instead of 2 for 400 keys.)
    WHERE k.job_type = :job_type AND k.tenant_id = c.tenant_id AND k.fairness_key = c.fairness_key
      {{shards.commit_async}} {{shards.k}}
    RETURNING k.tenant_id, k.fairness_key
)

-- fragment: charged_lanes
-- The lanes a charge charges, as rows ``c``: tenant_id, jobs n, stride, floor (NULL:
-- none), units served (:tenants, :counts, :strides, :floors, :served).
unnest(:tenants::text[], :counts::int[], :strides::float8[],
                :floors::float8[], :served::float8[])
         AS c(tenant_id, n, stride, floor, served)

-- fragment: charged_keys
-- The keys a charge charges, as rows ``c``: tenant_id, fairness_key, jobs n, stride,
-- units served (:key_tenants, :keys, :key_counts, :key_strides, :key_served).
unnest(:key_tenants::text[], :keys::text[], :key_counts::int[],
                :key_strides::float8[], :key_served::float8[])
         AS c(tenant_id, fairness_key, n, stride, served)

-- fragment: charged_vtime
-- The vtime of lane ``l`` once charged ``c`` (scheduler.advance from its floor).
GREATEST(l.vtime, c.floor)
            + c.n * GREATEST(c.stride, abs(GREATEST(l.vtime, c.floor)) * {{VTIME_RESOLUTION}}::float8, {{MIN_STRIDE}}::float8)

-- fragment: charge_counted
-- The fragment charge's ``charged`` and ``key_charged``, counted and not written: each
-- charged lane's vtime as the charge would leave it (the same arithmetic, from the
-- lane's vtime now), and the charged keys.  Locks nothing; one lanes_pkey probe per
-- charged lane.
charged AS (
    SELECT l.tenant_id,
           {{charged_vtime}}
             AS vtime
    FROM {{charged_lanes}}
    JOIN lanes l ON l.job_type = :job_type AND l.tenant_id = c.tenant_id {{shards.l}}
),
key_charged AS (
    SELECT c.tenant_id, c.fairness_key
    FROM {{charged_keys}}
)

-- fragment: per_key
-- The per-key cap of the job type ``t``: its maxActivePerKey, and 1 at most where its keys
-- are FIFO (one job of a key at a time, ADR 041).
CASE WHEN t.key_ordering = 'fifo' THEN LEAST(t.max_active_per_key, 1)
     ELSE t.max_active_per_key END

-- fragment: read_head
-- The first row of a lane read: the job type's configuration, and whether it is paused.
-- Its max_active_jobs, a tenant's cap in the lanes' rows, is the type's per-key cap (1 at
-- most where its keys are FIFO, ADR 041); its fairness_key, a key in the keys' rows, is
-- the type's keyOrdering; its ready, whether any tenant has a minimum (ADR 042: the read
-- then reads their lanes too, read_min_lanes).  Index: job_types pkey, tenants_min_idx.
SELECT NULL AS tenant_id, NULL::float8 AS vtime, NULL::int AS weight,
       {{per_key}} AS max_active_jobs, t.max_active_jobs AS type_cap, t.aging_interval_ms,
       t.aging_step, EXISTS (SELECT 1 FROM tenants m WHERE m.min_active_jobs > 0) AS ready,
       NULL::bool AS scanned, t.paused IS TRUE AS paused,
       t.key_ordering AS fairness_key, t.rate_per_s IS NOT NULL AS rate_limited,
       t.fairness_by, NULL::float8 AS unit_est
FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = :job_type

-- fragment: read_emptied
-- The last rows of a lane read: the charged lanes, then keys, that have no ready job left
-- (one descent of jobs_ready_idx each, as the probes of read_lanes).
SELECT ch.tenant_id, ch.vtime, NULL, NULL, NULL, NULL, NULL, false, false, NULL, NULL, NULL,
       NULL, NULL
FROM charged ch WHERE NOT (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = ch.tenant_id)
         IS NOT NULL
UNION ALL
SELECT kc.tenant_id, NULL, NULL, NULL, NULL, NULL, NULL, false, false, NULL, kc.fairness_key,
       NULL, NULL, NULL
FROM key_charged kc WHERE NOT (SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = kc.tenant_id
            AND j.fairness_key = kc.fairness_key)
         IS NOT NULL

-- name: read_lanes
-- First charges the lanes and keys the previous rounds claimed from (the fragment charge;
-- empty arrays charge nothing), saving the round a statement and the wait for a separate
-- charge to commit.  Then reads the job type's configuration and, in (vtime, tenant)
-- order, the type's active lanes with their tenants' weight and cap, each probed for a
-- ready job when :limit is at most PROBED_LANES (one round trip).  The scan stops at the
-- lane after the (:limit + len(:tenants))-th ready one (the run condition on
-- ``readies``), or after SCANNED_LANES lanes: lanes that are active but empty (emptied a
-- moment ago, not yet parked) are answered, flagged not ready, for the caller to park,
-- and never take a ready lane's place -- so a read finds the ready lanes however many
-- emptied ones sit in front of them (work conservation, DESIGN 1.6; ADR 014).  Last come
-- the charged lanes and keys that have no ready job any more: their claim emptied them,
-- and the caller parks them too.
-- The read's snapshot predates the charge, so a charged lane's new vtime comes from
-- ``charged``; charges only move lanes later, so the first :limit ready lanes by new
-- vtime are among the first :limit + len(:tenants) by old (the caller keeps those).
-- Lanes held at their tenant's cap are not read at all (the index range skips them); nor
-- are paused tenants' lanes, held too (a lane a pause missed, made by a producer racing
-- with it, is filtered out here; it costs the read a row).  The first row says whether
-- the type is paused; then the caller claims nothing, whatever lanes follow.
-- The limit of the scan is a subquery, not a constant: a type with fewer lanes than
-- SCANNED_LANES made the generic plan, expecting to read them all, join every lane to its
-- tenant and sort them (2.6 ms a read at 2,000 lanes, against 0.5 ms in index order).
-- An unknown limit keeps the plan that stops early.  A lane's ready probe is max(), not
-- EXISTS: the min/max rewrite always descends jobs_ready_idx, where EXISTS let the
-- generic plan scan the heap for a first match (ADR 014); and the greatest key, not the
-- least: it reads the lane's last entry (its last key's youngest job), not a head, where
-- draining activators leave entries of jobs just claimed (dead, not yet pruned).
-- Index: lanes_type_vtime_idx (job_type, active, held, vtime, tenant_id), a range scan of
-- the lanes up to the stop, excluded ones (:exclude) included; one probe of
-- jobs_ready_idx per lane scanned (small reads) and per lane and key charged.
-- Locks: the charged lanes and keys.
WITH {{charge}}
{{lanes_read}}

-- name: read_lanes_counted
-- As read_lanes, with the charges counted and not written (charge_counted): while the
-- job table is degraded (ClaimHints, ADR 036) a process writes its charges at most
-- every LaneCharges.CHARGE_EVERY_S, and its reads in between count them.
WITH {{charge_counted}}
{{lanes_read}}

-- fragment: lanes_read
-- read_lanes after its charge: the type's head, its lanes, the charged ones emptied.
{{read_head}}
UNION ALL
SELECT w.tenant_id, COALESCE(ch.vtime, w.vtime), w.weight, w.max_active_jobs, NULL, NULL,
       NULL, w.ready, true, NULL, NULL, w.rate_limited, NULL, w.unit_est
FROM (SELECT s.*, count(*) FILTER (WHERE s.ready)
                    OVER (ORDER BY s.vtime, s.tenant_id ROWS UNBOUNDED PRECEDING) AS readies
      FROM (SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
                   t.rate_per_s IS NOT NULL AS rate_limited, l.unit_est,
                   CASE WHEN :limit <= {{PROBED_LANES}} THEN (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id)
         IS NOT NULL ELSE true END AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = :job_type AND l.active AND NOT l.held
              AND t.paused IS NOT TRUE AND l.tenant_id <> ALL(:exclude::text[])
            ORDER BY l.vtime, l.tenant_id
            LIMIT (SELECT {{SCANNED_LANES}})) s) w
LEFT JOIN charged ch ON ch.tenant_id = w.tenant_id
WHERE w.readies <= :limit + cardinality(:tenants::text[])
UNION ALL
{{read_emptied}}

-- name: read_lanes_of_tenants
-- As read_lanes, restricted to the caller's :tenant_ids.  A statement of its own (not an
-- ":tenant_ids IS NULL OR" branch) so that its generic plan can use lanes pkey.
WITH {{charge}}
{{lanes_read_of_tenants}}

-- name: read_lanes_of_tenants_counted
-- As read_lanes_of_tenants, with the charges counted and not written (read_lanes_counted).
WITH {{charge_counted}}
{{lanes_read_of_tenants}}

-- fragment: lanes_read_of_tenants
-- read_lanes_of_tenants after its charge.
{{read_head}}
UNION ALL
SELECT w.tenant_id, COALESCE(ch.vtime, w.vtime), w.weight, w.max_active_jobs, NULL, NULL,
       NULL, w.ready, true, NULL, NULL, w.rate_limited, NULL, w.unit_est
FROM (SELECT s.*, count(*) FILTER (WHERE s.ready)
                    OVER (ORDER BY s.vtime, s.tenant_id ROWS UNBOUNDED PRECEDING) AS readies
      FROM (SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
                   t.rate_per_s IS NOT NULL AS rate_limited, l.unit_est,
                   CASE WHEN :limit <= {{PROBED_LANES}} THEN (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id)
         IS NOT NULL ELSE true END AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = :job_type AND l.active AND NOT l.held
              AND t.paused IS NOT TRUE AND l.tenant_id <> ALL(:exclude::text[])
              AND l.tenant_id = ANY(:tenant_ids::text[])
            ORDER BY l.vtime, l.tenant_id
            LIMIT {{SCANNED_LANES}}) s) w
LEFT JOIN charged ch ON ch.tenant_id = w.tenant_id
WHERE w.readies <= :limit + cardinality(:tenants::text[])
UNION ALL
{{read_emptied}}

-- name: read_lanes_across @citus
-- read_lanes on Citus (and read_lanes_of_tenants, with :tenant_ids; NULL: every tenant,
-- which the call's custom plan folds away): the type's lanes read across every node,
-- without the charge in front (the store charges first, on each charged lane's node:
-- charge_lanes) and without the type's configuration (read_type_head) -- Citus runs a
-- statement that locks rows on one node only, and one that joins a reference table's row
-- to a read across nodes in three steps, the middle one's rows sent to every node.  This
-- is one step: each node answers its first SCANNED_LANES lanes in (vtime, tenant) order,
-- each probed for a ready job when :limit is at most PROBED_LANES (the probe names the
-- shard, j.shard = l.shard: Citus joins on it only), and the coordinator merges them;
-- the store stops at the lane after the :limit-th ready one, as read_lanes' run
-- condition does (app.db.lanes).  The limit is a constant: Citus refuses a subquery
-- there.
SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
       t.rate_per_s IS NOT NULL AS rate_limited, l.unit_est,
       CASE WHEN :limit <= {{PROBED_LANES}} THEN (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id
            AND j.shard = l.shard)
         IS NOT NULL ELSE true END AS ready
FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
WHERE l.job_type = :job_type AND l.active AND NOT l.held
  AND t.paused IS NOT TRUE AND l.tenant_id <> ALL(:exclude::text[])
  AND (:tenant_ids::text[] IS NULL OR l.tenant_id = ANY(:tenant_ids::text[]))
ORDER BY l.vtime, l.tenant_id
LIMIT {{SCANNED_LANES}}

-- name: read_type_head @citus
-- On Citus, the first row of a lane read (read_head) on its own: a reference table's
-- row, read on the coordinator.
{{read_head}}

-- name: read_keys
-- The keys of the lanes a round allotted picks to (:tenants, with :wants: how many keys
-- to read of each), in (vtime, key) order, their weights (a key without a row weighs 1)
-- and caps (NULL: none; alembic 0016),
-- and each probed for a ready job when its lane asks for at most PROBED_LANES keys: for
-- scheduler.split_among_keys to divide each lane's picks among.  Active keys only; the
-- ones a call already excluded (:exclude_tenants, :exclude_keys: tenant and key pairs)
-- are skipped.  A lane whose read stops at its limit may have more ready keys beyond.  A
-- key's ready probe descends jobs_ready_idx to the key's youngest entry (min(priority),
-- its last), as read_lanes' lane probe.
-- Index: lane_keys_vtime_idx (job_type, tenant_id, active, vtime, fairness_key), a range
-- scan per lane up to its limit; key_weights pkey; one probe of jobs_ready_idx per key of
-- a small read.  No locks: the claim locks the jobs it takes.
SELECT a.tenant_id, k.fairness_key, k.vtime, COALESCE(w.weight, 1) AS weight, k.ready,
       w.max_active_jobs AS cap
FROM unnest(:tenants::text[], :wants::int[]) AS a(tenant_id, want)
CROSS JOIN LATERAL (
    SELECT x.fairness_key, x.vtime,
           CASE WHEN a.want <= {{PROBED_LANES}} THEN (SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = x.tenant_id
            AND j.fairness_key = x.fairness_key {{shards.j}})
         IS NOT NULL ELSE true END AS ready
    FROM lane_keys x
    WHERE x.job_type = :job_type AND x.tenant_id = a.tenant_id AND x.active AND NOT x.held
      {{shards.x}}
      AND NOT EXISTS (SELECT 1 FROM unnest(:exclude_tenants::text[], :exclude_keys::text[])
                             AS e(tenant_id, fairness_key)
                      WHERE e.tenant_id = x.tenant_id AND e.fairness_key = x.fairness_key)
    ORDER BY x.vtime, x.fairness_key
    LIMIT a.want
) k
LEFT JOIN key_weights w ON w.tenant_id = a.tenant_id AND w.fairness_key = k.fairness_key {{shards.w}}

-- name: charge_lanes
-- Charges each lane (jobs claimed) x stride of virtual time, and each key (jobs claimed)
-- x key stride (the fragment charge), after the claim committed (so no claim holds lane
-- rows across its WAL flush; ADR 001).  read_lanes carries the same charge in front of
-- its read.  Answers the charged lanes that have no ready job left, and the charged keys
-- (their tenant and key) that have none: their claim emptied them (the charge runs after
-- the claim committed, so the last claim of a lane sees it empty), and the caller parks
-- them (ADR 014).  Index: lanes pkey, lane_keys pkey, one probe of jobs_ready_idx per
-- lane and key.
WITH {{charge}}
SELECT ch.tenant_id, NULL AS fairness_key FROM charged ch WHERE NOT (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = ch.tenant_id {{shards.j}})
         IS NOT NULL
UNION ALL
SELECT kc.tenant_id, kc.fairness_key FROM key_charged kc WHERE NOT (SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = kc.tenant_id
            AND j.fairness_key = kc.fairness_key {{shards.j}})
         IS NOT NULL

-- name: hold_lanes
-- Marks lanes of :job_type held: their tenants (:tenant_ids) are at their caps as counted
-- by the claim that holds their cap locks, which it will hold until this commits.  A lane
-- read skips held lanes; jobfair_release_holds, which takes the same locks first,
-- releases them when the tenant's capacity frees (ADR 016).  Index: lanes pkey.
-- Locks: the lane rows.
UPDATE lanes l SET held = true, held_count = l.held_count + 1
WHERE l.job_type = :job_type AND l.tenant_id = ANY(:tenant_ids::text[]) AND NOT l.held {{shards.l}}

-- name: release_gate_shared @citus
-- On Citus, jobfair_release_holds's first step (it cannot run there as one function: its
-- statements join lanes of many nodes to the reference table tenants): the release gate,
-- shared (app.db.holds; the protocol in app.db.lanes).
SELECT pg_advisory_xact_lock_shared({{RELEASE_GATE_CLASS}}, 0)

-- name: caps_of @citus
-- jobfair_release_holds's choice of tenants, on Citus: whether each of :tenant_ids has a
-- cap, and whether it is paused (the reference table: on the coordinator).
SELECT t.tenant_id, t.max_active_jobs IS NOT NULL AS capped, t.paused
FROM tenants t WHERE t.tenant_id = ANY(:tenant_ids::text[])

-- name: finished_caps @citus
-- What a finish on Citus reads after the release gate (one round trip, the reference
-- tables on the coordinator): caps_of's rows for :tenant_ids (kind 'tenant'), and the
-- types of the ended activations (:job_types, :ended_tenants) whose type or tenant has
-- a cap (kind 'type': capped_types).
SELECT 'tenant' AS kind, t.tenant_id AS name, t.max_active_jobs IS NOT NULL AS capped,
       t.paused
FROM tenants t WHERE t.tenant_id = ANY(:tenant_ids::text[])
UNION ALL
SELECT DISTINCT 'type', x.job_type, true, false
FROM unnest(:job_types::text[], :ended_tenants::text[]) AS x(job_type, tenant_id)
WHERE EXISTS (SELECT 1 FROM job_types t WHERE t.job_type = x.job_type
                AND t.max_active_jobs IS NOT NULL)
   OR EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = x.tenant_id
                AND t.max_active_jobs IS NOT NULL)

-- name: held_of @citus
-- The held lanes of :tenant_ids (in :shards, theirs), by tenant and type: on the nodes
-- that hold those shards.  Index: a read of the tenants' lanes on each.
SELECT DISTINCT l.tenant_id, l.job_type FROM lanes l
WHERE l.held AND l.tenant_id = ANY(:tenant_ids::text[]) AND l.shard = ANY(:shards::int2[])

-- name: lock_caps_of @citus
-- The cap locks of :tenant_ids, in key order (jobfair_lock_tenant_caps), held until the
-- transaction ends.
SELECT jobfair_lock_tenant_caps({{TENANT_CAP_LOCK_CLASS}}, :tenant_ids::text[])

-- name: unhold_lanes @citus
-- jobfair_release_holds's release, on Citus, of one Citus shard's tenants (:tenant_ids,
-- not paused, their cap locks held): their held lanes let go, each re-entering at its
-- type's floor if it fell behind it (floor_l, read across every node before).  Answers
-- the types released, which the store notifies from the coordinator.
UPDATE lanes l SET held = false, vtime = GREATEST(l.vtime, {{floor_l}})
WHERE l.held AND l.tenant_id = ANY(:tenant_ids::text[]) {{shards.l}}
RETURNING l.job_type

-- name: notify @citus
-- A NOTIFY on :channel with :payload, sent from the coordinator (no table: Citus runs it
-- there), where every server listens.
SELECT pg_notify(:channel::text, :payload::text)

-- name: notify_all @citus
-- NOTIFYs on :channels with :payloads, one each, in one round trip, from the coordinator.
SELECT count(pg_notify(n.channel, n.payload))
FROM unnest(:channels::text[], :payloads::text[]) AS n(channel, payload)

-- name: release_key_holds_of
-- After jobs (:job_types, :tenants, :keys: triples) became ready again without a finish
-- (promoted from SCHEDULED, or revived from FAILED), in that transaction: the held keys
-- of theirs that have a cap or a FIFO type let go (jobfair_release_key_holds, alembic
-- 0017): a FIFO key held while its head backed off or failed has a CREATED head again
-- (ADR 041).  Two probes when no key has a cap and no type is FIFO.
SELECT jobfair_release_key_holds({{KEY_CAP_LOCK_CLASS}}, {{RELEASE_GATE_CLASS}},
    :tenants::text[], :keys::text[], :job_types::text[], '{{NOTIFY_CHANNEL}}')

-- name: read_min_lanes
-- The lanes of :job_type whose tenants are below their minimum (ADR 042), read beside a
-- lane read whatever their virtual time: active, not held, not paused, not :exclude, of
-- :tenant_ids (NULL: every tenant), with a ready job, and fewer ACTIVATED jobs than the
-- minimum (counted without a lock: the claim counts again under the tenant's); in
-- (vtime, tenant) order, :limit at most.  As a lane read's rows, with the minimum.  Cost:
-- a count and a probe per tenant with a minimum (each count stops at the minimum).
-- Index: tenants_min_idx, lanes pkey, jobs_active_tenant_idx, jobs_ready_idx.
SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
       t.rate_per_s IS NOT NULL AS rate_limited, l.unit_est, t.min_active_jobs
FROM tenants t
JOIN lanes l ON l.job_type = :job_type AND l.tenant_id = t.tenant_id
WHERE t.min_active_jobs > 0 AND t.paused IS NOT TRUE
  AND l.active AND NOT l.held AND l.tenant_id <> ALL(:exclude::text[])
  AND (:tenant_ids::text[] IS NULL OR l.tenant_id = ANY(:tenant_ids::text[]))
  AND (SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED'
                               AND j.tenant_id = t.tenant_id LIMIT t.min_active_jobs) a)
      < t.min_active_jobs
  AND (SELECT max(j.fairness_key) FROM jobs j
       WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id)
      IS NOT NULL
ORDER BY l.vtime, l.tenant_id
LIMIT :limit
