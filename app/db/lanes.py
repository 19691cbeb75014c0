"""Lanes: one per (job type, tenant), the unit stride scheduling picks among, and their
fairness keys (``lane_keys``: one per lane and key, ADR 027), the unit it picks among
inside a lane.

A lane is ``active`` while it may have ready jobs (lane reads see only active lanes),
``held`` while its tenant is at its cap, and carries the virtual time ``vtime`` the
scheduler orders lanes by.  This module reads lanes, charges them the jobs claimed,
wakes them when jobs become ready and holds them at caps (app.db.parking parks the
empty ones, app.db.settling writes worker-time settlements).

The no-lost-wake-up protocol, between the wakes here and the parks, is in app.db.parking.

Lanes held at a cap (``lanes.held``)
------------------------------------
A lane whose tenant is at its ``maxActiveJobs`` can give nothing, and lane reads skip it
(ADR 016): otherwise a thousand tenants at their caps would sit in front of every read,
their virtual times frozen while the others' move on.  The protocol, on the tenant's cap
lock (an advisory lock per tenant):

* Only a capped claim holds a lane (hold_lanes): with the tenant's cap lock held, it
  counts the tenant's active jobs in a later statement, claims, and holds the lanes it
  read whose tenant it leaves at its cap, then commits and lets the lock go.
* Everything that frees a tenant's capacity -- a job of it completed, failed, errored,
  released or expired; its configuration changed -- releases its held lanes with
  ``jobfair_release_holds``, which takes the tenant's cap lock first and releases in a
  statement of its own (a later snapshot), in the transaction that freed the capacity.

If the freer gets the lock first, the claimer's count (after its lock) sees the capacity
freed, and it holds nothing.  If the claimer has it, the freer waits for the hold to
commit and then sees and releases it.  So no lane stays held while its tenant has room.
A finisher decides which of its tenants are capped only once it holds the *release gate*
(shared), with a snapshot of its own; a configuration change, once committed, takes the
gate exclusively -- waiting out every finish in flight, which may have decided without
seeing the change -- and releases the tenant's lanes again (release_after_finishes).
Otherwise a cap set on an uncapped tenant during a finish of its jobs could be missed by
the finish and seen by a claim that counted those jobs as active: held, with nothing left
to release it.
``held`` is independent of ``active``: producers and parking ignore it, and a held lane
parked meanwhile is woken by its next job as any other.

"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from app.db.base import Queries, retry_deadlock
from app.db.bounds import PROBED_LANES, SCANNED_LANES
from app.db.listen import NOTIFY_CHANNEL
from app.db.locks import buckets_of, share_buckets_sql
from app.db.rows import KeyRead, LaneRead, LaneRow, TypeConfig
from app.scheduler import (
    MIN_STRIDE,
    VTIME_RESOLUTION,
    Charges,
    FairnessBy,
    LaneKey,
)

log = logging.getLogger(__name__)


# The virtual time at which a lane of job type ``{t}`` re-enters: the smallest vtime of
# the backlogged lanes not held at a cap or, when there is none, the largest of all (see
# scheduler.reentry_vtime).  jobfair_release_holds (alembic 0004) spells the same.
_REENTRY_VTIME = """COALESCE(
    (SELECT min(x.vtime) FROM lanes x WHERE x.job_type = {t} AND x.active AND NOT x.held),
    (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = {t}),
    0)"""

# The same rule one level down (ADR 027): the virtual time at which key ``{k}`` of lane
# (``{t}``, ``{n}``) re-enters is the smallest vtime of the lane's backlogged keys or, when
# there is none, the largest of its keys (all parked then: the second probe reads only
# those), as scheduler.reentry_vtime.  Index: lane_keys_vtime_idx, one descent each.
_KEY_REENTRY_VTIME = """COALESCE(
    (SELECT min(x.vtime) FROM lane_keys x
     WHERE x.job_type = {t} AND x.tenant_id = {n} AND x.active),
    (SELECT max(x.vtime) FROM lane_keys x
     WHERE x.job_type = {t} AND x.tenant_id = {n} AND NOT x.active),
    0)"""

# "type n": bounded, as a job type is at most 128 ASCII characters (JOB_TYPE_RE).
_NOTIFIED = f"""notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', job_type || ' ' || sum(n))
    FROM ready_lanes GROUP BY job_type
)"""

# Marks the lanes and keys in ``ready_lanes`` (job_type, tenant_id, fairness_key, n: how
# many of its jobs became ready, one row per lane and key) backlogged: creates missing
# lanes at the re-entry virtual time (held if their tenant is paused: a probe of tenants
# pkey per new lane), wakes parked ones (a lane already active matches nothing and is not
# written: no hot row), does the same for their keys inside their lanes, and notifies
# once per job type with how many of its jobs became ready ("type n") -- or, with
# {notified} as QUIET, does not (a hand-off's insert: the job may go to its waiter in the
# same transaction, and then nobody need be woken).  Lanes are locked before keys: the
# key CTEs are not read by the statement, so they run after it (as every statement that
# locks both does).  Index: lanes pkey, lane_keys pkey.
_WAKE = f"""lanes_ready AS (
    SELECT job_type, tenant_id, sum(n) AS n FROM ready_lanes GROUP BY job_type, tenant_id
),
new_lanes AS (
    INSERT INTO lanes (job_type, tenant_id, shard, vtime, active, held)
    SELECT r.job_type, r.tenant_id, jobfair_shard(r.tenant_id),
           {_REENTRY_VTIME.format(t="r.job_type")}, true,
           EXISTS (SELECT 1 FROM tenants p WHERE p.tenant_id = r.tenant_id AND p.paused)
    FROM lanes_ready r
    ORDER BY r.job_type, r.tenant_id
    ON CONFLICT (job_type, tenant_id, shard) DO NOTHING
    RETURNING 1
),
woken AS (
    UPDATE lanes l
    SET active = true, vtime = GREATEST(l.vtime, {_REENTRY_VTIME.format(t="l.job_type")})
    WHERE (l.job_type, l.tenant_id) IN (
        -- Parked lanes only (an active one is not written), locked in key order.
        SELECT x.job_type, x.tenant_id FROM lanes x JOIN lanes_ready r
          ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
        WHERE NOT x.active
        ORDER BY x.job_type, x.tenant_id
        FOR NO KEY UPDATE OF x)
    RETURNING 1
),
new_keys AS (
    INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)
    SELECT r.job_type, r.tenant_id, r.fairness_key, jobfair_shard(r.tenant_id),
           {_KEY_REENTRY_VTIME.format(t="r.job_type", n="r.tenant_id")}, true
    FROM ready_lanes r
    ORDER BY r.job_type, r.tenant_id, r.fairness_key
    ON CONFLICT (job_type, tenant_id, fairness_key, shard) DO NOTHING
),
woken_keys AS (
    UPDATE lane_keys k
    SET active = true,
        vtime = GREATEST(k.vtime, {_KEY_REENTRY_VTIME.format(t="k.job_type", n="k.tenant_id")})
    WHERE (k.job_type, k.tenant_id, k.fairness_key) IN (
        SELECT x.job_type, x.tenant_id, x.fairness_key FROM lane_keys x JOIN ready_lanes r
          ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
         AND x.fairness_key = r.fairness_key
        WHERE NOT x.active
        ORDER BY x.job_type, x.tenant_id, x.fairness_key
        FOR NO KEY UPDATE OF x)
),
{{notified}}
"""
QUIET = "notified AS (SELECT WHERE false)"
WAKE_CTES = _WAKE.format(notified=_NOTIFIED)
QUIET_WAKE_CTES = _WAKE.format(notified=QUIET)


# -- name: wake_lanes
# Marks lanes and their keys backlogged after jobs became ready (retry, lease expiry,
# promotion, revive; one (type, tenant, key) triple per job) and notifies their job types
# with how many.  Writes only lanes and keys that were parked.  Index: lanes pkey,
# lane_keys pkey.  Locks: caller holds the shared lane-bucket locks.
WAKE_LANES = f"""
WITH ready_lanes AS (
    SELECT job_type, tenant_id, fairness_key, count(*) AS n
    FROM unnest($1::text[], $2::text[], $3::text[]) AS r(job_type, tenant_id, fairness_key)
    GROUP BY job_type, tenant_id, fairness_key
),
{WAKE_CTES}SELECT (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
       + (SELECT count(*) FROM woken)
"""

# Charges lanes of job type $1 their claimed jobs x stride of virtual time, from the
# floor a rate-limited lane was lifted to (scheduler.rate_floor; NULL: none), and their
# keys their claimed jobs x key stride: the CTEs ``charge`` and ``charged`` (tenant_id
# and new vtime of each lane charged), with ``tenants``, ``counts``, ``strides`` and
# ``floors`` the parameters of the four arrays; ``key_charge`` and ``key_charged`` the same
# for keys (``key_tenants``, ``keys``, ``key_counts``, ``key_strides``).  ``served`` and
# ``key_served`` (aligned with ``tenants`` and ``keys``) are added to the running counts
# of units served (``units_total``: by cost, the jobs' costs; else 0).
# Locks: the lane rows, in tenant order (the sub-select's sort sits below its row
# locking), then the key rows, in (tenant, key) order (key_charge reads charge whole
# first), until the statement commits -- asynchronously (synchronous_commit = off for
# its own transaction only, set only when a lane is charged): a crash can forget the
# last few hundred milliseconds of charges, which fences nothing; the claim it accounts
# for was durable before it ran.  A pick advances a lane or key at least
# scheduler.VTIME_RESOLUTION of its virtual time or MIN_STRIDE (scheduler.advance).
_RES, _MIN = f"{VTIME_RESOLUTION!r}::float8", f"{MIN_STRIDE!r}::float8"
_CHARGE = f"""charge AS (
    -- Each charged lane found by key and locked, in tenant order.
    SELECT x.tenant_id, c.n, c.stride, c.floor, c.served
    FROM unnest({{tenants}}::text[], {{counts}}::int[], {{strides}}::float8[],
                {{floors}}::float8[], {{served}}::float8[])
         AS c(tenant_id, n, stride, floor, served)
    JOIN lanes x ON x.job_type = $1 AND x.tenant_id = c.tenant_id
    ORDER BY x.tenant_id
    FOR NO KEY UPDATE OF x
),
charged AS (
    UPDATE lanes l
    -- GREATEST ignores a NULL floor: only rate-limited lanes are lifted (ADR 028).
    SET vtime = GREATEST(l.vtime, c.floor)
            + c.n * GREATEST(c.stride, abs(GREATEST(l.vtime, c.floor)) * {_RES}, {_MIN}),
        activated_total = l.activated_total + c.n,
        units_total = l.units_total + COALESCE(c.served, 0)
    FROM charge c
    -- ANY(ARRAY(...)) keeps the update to one lanes_pkey probe per charged lane, as in
    -- the claim.  (An IN (...) of the locked keys made the generic plan a semi join
    -- comparing every charged lane with every other, slower than by key.)
    WHERE l.job_type = $1 AND l.tenant_id = ANY(ARRAY(SELECT tenant_id FROM charge))
      AND l.tenant_id = c.tenant_id
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING l.tenant_id, l.vtime
),
key_charge AS (
    -- Each charged key found by key and locked, in (tenant, key) order, once every
    -- charged lane is locked (the count reads charge whole).
    SELECT x.tenant_id, x.fairness_key, c.n, c.stride, c.served
    FROM unnest({{key_tenants}}::text[], {{keys}}::text[], {{key_counts}}::int[],
                {{key_strides}}::float8[], {{key_served}}::float8[])
         AS c(tenant_id, fairness_key, n, stride, served)
    JOIN lane_keys x ON x.job_type = $1 AND x.tenant_id = c.tenant_id
     AND x.fairness_key = c.fairness_key
    WHERE (SELECT count(*) FROM charge) >= 0
    ORDER BY x.tenant_id, x.fairness_key
    FOR NO KEY UPDATE OF x
),
key_charged AS (
    UPDATE lane_keys k
    SET vtime = k.vtime + c.n * GREATEST(c.stride, abs(k.vtime) * {_RES}, {_MIN}),
        activated_total = k.activated_total + c.n,
        units_total = k.units_total + COALESCE(c.served, 0)
    FROM key_charge c
    -- One lane_keys_pkey probe per charged key, driven by key_charge.  (ANY(ARRAY(...))
    -- of the tenants and of the keys, as for lanes, put both arrays in every probe's
    -- condition: 177 ms instead of 2 for 400 keys.)
    WHERE k.job_type = $1 AND k.tenant_id = c.tenant_id AND k.fairness_key = c.fairness_key
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING k.tenant_id, k.fairness_key
)"""

# Whether lane ``{lane}`` of job type $1 has a ready job: one descent of jobs_ready_idx.
# max(), not EXISTS: the min/max rewrite always descends jobs_ready_idx, where EXISTS let
# the generic plan scan the heap for a first match (ADR 014).  The greatest key, not the
# least: it reads the lane's last entry (its last key's youngest job), not a head, where
# draining activators leave entries of jobs just claimed (dead, not yet pruned).
_READY_PROBE = """(SELECT max(j.fairness_key) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = {lane})
         IS NOT NULL"""
LANE_READY = _READY_PROBE.format(lane="l.tenant_id")
# Whether key ``{key}`` of lane ``{lane}`` has a ready job: one descent of jobs_ready_idx,
# to the key's youngest entry (min(priority), its last), as above.
_KEY_READY_PROBE = """(SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = {lane}
            AND j.fairness_key = {key})
         IS NOT NULL"""
KEY_READY = _KEY_READY_PROBE.format(lane="x.tenant_id", key="x.fairness_key")

# -- name: read_lanes
# First charges the lanes and keys the previous rounds claimed from ($4 to $10, the
# floors $11 and the units served $12 and $13, as _CHARGE; empty arrays charge nothing),
# saving the round a statement and the wait for a separate charge to commit.  Then reads
# the job type's configuration and, in (vtime, tenant) order, the type's active lanes
# with their tenants' weight and cap, each probed for a ready job when $2 is at most
# PROBED_LANES (one round trip).  The scan stops at
# the lane after the ($2 + len($4))-th ready one
# (the run condition on ``readies``), or after SCANNED_LANES lanes: lanes that are
# active but empty (emptied a moment ago, not yet parked) are answered, flagged not
# ready, for the caller to park, and never take a ready lane's place -- so a read finds
# the ready lanes however many emptied ones sit in front of them (work conservation,
# DESIGN 1.6; ADR 014).  Last come the charged lanes and keys that have no ready job any
# more: their claim emptied them, and the caller parks them too.
# The read's snapshot predates the charge, so a charged lane's new vtime comes from
# ``charged``; charges only move lanes later, so the first $2 ready lanes by new vtime
# are among the first $2 + len($4) by old (the caller keeps those $2).
# Lanes held at their tenant's cap are not read at all (the index range skips them); nor
# are paused tenants' lanes, held too (a lane a pause missed, made by a producer racing
# with it, is filtered out here; it costs the read a row).  The first row says whether
# the type is paused; then the caller claims nothing, whatever lanes follow.
# Index: lanes_type_vtime_idx (job_type, active, held, vtime, tenant_id), a range scan of
# the lanes up to the stop, excluded ones ($3) included; one probe of jobs_ready_idx per lane
# scanned (small reads) and per lane and key charged.  Locks: the charged lanes and keys.
_READ_LANES = """
WITH {charge}
SELECT NULL AS tenant_id, NULL::float8 AS vtime, NULL::int AS weight,
       NULL::int AS max_active_jobs, t.max_active_jobs AS type_cap, t.aging_interval_ms,
       t.aging_step, NULL::bool AS ready, NULL::bool AS scanned, t.paused IS TRUE AS paused,
       NULL::text AS fairness_key, t.rate_per_s IS NOT NULL AS rate_limited,
       t.fairness_by, NULL::float8 AS unit_est
FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = $1
UNION ALL
SELECT w.tenant_id, COALESCE(ch.vtime, w.vtime), w.weight, w.max_active_jobs, NULL, NULL,
       NULL, w.ready, true, NULL, NULL, w.rate_limited, NULL, w.unit_est
FROM (SELECT s.*, count(*) FILTER (WHERE s.ready)
                    OVER (ORDER BY s.vtime, s.tenant_id ROWS UNBOUNDED PRECEDING) AS readies
      FROM (SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
                   t.rate_per_s IS NOT NULL AS rate_limited, l.unit_est,
                   CASE WHEN $2 <= {probed} THEN {ready} ELSE true END AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = $1 AND l.active AND NOT l.held
              AND t.paused IS NOT TRUE AND l.tenant_id <> ALL($3::text[]) {tenants}
            ORDER BY l.vtime, l.tenant_id
            LIMIT {scanned}) s) w
LEFT JOIN charged ch ON ch.tenant_id = w.tenant_id
WHERE w.readies <= $2 + cardinality($4::text[])
UNION ALL
SELECT ch.tenant_id, ch.vtime, NULL, NULL, NULL, NULL, NULL, false, false, NULL, NULL, NULL,
       NULL, NULL
FROM charged ch WHERE NOT {charged_ready}
UNION ALL
SELECT kc.tenant_id, NULL, NULL, NULL, NULL, NULL, NULL, false, false, NULL, kc.fairness_key,
       NULL, NULL, NULL
FROM key_charged kc WHERE NOT {key_charged_ready}
"""
# SCANNED_LANES and PROBED_LANES: app.db.bounds, shared with the .sql files.
# The floors and the units served come last ($11 to $13; $12 to $14 where $11 is the
# tenant filter).
_READ_CHARGE = _CHARGE.format(
    tenants="$4",
    counts="$5",
    strides="$6",
    key_tenants="$7",
    keys="$8",
    key_counts="$9",
    key_strides="$10",
    floors="{floors}",
    served="{served}",
    key_served="{key_served}",
)
_CHARGED_READY = _READY_PROBE.format(lane="ch.tenant_id")
_KEY_CHARGED_READY = _KEY_READY_PROBE.format(lane="kc.tenant_id", key="kc.fairness_key")
READ_LANES = _READ_LANES.format(
    charge=_READ_CHARGE.format(floors="$11", served="$12", key_served="$13"),
    tenants="",
    # A subquery, not a constant: a type with fewer lanes than SCANNED_LANES made the
    # generic plan, expecting to read them all, join every lane to its tenant and sort
    # them (2.6 ms a read at 2,000 lanes, against 0.5 ms in index order).  An unknown
    # limit keeps the plan that stops early.
    scanned=f"(SELECT {SCANNED_LANES})",
    probed=PROBED_LANES,
    ready=LANE_READY,
    charged_ready=_CHARGED_READY,
    key_charged_ready=_KEY_CHARGED_READY,
)

# -- name: read_lanes_of_tenants
# As read_lanes, restricted to the caller's tenantIds ($11; the floors and units served
# are $12 to $14).  A
# statement of its own (not an "$11 IS NULL OR" branch) so that its generic plan can use
# lanes pkey.
READ_LANES_OF_TENANTS = _READ_LANES.format(
    charge=_READ_CHARGE.format(floors="$12", served="$13", key_served="$14"),
    tenants="AND l.tenant_id = ANY($11::text[])",
    scanned=SCANNED_LANES,
    probed=PROBED_LANES,
    ready=LANE_READY,
    charged_ready=_CHARGED_READY,
    key_charged_ready=_KEY_CHARGED_READY,
)

# -- name: read_keys
# The keys of the lanes a round allotted picks to ($2: tenants, $3: how many keys to read
# of each), in (vtime, key) order, their weights (a key without a row weighs 1), and
# each probed for a ready job when its lane asks for at most PROBED_LANES keys: for
# scheduler.split_among_keys to divide each lane's picks among.  Active keys only; the
# ones a call already excluded ($4, $5: tenant and key pairs) are skipped.  A lane whose
# read stops at its limit may have more ready keys beyond.
# Index: lane_keys_vtime_idx (job_type, tenant_id, active, vtime, fairness_key), a range
# scan per lane up to its limit; key_weights pkey; one probe of jobs_ready_idx per key of
# a small read.  No locks: the claim locks the jobs it takes.
READ_KEYS = f"""
SELECT a.tenant_id, k.fairness_key, k.vtime, COALESCE(w.weight, 1) AS weight, k.ready
FROM unnest($2::text[], $3::int[]) AS a(tenant_id, want)
CROSS JOIN LATERAL (
    SELECT x.fairness_key, x.vtime,
           CASE WHEN a.want <= {PROBED_LANES} THEN {KEY_READY} ELSE true END AS ready
    FROM lane_keys x
    WHERE x.job_type = $1 AND x.tenant_id = a.tenant_id AND x.active
      AND NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) AS e(tenant_id, fairness_key)
                      WHERE e.tenant_id = x.tenant_id AND e.fairness_key = x.fairness_key)
    ORDER BY x.vtime, x.fairness_key
    LIMIT a.want
) k
LEFT JOIN key_weights w ON w.tenant_id = a.tenant_id AND w.fairness_key = k.fairness_key
"""


# -- name: charge_lanes
# Charges each lane (jobs claimed) x stride of virtual time ($2, $3, $4: tenants, jobs,
# strides), and each key (jobs claimed) x key stride ($5 to $8: tenants, keys, jobs,
# strides; $9 floors, $10 and $11 units served), after the claim committed (so no claim
# holds lane rows across its WAL flush;
# ADR 001).  read_lanes carries the same charge (_CHARGE) in front of its read.  Answers
# the charged lanes that have no ready job left, and the charged keys (their tenant and
# key) that have none: their claim emptied them (the charge runs after the claim
# committed, so the last claim of a lane sees it empty), and the caller parks them (ADR
# 014).  Index: lanes pkey, lane_keys pkey, one probe of jobs_ready_idx per lane and key.
CHARGE_LANES = f"""
WITH {
    _CHARGE.format(
        tenants="$2",
        counts="$3",
        strides="$4",
        key_tenants="$5",
        keys="$6",
        key_counts="$7",
        key_strides="$8",
        floors="$9",
        served="$10",
        key_served="$11",
    )
}
SELECT ch.tenant_id, NULL AS fairness_key FROM charged ch WHERE NOT {_CHARGED_READY}
UNION ALL
SELECT kc.tenant_id, kc.fairness_key FROM key_charged kc WHERE NOT {_KEY_CHARGED_READY}
"""

# -- name: hold_lanes
# Marks lanes of job type $1 held: their tenants ($2) are at their caps as counted by the
# claim that holds their cap locks, which it will hold until this commits.  A lane read
# skips held lanes; jobfair_release_holds, which takes the same locks first, releases them
# when the tenant's capacity frees (ADR 016).  Index: lanes pkey.  Locks: the lane rows.
HOLD_LANES = """
UPDATE lanes SET held = true, held_count = held_count + 1
WHERE job_type = $1 AND tenant_id = ANY($2::text[]) AND NOT held
"""


def _charge_arrays(charges: Charges | None) -> tuple[list[Any], ...]:
    """_CHARGE's ten arrays: lanes in tenant order, keys in (tenant, key) order, then the
    lanes' floors, the lanes' units served and the keys'."""
    if charges is None:
        return [], [], [], [], [], [], [], [], [], []
    tenants = sorted(charges.lanes)
    keys = sorted(charges.keys)
    return (
        tenants,
        [charges.lanes[t] for t in tenants],
        [charges.strides[t] for t in tenants],
        [t for t, _ in keys],
        [k for _, k in keys],
        [charges.keys[tk] for tk in keys],
        [charges.key_strides[tk] for tk in keys],
        [charges.floors.get(t) for t in tenants],
        [charges.served.get(t, 0.0) for t in tenants],
        [charges.key_served.get(tk, 0.0) for tk in keys],
    )


