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

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from app.db import citus, lanes, sql
from app.db.base import Queries, Sessions
from app.db.job_rows import insert_into, locks_for, notify_ready
from app.db.locks import TENANT_CAP_LOCK_CLASS, TYPE_CAP_LOCK_CLASS, cap_key, int4
from app.db.rows import Claimed, JobRow, LeadClaim, job_row
from app.scheduler import Bucket, Buckets, FairnessBy, LaneKey, left_at_cap

SQL = sql.load("claims")  # app/db/sql/claims.sql


class ClaimHints:
    """Where a claim's heads start while the job table is full of dead row versions
    (ADR 036).

    A claim finds a key's heads by descending jobs_ready_idx to the key's first entry.
    The jobs claimed from it before are dead versions whose entries stay at the front of
    the key until vacuum removes them; while a transaction holds the xmin horizon nothing
    removes them, and every claim walked every job claimed from its key since the
    horizon was held, visiting each one's heap tuple (issue 43's bench: a claim took
    48 ms instead of 1 ms after two minutes, and the rate fell by half).

    While ``degraded`` (DeadRowsWatch: the last vacuum of the job table left more than
    DEGRADED_AT dead versions behind, until one leaves fewer than RECOVERED_AT), a claim
    of a key this process claimed from before starts that key's heads, at the priority it
    took there, at the queued_at of the last job it took less SLACK_S: an index descent
    past the dead entries.  A job that becomes ready behind
    that point (a lease expired or released, a retry without back-off, a delayed job
    promoted late, a producer's insert that committed more than SLACK_S after its
    instant) is not seen by hinted claims; every FULL_EVERY_S, or a tenth of the time
    the table has been degraded if longer, each key is claimed from its first entry
    again, and so is a key whose hinted claim found fewer jobs than it was allotted.  So
    in that state FIFO and priority inside a key are exact only within that time;
    fairness between lanes and keys, caps, fencing and rate limits are not touched.  Not
    degraded, every claim starts from the first entry, as before.
    """

    DEGRADED_AT = 20_000
    RECOVERED_AT = 10_000
    SLACK_S = 1.0
    FULL_EVERY_S = 1.0
    MOST_KEYS = 100_000

    def __init__(self) -> None:
        self.degraded = False
        self.clock = time.monotonic
        self._since = 0.0  # when it became degraded (monotonic)
        # (job type, tenant, key) -> [priority, since, last claimed from the first entry]
        self._keys: dict[tuple[str, str, str], list[Any]] = {}

    def observe(self, dead: int) -> None:
        """The job table's dead row versions a vacuum of it just left behind."""
        if dead >= self.DEGRADED_AT:
            if not self.degraded:
                self._since = self.clock()
            self.degraded = True
        elif dead < self.RECOVERED_AT and self.degraded:
            self.degraded = False
            self._keys.clear()

    def starts(
        self, job_type: str, keys: Sequence[tuple[str, str]], at: float
    ) -> tuple[list[int | None], list[datetime | None]]:
        """The claim's hint per allotted key, in order: (priority, since), both None for a
        key claimed from its first entry (at ``at``, a monotonic instant)."""
        n = len(keys)
        if not self.degraded:
            return [None] * n, [None] * n
        priorities: list[int | None] = []
        since: list[datetime | None] = []
        # A claim from the first entry crosses every dead entry of its key, as many as the
        # key's claims since the horizon was held: once a tenth of that time, it costs a
        # key at most ten times its own rate of claims a second, however long it lasts.
        every = max(self.FULL_EVERY_S, (at - self._since) / 10)
        for tenant, key in keys:
            h = self._keys.get((job_type, tenant, key))
            if h is None or at - h[2] >= every:
                priorities.append(None)
                since.append(None)
            else:
                priorities.append(h[0])
                since.append(h[1])
        return priorities, since

    def took(
        self,
        job_type: str,
        counts: Mapping[tuple[str, str], int],
        since: Sequence[datetime | None],
        claimed: Sequence[Claimed],
        at: float,
    ) -> None:
        """What a claim of ``counts`` with hints ``since`` took, at ``at``."""
        if not self.degraded:
            return
        if len(self._keys) > self.MOST_KEYS:
            self._keys.clear()
        best: dict[tuple[str, str], tuple[int, datetime]] = {}
        got: dict[tuple[str, str], int] = {}
        for c in claimed:
            r = c.job
            lk = (r.tenant_id, r.fairness_key)
            got[lk] = got.get(lk, 0) + 1
            b = best.get(lk)
            if b is None or (r.priority, r.queued_at) > b:
                best[lk] = (r.priority, r.queued_at)
        slack = timedelta(seconds=self.SLACK_S)
        for (lk, n), hinted in zip(counts.items(), since, strict=True):
            h = self._keys.get((job_type, *lk))
            if h is None:
                h = self._keys[(job_type, *lk)] = [None, None, at]
            if hinted is None:
                h[2] = at  # claimed from its first entry
            elif got.get(lk, 0) < n:
                h[2] = -math.inf  # short: from the first entry next time
            b = best.get(lk)
            if b is not None:
                h[0], h[1] = b[0], b[1] - slack
            if h[1] is None:
                del self._keys[(job_type, *lk)]


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
    shares: Sequence[Share], now: datetime, taken: int = 0
) -> tuple[list[str | None], list[datetime], list[int]]:
    """A claim's shares as its array arguments: each share's worker, lease deadline and
    first row number (the i-th share takes rows from starts[i] to starts[i + 1] - 1),
    for a claim that follows one that ``taken`` rows already (on Citus, one claim per
    Citus shard: its first row is the (taken + 1)-th of the shares)."""
    starts, at = [], 1 - taken
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
    fifo: bool = False,
) -> list[Claimed]:
    """Claim ``counts`` jobs per (tenant, fairness key) (claim; claim_by_worker_time if
    the type was read fair by worker time).  The jobs claimed are shared out
    among ``shares`` in order, each taking up to its ``n`` (under its worker name and
    lease); a Claimed's ``share`` is its index there, from 1.  Alone (``db`` the
    database) the claim is one autocommit statement; a capped claim runs it in the
    transaction that holds the cap locks, with ``hold``: each capped tenant's room as
    counted under its lock, whose lanes the claim holds where it leaves none
    (claim_holding); ``fifo``: each key's head alone, whatever the priorities
    (claim_fifo, ADR 041).  On Citus, a statement per Citus shard, the shares taken in turn."""
    if not counts:
        if hold:
            await lanes.hold(db, job_type, left_at_cap(hold, {}))
        return []
    if not citus.on_citus(db):
        return await _claim(db, job_type, counts, now, shares, via_stream, aging_step,
                            aging_interval_ms, by_worker_time, hold, None, 0, fifo)  # fmt: skip
    out: list[Claimed] = []
    for shards, part in citus.split(db, sorted({*(t for t, _ in counts), *(hold or ())}), str):
        mine = set(part)
        some = {tk: n for tk, n in counts.items() if tk[0] in mine}
        held = None if hold is None else {t: room for t, room in hold.items() if t in mine}
        if not some:
            if held:
                await lanes.hold(db, job_type, left_at_cap(held, {}))
            continue
        out += await _claim(db, job_type, some, now, shares, via_stream, aging_step,
                            aging_interval_ms, by_worker_time, held, shards, len(out),
                            fifo)  # fmt: skip
    return out


