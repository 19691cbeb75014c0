-- name: settle_lanes
-- The worker-time settlements of ended activations (ADR 029, scheduler.settlement). Each
-- lane (:tenant_ids, with :units, :observed leases and their :held seconds, and
-- :lane_refunds) moves by its units (the seconds held; for activations before alembic
-- 0013, held less charged) per its tenant's weight now, less its refund (the virtual time
-- its estimates added when they were charged, the jobs' lane_charge), and its estimate of
-- a lease's seconds follows the leases observed (scheduler.mixed_estimate's twin: each
-- observation :estimate_alpha of the way, scheduler.ESTIMATE_ALPHA; the first ones set
-- it). Each key (:key_tenants and :keys, with :key_units, :key_held and :key_refunds)
-- the same by its weight. Both add the held seconds to their units served
-- (units_total). A parked lane or key moved back banks nothing: it re-enters at
-- max(own, system) as always. Written behind the finishes
-- (app.activation.charging.Settlements), committed asynchronously as the charges are (a
-- crash forgets the last few, which fences nothing). Index: lanes pkey, lane_keys pkey,
-- tenants pkey, key_weights pkey. Locks: the lanes in tenant order, then the keys in
-- (tenant, key) order, as lanes' charge does.
WITH settle AS (
    SELECT x.tenant_id, s.units, s.n, s.held, s.refund
    FROM unnest(:tenant_ids::text[], :units::float8[], :observed::int[], :held::float8[],
                :lane_refunds::float8[])
         AS s(tenant_id, units, n, held, refund)
    JOIN lanes x ON x.job_type = :job_type AND x.tenant_id = s.tenant_id {{shards.x}}
    ORDER BY x.tenant_id
    FOR NO KEY UPDATE OF x
),
settled AS (
    UPDATE lanes l
    SET vtime = l.vtime + s.units / COALESCE(
            (SELECT t.weight FROM tenants t WHERE t.tenant_id = l.tenant_id), 1) - s.refund,
        units_total = l.units_total + s.held,
        unit_est = CASE WHEN s.n = 0 THEN l.unit_est
                        WHEN l.unit_est IS NULL THEN s.held / s.n
                        ELSE l.unit_est + (1 - power(1 - :estimate_alpha::float8, s.n))
                                          * (s.held / s.n - l.unit_est) END
    FROM settle s
    WHERE l.job_type = :job_type AND l.tenant_id = ANY(ARRAY(SELECT tenant_id FROM settle))
      AND l.tenant_id = s.tenant_id {{shards.l}}
      {{shards.commit_async}}
    RETURNING 1
),
key_settle AS (
    SELECT x.tenant_id, x.fairness_key, s.units, s.held, s.refund
    FROM unnest(:key_tenants::text[], :keys::text[], :key_units::float8[], :key_held::float8[],
                :key_refunds::float8[])
         AS s(tenant_id, fairness_key, units, held, refund)
    JOIN lane_keys x ON x.job_type = :job_type AND x.tenant_id = s.tenant_id
     AND x.fairness_key = s.fairness_key {{shards.x}}
    WHERE (SELECT count(*) FROM settle) >= 0
    ORDER BY x.tenant_id, x.fairness_key
    FOR NO KEY UPDATE OF x
),
key_settled AS (
    UPDATE lane_keys k
    SET vtime = k.vtime + s.units / COALESCE(
            (SELECT w.weight FROM key_weights w
             WHERE w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key {{shards.w}}), 1)
            - s.refund,
        units_total = k.units_total + s.held
    FROM key_settle s
    WHERE k.job_type = :job_type AND k.tenant_id = s.tenant_id AND k.fairness_key = s.fairness_key {{shards.k}}
      {{shards.commit_async}}
    RETURNING 1
)
SELECT (SELECT count(*) FROM settled) + (SELECT count(*) FROM key_settled)