@retry_deadlock
async def read(
    db: Queries,
    job_type: str,
    limit: int,
    exclude: Sequence[str],
    tenant_ids: Sequence[str] | None,
    charges: Charges | None = None,
) -> LaneRead:
    """Charge ``charges`` (jobs claimed and stride per lane and per key) first, then read
    the type's configuration and its first ``limit`` lanes that have a ready job (see
    LaneRead)."""
    *charge, floors, served, key_served = _charge_arrays(charges)
    if tenant_ids is None:
        rows = await db.fetch(
            READ_LANES, job_type, limit, list(exclude), *charge, floors, served, key_served
        )
    else:
        rows = await db.fetch(
            READ_LANES_OF_TENANTS,
            job_type,
            limit,
            list(exclude),
            *charge,
            list(tenant_ids),
            floors,
            served,
            key_served,
        )
    head, lanes = rows[0], rows[1:]
    cfg = TypeConfig(
        head["type_cap"],
        head["aging_interval_ms"],
        head["aging_step"],
        head["rate_limited"],
        FairnessBy(head["fairness_by"] or FairnessBy.ACTIVATIONS),
    )
    if head["paused"]:
        return LaneRead(cfg, [], [], False, paused=True)
    ready = [
        LaneRow(
            r["tenant_id"],
            r["vtime"],
            r["weight"],
            r["max_active_jobs"],
            r["rate_limited"],
            r["unit_est"],
        )
        for r in lanes
        if r["ready"]
    ]
    # The charges moved some lanes: the first ``limit`` ready ones by their new vtime.
    ready.sort(key=lambda lane: (lane.vtime, lane.tenant_id))
    scanned = sum(1 for r in lanes if r["scanned"])
    empty = list(
        dict.fromkeys(r["tenant_id"] for r in lanes if not r["ready"] and r["fairness_key"] is None)
    )
    emptied_keys = [
        (r["tenant_id"], r["fairness_key"]) for r in lanes if r["fairness_key"] is not None
    ]
    more = len(ready) >= limit or scanned >= SCANNED_LANES
    return LaneRead(cfg, ready[:limit], empty, more, emptied_keys=emptied_keys)


