-- name: lock_and_count
-- A capped claim's cap locks and, read after them, its counts and token buckets, in one
-- round trip: jobfair_lock_and_count (alembic 0014), which takes the type's lock
-- (:type_lock_class, :type_lock_key; a NULL key takes none) and the tenants'
-- (:tenant_lock_class, :lock_tenants) in key order, then reads -- each statement of a
-- volatile function takes its own snapshot, so these see every claim that committed
-- before the locks were this one's -- the instant (kind 'now', in ``at``), the type's
-- ACTIVATED jobs up to its cap (:job_type, :type_cap; 'type'), each capped tenant's cap
-- and ACTIVATED jobs up to it (:capped; 'tenant'), and the buckets of the type (if
-- :type_limited; 'type_bucket') and of the tenants :limited ('tenant_bucket').
-- Index: jobs_active_type_idx, jobs_active_tenant_idx, tenants pkey, job_types pkey.
SELECT * FROM jobfair_lock_and_count(:type_lock_class, :type_lock_key, :tenant_lock_class,
                                     :lock_tenants::text[], :job_type, :type_cap,
                                     :capped::text[], :type_limited, :limited::text[])

-- name: lock_caps @citus
-- lock_and_count's locks alone, on Citus (its counts are count_caps, the next statement):
-- the type's cap lock (:type_lock_class, :type_lock_key; NULL takes none), then the
-- tenants' (:tenant_lock_class, :lock_tenants) in key order.  Advisory locks are the
-- coordinator's: every server talks to the coordinator, so they are as global as on one
-- PostgreSQL (docs/scaling.md).
SELECT (SELECT count(pg_advisory_xact_lock(:type_lock_class::int, :type_lock_key::int))
        WHERE :type_lock_key::int IS NOT NULL) AS type_locked,
       jobfair_lock_tenant_caps(:tenant_lock_class::int, :lock_tenants::text[]) AS tenants_locked

-- name: count_caps @citus
-- lock_and_count's reads, on Citus, in a statement after lock_caps (so a snapshot taken
-- once the locks were this claim's, on the coordinator and on each node): the instant,
-- the type's ACTIVATED jobs (its cap :type_cap at most), each capped tenant's
-- (:capped), across every node, and the buckets, as lock_and_count answers them.
-- Index: jobs_active_type_idx and jobs_active_tenant_idx on each shard.
WITH type_active AS (
    SELECT count(*) AS active FROM jobs j
    WHERE j.state = 'ACTIVATED' AND j.job_type = :job_type AND :type_cap::int IS NOT NULL
),
tenant_active AS (
    SELECT j.tenant_id, count(*) AS active FROM jobs j
    WHERE j.state = 'ACTIVATED' AND j.tenant_id = ANY(:capped::text[])
    GROUP BY j.tenant_id
)
SELECT 'now'::text AS kind, NULL::text AS name, NULL::int AS cap, NULL::bigint AS active,
       NULL::float8 AS per_s, NULL::float8 AS burst, NULL::float8 AS tokens,
       clock_timestamp() AS at
UNION ALL
SELECT 'type', :job_type, :type_cap::int,
       LEAST((SELECT active FROM type_active), :type_cap::int), NULL, NULL, NULL, NULL
WHERE :type_cap::int IS NOT NULL
UNION ALL
SELECT 'tenant', t.tenant_id, t.max_active_jobs,
       LEAST(COALESCE((SELECT a.active FROM tenant_active a WHERE a.tenant_id = t.tenant_id), 0),
             t.max_active_jobs), NULL, NULL, NULL, NULL
FROM tenants t WHERE t.tenant_id = ANY(:capped::text[]) AND t.max_active_jobs IS NOT NULL
UNION ALL
SELECT 'type_bucket', y.job_type, NULL, NULL, y.rate_per_s, y.rate_burst, y.rate_tokens,
       y.rate_at
FROM job_types y WHERE :type_limited AND y.job_type = :job_type AND y.rate_per_s IS NOT NULL
UNION ALL
SELECT 'tenant_bucket', t.tenant_id, NULL, NULL, t.rate_per_s, t.rate_burst,
       t.rate_tokens, t.rate_at
FROM tenants t WHERE t.tenant_id = ANY(:limited::text[]) AND t.rate_per_s IS NOT NULL