async def _claim(
    db: Queries,
    job_type: str,
    counts: Mapping[tuple[str, str], int],
    now: datetime,
    shares: Sequence[Share],
    via_stream: bool,
    aging_step: int,
    aging_interval_ms: int,
    by_worker_time: bool,
    hold: Mapping[str, int] | None,
    shards: Sequence[int] | None,
    taken: int,
    fifo: bool,
) -> list[Claimed]:
    """One claim statement (``claim``): on Citus, for the tenants of ``shards``, after
    claims that took ``taken`` rows of ``shares``."""
    workers, deadlines, starts = _share_arrays(shares, now, taken)
    # A FIFO claim takes heads by key order: no priority's hint applies to it, and it
    # leaves none (the heads it takes say nothing of where a priority's jobs start).
    hints: ClaimHints | None = None if fifo else getattr(db, "claim_hints", None)
    at = 0.0 if hints is None else hints.clock()
    hint_priorities, since = (
        ([None] * len(counts), [None] * len(counts))
        if hints is None
        else hints.starts(job_type, list(counts), at)
    )
    holding = [] if hold is None else sorted(hold)
    name = ("claim_fifo" if fifo else "claim") + ("_holding" if hold else "")
    more = dict(hold_tenants=holding, hold_room=[hold[t] for t in holding]) if hold else {}
    rows = await db.fetch(
        *SQL.on(
            shards,
            f"{name}_by_worker_time" if by_worker_time else name,
            job_type=job_type,
            tenants=[t for t, _ in counts],
            keys=[k for _, k in counts],
            counts=list(counts.values()),
            now=now,
            workers=workers,
            deadlines=deadlines,
            aging_step=aging_step,
            aging_interval_ms=aging_interval_ms,
            via_stream=via_stream,
            starts=starts,
            hint_priorities=hint_priorities,
            since=since,
            **more,
        )
    )
    claimed = _claimed(rows)
    if hints is not None:
        hints.took(job_type, counts, since, claimed, at)
    return claimed


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
    locks = dict(
        type_lock_class=int4(TYPE_CAP_LOCK_CLASS),
        type_lock_key=cap_key(job_type) if lock_type else None,
        tenant_lock_class=TENANT_CAP_LOCK_CLASS,
        lock_tenants=sorted(lock_tenants),
    )
    reads = dict(
        job_type=job_type,
        type_cap=type_cap,
        capped=list(capped),
        type_limited=type_limited,
        limited=list(limited),
    )
    if citus.on_citus(tx):  # the locks, then the counts across every node
        await tx.fetch(*SQL.citus["lock_caps"].bind(**locks))
        rows = await tx.fetch(*SQL.citus["count_caps"].bind(**reads))
    else:
        rows = await tx.fetch(*SQL["lock_and_count"].bind(**locks, **reads))
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
    type_bucket = dict(
        job_type=job_type,
        type_tokens=None if typed is None else typed.tokens,
        type_at=None if typed is None else typed.at,
        type_read_at=None if read.job_type is None else read.job_type.at,
    )
    tenant_buckets = dict(
        tenants=tenants,
        tokens=[spent[t].tokens for t in tenants],
        at=[spent[t].at for t in tenants],
        read_at=[read.tenants[t].at for t in tenants],
    )
    if not citus.on_citus(tx):
        await tx.execute(*SQL["take_tokens"].bind(**type_bucket, **tenant_buckets))
        return
    if typed is not None:  # a statement per reference table on Citus
        await tx.execute(*SQL.citus["take_type_tokens"].bind(**type_bucket))
    if tenants:
        await tx.execute(*SQL.citus["take_tokens"].bind(**tenant_buckets))


