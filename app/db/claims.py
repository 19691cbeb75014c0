"""Claims: jobs activated for callers, best effective priority first within each lane.

A claim is told how many jobs to take from which lanes (the scheduler's allocation); it
takes them with FOR UPDATE SKIP LOCKED, so activators of the same lanes pass each other.
Where caps or rate limits are involved the caller opens a transaction, takes the cap
locks and counts and reads the token buckets after them in one round trip
(``lock_and_count``), decides, claims -- holding the lanes it leaves at their caps in
the claim's own statement (``claim_holding``) -- and writes back the tokens taken
(``take_tokens``), all in it.  Charging the
lanes their virtual time is ``app.db.lanes.charge``, after the claim committed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from app.db import lanes
from app.db.base import Queries, Sessions
from app.db.history import TRIM_CTE
from app.db.jobs import INSERT_JOB_QUIET, NOTIFY_READY, insert_into, locks_for
from app.db.lanes import KEY_READY, LANE_READY, PROBED_LANES
from app.db.locks import TENANT_CAP_LOCK_CLASS, TYPE_CAP_LOCK_CLASS, cap_key, int4
from app.db.rows import Claimed, JobRow, LeadClaim, job_columns, job_row
from app.scheduler import DEFAULT_LEASE_ESTIMATE_S, Bucket, Buckets, FairnessBy, left_at_cap

# -- name: lock_and_count
# A capped claim's cap locks and, read after them, its counts and token buckets, in one
# round trip: jobfair_lock_and_count (alembic 0014), which takes the type's lock ($1, $2;
# a NULL key takes none) and the tenants' ($3, $4) in key order, then reads -- each
# statement of a volatile function takes its own snapshot, so these see every claim that
# committed before the locks were this one's -- the instant (kind 'now', in ``at``), the
# type's ACTIVATED jobs up to its cap ($5, $6; 'type'), each capped tenant's cap and
# ACTIVATED jobs up to it ($7; 'tenant'), and the buckets of the type (if $8;
# 'type_bucket') and of the tenants $9 ('tenant_bucket').  Index: jobs_active_type_idx,
# jobs_active_tenant_idx, tenants pkey, job_types pkey.
LOCK_AND_COUNT = """
SELECT * FROM jobfair_lock_and_count($1, $2, $3, $4::text[], $5, $6, $7::text[], $8, $9::text[])
"""

# -- name: take_tokens
# What a rate-limited claim left in its buckets (scheduler.Bucket.take), written in its
# transaction before the cap locks go: the type's ($1: its tokens and instant $2, $3; $2
# NULL: none taken) and the tenants' ($4 to $6).  A bucket whose limit changed since the
# claim read it (its rate_at is not the one read, $7 and $8) keeps the change: a new
# limit starts with its own bucket.  Index: job_types pkey, tenants pkey.  Locks: the
# rows (a job type's change writes its row without the cap lock, and is waited for).
TAKE_TOKENS = """
WITH type_taken AS (
    UPDATE job_types SET rate_tokens = $2, rate_at = $3
    WHERE $2::float8 IS NOT NULL AND job_type = $1 AND rate_at = $7
    RETURNING 1
)
UPDATE tenants t SET rate_tokens = u.tokens, rate_at = u.at
FROM unnest($4::text[], $5::float8[], $6::timestamptz[], $8::timestamptz[])
     AS u(tenant_id, tokens, at, read_at)