-- name: take_tokens
-- What a rate-limited claim left in its buckets (scheduler.Bucket.take), written in its
-- transaction before the cap locks go: the type's (its :type_tokens at :type_at; NULL
-- tokens: none taken) and the tenants' (:tenants, :tokens, :at).  A bucket whose limit
-- changed since the claim read it (its rate_at is not the one read, :type_read_at and
-- :read_at) keeps the change: a new limit starts with its own bucket.
-- Index: job_types pkey, tenants pkey.  Locks: the rows (a job type's change writes its
-- row without the cap lock, and is waited for).
WITH type_taken AS (
    UPDATE job_types SET rate_tokens = :type_tokens, rate_at = :type_at
    WHERE :type_tokens::float8 IS NOT NULL AND job_type = :job_type AND rate_at = :type_read_at
    RETURNING 1
)
UPDATE tenants t SET rate_tokens = u.tokens, rate_at = u.at
FROM unnest(:tenants::text[], :tokens::float8[], :at::timestamptz[], :read_at::timestamptz[])
     AS u(tenant_id, tokens, at, read_at)
WHERE t.tenant_id = u.tenant_id AND t.rate_at = u.read_at

-- name: take_tokens @citus
-- take_tokens on Citus, the tenants' buckets alone (Citus runs no statement that writes
-- two reference tables): the type's is take_type_tokens.
UPDATE tenants t SET rate_tokens = u.tokens, rate_at = u.at
FROM unnest(:tenants::text[], :tokens::float8[], :at::timestamptz[], :read_at::timestamptz[])
     AS u(tenant_id, tokens, at, read_at)
WHERE t.tenant_id = u.tenant_id AND t.rate_at = u.read_at

-- name: take_type_tokens @citus
-- take_tokens' type bucket, on Citus a statement of its own (:type_tokens at :type_at,
-- where its rate_at is still :type_read_at).
UPDATE job_types SET rate_tokens = :type_tokens, rate_at = :type_at
WHERE job_type = :job_type AND rate_at = :type_read_at

-- fragment: effective_priority
-- A job's effective priority: min(100, priority + step x whole intervals waited), of the
-- row ``u`` (its priority and queued_at) at :now, with the ``aging`` CTE's step and
-- interval.  Twin of app.scheduler.effective_priority; tests/integration/test_twins.py
-- checks that the two agree (through the statement effective_priority_of).  The wait
-- is computed in numeric (extract returns numeric), so a wait of exactly k intervals ages
-- k steps, as the Python twin's whole microseconds do.
LEAST(100, u.priority + (SELECT step FROM aging) * floor(
               GREATEST(0, extract(epoch FROM (:now::timestamptz - u.queued_at)) * 1000)
               / (SELECT interval_ms FROM aging)))

-- name: effective_priority_of
-- The fragment effective_priority alone, of one (:priority, :queued_at) at :now with
-- (:step, :interval_ms): what the twin test compares with the Python.
WITH aging AS (SELECT :step::int AS step, :interval_ms::int AS interval_ms)
SELECT {{effective_priority}} AS eff
FROM (SELECT :priority::int AS priority, :queued_at::timestamptz AS queued_at) u

-- fragment: since_p
-- Where the heads of the priority ``p.priority`` of the allotted key ``p`` start: its
-- hint's queued_at when the key has one at that priority (ClaimHints), else from the
-- first.
CASE WHEN p.priority = p.hint_priority THEN p.since ELSE '-infinity'::timestamptz END

