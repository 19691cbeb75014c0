"""The store: the only module that speaks SQL.

Every query is a named constant with a header: what it does, the index it relies on and
the lock it takes.  The hot path uses asyncpg directly; the schema is ``app.schema``.

The no-lost-wake-up protocol for ``lanes.active``
-------------------------------------------------
Activators read only *active* lanes, so a lane with ready jobs must never be left
inactive.  Producers must not write a shared row per insert, so they cannot simply set
``active = true`` every time.  The protocol:

* Whoever makes jobs ready (insert, retry, lease expiry, promotion, release) first takes
  a **shared** advisory lock on the lane's bucket, in its own statement, then -- in a
  later statement, hence with a later snapshot -- inserts or updates the jobs and runs
  ``UPDATE lanes SET active = true ... WHERE NOT active``.  When the lane is already
  active that UPDATE matches nothing and writes nothing: no hot row.
* An activator that found a lane short parks it only after ``pg_try_advisory_xact_lock``
  (exclusive, never waits) on the bucket succeeded, and only if -- in a later statement --
  the lane has no CREATED job.

If a maker holds the bucket, the parker's try fails and it parks nothing.  If the parker
holds it, makers wait for its commit and then see ``active = false`` and set it back.  If
the maker committed before the parker locked, the parker's emptiness probe sees its jobs.
In every order the lane ends active while it has ready jobs (tested in
``tests/integration/test_lanes.py``).

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

import asyncio
import contextlib
import functools
import logging
import random
import re
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, ParamSpec, TypeVar

import asyncpg
import orjson

from app.domain import DEFAULT_PRIORITY, DEFAULT_RETRIES, DEFAULT_TENANT, utcnow
from app.errors import OutcomeUnknown, ResourceExhausted

log = logging.getLogger(__name__)

# Advisory lock classes (the two-int4 key space; never overlaps the one-bigint space).
LANE_LOCK_CLASS = 0x4A460001
TYPE_CAP_LOCK_CLASS = 0x4A460002
TENANT_CAP_LOCK_CLASS = 0x4A460003
# Key 0 of this class is the gate between finishes and tenant configuration changes
# (jobfair_release_holds, alembic 0004).
RELEASE_GATE_CLASS = 0x4A460004
LEADER_LOCK_KEY = 0x4A46_4C45_4144  # one-bigint space: "JFLEAD"
# Lanes share this many lock buckets, so a 10,000-lane batch takes at most this many locks.
LANE_BUCKETS = 1024
# A park whose try-lock found a bucket held by a producer waits this long for it; a
# background park that waited in vain tries again after PARK_RETRY_S, doubling.
PARK_WAIT_MS = 1000
PARK_RETRY_S = 0.5

NOTIFY_CHANNEL = "jobfair"
DONE_CHANNEL = "jobfair_done"
# PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more ("payload string too long"),
# failing the statement that sends it; every payload here is bounded below that.
NOTIFY_PAYLOAD_MAX_BYTES = 7999
# Job keys per ``jobfair_done`` payload: a key (a positive bigint) is at most 19 digits,
# and a comma follows it.
CREDIT_KEYS_PER_NOTIFY = NOTIFY_PAYLOAD_MAX_BYTES // 20

# Releases the held lanes of the capped tenants whose jobs ``ended`` had, for they have
# room again (jobfair_release_holds, alembic 0004; ADR 016): takes the release gate
# shared, picks the capped tenants with a snapshot of its own, waits for their cap locks,
# and holds the locks until the statement commits.  Appended to the statements that end
# activations, referenced by their answer.
_RELEASE_HOLDS = f"""unheld AS (
    SELECT jobfair_release_holds({TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS},
        ARRAY(SELECT DISTINCT e.tenant_id FROM ended e), '{NOTIFY_CHANNEL}') AS n
)"""

# Appended to statements that end activations (RETURNING job_key, via_stream as ``ended``):
# NOTIFYs carrying the keys of stream-activated jobs, so their streams get their credit
# back, CREDIT_KEYS_PER_NOTIFY keys to a payload (a sweep or a batch ends thousands in one
# statement).  A stream that misses one finds its credit by its own periodic check.
# Long-poll jobs cost nothing here.
_CAPACITY_NOTIFY = f"""freed AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', job_type) FROM (
        SELECT DISTINCT e.job_type FROM ended e
        WHERE EXISTS (SELECT 1 FROM job_types t WHERE t.job_type = e.job_type
                        AND t.max_active_jobs IS NOT NULL)
           OR EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = e.tenant_id
                        AND t.max_active_jobs IS NOT NULL)) capped
)"""
_CREDIT_NOTIFY = f"""credited AS (
    SELECT pg_notify('{DONE_CHANNEL}', string_agg(job_key::text, ','))
    FROM (SELECT job_key, (row_number() OVER () - 1) / {CREDIT_KEYS_PER_NOTIFY} AS chunk
          FROM ended WHERE via_stream) s
    GROUP BY chunk
)"""

JOB_COLUMNS = """job_key, job_type, tenant_id, state, priority, retries, activation_count,
    worker, deadline, run_at, queued_at, variables, custom_headers, error_code,
    error_message, created_at, activated_at, completed_at, idempotency_key"""

# The virtual time at which a lane of job type ``{t}`` re-enters: the smallest vtime of
# the backlogged lanes not held at a cap or, when there is none, the largest of all (see
# scheduler.reentry_vtime).  jobfair_release_holds (alembic 0004) spells the same.
_REENTRY_VTIME = """COALESCE(
    (SELECT min(x.vtime) FROM lanes x WHERE x.job_type = {t} AND x.active AND NOT x.held),
    (SELECT max(x.vtime) FROM lanes x WHERE x.job_type = {t}),
    0)"""

# "type n": bounded, as a job type is at most 128 ASCII characters (JOB_TYPE_RE).
_NOTIFIED = f"""notified AS (
    SELECT pg_notify('{NOTIFY_CHANNEL}', job_type || ' ' || sum(n))
    FROM ready_lanes GROUP BY job_type
)"""

# Marks the lanes in ``ready_lanes`` (job_type, tenant_id, n: how many of its jobs became
# ready) backlogged: creates missing lanes at the re-entry virtual time, wakes parked ones
# (a lane already active matches nothing and is not written: no hot row), and notifies
# once per job type with how many of its jobs became ready ("type n").  Index: lanes pkey.
_WAKE_CTES = f"""new_lanes AS (
    INSERT INTO lanes (job_type, tenant_id, vtime, active)
    SELECT r.job_type, r.tenant_id, {_REENTRY_VTIME.format(t="r.job_type")}, true
    FROM ready_lanes r
    ORDER BY r.job_type, r.tenant_id
    ON CONFLICT (job_type, tenant_id) DO NOTHING
    RETURNING 1
),
woken AS (
    UPDATE lanes l
    SET active = true, vtime = GREATEST(l.vtime, {_REENTRY_VTIME.format(t="l.job_type")})
    WHERE (l.job_type, l.tenant_id) IN (
        -- Parked lanes only (an active one is not written), locked in key order.
        SELECT x.job_type, x.tenant_id FROM lanes x JOIN ready_lanes r
          ON x.job_type = r.job_type AND x.tenant_id = r.tenant_id
        WHERE NOT x.active
        ORDER BY x.job_type, x.tenant_id
        FOR NO KEY UPDATE OF x)
    RETURNING 1
),
{_NOTIFIED}
"""

# The jobs of insert_jobs' input CTE, as rows of jobs.
_INSERT_INPUT = """INSERT INTO jobs (job_key, job_type, tenant_id, state, priority, retries, run_at,
                      queued_at, variables, custom_headers, created_at, idempotency_key)
    SELECT job_key, job_type, tenant_id,
           CASE WHEN run_at > $2 THEN 'SCHEDULED' ELSE 'CREATED' END,
           priority, retries, run_at, GREATEST(run_at, $2), variables,
           custom_headers, $2, idempotency_key
    FROM input"""

# -- name: insert_jobs
# Inserts a batch of jobs in one round trip, marks their lanes backlogged and notifies
# once per job type.  Keys are drawn before the insert so that results map back to input
# order.  Idempotency: jobs_idempotency_idx, ON CONFLICT DO NOTHING.
# The batch travels as one JSON array of jobs spelled as the API spells them (validated
# by the caller), parsed by PostgreSQL: one parameter to encode instead of 8,000 array
# elements (asyncpg encodes those at ~1 us each).  Fields left out take the defaults
# $3 (tenantId), $4 (priority), $5 (retries).  Answers one row: every job's key in input
# order, and the (1-based) positions of jobs not inserted because their idempotency key
# was taken.
# Locks: the caller holds the shared lane-bucket locks (see module docstring).
INSERT_JOBS = f"""
WITH input AS MATERIALIZED (
    SELECT x.ord, nextval('job_key_seq') AS job_key,
           x.e->>'type' AS job_type, COALESCE(x.e->>'tenantId', $3) AS tenant_id,
           COALESCE((x.e->>'priority')::int, $4) AS priority,
           COALESCE((x.e->>'retries')::int, $5) AS retries,
           COALESCE(x.e->'variables', '{{}}') AS variables,
           COALESCE(x.e->'customHeaders', '{{}}') AS custom_headers,
           x.e->>'idempotencyKey' AS idempotency_key,
           CASE WHEN x.e->>'runAt' IS NOT NULL THEN (x.e->>'runAt')::timestamptz
                WHEN x.e->>'delay' IS NOT NULL
                  THEN $2::timestamptz + (x.e->>'delay')::float8 * interval '1 millisecond'
                ELSE $2::timestamptz END AS run_at
    FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(e, ord)
),
-- Jobs without an idempotency key are inserted apart: ON CONFLICT makes every row a
-- speculative insertion (a lock and an extra WAL record each), ~10 % of the statement.
ins_plain AS (
    {_INSERT_INPUT} WHERE idempotency_key IS NULL ORDER BY ord
    RETURNING job_key, job_type, tenant_id, state
),
ins_keyed AS (
    {_INSERT_INPUT} WHERE idempotency_key IS NOT NULL ORDER BY ord
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING job_key, job_type, tenant_id, state
),
ins AS (
    SELECT * FROM ins_plain UNION ALL SELECT * FROM ins_keyed
),
ready_lanes AS (
    SELECT job_type, tenant_id, count(*) AS n FROM ins WHERE state = 'CREATED'
    GROUP BY job_type, tenant_id
),
{_WAKE_CTES}SELECT ARRAY(SELECT job_key FROM input ORDER BY ord) AS job_keys,
       ARRAY(SELECT i.ord FROM input i LEFT JOIN ins ON ins.job_key = i.job_key
             WHERE ins.job_key IS NULL ORDER BY i.ord) AS not_inserted,
       (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
         + (SELECT count(*) FROM woken) AS _side_effects
"""


# -- name: insert_job_quiet
# insert_jobs without its NOTIFY, for a hand-off (Store.insert_and_claim_lead, ADR 012):
# the job may go to a waiter in the same transaction, and then nobody need be woken.
INSERT_JOB_QUIET = INSERT_JOBS.replace(_NOTIFIED, "notified AS (SELECT WHERE false)")

# -- name: notify_ready
# A job type's jobs that became activatable ("type n"), announced by hand.
NOTIFY_READY = f"SELECT pg_notify('{NOTIFY_CHANNEL}', $1)"

# -- name: find_idempotent
# The existing job for (tenant, idempotency key) pairs.  Index: jobs_idempotency_idx.
FIND_IDEMPOTENT = """
SELECT k.tenant_id, k.idempotency_key, j.job_key
FROM unnest($1::text[], $2::text[]) AS k(tenant_id, idempotency_key)
JOIN jobs j ON j.tenant_id = k.tenant_id AND j.idempotency_key = k.idempotency_key
"""

# -- name: wake_lanes
# Marks lanes backlogged after jobs became ready (retry, lease expiry, promotion, revive;
# one (type, tenant) pair per job) and notifies their job types with how many.  Writes
# only lanes that were parked.  Index: lanes pkey.
# Locks: caller holds the shared lane-bucket locks.
WAKE_LANES = f"""
WITH ready_lanes AS (
    SELECT job_type, tenant_id, count(*) AS n
    FROM unnest($1::text[], $2::text[]) AS r(job_type, tenant_id)
    GROUP BY job_type, tenant_id
),
{_WAKE_CTES}SELECT (SELECT count(*) FROM notified) + (SELECT count(*) FROM new_lanes)
       + (SELECT count(*) FROM woken)
"""

# Charges lanes of job type $1 their claimed jobs x stride of virtual time: the CTEs
# ``charge`` and ``charged`` (tenant_id and new vtime of each lane charged), with
# ``tenants``, ``counts`` and ``strides`` the parameters of the three arrays.
# Locks: the lane rows, in tenant order (the sub-select's sort sits below its row
# locking), until the statement commits -- asynchronously (synchronous_commit = off for
# its own transaction only, set only when a lane is charged): a crash can forget the
# last few hundred milliseconds of charges, which fences nothing; the claim it accounts
# for was durable before it ran.
_CHARGE = """charge AS (
    -- Each charged lane found by key and locked, in tenant order.
    SELECT x.tenant_id, c.n, c.stride
    FROM unnest({tenants}::text[], {counts}::int[], {strides}::float8[])
         AS c(tenant_id, n, stride)
    JOIN lanes x ON x.job_type = $1 AND x.tenant_id = c.tenant_id
    ORDER BY x.tenant_id
    FOR NO KEY UPDATE OF x
),
charged AS (
    UPDATE lanes l
    SET vtime = l.vtime + c.n * c.stride, activated_total = l.activated_total + c.n
    FROM charge c
    -- ANY(ARRAY(...)) keeps the update to one lanes_pkey probe per charged lane, as in
    -- the claim.  (An IN (...) of the locked keys made the generic plan a semi join
    -- comparing every charged lane with every other: 21 ms for 400 lanes, against 15 ms
    -- by key.)
    WHERE l.job_type = $1 AND l.tenant_id = ANY(ARRAY(SELECT tenant_id FROM charge))
      AND l.tenant_id = c.tenant_id
      AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off'
    RETURNING l.tenant_id, l.vtime
)"""

# Whether lane ``{lane}`` of job type $1 has a ready job: one descent of jobs_ready_idx.
# min(), not EXISTS: the min/max rewrite always descends jobs_ready_idx, where EXISTS let
# the generic plan scan the heap for a first match (660 ms at 1M).  min(), not max(): it
# reads the lane's youngest entry, not its head, where draining activators leave entries
# of jobs just claimed (dead, not yet pruned).
_READY_PROBE = """(SELECT min(j.priority) FROM jobs j
          WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = {lane})
         IS NOT NULL"""
_LANE_READY = _READY_PROBE.format(lane="l.tenant_id")

# -- name: read_lanes
# First charges the lanes the previous rounds claimed from ($4, $5, $6, as _CHARGE; empty
# arrays charge nothing), saving the round a statement and the wait for a separate charge
# to commit.  Then reads the job type's configuration and, in (vtime, tenant) order, the
# type's active lanes with their tenants' weight and cap, each probed for a ready job
# when $2 is at most PROBED_LANES (one round trip).  The scan stops at the lane after the
# ($2 + len($4))-th ready one
# (the run condition on ``readies``), or after SCANNED_LANES lanes: lanes that are
# active but empty (emptied a moment ago, not yet parked) are answered, flagged not
# ready, for the caller to park, and never take a ready lane's place -- so a read finds
# the ready lanes however many emptied ones sit in front of them (work conservation,
# DESIGN 1.6; ADR 014).  Last come the charged lanes that have no ready job any more:
# their claim emptied them, and the caller parks them too.
# The read's snapshot predates the charge, so a charged lane's new vtime comes from
# ``charged``; charges only move lanes later, so the first $2 ready lanes by new vtime
# are among the first $2 + len($4) by old (the caller keeps those $2).
# Lanes held at their tenant's cap are not read at all (the index range skips them).
# Index: lanes_type_vtime_idx (job_type, active, held, vtime, tenant_id), a range scan of
# the lanes up to the stop, excluded ones ($3) included; one probe of jobs_ready_idx per lane
# scanned (small reads) and per lane charged.  Locks: the charged lanes only.
_READ_LANES = """
WITH {charge}
SELECT NULL AS tenant_id, NULL::float8 AS vtime, NULL::int AS weight,
       NULL::int AS max_active_jobs, t.max_active_jobs AS type_cap, t.aging_interval_ms,
       t.aging_step, NULL::bool AS ready, NULL::bool AS scanned
FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = $1
UNION ALL
SELECT w.tenant_id, COALESCE(ch.vtime, w.vtime), w.weight, w.max_active_jobs, NULL, NULL,
       NULL, w.ready, true
FROM (SELECT s.*, count(*) FILTER (WHERE s.ready)
                    OVER (ORDER BY s.vtime, s.tenant_id ROWS UNBOUNDED PRECEDING) AS readies
      FROM (SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight, t.max_active_jobs,
                   CASE WHEN $2 <= {probed} THEN {ready} ELSE true END AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = $1 AND l.active AND NOT l.held
              AND l.tenant_id <> ALL($3::text[]) {tenants}
            ORDER BY l.vtime, l.tenant_id
            LIMIT {scanned}) s) w
LEFT JOIN charged ch ON ch.tenant_id = w.tenant_id
WHERE w.readies <= $2 + cardinality($4::text[])
UNION ALL
SELECT ch.tenant_id, ch.vtime, NULL, NULL, NULL, NULL, NULL, false, false
FROM charged ch WHERE NOT {charged_ready}
"""
# A read scans at most this many lanes: past them, the next round reads on (the empty
# lanes met are excluded from it), so one statement's cost stays bounded even where
# thousands of lanes were emptied at once and not yet parked.
SCANNED_LANES = 1024
# Reads of at most this many lanes probe each for a ready job, and so does the lead claim
# (claim_lead): small activations (long polls, streams), which an empty lane would cost a
# whole round.  A larger read (100 jobs over 108 lanes) takes every lane as ready: an
# empty one comes up short in the claim, is excluded and parked, and the call reads on.
# Probing them cost the 10,000-tenant drain 7 % (an earlier session) to ~25 % (medians of
# three alternating pairs under load, ADR 014) for rounds that eager parking makes rare.
PROBED_LANES = 16
_READ_CHARGE = _CHARGE.format(tenants="$4", counts="$5", strides="$6")
READ_LANES = _READ_LANES.format(
    charge=_READ_CHARGE,
    tenants="",
    scanned=SCANNED_LANES,
    probed=PROBED_LANES,
    ready=_LANE_READY,
    charged_ready=_READY_PROBE.format(lane="ch.tenant_id"),
)

# -- name: read_lanes_of_tenants
# As read_lanes, restricted to the caller's tenantIds.  A statement of its own (not an
# "$7 IS NULL OR" branch) so that its generic plan can use lanes pkey.
READ_LANES_OF_TENANTS = _READ_LANES.format(
    charge=_READ_CHARGE,
    tenants="AND l.tenant_id = ANY($7::text[])",
    scanned=SCANNED_LANES,
    probed=PROBED_LANES,
    ready=_LANE_READY,
    charged_ready=_READY_PROBE.format(lane="ch.tenant_id"),
)

# -- name: type_config
TYPE_CONFIG = """
SELECT max_active_jobs, aging_interval_ms, aging_step FROM job_types WHERE job_type = $1
"""

# -- name: count_active_type
# ACTIVATED jobs of a type, counted up to the cap only.  Index: jobs_active_type_idx.
# Called with the type's cap lock held, in a statement after the lock was taken.
COUNT_ACTIVE_TYPE = """
SELECT count(*) FROM (
    SELECT 1 FROM jobs WHERE state = 'ACTIVATED' AND job_type = $1 LIMIT $2
) capped
"""

# -- name: count_active_tenants
# The tenants' caps as they are now, and their ACTIVATED jobs (all types), each counted up
# to its cap only.  Read in a statement after the tenants' cap locks were taken, so a cap
# changed before sees its change (a change takes the locks too: jobfair_release_holds).
# Index: tenants pkey, jobs_active_tenant_idx.
COUNT_ACTIVE_TENANTS = """
SELECT t.tenant_id, t.max_active_jobs AS cap, (
    SELECT count(*) FROM (
        SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = t.tenant_id
        LIMIT t.max_active_jobs
    ) capped
) AS active
FROM tenants t WHERE t.tenant_id = ANY($1::text[]) AND t.max_active_jobs IS NOT NULL
"""

# -- name: lock_caps
# The cap locks of a capped claim: the job type's ($1, $2: class and key; a NULL key
# takes none) first, then the tenants' ($3, $4) in key order, in one statement (one
# global order: no deadlock).  jobfair_lock_tenant_caps is alembic 0003's.
LOCK_CAPS = """
SELECT CASE WHEN $2::int IS NULL THEN NULL ELSE pg_advisory_xact_lock($1, $2) END,
       jobfair_lock_tenant_caps($3, $4::text[])
"""

# -- name: hold_lanes
# Marks lanes of job type $1 held: their tenants ($2) are at their caps as counted by the
# claim that holds their cap locks, which it will hold until this commits.  A lane read
# skips held lanes; jobfair_release_holds, which takes the same locks first, releases them
# when the tenant's capacity frees (ADR 016).  Index: lanes pkey.  Locks: the lane rows.
HOLD_LANES = """
UPDATE lanes SET held = true
WHERE job_type = $1 AND tenant_id = ANY($2::text[]) AND NOT held
"""

# Up to k heads of each priority of claim's prios, FIFO (also aging order within one
# priority): locked ({lock}) for the top priority, read for the others.
_PRIORITY_HEADS = """SELECT h.job_key, p.tenant_id, p.priority, p.k, p.top, h.queued_at
          FROM prios p
          CROSS JOIN LATERAL (
              SELECT j.job_key, j.queued_at FROM jobs j
              WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = p.tenant_id
                AND j.priority = p.priority
              ORDER BY j.queued_at, j.job_key
              LIMIT p.k
              {lock}
          ) h
          WHERE {which} AND p.priority IS NOT NULL"""

# -- name: claim
# Activates up to k jobs from each allotted lane of one job type, best effective
# priority first.
# Index: jobs_ready_idx (job_type, tenant_id, priority DESC, queued_at, job_key)
#   WHERE state = 'CREATED'.  Per lane a recursive skip scan finds the distinct
#   priorities (one index descent each, at most 101); each priority's head yields up to k
#   rows in FIFO order, which within one priority is also aging order.  The best k of
#   those heads are the lane's best k jobs.  Cost O(k x P x log N), never a backlog scan.
# Locks: FOR UPDATE SKIP LOCKED, so concurrent activators of the same lane pass each
#   other (each takes the next unlocked rows) instead of queueing.  Only the top
#   priority's heads are locked as they are read; lower priorities' heads are read
#   without locks and, when aging promotes some of them into the best k, that many rows
#   of their priority are locked from its head (promoted).  Locking every priority's k
#   heads made concurrent claims skip rows that were never going to be taken, and hand
#   out younger jobs while older ones sat locked by a claim that would not take them
#   (ADR 003; tests/integration/test_claim.py).  No lane row is locked here: charging
#   is charge_lanes, after this statement has committed.
_CLAIM = f"""
WITH RECURSIVE {{alloc}},
prios AS (
    SELECT a.tenant_id, a.k, true AS top,
           (SELECT max(j.priority) FROM jobs j
             WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = a.tenant_id)
             AS priority
    FROM alloc a
  UNION ALL
    SELECT p.tenant_id, p.k, false,
           (SELECT max(j.priority) FROM jobs j
             WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = p.tenant_id
               AND j.priority < p.priority)
    FROM prios p WHERE p.priority IS NOT NULL
),
heads AS (
    SELECT u.*,
           LEAST(100, u.priority + {{step}} * floor(
               GREATEST(0, extract(epoch FROM ({{now}} - u.queued_at)) * 1000)
               / {{interval}})) AS eff
    FROM ({_PRIORITY_HEADS.format(lock="FOR UPDATE SKIP LOCKED", which="p.top")}
      UNION ALL
          {_PRIORITY_HEADS.format(lock="", which="NOT p.top")}) u
),
chosen AS (
    SELECT job_key, tenant_id, priority, top FROM (
        SELECT job_key, tenant_id, priority, k, top,
               row_number() OVER (PARTITION BY tenant_id
                                  ORDER BY eff DESC, queued_at, job_key) AS rn
        FROM heads
    ) ranked
    WHERE rn <= k
),
promoted AS (
    SELECT h.job_key
    FROM (SELECT tenant_id, priority, count(*)::int AS n FROM chosen WHERE NOT top
          GROUP BY tenant_id, priority) s
    CROSS JOIN LATERAL (
        SELECT j.job_key FROM jobs j
        WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = s.tenant_id
          AND j.priority = s.priority
        ORDER BY j.queued_at, j.job_key
        LIMIT s.n
        FOR UPDATE SKIP LOCKED
    ) h
),
taken AS (
    -- The taken rows shared out among the requests: the i-th gets row numbers from
    -- starts[i] up to the next one's start (with the i-th worker and deadline).
    SELECT t.job_key, width_bucket(row_number() OVER (), {{starts}}) AS share
    FROM (SELECT job_key FROM chosen WHERE top UNION ALL SELECT job_key FROM promoted) t
),
activated AS (
    UPDATE jobs j
    SET state = 'ACTIVATED', activation_count = j.activation_count + 1,
        worker = ({{workers}})[t.share], deadline = ({{deadlines}})[t.share],
        activated_at = {{now}}, via_stream = {{via_stream}}
    FROM taken t
    -- ANY(ARRAY(...)) makes this a primary-key probe per chosen row; a join alone lets
    -- the planner (misled by LIMIT k estimates) pick a sequential scan of jobs.
    WHERE j.job_key = ANY(ARRAY(SELECT job_key FROM taken)) AND t.job_key = j.job_key
    RETURNING j.*, t.share
)
{{answer}}
"""
CLAIM = _CLAIM.format(
    alloc="alloc AS (SELECT * FROM unnest($2::text[], $3::int[]) AS a(tenant_id, k))",
    now="$4::timestamptz",
    workers="$5::text[]",
    deadlines="$6::timestamptz[]",
    step="$7::int",
    interval="$8::int",
    via_stream="$9",
    starts="$10::int[]",
    answer="SELECT * FROM activated",
)

# -- name: claim_lead
# One stride pick, read and claimed in one round trip: the job type's first backlogged
# lane in (vtime, tenant) order that has a ready job -- the lane scheduler.allocate picks
# first -- gives its best job, exactly as CLAIM would give it with the count 1 for that
# lane.  For a waiter woken by one new job of an idle type, this saves read_lanes' round
# trip (~0.3-0.5 ms of a ~1.5 ms pickup).  It claims nothing where a cap is involved
# (the type's, or the lead lane's tenant's: those need their locks and counts), when none
# of the first PROBED_LANES active lanes has a ready job, or when the lead lane's heads
# are held by another activator; the caller then runs the full rounds, unless the answer
# says the type is dry.  Answers one row: the claimed job with the lane's weight (for its
# charge) and the type's aging ($5, $6: the server's defaults), or NULLs and whether the
# type is dry.  Index: lanes_type_vtime_idx, then as read_lanes and CLAIM.
_LEAD = f"""lead_lane AS (
    SELECT x.tenant_id, x.weight, x.cap, c.type_cap, c.aging_step, c.aging_interval_ms
    FROM (SELECT t.max_active_jobs AS type_cap,
                 COALESCE(t.aging_step, $5::int) AS aging_step,
                 COALESCE(t.aging_interval_ms, $6::int) AS aging_interval_ms
          FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = $1) c
    CROSS JOIN LATERAL (
        SELECT r.tenant_id, r.weight, r.cap FROM (
            SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight,
                   t.max_active_jobs AS cap, {_LANE_READY} AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = $1 AND l.active AND NOT l.held {{tenants}}
            ORDER BY l.vtime, l.tenant_id
            LIMIT {PROBED_LANES}) r
        WHERE r.ready
        ORDER BY r.vtime, r.tenant_id
        LIMIT 1) x
),
lead AS (
    SELECT tenant_id, weight, aging_step, aging_interval_ms FROM lead_lane
    WHERE type_cap IS NULL AND cap IS NULL
),
alloc AS (SELECT tenant_id, 1 AS k FROM lead)"""
# Whether the type is dry for the filter: no probed lane had a ready job, and the probe
# saw every active lane (fewer than PROBED_LANES).  Evaluated only when nothing was
# claimed (AND evaluates in order); it counts lanes_type_vtime_idx entries, the ready
# probes were the lead's.  It saves that caller the lane read that would prove it.
_LEAD_DRY = f"""NOT EXISTS (SELECT 1 FROM lead_lane)
       AND (SELECT count(*) < {PROBED_LANES}
            FROM (SELECT 1 FROM lanes l
                  WHERE l.job_type = $1 AND l.active AND NOT l.held {{tenants}}
                  LIMIT {PROBED_LANES}) p)"""


def _claim_lead(tenants: str) -> str:
    return _CLAIM.format(
        alloc=_LEAD.format(tenants=tenants),
        now="$2::timestamptz",
        workers="$3::text[]",
        deadlines="$4::timestamptz[]",
        step="(SELECT aging_step FROM lead)",
        interval="(SELECT aging_interval_ms FROM lead)",
        via_stream="$7",
        starts="$8::int[]",
        answer=f"""SELECT a.*, lead.weight AS lane_weight, lead.aging_step AS lane_aging_step,
       lead.aging_interval_ms AS lane_aging_interval_ms,
       (a.job_key IS NULL AND {_LEAD_DRY.format(tenants=tenants)}) AS dry
FROM (SELECT 1) one LEFT JOIN (activated a CROSS JOIN lead) ON true""",
    )


CLAIM_LEAD = _claim_lead("")
CLAIM_LEAD_OF_TENANTS = _claim_lead("AND l.tenant_id = ANY($9::text[])")


# -- name: charge_lanes
# Charges each lane (jobs claimed) x stride of virtual time ($2, $3, $4: tenants, jobs,
# strides), after the claim committed (so no claim holds lane rows across its WAL flush;
# ADR 001).  read_lanes carries the same charge (_CHARGE) in front of its read.  Answers
# the charged lanes that have no ready job left: their claim emptied them (the charge
# runs after the claim committed, so the last claim of a lane sees it empty), and the
# caller parks them (ADR 014).  Index: lanes pkey, one probe of jobs_ready_idx per lane.
CHARGE_LANES = f"""
WITH {_CHARGE.format(tenants="$2", counts="$3", strides="$4")}
SELECT ch.tenant_id FROM charged ch WHERE NOT {_READY_PROBE.format(lane="ch.tenant_id")}
"""

# -- name: park_lanes
# Second half of parking: with the exclusive bucket locks held (taken by the statement
# before), mark lanes inactive that have no CREATED job.  Index: jobs_ready_idx (one
# probe per lane), lanes pkey.
PARK_LANES = """
UPDATE lanes l SET active = false
WHERE l.job_type = $1 AND l.tenant_id IN (
      -- A lane an activator holds is busy, not empty: skip it rather than wait.
      SELECT x.tenant_id FROM lanes x
      WHERE x.job_type = $1 AND x.tenant_id = ANY($2::text[]) AND x.active
      FOR NO KEY UPDATE SKIP LOCKED)
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = l.tenant_id)
RETURNING l.tenant_id
"""

# -- name: get_job
# With the job type's aging settings, so a record renders in one round trip.
GET_JOB = f"""
SELECT {JOB_COLUMNS.replace("job_type,", "j.job_type,", 1)},
       t.aging_interval_ms AS type_aging_interval_ms, t.aging_step AS type_aging_step