async def read_keys(
    db: Queries, job_type: str, wants: Mapping[str, int], exclude: Sequence[LaneKey]
) -> KeyRead:
    """The first ``wants[tenant]`` active keys of each lane, not ``exclude``d, in
    (vtime, key) order (read_keys; see KeyRead)."""
    if not wants:
        return KeyRead({}, [], set())
    tenants = sorted(wants)
    rows = await db.fetch(
        READ_KEYS,
        job_type,
        tenants,
        [wants[t] for t in tenants],
        [t for t, _ in exclude],
        [k for _, k in exclude],
    )
    ready: dict[str, list[tuple[str, float, int]]] = {}
    empty: list[tuple[str, str]] = []
    seen: Counter[str] = Counter()
    for r in rows:
        seen[r["tenant_id"]] += 1
        if r["ready"]:
            found = (r["fairness_key"], r["vtime"], r["weight"])
            ready.setdefault(r["tenant_id"], []).append(found)
        else:
            empty.append((r["tenant_id"], r["fairness_key"]))
    return KeyRead(ready, empty, {t for t in tenants if seen[t] >= wants[t]})


@retry_deadlock
async def charge(db: Queries, job_type: str, charges: Charges) -> tuple[list[str], list[LaneKey]]:
    """Charge each lane its claimed jobs x stride and each key its claimed jobs x key
    stride (charge_lanes), after the claim; the charged lanes and keys left without a
    ready job, to be parked."""
    rows = await db.fetch(CHARGE_LANES, job_type, *_charge_arrays(charges))
    drained = [r["tenant_id"] for r in rows if r["fairness_key"] is None]
    keys = [(r["tenant_id"], r["fairness_key"]) for r in rows if r["fairness_key"] is not None]
    return drained, keys


async def lock_to_wake(tx: Queries, lanes: Sequence[tuple[str, str]]) -> None:
    """In a transaction that is about to make jobs of ``lanes`` ((type, tenant) pairs)
    ready: their buckets' shared locks, in a statement of their own (the protocol)."""
    buckets = buckets_of(lanes)
    if buckets:
        await tx.execute(share_buckets_sql(buckets))


async def wake(tx: Queries, jobs: Sequence[Mapping[str, Any]]) -> None:
    """Mark lanes and their keys backlogged after ``jobs`` (rows with their job_type,
    tenant_id and fairness_key) became ready (wake_lanes), in the transaction that holds
    their buckets (lock_to_wake)."""
    if jobs:
        await tx.fetchval(
            WAKE_LANES,
            [j["job_type"] for j in jobs],
            [j["tenant_id"] for j in jobs],
            [j["fairness_key"] for j in jobs],
        )


async def hold(tx: Queries, job_type: str, tenant_ids: Sequence[str]) -> None:
    """Hold the lanes of ``tenant_ids`` (at their caps, counted under their cap locks in
    this transaction) out of the reads until their capacity frees (hold_lanes)."""
    if tenant_ids:
        await tx.execute(HOLD_LANES, job_type, list(tenant_ids))