-- fragment: claim_heads
-- Up to k jobs from each allotted key of each allotted lane (the CTE ``alloc``: tenant_id,
-- fairness_key, k) of :job_type (scheduler.split_among_keys), best effective priority
-- first within the key, shared out among the requests: the CTEs prios, heads, chosen,
-- promoted and ``taken`` (job_key, share).
-- Index: jobs_ready_idx (job_type, tenant_id, fairness_key, priority DESC, queued_at,
--   job_key) WHERE state = 'CREATED'.  Per key a recursive skip scan finds the distinct
--   priorities (one index descent each, at most 101); each priority's head yields up to k
--   rows in FIFO order, which within one priority is also aging order.  The best k of
--   those heads are the key's best k jobs.  Cost O(k x P x log N), never a backlog scan.
-- Locks: FOR UPDATE SKIP LOCKED, so concurrent activators of the same lane pass each
--   other (each takes the next unlocked rows) instead of queueing.  Only the top
--   priority's heads are locked as they are read; lower priorities' heads are read
--   without locks and, when aging promotes some of them into the best k, that many rows
--   of their priority are locked from its head (promoted).  Locking every priority's k
--   heads made concurrent claims skip rows that were never going to be taken, and hand
--   out younger jobs while older ones sat locked by a claim that would not take them
--   (ADR 003; tests/integration/test_claim.py).
prios AS (
    SELECT a.tenant_id, a.fairness_key, a.k, true AS top, a.hint_priority, a.since,
           CASE WHEN a.since IS NULL THEN
               (SELECT max(j.priority) FROM jobs j
                 WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = a.tenant_id
                   AND j.fairness_key = a.fairness_key {{shards.j}})
           ELSE COALESCE(
               (SELECT max(j.priority) FROM jobs j
                 WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = a.tenant_id
                   AND j.fairness_key = a.fairness_key AND j.priority > a.hint_priority {{shards.j}}),
               (SELECT j.priority FROM jobs j
                 WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = a.tenant_id
                   AND j.fairness_key = a.fairness_key AND j.priority = a.hint_priority
                   AND j.queued_at >= a.since {{shards.j}}
                 ORDER BY j.queued_at LIMIT 1),
               (SELECT max(j.priority) FROM jobs j
                 WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = a.tenant_id
                   AND j.fairness_key = a.fairness_key AND j.priority < a.hint_priority {{shards.j}}))
           END AS priority
    FROM alloc a
  UNION ALL
    SELECT p.tenant_id, p.fairness_key, p.k, false, p.hint_priority, p.since,
           (SELECT max(j.priority) FROM jobs j
             WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = p.tenant_id
               AND j.fairness_key = p.fairness_key AND j.priority < p.priority {{shards.j}})
    FROM prios p WHERE p.priority IS NOT NULL
),
heads AS (
    -- Each priority's heads: locked for the top priority, read for the others.
    SELECT u.*, {{effective_priority}} AS eff
    FROM (SELECT h.job_key, p.tenant_id, p.fairness_key, p.priority, p.k, p.top,
                 h.queued_at
          FROM prios p
          CROSS JOIN LATERAL (
              SELECT j.job_key, j.queued_at FROM jobs j
              WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = p.tenant_id
                AND j.fairness_key = p.fairness_key AND j.priority = p.priority {{shards.j}}
                AND j.queued_at >= {{since_p}}
              ORDER BY j.queued_at, j.job_key
              LIMIT p.k
              FOR UPDATE SKIP LOCKED
          ) h
          WHERE p.top AND p.priority IS NOT NULL
      UNION ALL
          SELECT h.job_key, p.tenant_id, p.fairness_key, p.priority, p.k, p.top,
                 h.queued_at
          FROM prios p
          CROSS JOIN LATERAL (
              SELECT j.job_key, j.queued_at FROM jobs j
              WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = p.tenant_id
                AND j.fairness_key = p.fairness_key AND j.priority = p.priority {{shards.j}}
                AND j.queued_at >= {{since_p}}
              ORDER BY j.queued_at, j.job_key
              LIMIT p.k
          ) h
          WHERE NOT p.top AND p.priority IS NOT NULL) u
),
chosen AS (
    SELECT job_key, tenant_id, fairness_key, priority, top FROM (
        SELECT job_key, tenant_id, fairness_key, priority, k, top,
               row_number() OVER (PARTITION BY tenant_id, fairness_key
                                  ORDER BY eff DESC, queued_at, job_key) AS rn
        FROM heads
    ) ranked
    WHERE rn <= k
),
promoted AS (
    SELECT h.job_key
    FROM (SELECT c.tenant_id, c.fairness_key, c.priority, count(*)::int AS n,
                 min(a.hint_priority) AS hint_priority, min(a.since) AS since
          FROM chosen c JOIN alloc a ON a.tenant_id = c.tenant_id AND a.fairness_key = c.fairness_key
          WHERE NOT c.top GROUP BY c.tenant_id, c.fairness_key, c.priority) s
    CROSS JOIN LATERAL (
        SELECT j.job_key FROM jobs j
        WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = s.tenant_id
          AND j.fairness_key = s.fairness_key AND j.priority = s.priority {{shards.j}}
          AND j.queued_at >= CASE WHEN s.priority = s.hint_priority THEN s.since
                                  ELSE '-infinity'::timestamptz END
        ORDER BY j.queued_at, j.job_key
        LIMIT s.n
        FOR UPDATE SKIP LOCKED
    ) h
),
taken AS (
    -- The taken rows shared out among the requests: the i-th gets row numbers from
    -- :starts[i] up to the next one's start (with the i-th of :workers and :deadlines).
    SELECT t.job_key, width_bucket(row_number() OVER (), :starts::int[]) AS share
    FROM (SELECT job_key FROM chosen WHERE top UNION ALL SELECT job_key FROM promoted) t
),