WHERE t.tenant_id = u.tenant_id AND t.rate_at = u.read_at
"""

# What an activation of job j is charged (ADR 029): by worker time, its lane's estimate of
# the seconds its lease will be held (scheduler.job_units; DEFAULT_LEASE_ESTIMATE_S before
# one of the lane's jobs finished), settled when the lease ends; NULL by activations or
# cost, whose charge is exact (a job's cost is in its row).  The type's mode is an
# InitPlan, read once per claim; the lane's estimate one lanes pkey probe per job, made
# only by worker time (CASE evaluates it only then).  With it, the virtual time it adds
# to its lane and its key: the estimate per their weights as they are now (a tenants and
# a key_weights pkey probe, by worker time only).  The round charges the lane and key
# exactly these (app.scheduler.round_charges), and the settlement takes exactly these
# back, so a weight changed while the lease is out moves nothing it should not (a
# helper's runs: a weight lowered while a claim was in flight banked the lane 1,500 s of
# worker time when charge and settlement each read the weight of their own moment).
_WORKER_TIME = "(SELECT t.fairness_by FROM job_types t WHERE t.job_type = $1) = 'workerTime'"
_ESTIMATE = f"""COALESCE((SELECT l.unit_est FROM lanes l
                       WHERE l.job_type = $1 AND l.tenant_id = j.tenant_id),
                      {DEFAULT_LEASE_ESTIMATE_S}::float8)"""
_CHARGED = f"""CASE WHEN {_WORKER_TIME} THEN {_ESTIMATE} END"""
_LANE_CHARGE = f"""CASE WHEN {_WORKER_TIME}
        THEN {_ESTIMATE} / COALESCE((SELECT t.weight FROM tenants t
                                     WHERE t.tenant_id = j.tenant_id), 1) END"""
_KEY_CHARGE = f"""CASE WHEN {_WORKER_TIME}
        THEN {_ESTIMATE} / COALESCE((SELECT w.weight FROM key_weights w
                                     WHERE w.tenant_id = j.tenant_id
                                       AND w.fairness_key = j.fairness_key
                                       AND w.shard = jobfair_shard(j.tenant_id)), 1) END"""

# priority): locked ({lock}) for the top priority, read for the others.
_PRIORITY_HEADS = """SELECT h.job_key, p.tenant_id, p.fairness_key, p.priority, p.k, p.top,
                 h.queued_at
          FROM prios p
          CROSS JOIN LATERAL (
              SELECT j.job_key, j.queued_at FROM jobs j
              WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = p.tenant_id
                AND j.fairness_key = p.fairness_key AND j.priority = p.priority
              ORDER BY j.queued_at, j.job_key
              LIMIT p.k
              {lock}
          ) h
          WHERE {which} AND p.priority IS NOT NULL"""

# A job's effective priority in SQL: min(100, priority + step x whole intervals waited).
# Twin of app.scheduler.effective_priority; tests/integration/test_twins.py checks that
# the two agree.  The wait is computed in numeric (extract returns numeric), so a wait of
# exactly k intervals ages k steps, as the Python twin's whole microseconds do.
EFFECTIVE_PRIORITY = """LEAST(100, {priority} + {step} * floor(
               GREATEST(0, extract(epoch FROM ({now} - {queued_at})) * 1000)
               / {interval}))"""

# -- name: claim
# Activates up to k jobs from each allotted key of each allotted lane of one job type
# (scheduler.split_among_keys), best effective priority first within the key.
# Index: jobs_ready_idx (job_type, tenant_id, fairness_key, priority DESC, queued_at,
#   job_key) WHERE state = 'CREATED'.  Per key a recursive skip scan finds the distinct
#   priorities (one index descent each, at most 101); each priority's head yields up to k
#   rows in FIFO order, which within one priority is also aging order.  The best k of
#   those heads are the key's best k jobs.  Cost O(k x P x log N), never a backlog scan.
# Locks: FOR UPDATE SKIP LOCKED, so concurrent activators of the same lane pass each
#   other (each takes the next unlocked rows) instead of queueing.  Only the top
#   priority's heads are locked as they are read; lower priorities' heads are read
#   without locks and, when aging promotes some of them into the best k, that many rows
#   of their priority are locked from its head (promoted).  Locking every priority's k
#   heads made concurrent claims skip rows that were never going to be taken, and hand
#   out younger jobs while older ones sat locked by a claim that would not take them
#   (ADR 003; tests/integration/test_claim.py).  No lane row is locked here: charging
#   is charge_lanes, after this statement has committed.
# History: writes nothing (an activation is recorded when it ends), but drops an old
# activation's rows once a job is past the windows it keeps (app.db.history).
_CLAIM = f"""
WITH RECURSIVE {{alloc}},
prios AS (
    SELECT a.tenant_id, a.fairness_key, a.k, true AS top,
           (SELECT max(j.priority) FROM jobs j
             WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = a.tenant_id
               AND j.fairness_key = a.fairness_key)
             AS priority
    FROM alloc a
  UNION ALL
    SELECT p.tenant_id, p.fairness_key, p.k, false,
           (SELECT max(j.priority) FROM jobs j
             WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = p.tenant_id
               AND j.fairness_key = p.fairness_key AND j.priority < p.priority)
    FROM prios p WHERE p.priority IS NOT NULL
),
heads AS (
    -- The effective priority: twin of app.scheduler.effective_priority (property-tested
    -- against it, tests/integration/test_twins.py).
    SELECT u.*,
           {
    EFFECTIVE_PRIORITY.format(
        priority="u.priority",
        queued_at="u.queued_at",
        now="{now}",
        step="{step}",
        interval="{interval}",
    )
}
             AS eff
    FROM ({_PRIORITY_HEADS.format(lock="FOR UPDATE SKIP LOCKED", which="p.top")}
      UNION ALL
          {_PRIORITY_HEADS.format(lock="", which="NOT p.top")}) u
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
    FROM (SELECT tenant_id, fairness_key, priority, count(*)::int AS n FROM chosen
          WHERE NOT top GROUP BY tenant_id, fairness_key, priority) s
    CROSS JOIN LATERAL (
        SELECT j.job_key FROM jobs j
        WHERE j.state = 'CREATED' AND j.job_type = $1 AND j.tenant_id = s.tenant_id
          AND j.fairness_key = s.fairness_key AND j.priority = s.priority
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
        activated_at = {{now}}, via_stream = {{via_stream}}, charged = {_CHARGED}{{charges}}
    FROM taken t
    -- ANY(ARRAY(...)) makes this a primary-key probe per chosen row; a join alone lets
    -- the planner (misled by LIMIT k estimates) pick a sequential scan of jobs.
    WHERE j.job_key = ANY(ARRAY(SELECT job_key FROM taken)) AND t.job_key = j.job_key
    RETURNING t.share, {job_columns("j")}
),
{{log}}
{{answer}}
"""
# The virtual times an estimate adds (by worker time), written by the claims of a type
# fair by worker time (claim_by_worker_time, and the lead claims of a type last seen so).
# Claims by activations or cost leave them out: their two CASEs cost a claim 6 to 7 %
# (p50; docs/benchmarks.md).  A type switched to worker time between what a process saw
# and its claim has that claim's jobs settled at the weights of their end, as before
# alembic 0013.
_CHARGES = f""",
        lane_charge = {_LANE_CHARGE}, key_charge = {_KEY_CHARGE}"""
_ALLOC = """alloc AS (
    SELECT * FROM unnest($2::text[], $11::text[], $3::int[]) AS a(tenant_id, fairness_key, k)
)"""


# A capped claim's holds (ADR 016), in the claim's own statement: the lanes of the capped
# tenants ($12, with their room as counted under their cap locks, $13) that the claim
# leaves with no room (scheduler.left_at_cap) are held out of later reads.  Index: lanes
# pkey.  Locks: the lane rows, after the jobs'.
_HOLD = """,
held AS (
    UPDATE lanes l SET held = true, held_count = l.held_count + 1
    WHERE l.job_type = $1 AND NOT l.held AND l.tenant_id = ANY(ARRAY(
        SELECT r.tenant_id FROM unnest($12::text[], $13::int[]) AS r(tenant_id, room)
        WHERE r.room <= (SELECT count(*) FROM activated a WHERE a.tenant_id = r.tenant_id)))
)"""


def _claim(charges: str, hold: str = "") -> str:
    return _CLAIM.format(
        alloc=_ALLOC,
        charges=charges,
        now="$4::timestamptz",
        workers="$5::text[]",
        deadlines="$6::timestamptz[]",
        step="$7::int",
        interval="$8::int",
        via_stream="$9",
        starts="$10::int[]",
        log=TRIM_CTE + hold,
        answer="SELECT * FROM activated",
    )


CLAIM = _claim("")
# -- name: claim_by_worker_time
# As claim, for a type fair by worker time: each job also records the virtual time its
# estimate adds to its lane and its key (lane_charge, key_charge; ADR 029).
CLAIM_BY_WORKER_TIME = _claim(_CHARGES)
# -- name: claim_holding
# As claim, for a claim under cap locks: it also holds the lanes of the capped tenants
# ($12) it leaves with no room ($13: each one's room as counted under its lock), in the
# same statement (one round trip less with the locks held; hold_lanes, ADR 016).
CLAIM_HOLDING = _claim("", _HOLD)
# -- name: claim_holding_by_worker_time
# As claim_holding, for a type fair by worker time (claim_by_worker_time).
CLAIM_HOLDING_BY_WORKER_TIME = _claim(_CHARGES, _HOLD)

# -- name: claim_lead
# One stride pick, read and claimed in one round trip: the job type's first backlogged
# lane in (vtime, tenant) order that has a ready job -- the lane scheduler.allocate picks
# first -- and in it the first backlogged key in (vtime, key) order that has one -- the
# key scheduler.allocate_keys picks first -- gives its best job, exactly as CLAIM would
# give it with the count 1 for that key.  For a waiter woken by one new job of an idle
# type, this saves read_lanes' and read_keys' round trips, a large part of a pickup (ADR
# 011).  It claims nothing where a cap or a rate limit is involved (the type's, or the
# lead lane's tenant's: those need their locks and counts, ADR 016 and 028), when none
# of the first PROBED_LANES active lanes has a ready job, nor any of the lead lane's
# first PROBED_LANES active keys, or when the lead key's heads are held by another
# activator; the caller then runs the full rounds, unless the answer says the type is
# dry.  Answers one row: the claimed
# job with the lane's and the key's weights (for their charges) and the type's aging
# ($5, $6: the server's defaults), or NULLs and whether the type is dry.  A paused type,
# or a paused tenant's lane, gives nothing (as read_lanes).
# Index: lanes_type_vtime_idx, lane_keys_vtime_idx, then as read_lanes, read_keys and CLAIM.
_LEAD = f"""lead_lane AS (
    SELECT x.tenant_id, x.weight, x.cap, x.rate, c.type_cap, c.type_rate, c.aging_step,
           c.aging_interval_ms, c.fairness_by
    FROM (SELECT t.max_active_jobs AS type_cap, t.rate_per_s AS type_rate, t.fairness_by,
                 COALESCE(t.aging_step, $5::int) AS aging_step,
                 COALESCE(t.aging_interval_ms, $6::int) AS aging_interval_ms
          FROM (SELECT 1) one LEFT JOIN job_types t ON t.job_type = $1
          WHERE t.paused IS NOT TRUE) c
    CROSS JOIN LATERAL (
        SELECT r.tenant_id, r.weight, r.cap, r.rate FROM (
            SELECT l.tenant_id, l.vtime, COALESCE(t.weight, 1) AS weight,
                   t.max_active_jobs AS cap, t.rate_per_s AS rate, {LANE_READY} AS ready
            FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
            WHERE l.job_type = $1 AND l.active AND NOT l.held AND t.paused IS NOT TRUE
              {{tenants}}
            ORDER BY l.vtime, l.tenant_id
            LIMIT {PROBED_LANES}) r
        WHERE r.ready
        ORDER BY r.vtime, r.tenant_id
        LIMIT 1) x
),
lead AS (
    SELECT ll.tenant_id, y.fairness_key, ll.weight, y.key_weight, ll.aging_step,
           ll.aging_interval_ms, ll.fairness_by
    FROM lead_lane ll
    CROSS JOIN LATERAL (
        SELECT r.fairness_key, COALESCE(w.weight, 1) AS key_weight FROM (
            SELECT x.fairness_key, x.vtime, {KEY_READY} AS ready
            FROM lane_keys x
            WHERE x.job_type = $1 AND x.tenant_id = ll.tenant_id AND x.active
            ORDER BY x.vtime, x.fairness_key
            LIMIT {PROBED_LANES}) r
        LEFT JOIN key_weights w ON w.tenant_id = ll.tenant_id
         AND w.fairness_key = r.fairness_key
        WHERE r.ready
        ORDER BY r.vtime, r.fairness_key
        LIMIT 1) y
    WHERE ll.type_cap IS NULL AND ll.cap IS NULL AND ll.type_rate IS NULL AND ll.rate IS NULL
),
alloc AS (SELECT tenant_id, fairness_key, 1 AS k FROM lead)"""
# Whether the type is dry for the filter: no probed lane had a ready job, and the probe
# saw every active lane (fewer than PROBED_LANES).  Evaluated only when nothing was
# claimed (AND evaluates in order); it counts lanes_type_vtime_idx entries, the ready
# probes were the lead's.  It saves that caller the lane read that would prove it.
_LEAD_DRY = f"""NOT EXISTS (SELECT 1 FROM lead_lane)
       AND (SELECT count(*) < {PROBED_LANES}
            FROM (SELECT 1 FROM lanes l
                  WHERE l.job_type = $1 AND l.active AND NOT l.held {{tenants}}
                  LIMIT {PROBED_LANES}) p)"""


def _claim_lead(tenants: str, charges: str = "") -> str:
    return _CLAIM.format(
        alloc=_LEAD.format(tenants=tenants),
        charges=charges,
        now="$2::timestamptz",
        workers="$3::text[]",
        deadlines="$4::timestamptz[]",
        step="(SELECT aging_step FROM lead)",
        interval="(SELECT aging_interval_ms FROM lead)",
        via_stream="$7",
        starts="$8::int[]",
        log=TRIM_CTE,
        answer=f"""SELECT a.*, lead.weight AS lane_weight, lead.key_weight AS lane_key_weight,
       lead.aging_step AS lane_aging_step,
       lead.aging_interval_ms AS lane_aging_interval_ms, lead.fairness_by AS lane_fairness_by,
       (a.job_key IS NULL AND {_LEAD_DRY.format(tenants=tenants)}) AS dry
FROM (SELECT 1) one LEFT JOIN (activated a CROSS JOIN lead) ON true""",
    )


CLAIM_LEAD = _claim_lead("")
# -- name: claim_lead_of_tenants
# As claim_lead, restricted to the caller's tenantIds ($9).  A statement of its own so
# that its generic plan can use lanes pkey.
CLAIM_LEAD_OF_TENANTS = _claim_lead("AND l.tenant_id = ANY($9::text[])")
# -- name: claim_lead_by_worker_time
# As claim_lead, writing lane_charge and key_charge as claim_by_worker_time does: for a
# type this process last saw fair by worker time (or has not seen yet; LeadAsk).
CLAIM_LEAD_BY_WORKER_TIME = _claim_lead("", _CHARGES)
# -- name: claim_lead_of_tenants_by_worker_time
# As claim_lead_of_tenants, writing lane_charge and key_charge.
CLAIM_LEAD_OF_TENANTS_BY_WORKER_TIME = _claim_lead("AND l.tenant_id = ANY($9::text[])", _CHARGES)


class Share(NamedTuple):
    """One request's part in a claim: up to ``n`` jobs, leased to ``worker``."""

    worker: str | None
    lease_ms: int
    n: int


@dataclass(frozen=True, slots=True)
class LeadAsk:
    """Whom a lead claim is for: the request's tenants (None: all), its share, whether
    the job goes to a stream, and the server's aging defaults; and whether to record the
    estimate's virtual times (the type was last seen fair by worker time, or not seen)."""

    tenant_ids: Sequence[str] | None
    share: Share
    via_stream: bool
    default_aging_step: int
    default_aging_interval_ms: int
    by_worker_time: bool = True


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


def _claimed(rows: Sequence[Any]) -> list[Claimed]:
    return [Claimed(r[0], job_row(r, 1)) for r in rows]


async def claim(
    db: Queries,
    job_type: str,
    counts: Mapping[tuple[str, str], int],
    *,
    now: datetime,
    shares: Sequence[Share],
    via_stream: bool,
    aging_step: int,
    aging_interval_ms: int,
    by_worker_time: bool = False,
    hold: Mapping[str, int] | None = None,
) -> list[Claimed]:
    """Claim ``counts`` jobs per (tenant, fairness key) (claim; claim_by_worker_time if
    the type was read fair by worker time).  The jobs claimed are shared out
    among ``shares`` in order, each taking up to its ``n`` (under its worker name and
    lease); a Claimed's ``share`` is its index there, from 1.  Alone (``db`` the
    database) the claim is one autocommit statement; a capped claim runs it in the
    transaction that holds the cap locks, with ``hold``: each capped tenant's room as
    counted under its lock, whose lanes the claim holds where it leaves none
    (claim_holding)."""
    if not counts:
        if hold:
            await lanes.hold(db, job_type, left_at_cap(hold, {}))
        return []
    workers, deadlines, starts = _share_arrays(shares, now)
    holding = [] if hold is None else sorted(hold)
    if hold:
        sql = CLAIM_HOLDING_BY_WORKER_TIME if by_worker_time else CLAIM_HOLDING
        more: tuple[Any, ...] = (holding, [hold[t] for t in holding])
    else:
        sql, more = CLAIM_BY_WORKER_TIME if by_worker_time else CLAIM, ()
    rows = await db.fetch(
        sql,
        job_type,
        [t for t, _ in counts],
        list(counts.values()),
        now,
        workers,
        deadlines,
        aging_step,
        aging_interval_ms,
        via_stream,
        starts,
        [k for _, k in counts],
        *more,
    )
    return _claimed(rows)


@dataclass(frozen=True, slots=True)
class Counted:
    """What a capped claim read under its cap locks (lock_and_count): the type's
    ACTIVATED jobs up to its cap (None: not counted), each capped tenant's room (its cap
    as it is now minus its ACTIVATED jobs), and the token buckets (None: none read)."""

    type_active: int | None
    room: dict[str, int]
    buckets: Buckets | None


async def lock_and_count(
    tx: Queries,
    job_type: str,
    *,
    lock_type: bool,
    lock_tenants: Sequence[str],
    type_cap: int | None,
    capped: Sequence[str],
    type_limited: bool,
    limited: Sequence[str],
) -> Counted:
    """The cap locks of a capped claim, held until ``tx`` ends -- the type's if
    ``lock_type``, then ``lock_tenants``' in key order -- and, read after them in the
    same round trip (lock_and_count): the type's ACTIVATED jobs if ``type_cap``, the room
    of the ``capped`` tenants, and the buckets of the type if ``type_limited`` and of the
    ``limited`` tenants (none read if neither)."""
    rows = await tx.fetch(
        LOCK_AND_COUNT,
        int4(TYPE_CAP_LOCK_CLASS),
        cap_key(job_type) if lock_type else None,
        TENANT_CAP_LOCK_CLASS,
        sorted(lock_tenants),
        job_type,
        type_cap,
        list(capped),
        type_limited,
        list(limited),
    )
    now = rows[0]["at"]
    type_active = None
    room: dict[str, int] = {}
    type_bucket = None
    tenant_buckets: dict[str, Bucket] = {}
    for r in rows[1:]:
        kind = r["kind"]
        if kind == "type":
            type_active = int(r["active"])
        elif kind == "tenant":
            room[r["name"]] = r["cap"] - r["active"]
        else:
            bucket = Bucket(r["per_s"], r["burst"], r["tokens"], r["at"])
            if kind == "type_bucket":
                type_bucket = bucket
            else:
                tenant_buckets[r["name"]] = bucket
    read = type_limited or bool(limited)
    return Counted(type_active, room, Buckets(now, type_bucket, tenant_buckets) if read else None)


async def take_tokens(
    tx: Queries, job_type: str, read: Buckets, taken: Mapping[str, int], total: int
) -> None:
    """Write back what a claim that took ``taken`` jobs per tenant (``total`` in all) left
    in the buckets it read (take_tokens)."""
    now = read.now
    spent = {t: read.tenants[t].take(n, now) for t, n in taken.items() if t in read.tenants}
    spent = {t: b for t, b in spent.items() if taken[t] > 0}
    typed = read.job_type.take(total, now) if read.job_type is not None and total else None
    if not spent and typed is None:
        return  # nothing taken: the stored pair still says what the bucket holds
    tenants = sorted(spent)
    await tx.execute(
        TAKE_TOKENS,
        job_type,
        None if typed is None else typed.tokens,
        None if typed is None else typed.at,
        tenants,
        [spent[t].tokens for t in tenants],
        [spent[t].at for t in tenants],
        None if read.job_type is None else read.job_type.at,
        [read.tenants[t].at for t in tenants],
    )


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
        return (CLAIM_LEAD_BY_WORKER_TIME if ask.by_worker_time else CLAIM_LEAD), args
    sql = CLAIM_LEAD_OF_TENANTS_BY_WORKER_TIME if ask.by_worker_time else CLAIM_LEAD_OF_TENANTS
    return sql, (*args, list(ask.tenant_ids))


def _lead_claim(row: Any) -> LeadClaim:
    job: JobRow | None = None if row["job_key"] is None else job_row(row, 1)
    return LeadClaim(
        job,
        row["lane_weight"],
        row["lane_key_weight"],
        row["lane_aging_step"],
        row["lane_aging_interval_ms"],
        row["dry"],
        FairnessBy(row["lane_fairness_by"] or FairnessBy.ACTIVATIONS),
    )


async def claim_lead(db: Queries, job_type: str, ask: LeadAsk, now: datetime) -> LeadClaim:
    """One stride pick read and claimed at once (claim_lead)."""
    sql, args = _lead_call(job_type, ask, now)
    return _lead_claim(await db.fetchrow(sql, *args))


async def insert_and_claim_lead(
    db: Sessions, job: Mapping[str, Any], now: datetime, ask: LeadAsk
) -> tuple[int, LeadClaim]:
    """A hand-off (ADR 012): insert one job that is ready at once, without an
    idempotency key, and claim its type's first stride pick for a waiting worker in the
    same transaction, as claim_lead would after it.  The pick is usually the new job;
    then nothing is notified, for nobody else need wake.  Otherwise (another lane is
    ahead of it, a cap, a head held) the new job is announced as insert_jobs announces
    it.  The new job's key, and what the claim got."""
    sql, args = _lead_call(job["type"], ask, now)
    async with db.transaction(first=locks_for([job], now)) as tx:
        [key], _ = await insert_into(tx, INSERT_JOB_QUIET, [job], now)
        got = _lead_claim(await tx.fetchrow(sql, *args))
        if got.job is None or got.job.job_key != key:
            await tx.execute(NOTIFY_READY, job["type"] + " 1")
    return key, got