FROM jobs j LEFT JOIN job_types t ON t.job_type = j.job_type
WHERE j.job_key = $1
"""

# -- name: job_state
JOB_STATES = "SELECT job_key, state, activation_count FROM jobs WHERE job_key = ANY($1::bigint[])"

# -- name: cancel_job
# CREATED (or SCHEDULED) -> CANCELED.  Index: jobs pkey.  Row lock via UPDATE.
CANCEL_JOB = """
UPDATE jobs SET state = 'CANCELED', completed_at = $2
WHERE job_key = $1 AND state IN ('CREATED', 'SCHEDULED')
RETURNING job_type, tenant_id
"""

# The finishing statements' test that job j is leased, for statements that find their
# jobs by key.  Spelled IS TRUE so that no partial index on ACTIVATED rows matches it:
# with "j.state = 'ACTIVATED'" the generic plan read every ACTIVATED job of the type
# through jobs_active_type_idx instead of probing jobs_pkey (7 ms instead of 4 to
# complete 100 jobs at 4,000 leases; ADR 002, tests/integration/test_claim.py).  The
# keys come from the unnest the statement joins, probed one by one; an extra
# "j.job_key = ANY($1)" made the generic plan scan jobs_pkey for all the keys and then
# rescan the unnest once per job (quadratic: 221 ms instead of 19 to complete 1,000).
_LEASED = "(j.state = 'ACTIVATED') IS TRUE"

# -- name: complete_jobs
# ACTIVATED -> COMPLETED for (key, activationCount) pairs; fenced by the count.  Merges
# the result variables.  Notifies when a job type or tenant has a cap (capacity freed).
COMPLETE_JOBS = f"""
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::jsonb[])
                  AS i(job_key, activation_count, variables)
),
ended AS (
    UPDATE jobs j
    SET state = 'COMPLETED', completed_at = $4, deadline = NULL,
        variables = j.variables || COALESCE(i.variables, '{{}}'::jsonb)
    FROM input i
    WHERE j.job_key = i.job_key AND {_LEASED}
      AND j.activation_count = i.activation_count
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream
),
{_CREDIT_NOTIFY},
{_CAPACITY_NOTIFY},
{_RELEASE_HOLDS}
SELECT job_key,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""

