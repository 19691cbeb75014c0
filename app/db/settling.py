"""Worker-time settlements written (ADR 029): what ended leases owe their lanes and keys."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from app.db.base import Queries, retry_deadlock
from app.scheduler import (
    ESTIMATE_ALPHA,
    LaneKey,
    Settled,
)

log = logging.getLogger(__name__)

# -- name: settle_lanes
# The worker-time settlements of ended activations (ADR 029, scheduler.settlement): each
# lane ($2 to $5: tenants, units, leases observed, their held seconds; $10 refunds)
# moves by its units (the seconds held; for activations before alembic 0013, held less
# charged) per its tenant's weight now, less its refund (the virtual time its estimates
# added when they were charged, the jobs' lane_charge), and its estimate of a lease's
# seconds follows the leases observed (scheduler.mixed_estimate's twin: each observation
# ESTIMATE_ALPHA of the way, the first ones set it); each key ($6 to $9: tenants, keys,
# units, held seconds; $11 refunds) the same by its weight.  Both add the held seconds
# to their units served (units_total).  A parked lane or key moved back banks nothing:
# it re-enters at max(own, system) as always.  Written behind the finishes
# (app.activation.charging.Settlements), committed asynchronously as the charges are (a crash
# forgets the last few, which fences nothing).  Index: lanes pkey, lane_keys pkey,
# tenants pkey, key_weights pkey. Locks: the lanes in tenant order, then the keys in
# (tenant, key) order, as _CHARGE.
SETTLE_LANES = f"""
WITH settle AS (
    SELECT x.tenant_id, s.units, s.n, s.held, s.refund
    FROM unnest($2::text[], $3::float8[], $4::int[], $5::float8[], $10::float8[])
         AS s(tenant_id, units, n, held, refund)
    JOIN lanes x ON x.job_type = $1 AND x.tenant_id = s.tenant_id
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
                        ELSE l.unit_est + (1 - power(1 - {ESTIMATE_ALPHA}::float8, s.n))
                                          * (s.held / s.n - l.unit_est) END
    FROM settle s
    WHERE l.job_type = $1 AND l.tenant_id = ANY(ARRAY(SELECT tenant_id FROM settle))
      AND l.tenant_id = s.tenant_id
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING 1
),
key_settle AS (
    SELECT x.tenant_id, x.fairness_key, s.units, s.held, s.refund
    FROM unnest($6::text[], $7::text[], $8::float8[], $9::float8[], $11::float8[])
         AS s(tenant_id, fairness_key, units, held, refund)
    JOIN lane_keys x ON x.job_type = $1 AND x.tenant_id = s.tenant_id
     AND x.fairness_key = s.fairness_key
    WHERE (SELECT count(*) FROM settle) >= 0
    ORDER BY x.tenant_id, x.fairness_key
    FOR NO KEY UPDATE OF x
),
key_settled AS (
    UPDATE lane_keys k
    SET vtime = k.vtime + s.units / COALESCE(
            (SELECT w.weight FROM key_weights w
             WHERE w.tenant_id = k.tenant_id AND w.fairness_key = k.fairness_key), 1)
            - s.refund,
        units_total = k.units_total + s.held
    FROM key_settle s
    WHERE k.job_type = $1 AND k.tenant_id = s.tenant_id AND k.fairness_key = s.fairness_key
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING 1
)
SELECT (SELECT count(*) FROM settled) + (SELECT count(*) FROM key_settled)
"""


@retry_deadlock
async def settle(
    db: Queries, job_type: str, lanes: Mapping[str, Settled], keys: Mapping[LaneKey, Settled]
) -> int:
    """Write worker-time settlements (settle_lanes): how many lanes and keys moved (a
    key's ``n`` is not used: keys keep no estimate)."""
    tenants = sorted(lanes)
    pairs = sorted(keys)
    moved: int = await db.fetchval(
        SETTLE_LANES,
        job_type,
        tenants,
        [lanes[t].units for t in tenants],
        [lanes[t].n for t in tenants],
        [lanes[t].held_s for t in tenants],
        [t for t, _ in pairs],
        [k for _, k in pairs],
        [keys[tk].units for tk in pairs],
        [keys[tk].held_s for tk in pairs],
        [lanes[t].refund for t in tenants],
        [keys[tk].refund for tk in pairs],
    )
    return moved