def _lead_call(
    job_type: str, ask: LeadAsk, now: datetime, shards: Sequence[int] | None = None
) -> tuple[Any, ...]:
    """claim_lead's statement (of its four) and arguments, as a driver call takes them
    (on Citus, ``shards``: those of ``ask``'s one tenant)."""
    workers, deadlines, starts = _share_arrays([ask.share], now)
    name = "claim_lead" if ask.tenant_ids is None else "claim_lead_of_tenants"
    tenants = {} if ask.tenant_ids is None else {"tenant_ids": list(ask.tenant_ids)}
    return SQL.on(
        shards,
        f"{name}_by_worker_time" if ask.by_worker_time else name,
        job_type=job_type,
        now=now,
        workers=workers,
        deadlines=deadlines,
        default_aging_step=ask.default_aging_step,
        default_aging_interval_ms=ask.default_aging_interval_ms,
        via_stream=ask.via_stream,
        starts=starts,
        **tenants,
    )


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


# What a lead claim answers when it claims nothing and does not know the type dry (on
# Citus, where a pause, a cap or a rate limit is involved): the caller runs the full
# rounds, as when a lead claim finds its heads held.
NOTHING_LED = LeadClaim(None, None, None, None, None, False)


async def claim_lead(db: Queries, job_type: str, ask: LeadAsk, now: datetime) -> LeadClaim:
    """One stride pick read and claimed at once (claim_lead).  On Citus, two statements:
    the lead lane read across every node (lanes.read_across), then claim_lead of its
    tenant alone, on its node -- or NOTHING_LED where a pause, a cap or a rate limit is
    involved (the full rounds then read them), or when its heads were held."""
    if not citus.on_citus(db):
        return _lead_claim(await db.fetchrow(*_lead_call(job_type, ask, now)))
    read = await lanes.read_across(db, job_type, 1, [], ask.tenant_ids)
    if read.paused:
        return NOTHING_LED
    if not read.ready:
        # No ready lane, and every active lane seen (fewer than SCANNED_LANES): dry.
        return NOTHING_LED if read.more else LeadClaim(None, None, None, None, None, True)
    lead = read.ready[0]
    config = read.config
    if (config.max_active_jobs, lead.max_active_jobs) != (None, None) or config.rate_limited:
        return NOTHING_LED
    if lead.rate_limited:
        return NOTHING_LED
    [(shards, _)] = citus.split(db, [lead.tenant_id], str)
    alone = LeadAsk(
        [lead.tenant_id], ask.share, ask.via_stream, ask.default_aging_step,
        ask.default_aging_interval_ms, ask.by_worker_time,
    )  # fmt: skip
    text, *args = _lead_call(job_type, alone, now, shards)
    got = _lead_claim(await db.fetchrow(text, *args))
    return got if got.job is not None else NOTHING_LED