-- fragment: fifo_heads
-- claim_heads for a type whose keys are FIFO (ADR 041): from each allotted key (``alloc``;
-- k is at most 1, the room jobfair_lock_and_count_keys counted under the key's lock: it
-- has no job ACTIVATED), its head -- its first job in key order waiting: CREATED,
-- SCHEDULED or FAILED -- if that is CREATED, and nothing else of the key, whatever the
-- priorities.  The head is
-- read without a lock and then locked, SKIP LOCKED and re-checked CREATED: a claim never
-- passes a head that another transaction holds to take the job behind it.
-- Index: jobs_waiting_key_idx (one descent per key), jobs pkey.
fifo_open AS (
    SELECT h.job_key
    FROM alloc a
    CROSS JOIN LATERAL (
        SELECT j.job_key, j.state FROM jobs j
        WHERE (j.state IN ('CREATED', 'SCHEDULED', 'FAILED')) IS TRUE
          AND j.job_type = :job_type AND j.tenant_id = a.tenant_id
          AND j.fairness_key = a.fairness_key {{shards.j}}
        ORDER BY j.job_key
        LIMIT 1
    ) h
    WHERE a.k > 0 AND h.state = 'CREATED'
),
fifo_locked AS (
    SELECT j.job_key FROM jobs j
    WHERE j.job_key = ANY(ARRAY(SELECT job_key FROM fifo_open)) AND j.state = 'CREATED' {{shards.j}}
    FOR UPDATE SKIP LOCKED
),
taken AS (
    SELECT f.job_key, width_bucket(row_number() OVER (), :starts::int[]) AS share
    FROM fifo_locked f
),