# -- name: fail_job
# ACTIVATED -> CREATED/SCHEDULED (retries left) or FAILED (none left); fenced.  A retried
# job rejoins the back of its priority when its back-off ends (queued_at = run_at).
# The caller then wakes the lane (lock, then wake_lanes) if the job became CREATED.
FAIL_JOB = f"""
WITH ended AS (
    UPDATE jobs j
    SET state = CASE WHEN r.retries = 0 THEN 'FAILED'
                     WHEN $5::timestamptz > $7::timestamptz THEN 'SCHEDULED'
                     ELSE 'CREATED' END,
        retries = r.retries, error_message = $4, deadline = NULL,
        run_at = CASE WHEN r.retries = 0 THEN j.run_at ELSE $5 END,
        queued_at = CASE WHEN r.retries = 0 THEN j.queued_at ELSE $5 END,
        completed_at = CASE WHEN r.retries = 0 THEN $7 ELSE NULL END,
        variables = j.variables || COALESCE($6::jsonb, '{{}}'::jsonb)
    FROM jobs cur
    CROSS JOIN LATERAL (SELECT COALESCE($3::int, GREATEST(0, cur.retries - 1)) AS retries) r
    WHERE j.job_key = $1 AND cur.job_key = $1 AND {_LEASED}
      AND j.activation_count = $2
    RETURNING j.job_key, j.job_type, j.tenant_id, j.state, j.via_stream
),
{_CREDIT_NOTIFY},
{_CAPACITY_NOTIFY},
{_RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, state,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""

# -- name: throw_error
# ACTIVATED -> ERROR_THROWN (terminal); fenced.
THROW_ERROR = f"""
WITH ended AS (
    UPDATE jobs j
    SET state = 'ERROR_THROWN', error_code = $3, error_message = $4, deadline = NULL,
        completed_at = $6, variables = j.variables || COALESCE($5::jsonb, '{{}}'::jsonb)
    WHERE j.job_key = $1 AND {_LEASED} AND j.activation_count = $2
    RETURNING j.job_key, j.job_type, j.tenant_id, j.via_stream
),
{_CREDIT_NOTIFY},
{_CAPACITY_NOTIFY},
{_RELEASE_HOLDS}
SELECT job_key,
       (SELECT count(*) FROM credited) + (SELECT count(*) FROM freed) + (SELECT n FROM unheld)
         AS _n