async def insert_and_claim_lead(
    db: Sessions, job: Mapping[str, Any], now: datetime, ask: LeadAsk
) -> tuple[int, LeadClaim]:
    """A hand-off (ADR 012): insert one job that is ready at once, without an
    idempotency key, and claim its type's first stride pick for a waiting worker in the
    same transaction, as claim_lead would after it.  The pick is usually the new job;
    then nothing is notified, for nobody else need wake.  Otherwise (another lane is
    ahead of it, a cap, a head held) the new job is announced as insert_jobs announces
    it.  The new job's key, and what the claim got.  On Citus the same, with the insert
    and the lead claim each as Citus runs them."""
    lead = None if citus.on_citus(db) else _lead_call(job["type"], ask, now)
    async with db.transaction(first=locks_for([job], now)) as tx:
        [key], _ = await insert_into(tx, [job], now, quiet=True)
        if lead is None:
            got = await claim_lead(tx, job["type"], ask, now)
        else:
            got = _lead_claim(await tx.fetchrow(*lead))
        if got.job is None or got.job.job_key != key:
            await notify_ready(tx, job["type"], 1)
    return key, got


async def count_minimums(tx: Queries, tenants: Sequence[str]) -> dict[str, tuple[int, int]]:
    """In a capped claim's transaction, after the cap locks of ``tenants``: each one's
    minimum and its ACTIVATED jobs (up to it), where it has a minimum (count_minimums,
    ADR 042)."""
    rows = await tx.fetch(*SQL["count_minimums"].bind(tenants=list(tenants)))
    return {r["tenant_id"]: (r["minimum"], r["active"]) for r in rows}


async def lock_and_count_keys(
    tx: Queries, job_type: str, keys: Sequence[LaneKey], per_key: int | None
) -> dict[LaneKey, int]:
    """In a claim's transaction, after its other cap locks: the cap locks of ``keys``,
    then each one's room (its own cap and the type's per-key cap as it is now -- not
    ``per_key``, what the round read -- less its ACTIVATED jobs; absent: neither),
    lock_and_count_keys (ADR 040)."""
    rows = await tx.fetch(
        *SQL["lock_and_count_keys"].bind(
            tenants=[t for t, _ in keys],
            keys=[k for _, k in keys],
            job_type=job_type,
        )
    )
    return {
        (r["tenant_id"], r["fairness_key"]): max(0, r["room"])
        for r in rows
        if r["room"] is not None
    }


async def hold_keys(tx: Queries, job_type: str, keys: Sequence[LaneKey]) -> None:
    """The keys a claim left at their caps, held until a finish frees room (hold_keys)."""
    for shards, part in citus.split(tx, sorted(keys), lambda tk: tk[0]):
        await tx.execute(
            *SQL.on(
                shards,
                "hold_keys",
                job_type=job_type,
                tenants=[t for t, _ in part],
                keys=[k for _, k in part],
            )
        )