-- fragment: activated
-- The ``taken`` jobs activated at :now, each with its share's worker and lease, and what
-- its activation is charged (ADR 029): by worker time, its lane's estimate of the
-- seconds its lease will be held (scheduler.job_units; DEFAULT_LEASE_ESTIMATE_S before
-- one of the lane's jobs finished), settled when the lease ends; NULL by activations or
-- cost, whose charge is exact (a job's cost is in its row).  The type's mode is an
-- InitPlan, read once per claim; the lane's estimate one lanes pkey probe per job, made
-- only by worker time (CASE evaluates it only then).  No lane row is locked here:
-- charging is lanes' charge_lanes, after this statement has committed.  The shares'
-- workers and leases are joined as rows, not subscripted ((:workers)[t.share]): Citus
-- 13.2.2 crashed its backend on an UPDATE whose SET subscripts an array by a joined
-- column (docs/scaling.md).
activated AS (
    UPDATE jobs j
    SET state = 'ACTIVATED', activation_count = j.activation_count + 1,
        worker = s.worker, deadline = s.deadline,
        activated_at = :now::timestamptz, via_stream = :via_stream,
        charged = CASE WHEN (SELECT t.fairness_by FROM job_types t WHERE t.job_type = :job_type) = 'workerTime'
                  THEN COALESCE((SELECT l.unit_est FROM lanes l
                                 WHERE l.job_type = :job_type AND l.tenant_id = j.tenant_id {{shards.l}}),
                                {{DEFAULT_LEASE_ESTIMATE_S}}::float8) END
    FROM taken t
    JOIN unnest(:workers::text[], :deadlines::timestamptz[]) WITH ORDINALITY
         AS s(worker, deadline, share) ON s.share = t.share
    -- ANY(ARRAY(...)) makes this a primary-key probe per chosen row; a join alone lets
    -- the planner (misled by LIMIT k estimates) pick a sequential scan of jobs.
    WHERE j.job_key = ANY(ARRAY(SELECT job_key FROM taken)) AND t.job_key = j.job_key {{shards.j}}
    RETURNING t.share, {{J_JOB_COLUMNS}}
),

-- fragment: activated_by_worker_time
-- As activated, for a type fair by worker time: each job also records the virtual times
-- its estimate adds to its lane and its key, per their weights as they are now (a
-- tenants and a key_weights pkey probe each; lane_charge, key_charge).  The round
-- charges the lane and key exactly these (app.scheduler.round_charges), and the
-- settlement takes exactly these back, so a weight changed while the lease is out moves
-- nothing it should not (a helper's runs: a weight lowered while a claim was in flight
-- banked the lane 1,500 s of worker time when charge and settlement each read the
-- weight of their own moment).  Claims by activations or cost leave them out: their two
-- CASEs cost a claim 6 to 7 % (p50; docs/benchmarks.md).  A type switched to worker time
-- between what a process saw and its claim has that claim's jobs settled at the weights
-- of their end, as before alembic 0013.
activated AS (
    UPDATE jobs j
    SET state = 'ACTIVATED', activation_count = j.activation_count + 1,
        worker = s.worker, deadline = s.deadline,
        activated_at = :now::timestamptz, via_stream = :via_stream,
        charged = CASE WHEN (SELECT t.fairness_by FROM job_types t WHERE t.job_type = :job_type) = 'workerTime'
                  THEN COALESCE((SELECT l.unit_est FROM lanes l
                                 WHERE l.job_type = :job_type AND l.tenant_id = j.tenant_id {{shards.l}}),
                                {{DEFAULT_LEASE_ESTIMATE_S}}::float8) END,
        lane_charge = CASE WHEN (SELECT t.fairness_by FROM job_types t WHERE t.job_type = :job_type) = 'workerTime'
                      THEN COALESCE((SELECT l.unit_est FROM lanes l
                                     WHERE l.job_type = :job_type AND l.tenant_id = j.tenant_id {{shards.l}}),
                                    {{DEFAULT_LEASE_ESTIMATE_S}}::float8)
                           / COALESCE((SELECT t.weight FROM tenants t
                                       WHERE t.tenant_id = j.tenant_id), 1) END,
        key_charge = CASE WHEN (SELECT t.fairness_by FROM job_types t WHERE t.job_type = :job_type) = 'workerTime'
                     THEN COALESCE((SELECT l.unit_est FROM lanes l
                                    WHERE l.job_type = :job_type AND l.tenant_id = j.tenant_id {{shards.l}}),
                                   {{DEFAULT_LEASE_ESTIMATE_S}}::float8)
                          / COALESCE((SELECT w.weight FROM key_weights w
                                      WHERE w.tenant_id = j.tenant_id
                                        AND w.fairness_key = j.fairness_key
                                        AND w.shard = jobfair_shard(j.tenant_id) {{shards.w}}), 1) END
    FROM taken t
    JOIN unnest(:workers::text[], :deadlines::timestamptz[]) WITH ORDINALITY
         AS s(worker, deadline, share) ON s.share = t.share
    WHERE j.job_key = ANY(ARRAY(SELECT job_key FROM taken)) AND t.job_key = j.job_key {{shards.j}}
    RETURNING t.share, {{J_JOB_COLUMNS}}
),

-- fragment: trimmed
-- A claim writes no history (an activation is recorded when it ends), but once a job is
-- past the windows it keeps (app.db.history), it drops the activation that leaves the
-- latest one: a filter on the claimed rows (``activated``), so no probe before a job's
-- KEPT_ACTIVATIONS + 1st activation.  Index: job_events pkey.  Locks: the rows it
-- deletes, of jobs the claim holds.
trimmed AS (
    DELETE FROM job_events e USING activated s
    WHERE s.activation_count > {{KEPT_ACTIVATIONS}}
      AND e.job_key = s.job_key AND e.shard = jobfair_key_shard(s.job_key)
      AND e.activation_count = s.activation_count - {{LAST_ACTIVATIONS}} {{shards.e}}
      AND {{history.on}}
)

-- fragment: alloc
-- A claim's allotment, as the scheduler decided it: :counts jobs of each (:tenants,
-- :keys), and the type's aging (:aging_step, :aging_interval_ms) as the rounds read it.
alloc AS (
    SELECT * FROM unnest(:tenants::text[], :keys::text[], :counts::int[],
                         :hint_priorities::int[], :since::timestamptz[])
             AS a(tenant_id, fairness_key, k, hint_priority, since)
),
aging AS (SELECT :aging_step::int AS step, :aging_interval_ms::int AS interval_ms),

-- fragment: held
-- A capped claim's holds (ADR 016), in the claim's own statement: the lanes of the capped
-- tenants (:hold_tenants, with their room as counted under their cap locks, :hold_room)
-- that the claim leaves with no room (scheduler.left_at_cap) are held out of later
-- reads.  Index: lanes pkey.  Locks: the lane rows, after the jobs'.
held AS (
    UPDATE lanes l SET held = true, held_count = l.held_count + 1
    WHERE l.job_type = :job_type AND NOT l.held {{shards.l}} AND l.tenant_id = ANY(ARRAY(
        SELECT r.tenant_id FROM unnest(:hold_tenants::text[], :hold_room::int[]) AS r(tenant_id, room)
        WHERE r.room <= (SELECT count(*) FROM activated a WHERE a.tenant_id = r.tenant_id)))
)

-- name: claim
-- Activates up to :counts jobs from each allotted key of each allotted lane of one job
-- type (the fragments claim_heads and activated), best effective priority first within
-- the key.  Index and locks: claim_heads'.  History: trimmed.
WITH RECURSIVE {{alloc}}
{{claim_heads}}
{{activated}}
{{trimmed}}
SELECT * FROM activated

-- name: claim_by_worker_time
-- As claim, for a type fair by worker time: each job also records the virtual time its
-- estimate adds to its lane and its key (lane_charge, key_charge; ADR 029).
WITH RECURSIVE {{alloc}}
{{claim_heads}}
{{activated_by_worker_time}}
{{trimmed}}
SELECT * FROM activated

-- name: claim_holding
-- As claim, for a claim under cap locks: it also holds the lanes of the capped tenants
-- (:hold_tenants) it leaves with no room (:hold_room: each one's room as counted under
-- its lock), in the same statement (one round trip less with the locks held;
-- hold_lanes, ADR 016).
WITH RECURSIVE {{alloc}}
{{claim_heads}}
{{activated}}
{{trimmed}},
{{held}}
SELECT * FROM activated

-- name: claim_holding_by_worker_time
-- As claim_holding, for a type fair by worker time (claim_by_worker_time).
WITH RECURSIVE {{alloc}}
{{claim_heads}}
{{activated_by_worker_time}}
{{trimmed}},
{{held}}
SELECT * FROM activated

-- name: claim_fifo
-- As claim, for a type whose keys are FIFO: each allotted key's head (fifo_heads).
WITH RECURSIVE {{alloc}}
{{fifo_heads}}
{{activated}}
{{trimmed}}
SELECT * FROM activated

-- name: claim_fifo_by_worker_time
-- As claim_fifo, fair by worker time (claim_by_worker_time).
WITH RECURSIVE {{alloc}}
{{fifo_heads}}
{{activated_by_worker_time}}
{{trimmed}}
SELECT * FROM activated

-- name: claim_fifo_holding
-- As claim_holding, for a type whose keys are FIFO (fifo_heads).
WITH RECURSIVE {{alloc}}
{{fifo_heads}}
{{activated}}
{{trimmed}},
{{held}}
SELECT * FROM activated

-- name: claim_fifo_holding_by_worker_time
-- As claim_fifo_holding, fair by worker time.
WITH RECURSIVE {{alloc}}
{{fifo_heads}}
{{activated_by_worker_time}}
{{trimmed}},
{{held}}
SELECT * FROM activated

-- fragment: lead_type
-- The type's configuration for a lead claim: nothing if it is paused; its caps, rate
-- and aging (the server's defaults :default_aging_step, :default_aging_interval_ms where
-- it has none).
SELECT t.max_active_jobs AS type_cap, t.rate_per_s AS type_rate, t.fairness_by,
                 {{lanes.per_key}} AS per_key,
                 EXISTS (SELECT 1 FROM tenants m WHERE m.min_active_jobs > 0) AS minimums,
                 COALESCE(t.aging_step, :default_aging_step::int) AS aging_step,
                 COALESCE(t.aging_interval_ms, :default_aging_interval_ms::int) AS aging_interval_ms
          FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = :job_type
          WHERE t.paused IS NOT TRUE

-- fragment: lead
-- The lead lane's first backlogged key in (vtime, key) order that has a ready job (one
-- descent of jobs_ready_idx to the key's youngest entry each, as read_keys' probe) --
-- the key scheduler.allocate_keys picks first -- unless a cap or a rate limit is
-- involved (the type's, the lead lane's tenant's, or the lead key's: those need their
-- locks and counts, ADR 016, 028 and 040), or some tenant has a minimum (a lane below it
-- goes first, which the rounds read: ADR 042); the allotment of one job from it; and the
-- type's aging.
-- Index: lane_keys_vtime_idx, key_weights pkey, jobs_ready_idx.
lead AS (
    SELECT ll.tenant_id, y.fairness_key, ll.weight, y.key_weight, ll.aging_step,
           ll.aging_interval_ms, ll.fairness_by
    FROM lead_lane ll
    CROSS JOIN LATERAL (
        SELECT r.fairness_key, COALESCE(w.weight, 1) AS key_weight,
               w.max_active_jobs AS key_cap FROM (
            SELECT x.fairness_key, x.vtime, (SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = x.tenant_id
            AND j.fairness_key = x.fairness_key {{shards.j}})
         IS NOT NULL AS ready
            FROM lane_keys x
            WHERE x.job_type = :job_type AND x.tenant_id = ll.tenant_id AND x.active
              AND NOT x.held {{shards.x}}
            ORDER BY x.vtime, x.fairness_key
            LIMIT {{PROBED_LANES}}) r
        LEFT JOIN key_weights w ON w.tenant_id = ll.tenant_id
         AND w.fairness_key = r.fairness_key {{shards.w}}
        WHERE r.ready
        ORDER BY r.vtime, r.fairness_key
        LIMIT 1) y
    WHERE ll.type_cap IS NULL AND ll.cap IS NULL AND ll.type_rate IS NULL AND ll.rate IS NULL
      AND ll.per_key IS NULL AND y.key_cap IS NULL AND NOT ll.minimums
),
alloc AS (SELECT tenant_id, fairness_key, 1 AS k, NULL::int AS hint_priority,
                 NULL::timestamptz AS since FROM lead),