FROM ended
"""

# -- name: lock_job
# The job's row, locked for an update that reads before it writes (PATCH).
LOCK_JOB = f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_key = $1 FOR UPDATE"

# -- name: update_job
# PATCH: retries, lease (deadline) and priority; revives FAILED when retries > 0.
UPDATE_JOB = """
UPDATE jobs
SET retries = $2, deadline = $3, priority = $4, state = $5,
    completed_at = CASE WHEN $5 = 'FAILED' THEN completed_at ELSE NULL END,
    queued_at = CASE WHEN state = 'FAILED' AND $5 <> 'FAILED' THEN $6 ELSE queued_at END,
    run_at = CASE WHEN state = 'FAILED' AND $5 <> 'FAILED' THEN $6 ELSE run_at END
WHERE job_key = $1
RETURNING job_key
"""

# -- name: expired_leases
# ACTIVATED jobs whose lease ended.  Index: jobs_lease_idx.  No locks (the release
# re-checks state and deadline).
EXPIRED_LEASES = """
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'ACTIVATED' AND deadline < $1
ORDER BY deadline LIMIT $2
"""

# -- name: release_expired
# Expired ACTIVATED -> CREATED; retries and activationCount unchanged, so the stale
# holder is fenced out as soon as the job is activated again.
RELEASE_EXPIRED = f"""
WITH ended AS (
    UPDATE jobs SET state = 'CREATED', deadline = NULL
    WHERE job_key = ANY($1::bigint[]) AND state = 'ACTIVATED' AND deadline < $2
    RETURNING job_key, job_type, tenant_id, via_stream
),
{_CREDIT_NOTIFY},
{_RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, (SELECT count(*) FROM credited) + (SELECT n FROM unheld) AS _n
FROM ended
"""

# -- name: release_jobs
# ACTIVATED -> CREATED at once, for activations whose caller never got them; fenced.
RELEASE_JOBS = f"""
WITH ended AS (
    UPDATE jobs j SET state = 'CREATED', deadline = NULL
    FROM unnest($1::bigint[], $2::int[]) AS r(job_key, activation_count)
    WHERE j.job_key = r.job_key AND {_LEASED}
      AND j.activation_count = r.activation_count
    RETURNING j.job_key, j.job_type, j.tenant_id
),
{_RELEASE_HOLDS}
SELECT job_key, job_type, tenant_id, (SELECT n FROM unheld) AS _n FROM ended
"""

# -- name: due_scheduled
# Delayed jobs that are due.  Index: jobs_scheduled_idx.
DUE_SCHEDULED = """
SELECT job_key, job_type, tenant_id FROM jobs
WHERE state = 'SCHEDULED' AND run_at <= $1
ORDER BY run_at LIMIT $2
"""

# -- name: promote_scheduled
PROMOTE_SCHEDULED = """
UPDATE jobs SET state = 'CREATED'
WHERE job_key = ANY($1::bigint[]) AND state = 'SCHEDULED' AND run_at <= $2
RETURNING job_key, job_type, tenant_id
"""

# -- name: prune_terminal
# Deletes terminal jobs finished before $1, oldest first, in bounded batches.
# Index: jobs_terminal_idx.
PRUNE_TERMINAL = """
DELETE FROM jobs WHERE job_key IN (
    SELECT job_key FROM jobs
    WHERE state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED') AND completed_at < $1
    ORDER BY completed_at LIMIT $2
)
"""

# -- name: search_jobs
# Job search (Camunda's POST /v2/jobs/search): equality/IN filters on whitelisted
# columns, one sort key, offset paging.  An operator query: it may scan; the count is
# bounded (SEARCH_COUNT_LIMIT) so a huge table costs a bounded count.
SEARCH_COLUMNS = {
    "jobKey": "job_key",
    "type": "job_type",
    "tenantId": "tenant_id",
    "state": "state",
    "worker": "worker",
    "retries": "retries",
    "priority": "priority",
    "deadline": "deadline",
    "creationTime": "created_at",
    "endTime": "completed_at",
}
SEARCH_COUNT_LIMIT = 10_000

# -- name: stats
# Per lane (type, tenant): ready jobs (CREATED), delayed ones (SCHEDULED: a runAt or a
# retry back-off still ahead), active ones; the oldest ready job (by queued_at, when it
# became ready) and its key; and what may hold the lane back: its tenant's cap with the
# tenant's active jobs of every type (counted up to the cap, jobs_active_tenant_idx),
# and its type's cap.  Reads the backlog: an operator query, not hot path.  No locks.
_STATS = """
WITH per_lane AS (
    SELECT job_type, tenant_id,
           count(*) FILTER (WHERE state = 'CREATED') AS ready,
           count(*) FILTER (WHERE state = 'SCHEDULED') AS delayed,
           count(*) FILTER (WHERE state = 'ACTIVATED') AS active,
           min(queued_at) FILTER (WHERE state = 'CREATED') AS oldest_ready_at,
           -- The oldest ready job's key in the same pass: arrays compare element-wise.
           (min(ARRAY[extract(epoch FROM queued_at), job_key])
              FILTER (WHERE state = 'CREATED'))[2]::bigint AS oldest_ready_key
    FROM jobs WHERE state IN ('CREATED', 'SCHEDULED', 'ACTIVATED') {type}
    GROUP BY job_type, tenant_id
)
SELECT l.*, tn.max_active_jobs AS tenant_cap, jt.max_active_jobs AS type_cap,
       CASE WHEN tn.max_active_jobs IS NOT NULL THEN (
           SELECT count(*) FROM (
               SELECT 1 FROM jobs j WHERE j.state = 'ACTIVATED' AND j.tenant_id = l.tenant_id
               LIMIT tn.max_active_jobs) capped
       ) END AS tenant_active
FROM per_lane l
LEFT JOIN tenants tn ON tn.tenant_id = l.tenant_id
LEFT JOIN job_types jt ON jt.job_type = l.job_type
ORDER BY l.job_type, l.tenant_id
"""
STATS = _STATS.format(type="")
# -- name: stats_of_type
# As stats, for job type $1 only.
STATS_OF_TYPE = _STATS.format(type="AND job_type = $1")

LANE_TOTALS = "SELECT job_type, tenant_id, activated_total FROM lanes"

# -- name: upsert_tenant
# A tenant's configuration set; its held lanes are released (the cap that held them may
# be gone or higher; a claim holds them again if not), under its cap lock, which orders
# the change before or after every capped claim of the tenant (jobfair_release_holds).
UPSERT_TENANT = f"""
WITH up AS (
    INSERT INTO tenants (tenant_id, weight, max_active_jobs) VALUES ($1, $2, $3)
    ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight,
                                          max_active_jobs = EXCLUDED.max_active_jobs
    RETURNING tenant_id, weight, max_active_jobs
),
unheld AS (
    SELECT jobfair_release_holds(
        {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
)
SELECT up.* FROM up WHERE (SELECT count(*) FROM unheld) = 1
"""
GET_TENANT = "SELECT tenant_id, weight, max_active_jobs FROM tenants WHERE tenant_id = $1"
LIST_TENANTS = "SELECT tenant_id, weight, max_active_jobs FROM tenants ORDER BY tenant_id"
# -- name: release_after_finishes
# After a tenant's configuration change committed: waits, on the release gate taken
# exclusively, for every finishing statement in flight (one that began before the change
# chose the capped tenants it releases without seeing it), then releases the tenant's
# held lanes again, so that none stays held by a claim that counted those finishes'
# jobs as active (ADR 016).  Locks: the gate, then as jobfair_release_holds.
RELEASE_AFTER_FINISHES = f"""
SELECT pg_advisory_xact_lock({RELEASE_GATE_CLASS}, 0),
       jobfair_release_holds(
           {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
"""

# -- name: delete_tenant
# As upsert_tenant: the tenant's held lanes are released.
DELETE_TENANT = f"""
WITH gone AS (DELETE FROM tenants WHERE tenant_id = $1 RETURNING tenant_id),
unheld AS (
    SELECT jobfair_release_holds(
        {TENANT_CAP_LOCK_CLASS}, {RELEASE_GATE_CLASS}, ARRAY[$1::text], '{NOTIFY_CHANNEL}')
)
SELECT gone.tenant_id FROM gone WHERE (SELECT count(*) FROM unheld) = 1
"""
UPSERT_JOB_TYPE = """
INSERT INTO job_types (job_type, max_active_jobs, aging_interval_ms, aging_step)
VALUES ($1, $2, $3, $4)
ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs,
    aging_interval_ms = EXCLUDED.aging_interval_ms, aging_step = EXCLUDED.aging_step
RETURNING job_type, max_active_jobs, aging_interval_ms, aging_step
"""
GET_JOB_TYPE = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step FROM job_types WHERE job_type = $1
"""
LIST_JOB_TYPES = """
SELECT job_type, max_active_jobs, aging_interval_ms, aging_step FROM job_types ORDER BY job_type
"""


def lane_bucket(job_type: str, tenant_id: str) -> int:
    """The advisory-lock bucket of a lane (stable across processes and restarts)."""
    return zlib.crc32(f"{job_type}\x1f{tenant_id}".encode()) % LANE_BUCKETS


def _int4(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def cap_key(name: str) -> int:
    return _int4(zlib.crc32(name.encode()))


def _lock_sql(fn: str, klass: int, keys: Sequence[int]) -> str:
    # Integers only, so the literal SQL is safe; one simple-protocol round trip with BEGIN.
    calls = ", ".join(f"{fn}({_int4(klass)}, {int(k)})" for k in keys)
    return f"SELECT {calls}"


async def _insert(
    conn: asyncpg.Connection, statement: str, jobs: Sequence[Mapping[str, Any]], now: datetime
) -> tuple[list[int], list[int]]:
    """In the caller's transaction: the shared bucket locks of the lanes the jobs make
    ready, then ``statement`` (INSERT_JOBS or its quiet variant).  The keys in input
    order, and the 1-based positions not inserted (their idempotency key was taken)."""
    buckets = sorted({lane_bucket(j["type"], tenant_of(j)) for j in jobs if ready_at_once(j, now)})
    if buckets:
        await conn.execute(_lock_sql("pg_advisory_xact_lock_shared", LANE_LOCK_CLASS, buckets))
    keys, not_inserted, _ = await conn.fetchrow(
        statement,
        orjson.dumps(jobs).decode(),
        now,
        DEFAULT_TENANT,
        DEFAULT_PRIORITY,
        DEFAULT_RETRIES,
    )
    return keys, not_inserted


def tenant_of(job: Mapping[str, Any]) -> str:
    """A job to insert's tenant (INSERT_JOBS fills the same default in SQL)."""
    tenant: str = job.get("tenantId", DEFAULT_TENANT)
    return tenant


def ready_at_once(job: Mapping[str, Any], now: datetime) -> bool:
    """Whether a job to insert is CREATED (not SCHEDULED) at ``now``."""
    run_at = job.get("runAt")
    if run_at is not None:
        return datetime.fromisoformat(run_at) <= now
    return not job.get("delay")


class Inserted(NamedTuple):
    job_key: int
    created: bool


@dataclass(frozen=True, slots=True)
class LaneRow:
    tenant_id: str
    vtime: float
    weight: int
    max_active_jobs: int | None


@dataclass(frozen=True, slots=True)
class LaneRead:
    """What read_lanes found: the type's configuration; up to ``limit`` lanes with a ready
    job, in (vtime, tenant) order; the active lanes met that have none (to be parked);
    and whether there may be ready lanes beyond those read (``more``: the scan stopped
    at a ready lane past ``limit``, or at SCANNED_LANES) -- when not, every active lane
    not excluded was seen."""

    config: TypeConfig
    ready: list[LaneRow]
    empty: list[str]
    more: bool


class Share(NamedTuple):
    """One request's part in a claim: up to ``n`` jobs, leased to ``worker``."""

    worker: str | None
    lease_ms: int
    n: int


# Lane charges: jobs claimed per tenant, and each tenant's stride (1 / weight).
Charges = tuple[Counter[str], Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class TypeConfig:
    max_active_jobs: int | None
    aging_interval_ms: int | None
    aging_step: int | None


@dataclass(frozen=True, slots=True)
class LeadAsk:
    """Whom a lead claim is for: the request's tenants (None: all), its share, whether
    the job goes to a stream, and the server's aging defaults."""

    tenant_ids: Sequence[str] | None
    share: Share
    via_stream: bool
    default_aging_step: int
    default_aging_interval_ms: int


def _lead_call(job_type: str, ask: LeadAsk, now: datetime) -> tuple[str, tuple[Any, ...]]:
    """claim_lead's statement and arguments."""
    workers, deadlines, starts = _share_arrays([ask.share], now)
    args = (
        job_type,
        now,
        workers,
        deadlines,
        ask.default_aging_step,
        ask.default_aging_interval_ms,
        ask.via_stream,
        starts,
    )
    if ask.tenant_ids is None:
        return CLAIM_LEAD, args
    return CLAIM_LEAD_OF_TENANTS, (*args, list(ask.tenant_ids))


def _share_arrays(
    shares: Sequence[Share], now: datetime
) -> tuple[list[str | None], list[datetime], list[int]]:
    """A claim's shares as its array arguments: each share's worker, lease deadline and
    first row number (the i-th share takes rows from starts[i] to starts[i + 1] - 1)."""
    starts, at = [], 1
    for share in shares:
        starts.append(at)
        at += share.n
    deadlines = [now + timedelta(milliseconds=share.lease_ms) for share in shares]
    return [share.worker for share in shares], deadlines, starts


def _charge_arrays(charges: Charges | None) -> tuple[list[str], list[int], list[float]]:
    """_CHARGE's three arrays, in tenant order."""
    if charges is None:
        return [], [], []
    claimed, strides = charges
    tenants = sorted(claimed)
    return tenants, [claimed[t] for t in tenants], [strides[t] for t in tenants]


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "jsonb", encoder=_encode_jsonb, decoder=orjson.loads, schema="pg_catalog"
    )
    for sql, args in _warm_up_calls():
        await conn.fetch(sql, *args)


def _warm_up_calls() -> list[tuple[str, tuple[Any, ...]]]:
    """The statements of a job's path (create, activate, complete), each with arguments
    that match nothing, so it writes nothing.  Run once on every new pool connection,
    they leave it with the statements prepared and their generic plans built: otherwise
    the first calls on a fresh connection pay ~3 ms of parse and plan per statement, and
    a connection opened under load held up every pickup behind it for 10-25 ms."""
    now = utcnow()
    return [
        (INSERT_JOBS, ("[]", now, DEFAULT_TENANT, DEFAULT_PRIORITY, DEFAULT_RETRIES)),
        (INSERT_JOB_QUIET, ("[]", now, DEFAULT_TENANT, DEFAULT_PRIORITY, DEFAULT_RETRIES)),
        (GET_JOB, (-1,)),
        (READ_LANES, ("", 1, [], [], [], [])),
        # The same with a tenant filter: a worker that names its tenants (as Camunda's
        # clients do) reads with these.
        (READ_LANES_OF_TENANTS, ("", 1, [], [], [], [], [])),
        (CLAIM, ("", [], [], now, [], [], 0, 1, False, [])),
        (CLAIM_LEAD, ("", now, [], [], 0, 1, False, [])),
        (CLAIM_LEAD_OF_TENANTS, ("", now, [], [], 0, 1, False, [], [])),
        (CHARGE_LANES, ("", [], [], [])),
        (COMPLETE_JOBS, ([], [], [], now)),
    ]


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """Replaces asyncpg's default reset (a round trip on every release).  Pool
    connections keep no session state: advisory locks here are transaction-scoped, and
    LISTEN and the leader lock live on dedicated connections.  Only an interrupted
    transaction needs undoing."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


_WRITE = re.compile(r"\b(INSERT|DELETE|MERGE)\b|(?<!FOR )(?<!KEY )\bUPDATE\b", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def _writes(query: str) -> bool:
    """Whether a statement may change rows (a SELECT ... FOR UPDATE does not)."""
    return _WRITE.search(query) is not None


class _Connection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection that marks the failure of a statement that could have
    committed (a COMMIT, or a write outside a transaction) with ``may_have_committed``:
    if the connection died then, the call's outcome is unknown (``OutcomeUnknown``).  A
    failure anywhere else in a transaction rolled it back, and the call can be sent
    again as it was.  (The mark is on the exception: a pool's proxy of a connection that
    died is detached from it at once.)"""

    def _may_commit(self, query: str) -> bool:
        if self.is_in_transaction():
            return query.lstrip()[:6].upper() == "COMMIT"
        return _writes(query)

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        may_commit = self._may_commit(query)
        try:
            return await super().execute(query, *args, **kwargs)  # type: ignore[no-any-return]
        except DATABASE_UNAVAILABLE as exc:
            exc.may_have_committed = may_commit  # type: ignore[attr-defined]
            raise

    async def _execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
        may_commit = self._may_commit(query)
        try:
            return await super()._execute(query, *args, **kwargs)
        except DATABASE_UNAVAILABLE as exc:
            exc.may_have_committed = may_commit  # type: ignore[attr-defined]
            raise


def _encode_jsonb(value: Any) -> str:
    # Callers pass already-serialized JSON text (validated and size-checked at the edge).
    return value if isinstance(value, str) else orjson.dumps(value).decode()


P = ParamSpec("P")
R = TypeVar("R")
DEADLOCK_RETRIES = 3


def retry_deadlock(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Re-run a whole transaction that PostgreSQL aborted as a deadlock victim.

    Lanes are locked in key order on every path, so a deadlock needs a rare three-way
    race (a lane parked and woken while an activator holds its neighbour); the victim's
    transaction rolled back completely, so running it again is safe.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(DEADLOCK_RETRIES):
            try:
                return await fn(*args, **kwargs)
            except asyncpg.DeadlockDetectedError:
                if attempt == DEADLOCK_RETRIES - 1:
                    raise
                log.warning("deadlock in %s; retrying", fn.__name__)
        raise AssertionError("unreachable")

    return wrapper


# What a database that cannot be reached right now raises: refused, reset or missing
# socket (OSError), a connection lost in the middle of a call (class 08), a server
# starting up or shutting down (57P01-57P03), no connection slots left (53300).
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)
UNAVAILABLE_LOG_EVERY_S = 5.0
# What a background task retries rather than dies of: the database away (also as the
# pool's 503), a connection closed under a call (InterfaceError "connection is closed",
# asyncpg's InternalClientError "another operation is in progress" on a connection being
# torn down), a statement or connect that timed out.
TRANSIENT: tuple[type[Exception], ...] = (
    *DATABASE_UNAVAILABLE,
    ResourceExhausted,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.QueryCanceledError,
    TimeoutError,
)


# What start-up waits out: the database not (yet) there, starting or restarting.
NOT_YET_REACHABLE: tuple[type[Exception], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    TimeoutError,
)
STARTUP_RETRY_MAX_S = 2.0


async def until_reachable(attempt: Callable[[], Awaitable[R]], wait_s: float, what: str) -> R:
    """``attempt()``, repeated with back-off while the database cannot be reached, for
    at most ``wait_s``; logged once when it starts waiting and once when it is through.
    A process started during an outage then comes up when the database does."""
    deadline = time.monotonic() + wait_s
    delay_s = 0.1
    waited = False
    while True:
        try:
            result = await attempt()
        except NOT_YET_REACHABLE as exc:
            if time.monotonic() + delay_s > deadline:
                log.error("%s: database still unreachable after %.0f s: %r", what, wait_s, exc)
                raise
            if not waited:
                log.warning(
                    "%s: database unreachable (%r); waiting up to %.0f s", what, exc, wait_s
                )
                waited = True
            await asyncio.sleep(delay_s * (0.5 + random.random()))
            delay_s = min(delay_s * 2, STARTUP_RETRY_MAX_S)
            continue
        if waited:
            log.info("%s: database reachable", what)
        return result


async def ping_url(url: str) -> None:
    """One connection, one ``SELECT 1``: whether the database at ``url`` answers."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


def _broken(conn: asyncpg.Connection, exc: Exception) -> bool:
    """Whether asyncpg refused a call because its connection is closed or left in a
    state it cannot use (after the server died under it: InterfaceError "connection is
    closed", from ``Transaction.__aexit__`` too; InternalClientError "cannot switch to
    state N; another operation is in progress"), rather than because of the call."""
    if isinstance(exc, asyncpg.InternalClientError):
        return True
    try:
        return bool(conn.is_closed())
    except asyncpg.InterfaceError:  # the pool's proxy, detached from a connection that died
        return True


def refused_input(exc: Exception) -> bool:
    """Whether a statement failed on a value it was given rather than on the database or
    the statement itself: a data exception (SQLSTATE class 22: a NUL in text or JSON, an
    integer beyond its column, a date out of range; asyncpg raises the same class for an
    argument it cannot encode), or a deadline beyond the dates Python can represent.
    Where callers share a statement, such a failure is one caller's (see Coalescer's
    ``split``), and rerunning the others without it is safe: the statement was undone."""
    return isinstance(exc, asyncpg.DataError | OverflowError)


class BoundedPool:
    """The asyncpg pool, but waiting at most ``timeout_s`` for a connection: an exhausted
    pool is back pressure (503 RESOURCE_EXHAUSTED), not an unbounded queue.  So is a
    database that cannot be reached: the call is answered 503 with ``Retry-After``, and
    the pool reconnects by itself on a later call once the database is back."""

    def __init__(self, pool: asyncpg.Pool, timeout_s: float) -> None:
        self._pool = pool
        self.timeout_s = timeout_s
        self._unavailable_logged = -UNAVAILABLE_LOG_EVERY_S

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        try:
            if self._pool.get_idle_size():
                # Nothing to wait for, so no timeout: arming one costs a few percent of
                # the server's CPU on the hot path.
                conn = await self._pool.acquire()
            else:
                conn = await self._pool.acquire(timeout=self.timeout_s)
        except TimeoutError:
            raise ResourceExhausted("all database connections are busy", retry_after_s=1) from None
        except (*DATABASE_UNAVAILABLE, asyncpg.InternalClientError) as exc:
            raise self._unavailable(exc) from exc
        try:
            yield conn
        except DATABASE_UNAVAILABLE as exc:
            if getattr(exc, "may_have_committed", False):
                self._log_unavailable(exc)
                raise OutcomeUnknown(
                    "the database went away while this call's changes were being "
                    "committed: they may or may not have been made",
                ) from exc
            raise self._unavailable(exc) from exc
        except (asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            if not _broken(conn, exc):
                raise  # a statement called wrongly: a bug
            # Nothing was sent on it (the failure is asyncpg refusing to): the call is
            # safe to repeat.  Not reused: the pool opens a fresh connection instead.
            with contextlib.suppress(asyncpg.InterfaceError):  # a proxy already detached
                conn.terminate()
            raise self._unavailable(exc) from exc
        finally:
            await self._pool.release(conn)

    def _unavailable(self, exc: Exception) -> ResourceExhausted:
        """The client's answer names no host or port; the log says what failed (at most
        every few seconds: an outage fails every call)."""
        self._log_unavailable(exc)
        return ResourceExhausted("the database is unavailable; retry later", retry_after_s=1)

    def _log_unavailable(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._unavailable_logged >= UNAVAILABLE_LOG_EVERY_S:
            self._unavailable_logged = now
            log.warning("database unavailable: %r", exc)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        async with self.acquire() as conn:
            return await conn.fetch(query, *args)  # type: ignore[no-any-return]

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        async with self.acquire() as conn:
            return await conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        async with self.acquire() as conn:
            return await conn.execute(query, *args)  # type: ignore[no-any-return]

    def get_size(self) -> int:
        return self._pool.get_size()  # type: ignore[no-any-return]

    def get_idle_size(self) -> int:
        return self._pool.get_idle_size()  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self._pool.close()


class Store:
    """Named operations over an asyncpg pool."""

    def __init__(self, pool: BoundedPool) -> None:
        self.pool = pool

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        size: int,
        min_size: int | None = None,
        acquire_timeout_s: float = 5.0,
        wait_s: float = 0.0,
    ) -> Store:
        """A pool of ``size`` connections, ``min_size`` of them (default: all) opened now
        and kept open, so that load arriving later finds them connected and warm.  An
        unreachable database is waited for up to ``wait_s`` (``until_reachable``)."""
        pool = await until_reachable(lambda: cls._create_pool(url, size, min_size), wait_s, "pool")
        return cls(BoundedPool(pool, acquire_timeout_s))

    @staticmethod
    async def _create_pool(url: str, size: int, min_size: int | None) -> asyncpg.Pool:
        return await asyncpg.create_pool(
            url,
            min_size=size if min_size is None else min(min_size, size),
            max_size=size,
            init=_init_connection,
            reset=_reset_connection,
            connection_class=_Connection,
            # The hot statements are written to be plan-robust (primary-key probes via
            # ANY(ARRAY(...)), index range scans), so a generic plan is as good as a custom
            # one and saves ~2 ms of planning per claim.  JIT only adds latency here.
            server_settings={"plan_cache_mode": "force_generic_plan", "jit": "off"},
            command_timeout=60,
        )

    async def close(self) -> None:
        await self.pool.close()

    # -- producers -------------------------------------------------------------------

    @retry_deadlock
    async def insert_jobs(self, jobs: Sequence[Mapping[str, Any]], now: datetime) -> list[Inserted]:
        """Insert jobs given as the API spells them (validated ``schemas.CreateJob``
        dicts: a field left out takes its default here, in SQL)."""
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                keys, not_inserted = await _insert(conn, INSERT_JOBS, jobs, now)
            out = [Inserted(key, True) for key in keys]
            if not_inserted:
                # Their idempotency key was taken: answer with the job that holds it.  A
                # new statement sees jobs committed concurrently under the same key.
                taken = [jobs[o - 1] for o in not_inserted]
                found = await conn.fetch(
                    FIND_IDEMPOTENT,
                    [tenant_of(j) for j in taken],
                    [j["idempotencyKey"] for j in taken],
                )
                existing = {(f["tenant_id"], f["idempotency_key"]): f["job_key"] for f in found}
                for o, j in zip(not_inserted, taken, strict=True):
                    key = existing[(tenant_of(j), j["idempotencyKey"])]
                    out[o - 1] = Inserted(key, False)
        return out

    async def get_job(self, job_key: int) -> asyncpg.Record | None:
        return await self.pool.fetchrow(GET_JOB, job_key)

    async def job_states(self, job_keys: Sequence[int]) -> dict[int, asyncpg.Record]:
        rows = await self.pool.fetch(JOB_STATES, list(job_keys))
        return {r["job_key"]: r for r in rows}

    async def cancel_job(self, job_key: int, now: datetime) -> bool:
        """Cancel a CREATED or SCHEDULED job; then park its lane if that emptied it (an
        empty lane left active would keep its idle vtime, ADR 014)."""
        row = await self.pool.fetchrow(CANCEL_JOB, job_key, now)
        if row is None:
            return False
        await self.park_lanes(row["job_type"], [row["tenant_id"]])
        return True

    # -- activation ------------------------------------------------------------------

    @retry_deadlock
    async def read_lanes(
        self,
        job_type: str,
        limit: int,
        exclude: Sequence[str],
        tenant_ids: Sequence[str] | None,
        charges: Charges | None = None,
    ) -> LaneRead:
        """Charge ``charges`` (jobs claimed and stride per tenant) first, then read the
        type's configuration and its first ``limit`` lanes that have a ready job (see
        LaneRead)."""
        charge = _charge_arrays(charges)
        if tenant_ids is None:
            rows = await self.pool.fetch(READ_LANES, job_type, limit, list(exclude), *charge)
        else:
            rows = await self.pool.fetch(
                READ_LANES_OF_TENANTS, job_type, limit, list(exclude), *charge, list(tenant_ids)
            )
        cfg = TypeConfig(rows[0][4], rows[0][5], rows[0][6])
        ready = [LaneRow(r[0], r[1], r[2], r[3]) for r in rows[1:] if r[7]]
        # The charges moved some lanes: the first ``limit`` ready ones by their new vtime.
        ready.sort(key=lambda lane: (lane.vtime, lane.tenant_id))
        scanned = sum(1 for r in rows[1:] if r[8])
        empty = list(dict.fromkeys(r[0] for r in rows[1:] if not r[7]))
        more = len(ready) >= limit or scanned >= SCANNED_LANES
        return LaneRead(cfg, ready[:limit], empty, more)

    async def type_config(self, job_type: str) -> TypeConfig:
        row = await self.pool.fetchrow(TYPE_CONFIG, job_type)
        if row is None:
            return TypeConfig(None, None, None)
        return TypeConfig(row[0], row[1], row[2])

    @retry_deadlock
    async def claim(
        self,
        job_type: str,
        counts: dict[str, int],
        *,
        now: datetime,
        shares: Sequence[Share],
        via_stream: bool = False,
        aging_step: int,
        aging_interval_ms: int,
        type_cap: int | None,
        tenant_caps: dict[str, int],
        headroom: Callable[[int | None, dict[str, int]], dict[str, int]],
    ) -> list[asyncpg.Record]:
        """Claim ``counts`` jobs per tenant lane.  The caller charges the lanes after.

        The jobs claimed are shared out among ``shares`` in order, each taking up to its
        ``n`` (under its worker name and lease); a row's ``share`` is its index there.

        Without caps the claim is one autocommit statement.  With caps, the cap locks
        are taken first (type, then tenants by key: one global order, so no deadlock),
        the active jobs are counted *in a later statement* (so it sees every activation
        that committed before we got the lock), ``headroom(type_active, tenant_active)``
        trims the allocation, and the claim commits before the locks are released.
        """
        workers, deadlines, starts = _share_arrays(shares, now)
        args = (now, workers, deadlines, aging_step, aging_interval_ms, via_stream, starts)
        if type_cap is None and not tenant_caps:
            return await self.pool.fetch(
                CLAIM, job_type, list(counts), list(counts.values()), *args
            )
        return await self._claim_capped(job_type, type_cap, tenant_caps, headroom, args)

    async def claim_lead(
        self, job_type: str, ask: LeadAsk, now: datetime
    ) -> tuple[asyncpg.Record | None, bool]:
        """One stride pick read and claimed at once (claim_lead): the job, with its lane's
        weight and its type's aging, or None; and, when None, whether that is because
        the type is dry for the asker's tenants (else the full rounds are needed)."""
        sql, args = _lead_call(job_type, ask, now)
        row = await self.pool.fetchrow(sql, *args)
        assert row is not None  # the statement answers one row, claimed or not
        return (None if row["job_key"] is None else row), row["dry"]

    async def insert_and_claim_lead(
        self, job: Mapping[str, Any], now: datetime, ask: LeadAsk
    ) -> tuple[int, asyncpg.Record | None]:
        """A hand-off (ADR 012): insert one job that is ready at once, without an
        idempotency key, and claim its type's first stride pick for a waiting worker in
        the same transaction, as claim_lead would after it.  The pick is usually the new
        job; then nothing is notified, for nobody else need wake.  Otherwise (another
        lane is ahead of it, a cap, a head held) the new job is announced as
        insert_jobs announces it.  The new job's key, and the claimed job or None."""
        sql, args = _lead_call(job["type"], ask, now)
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                [key], _ = await _insert(conn, INSERT_JOB_QUIET, [job], now)
                row = await conn.fetchrow(sql, *args)
                if row["job_key"] != key:
                    await conn.execute(NOTIFY_READY, job["type"] + " 1")
        return key, (None if row["job_key"] is None else row)

    @retry_deadlock
    async def charge_lanes(self, job_type: str, charges: Charges) -> list[str]:
        """Charge each lane its claimed jobs x stride (charge_lanes), after the claim; the
        charged lanes left without a ready job, to be parked."""
        rows = await self.pool.fetch(CHARGE_LANES, job_type, *_charge_arrays(charges))
        return [r[0] for r in rows]

    async def _claim_capped(
        self,
        job_type: str,
        type_cap: int | None,
        tenant_caps: dict[str, int],
        headroom: Callable[[int | None, dict[str, int]], dict[str, int]],
        args: tuple[Any, ...],
    ) -> list[asyncpg.Record]:
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(
                    LOCK_CAPS,
                    _int4(TYPE_CAP_LOCK_CLASS),
                    None if type_cap is None else cap_key(job_type),
                    TENANT_CAP_LOCK_CLASS,
                    sorted(tenant_caps),
                )
                type_active = None
                if type_cap is not None:
                    type_active = await conn.fetchval(COUNT_ACTIVE_TYPE, job_type, type_cap)
                # Each capped tenant's room as counted now: cap (as it is now) - active.
                room: dict[str, int] = {}
                if tenant_caps:
                    counted = await conn.fetch(COUNT_ACTIVE_TENANTS, list(tenant_caps))
                    room = {r[0]: r[1] - r[2] for r in counted}
                counts = {t: k for t, k in headroom(type_active, room).items() if k > 0}
                got = []
                if counts:
                    got = await conn.fetch(
                        CLAIM, job_type, list(counts), list(counts.values()), *args
                    )
                # The tenants this claim leaves at their caps: their lanes of this type
                # are held, out of the reads, until their capacity frees (ADR 016).
                taken = Counter(r["tenant_id"] for r in got)
                full = sorted(t for t, n in room.items() if n - taken[t] <= 0)
                if full:
                    await conn.execute(HOLD_LANES, job_type, full)
                return got

    async def park_lanes(
        self, job_type: str, tenant_ids: Sequence[str], *, retries: int = 0
    ) -> list[str]:
        """Mark lanes inactive that are really empty (see the module docstring); the lanes
        parked.  Lanes whose bucket a producer held for longer than PARK_WAIT are tried
        again up to ``retries`` times, after PARK_RETRY_S, doubling: an emptied lane left
        active keeps its idle virtual time, and when jobs come back it takes every
        activation until it catches up (ADR 014), so background parks keep trying while
        two producers' batches overlap for seconds."""
        parked, busy = await self._park_once(job_type, tenant_ids)
        pause = PARK_RETRY_S
        for _ in range(retries):
            if not busy:
                break
            await asyncio.sleep(pause)
            pause *= 2
            more, busy = await self._park_once(job_type, busy)
            parked += more
        if busy:
            log.info("parking %d lanes of %r waited in vain", len(busy), job_type)
        return parked

    @retry_deadlock
    async def _park_once(
        self, job_type: str, tenant_ids: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """One try of park_lanes: the lanes parked, and those whose bucket stayed busy."""
        by_bucket: dict[int, list[str]] = {}
        for t in tenant_ids:
            by_bucket.setdefault(lane_bucket(job_type, t), []).append(t)
        buckets = sorted(by_bucket)
        unlocked: list[str] = []
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                got = await conn.fetchrow(
                    _lock_sql("pg_try_advisory_xact_lock", LANE_LOCK_CLASS, buckets)
                )
                locked = [t for b, ok in zip(buckets, got, strict=True) if ok for t in by_bucket[b]]
                rows = await conn.fetch(PARK_LANES, job_type, locked) if locked else []
            busy = [b for b, ok in zip(buckets, got, strict=True) if not ok]
            if busy:
                # A producer holds these buckets (for any lane of them).  Trying again
                # later could fail every time under a steady producer, and an empty
                # lane left active would keep its idle vtime (ADR 014): wait for them,
                # in a transaction of their own and in bucket order as producers lock
                # them (no deadlock), for at most PARK_WAIT.  New producers of these
                # buckets queue behind the park for that long at most.
                waited = [t for b in busy for t in by_bucket[b]]
                try:
                    async with conn.transaction():
                        await conn.execute(f"SET LOCAL lock_timeout = '{PARK_WAIT_MS}ms'")
                        await conn.execute(
                            _lock_sql("pg_advisory_xact_lock", LANE_LOCK_CLASS, busy)
                        )
                        rows = [*rows, *await conn.fetch(PARK_LANES, job_type, waited)]
                except asyncpg.LockNotAvailableError:
                    unlocked = waited
        return [r[0] for r in rows], unlocked

    # -- finishing -------------------------------------------------------------------

    async def complete_jobs(
        self, items: Sequence[tuple[int, int, str | None]], now: datetime
    ) -> set[int]:
        rows = await self.pool.fetch(
            COMPLETE_JOBS,
            [i[0] for i in items],
            [i[1] for i in items],
            [i[2] for i in items],
            now,
        )
        return {r[0] for r in rows}

    @retry_deadlock
    async def fail_job(
        self,
        job_key: int,
        activation_count: int,
        *,
        retries: int | None,
        error_message: str | None,
        run_at: datetime,
        variables: str | None,
        now: datetime,
    ) -> asyncpg.Record | None:
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                row = await conn.fetchrow(
                    FAIL_JOB,
                    job_key,
                    activation_count,
                    retries,
                    error_message,
                    run_at,
                    variables,
                    now,
                )
                if row is not None and row["state"] == "CREATED":
                    # Lock before wake, in its own statement (module docstring).
                    await conn.execute(
                        _lock_sql(
                            "pg_advisory_xact_lock_shared",
                            LANE_LOCK_CLASS,
                            [lane_bucket(row["job_type"], row["tenant_id"])],
                        )
                    )
                    await conn.fetchval(WAKE_LANES, [row["job_type"]], [row["tenant_id"]])
                return row

    async def throw_error(
        self,
        job_key: int,
        activation_count: int,
        error_code: str,
        error_message: str | None,
        variables: str | None,
        now: datetime,
    ) -> bool:
        row = await self.pool.fetchrow(
            THROW_ERROR, job_key, activation_count, error_code, error_message, variables, now
        )
        return row is not None

    @retry_deadlock
    async def update_job(self, job_key: int, decide: Any, now: datetime) -> Any:
        """Read-modify-write under the row lock: ``decide(row)`` returns the new values
        ``(retries, deadline, priority, state)`` or raises a domain error."""
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                row = await conn.fetchrow(LOCK_JOB, job_key)
                retries, deadline, priority, state = decide(row)
                if state == "CREATED" and row["state"] != "CREATED":
                    await conn.execute(
                        _lock_sql(
                            "pg_advisory_xact_lock_shared",
                            LANE_LOCK_CLASS,
                            [lane_bucket(row["job_type"], row["tenant_id"])],
                        )
                    )
                await conn.execute(UPDATE_JOB, job_key, retries, deadline, priority, state, now)
                if state == "CREATED" and row["state"] != "CREATED":
                    await conn.fetchval(WAKE_LANES, [row["job_type"]], [row["tenant_id"]])
                return row

    # -- making jobs ready in bulk (sweepers, releases) -------------------------------

    @retry_deadlock
    async def _ready_by_keys(
        self,
        select_sql: str,
        select_args: tuple[Any, ...],
        update_sql: str,
        update_args: tuple[Any, ...],
    ) -> list[asyncpg.Record]:
        """Select candidates, take their lanes' shared bucket locks, then update them."""
        async with self.pool.acquire() as conn:
            candidates = await conn.fetch(select_sql, *select_args)
            if not candidates:
                return []
            buckets = sorted({lane_bucket(r["job_type"], r["tenant_id"]) for r in candidates})
            async with conn.transaction():
                await conn.execute(
                    _lock_sql("pg_advisory_xact_lock_shared", LANE_LOCK_CLASS, buckets)
                )
                rows = await conn.fetch(
                    update_sql, [r["job_key"] for r in candidates], *update_args
                )
                if rows:
                    await conn.fetchval(
                        WAKE_LANES, [r["job_type"] for r in rows], [r["tenant_id"] for r in rows]
                    )
            return rows

    async def release_expired(self, now: datetime, limit: int) -> int:
        rows = await self._ready_by_keys(EXPIRED_LEASES, (now, limit), RELEASE_EXPIRED, (now,))
        return len(rows)

    async def promote_scheduled(self, now: datetime, limit: int) -> int:
        rows = await self._ready_by_keys(DUE_SCHEDULED, (now, limit), PROMOTE_SCHEDULED, (now,))
        return len(rows)

    @retry_deadlock
    async def release_jobs(self, jobs: Sequence[asyncpg.Record]) -> int:
        """Give back activations the caller never received (fenced by activationCount)."""
        if not jobs:
            return 0
        buckets = sorted({lane_bucket(j["job_type"], j["tenant_id"]) for j in jobs})
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(
                    _lock_sql("pg_advisory_xact_lock_shared", LANE_LOCK_CLASS, buckets)
                )
                rows = await conn.fetch(
                    RELEASE_JOBS,
                    [j["job_key"] for j in jobs],
                    [j["activation_count"] for j in jobs],
                )
                if rows:
                    await conn.fetchval(
                        WAKE_LANES, [r["job_type"] for r in rows], [r["tenant_id"] for r in rows]
                    )
        return len(rows)

    async def prune_terminal(self, before: datetime, limit: int) -> int:
        status = await self.pool.execute(PRUNE_TERMINAL, before, limit)
        return int(status.split()[-1])

    # -- operators -------------------------------------------------------------------

    async def upsert_tenant(self, tenant_id: str, weight: int, cap: int | None) -> asyncpg.Record:
        row = await self.pool.fetchrow(UPSERT_TENANT, tenant_id, weight, cap)
        await self._release_after_finishes(tenant_id)
        return row

    async def _release_after_finishes(self, tenant_id: str) -> None:
        """After a tenant's change committed (release_after_finishes)."""
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                await conn.execute(RELEASE_AFTER_FINISHES, tenant_id)

    async def get_tenant(self, tenant_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(GET_TENANT, tenant_id)

    async def list_tenants(self) -> list[asyncpg.Record]:
        return await self.pool.fetch(LIST_TENANTS)

    async def delete_tenant(self, tenant_id: str) -> bool:
        deleted = await self.pool.fetchval(DELETE_TENANT, tenant_id) is not None
        await self._release_after_finishes(tenant_id)
        return deleted

    async def upsert_job_type(
        self, job_type: str, cap: int | None, interval_ms: int | None, step: int | None
    ) -> asyncpg.Record:
        return await self.pool.fetchrow(UPSERT_JOB_TYPE, job_type, cap, interval_ms, step)

    async def get_job_type(self, job_type: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(GET_JOB_TYPE, job_type)

    async def list_job_types(self) -> list[asyncpg.Record]:
        return await self.pool.fetch(LIST_JOB_TYPES)

    async def search_jobs(
        self,
        filters: dict[str, list[Any]],
        sort: list[tuple[str, bool]],
        limit: int,
        offset: int,
    ) -> tuple[list[asyncpg.Record], int, bool]:
        """``filters``: API field -> accepted values; ``sort``: (API field, descending).
        Returns (rows, total counted up to SEARCH_COUNT_LIMIT, more than that)."""
        where, args = [], []
        for field, values in filters.items():
            args.append(values)
            cast = (
                "bigint[]" if field == "jobKey" else ("int[]" if field == "retries" else "text[]")
            )
            where.append(f"{SEARCH_COLUMNS[field]} = ANY(${len(args)}::{cast})")
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        order = ", ".join(
            f"{SEARCH_COLUMNS[f]} {'DESC' if desc else 'ASC'} NULLS LAST" for f, desc in sort
        )
        order = f"ORDER BY {order + ', ' if order else ''}job_key"
        rows = await self.pool.fetch(
            f"SELECT {JOB_COLUMNS} FROM jobs {clause} {order} "
            f"LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
            *args,
            limit,
            offset,
        )
        total = await self.pool.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM jobs {clause} "
            f"LIMIT {SEARCH_COUNT_LIMIT + 1}) bounded",
            *args,
        )
        return rows, min(total, SEARCH_COUNT_LIMIT), total > SEARCH_COUNT_LIMIT

    async def stats(self, job_type: str | None = None) -> list[asyncpg.Record]:
        if job_type is None:
            return await self.pool.fetch(STATS)
        return await self.pool.fetch(STATS_OF_TYPE, job_type)

    async def lane_totals(self) -> list[asyncpg.Record]:
        return await self.pool.fetch(LANE_TOTALS)

    async def ping(self) -> None:
        await self.pool.fetchval("SELECT 1")

    async def schema_revision(self) -> str | None:
        try:
            return await self.pool.fetchval("SELECT version_num FROM alembic_version")
        except asyncpg.UndefinedTableError:
            return None