aging AS (SELECT aging_step AS step, aging_interval_ms AS interval_ms FROM lead),

-- fragment: lead_lane
-- The job type's first backlogged lane in (vtime, tenant) order that has a ready job --
-- the lane scheduler.allocate picks first -- among the first PROBED_LANES active ones,
-- not held, of a tenant not paused (one descent of jobs_ready_idx each, as read_lanes'
-- probe), with its tenant's weight, cap and rate and the type's (the fragment
-- lead_type).  Index: lanes_type_vtime_idx, tenants pkey, jobs_ready_idx.
lead_lane AS (
    SELECT x.tenant_id, x.weight, x.cap, x.rate, c.type_cap, c.type_rate, c.aging_step,
           c.aging_interval_ms, c.fairness_by, c.per_key, c.minimums
    FROM ({{lead_type}}) c
    CROSS JOIN LATERAL (
        SELECT r.tenant_id, r.weight, r.cap, r.rate FROM (
            SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight,
                   t.max_active_jobs AS cap, t.rate_per_s AS rate, (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id)
         IS NOT NULL AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = :job_type AND l.active AND NOT l.held AND t.paused IS NOT TRUE
            ORDER BY l.vtime, l.tenant_id
            LIMIT {{PROBED_LANES}}) r
        WHERE r.ready
        ORDER BY r.vtime, r.tenant_id
        LIMIT 1) x
)

-- fragment: lead_lane_of_tenants
-- As lead_lane, among the caller's :tenant_ids only.
lead_lane AS (
    SELECT x.tenant_id, x.weight, x.cap, x.rate, c.type_cap, c.type_rate, c.aging_step,
           c.aging_interval_ms, c.fairness_by, c.per_key, c.minimums
    FROM ({{lead_type}}) c
    CROSS JOIN LATERAL (
        SELECT r.tenant_id, r.weight, r.cap, r.rate FROM (
            SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight,
                   t.max_active_jobs AS cap, t.rate_per_s AS rate, (SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = :job_type AND j.tenant_id = l.tenant_id {{shards.j}})
         IS NOT NULL AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = :job_type AND l.active AND NOT l.held AND t.paused IS NOT TRUE
              AND l.tenant_id = ANY(:tenant_ids::text[]) {{shards.l}}
            ORDER BY l.vtime, l.tenant_id
            LIMIT {{PROBED_LANES}}) r
        WHERE r.ready
        ORDER BY r.vtime, r.tenant_id
        LIMIT 1) x
)

-- fragment: lead_answer
-- A lead claim's one row: the claimed job with the lane's and the key's weights (for
-- their charges) and the type's aging, or NULLs and whether the type is dry.
SELECT a.*, lead.weight AS lane_weight, lead.key_weight AS lane_key_weight,
       lead.aging_step AS lane_aging_step,
       lead.aging_interval_ms AS lane_aging_interval_ms, lead.fairness_by AS lane_fairness_by,
       (a.job_key IS NULL AND NOT EXISTS (SELECT 1 FROM lead_lane)
       AND (SELECT count(*) < {{PROBED_LANES}}
            FROM (SELECT 1 FROM lanes l
                  WHERE l.job_type = :job_type AND l.active AND NOT l.held
                  LIMIT {{PROBED_LANES}}) p)) AS dry
FROM (SELECT 1) one LEFT JOIN (activated a CROSS JOIN lead) ON true

-- fragment: lead_answer_of_tenants
-- As lead_answer, dry among the caller's :tenant_ids.
SELECT a.*, lead.weight AS lane_weight, lead.key_weight AS lane_key_weight,
       lead.aging_step AS lane_aging_step,
       lead.aging_interval_ms AS lane_aging_interval_ms, lead.fairness_by AS lane_fairness_by,
       (a.job_key IS NULL AND NOT EXISTS (SELECT 1 FROM lead_lane)
       AND (SELECT count(*) < {{PROBED_LANES}}
            FROM (SELECT 1 FROM lanes l
                  WHERE l.job_type = :job_type AND l.active AND NOT l.held
                    AND l.tenant_id = ANY(:tenant_ids::text[]) {{shards.l}}
                  LIMIT {{PROBED_LANES}}) p)) AS dry
FROM (SELECT 1) one LEFT JOIN (activated a CROSS JOIN lead) ON true

-- name: claim_lead
-- One stride pick, read and claimed in one round trip: the job type's first backlogged
-- lane in (vtime, tenant) order that has a ready job -- the lane scheduler.allocate
-- picks first -- and in it the first backlogged key in (vtime, key) order that has one
-- (the fragment lead) gives its best job, exactly as claim would give it with the count
-- 1 for that key.  For a waiter woken by one new job of an idle type, this saves
-- read_lanes' and read_keys' round trips, a large part of a pickup (ADR 011).  It claims
-- nothing where a cap or a rate limit is involved, when none of the first PROBED_LANES
-- active lanes has a ready job, nor any of the lead lane's first PROBED_LANES active
-- keys, or when the lead key's heads are held by another activator; the caller then
-- runs the full rounds, unless the answer says the type is dry: no probed lane had a
-- ready job, and the probe saw every active lane (fewer than PROBED_LANES; evaluated
-- only when nothing was claimed, and it counts lanes_type_vtime_idx entries: the ready
-- probes were the lead's), which saves that caller the lane read that would prove it.  A
-- paused type, or a paused tenant's lane, gives nothing (as read_lanes).
-- Index: lanes_type_vtime_idx, lane_keys_vtime_idx, then as read_lanes, read_keys and
-- claim.
WITH RECURSIVE {{lead_lane}},
{{lead}}
{{claim_heads}}
{{activated}}
{{trimmed}}
{{lead_answer}}

-- name: claim_lead_by_worker_time
-- As claim_lead, writing lane_charge and key_charge as claim_by_worker_time does: for a
-- type this process last saw fair by worker time (or has not seen yet; LeadAsk).
WITH RECURSIVE {{lead_lane}},
{{lead}}
{{claim_heads}}
{{activated_by_worker_time}}
{{trimmed}}
{{lead_answer}}

-- name: claim_lead_of_tenants
-- As claim_lead, restricted to the caller's :tenant_ids.  A statement of its own so that
-- its generic plan can use lanes pkey.
WITH RECURSIVE {{lead_lane_of_tenants}},
{{lead}}
{{claim_heads}}
{{activated}}
{{trimmed}}
{{lead_answer_of_tenants}}

-- name: claim_lead_of_tenants_by_worker_time
-- As claim_lead_of_tenants, writing lane_charge and key_charge.
WITH RECURSIVE {{lead_lane_of_tenants}},
{{lead}}
{{claim_heads}}
{{activated_by_worker_time}}
{{trimmed}}
{{lead_answer_of_tenants}}

-- name: count_minimums
-- A capped claim's minimums (ADR 042), in its transaction after lock_and_count took the
-- tenants' cap locks (:tenants among them): each one's minimum as it is now and its
-- ACTIVATED jobs (the count stops at the minimum), for the tenants that have one.
-- Index: tenants pkey, jobs_active_tenant_idx.
SELECT t.tenant_id, t.min_active_jobs AS minimum, (SELECT count(*) FROM (
           SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = t.tenant_id
           LIMIT t.min_active_jobs) a) AS active
FROM tenants t
WHERE t.tenant_id = ANY(:tenants::text[]) AND t.min_active_jobs > 0

-- name: lock_and_count_keys
-- A claim's key step (ADR 040), in its transaction after the type's and the tenants' cap
-- locks: :job_type's per-key configuration lock shared, the cap locks of the keys
-- (:tenants, :keys: pairs) in one global order, then -- each statement of a volatile
-- function takes its own snapshot -- each key's room: the least of its own cap minus its
-- ACTIVATED jobs of every type and the type's per-key cap, read now, minus its ACTIVATED
-- jobs of the type (NULL: neither).  Each count stops at its cap.  Index:
-- jobs_active_key_idx, key_weights pkey, job_types pkey.
SELECT * FROM jobfair_lock_and_count_keys({{KEY_CAP_LOCK_CLASS}}, {{TYPE_KEYS_LOCK_CLASS}},
                                          :tenants::text[], :keys::text[], :job_type)

-- name: hold_keys
-- The keys of :job_type a claim left at their caps (:tenants, :keys: pairs), counted under
-- their cap locks, which it holds until this commits: held out of the key reads until a
-- finish frees room (jobfair_release_key_holds, which takes the same locks first).
-- Index: lane_keys pkey.  Locks: the key rows.
UPDATE lane_keys k SET held = true
FROM unnest(:tenants::text[], :keys::text[]) AS p(tenant_id, fairness_key)
WHERE k.job_type = :job_type AND k.tenant_id = p.tenant_id
  AND k.fairness_key = p.fairness_key AND NOT k.held {{shards.k}}
