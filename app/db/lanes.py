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
from dataclasses import replace
from typing import Any

from app.db import citus, sql
from app.db.base import Queries, retry_deadlock
from app.db.bounds import SCANNED_LANES
from app.db.locks import buckets_of, share_buckets_sql
from app.db.rows import KeyRead, LaneRead, LaneRow, TypeConfig
from app.scheduler import (
    Charges,
    FairnessBy,
    LaneKey,
    advance,
)

log = logging.getLogger(__name__)


SQL = sql.load("lanes")  # app/db/sql/lanes.sql
_NOTIFY = sql.load("jobs")["notify_ready"]


CHARGE_ARRAYS = (
    *("tenants", "counts", "strides", "floors", "served"),
    *("key_tenants", "keys", "key_counts", "key_strides", "key_served"),
)


def _charge_arrays(charges: Charges | None, only: set[str] | None = None) -> dict[str, list[Any]]:
    """The fragment charge's ten arrays, by name: lanes in tenant order, keys in
    (tenant, key) order; of the tenants ``only`` (None: all)."""
    if charges is None:
        return {name: [] for name in CHARGE_ARRAYS}
    tenants = sorted(t for t in charges.lanes if only is None or t in only)
    keys = sorted(tk for tk in charges.keys if only is None or tk[0] in only)
    return dict(
        tenants=tenants,
        counts=[charges.lanes[t] for t in tenants],
        strides=[charges.strides[t] for t in tenants],
        floors=[charges.floors.get(t) for t in tenants],
        served=[charges.served.get(t, 0.0) for t in tenants],
        key_tenants=[t for t, _ in keys],
        keys=[k for _, k in keys],
        key_counts=[charges.keys[tk] for tk in keys],
        key_strides=[charges.key_strides[tk] for tk in keys],
        key_served=[charges.key_served.get(tk, 0.0) for tk in keys],
    )


@retry_deadlock
async def read(
    db: Queries,
    job_type: str,
    limit: int,
    exclude: Sequence[str],
    tenant_ids: Sequence[str] | None,
    charges: Charges | None = None,
    *,
    counted: bool = False,
) -> LaneRead:
    """Charge ``charges`` (jobs claimed and stride per lane and per key) first, then read
    the type's configuration and its first ``limit`` lanes that have a ready job (see
    LaneRead); ``counted``: the charges only counted in the read, not written
    (read_lanes_counted, ADR 036).  On Citus the charge goes first, a statement per Citus
    shard, and the read after it across every node (read_across)."""
    if citus.on_citus(db):
        drained, keys = ([], []) if charges is None else await charge(db, job_type, charges)
        found = await read_across(db, job_type, limit, exclude, tenant_ids)
        found.empty.extend(t for t in drained if t not in found.empty)
        found.emptied_keys.extend(keys)
        return found
    args = dict(job_type=job_type, limit=limit, exclude=list(exclude), **_charge_arrays(charges))
    suffix = "_counted" if counted else ""
    if tenant_ids is None:
        rows = await db.fetch(*SQL["read_lanes" + suffix].bind(**args))
    else:
        rows = await db.fetch(
            *SQL["read_lanes_of_tenants" + suffix].bind(**args, tenant_ids=list(tenant_ids))
        )
    found = _lane_read(rows, limit)
    if found.config.minimums and not found.paused:
        try:
            found = await _with_minimums(db, found, job_type, limit, exclude, tenant_ids)
        except Exception as exc:  # noqa: BLE001 (the read's charges are written already)
            # The caller takes a failed read as one that charged nothing and owes the
            # charges again; the read above committed them.  So this round goes on
            # without the lanes below their minimum (the next one reads them).
            log.warning("reading the lanes below their minimum of %r failed: %r", job_type, exc)
    return found


async def _with_minimums(
    db: Queries,
    found: LaneRead,
    job_type: str,
    limit: int,
    exclude: Sequence[str],
    tenant_ids: Sequence[str] | None,
) -> LaneRead:
    """``found`` with the lanes of the tenants below their minimum added, whatever their
    virtual time (read_min_lanes, ADR 042), in (vtime, tenant) order."""
    below = {
        r["tenant_id"]: LaneRow(*r)
        for r in await db.fetch(
            *SQL["read_min_lanes"].bind(
                job_type=job_type,
                limit=limit,
                exclude=list(exclude),
                tenant_ids=None if tenant_ids is None else list(tenant_ids),
            )
        )
    }
    if not below:
        return found
    # A lane read already keeps the virtual time it read (counted charges included).
    ready = [
        replace(r, min_active_jobs=below.pop(r.tenant_id).min_active_jobs)
        if r.tenant_id in below
        else r
        for r in found.ready
    ] + list(below.values())
    ready.sort(key=lambda r: (r.vtime, r.tenant_id))
    return replace(found, ready=ready)


async def read_across(
    db: Queries, job_type: str, limit: int, exclude: Sequence[str], tenant_ids: Sequence[str] | None
) -> LaneRead:
    """``read`` on Citus, across every node and without charges (the store charges first,
    on each lane's node: ``charge``)."""
    head = await db.fetchrow(*SQL.citus["read_type_head"].bind(job_type=job_type))
    found = await db.fetch(
        *SQL.citus["read_lanes_across"].bind(
            job_type=job_type,
            limit=limit,
            exclude=list(exclude),
            tenant_ids=None if tenant_ids is None else list(tenant_ids),
        )
    )
    # read_lanes' run condition, here: up to the lane after the limit-th ready one.
    rows: list[Any] = [head]
    readies = 0
    for r in found:
        readies += r["ready"]
        if readies > limit:
            break
        rows.append({**r, "scanned": True, "fairness_key": None})
    return _lane_read(rows, limit)


def _lane_read(rows: Sequence[Any], limit: int) -> LaneRead:
    head, lanes = rows[0], rows[1:]
    cfg = TypeConfig(
        head["type_cap"],
        head["aging_interval_ms"],
        head["aging_step"],
        head["rate_limited"],
        FairnessBy(head["fairness_by"] or FairnessBy.ACTIVATIONS),
        head["max_active_jobs"],  # the head row carries the type's per-key cap there
        head["fairness_key"] == "fifo",  # and its keyOrdering there
        bool(head["ready"]),  # and whether any tenant has a minimum there
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
    db: Queries,
    job_type: str,
    wants: Mapping[str, int],
    exclude: Sequence[LaneKey],
    owed: Mapping[LaneKey, tuple[int, float]] | None = None,
) -> KeyRead:
    """The first ``wants[tenant]`` active keys of each lane, not ``exclude``d, in
    (vtime, key) order (read_keys; see KeyRead); on Citus a statement per Citus shard
    (app.db.citus.split).  ``owed``: charges of keys not yet written (jobs, stride per
    job; ADR 036), added to their vtimes as the charge would."""
    if not wants:
        return KeyRead({}, [], set())
    tenants = sorted(wants)
    rows = []
    for shards, part in citus.split(db, tenants, str):
        rows += await db.fetch(
            *SQL.on(
                shards,
                "read_keys",
                job_type=job_type,
                tenants=part,
                wants=[wants[t] for t in part],
                exclude_tenants=[t for t, _ in exclude],
                exclude_keys=[k for _, k in exclude],
            )
        )
    ready: dict[str, list[tuple[str, float, int, int | None]]] = {}
    empty: list[tuple[str, str]] = []
    seen: Counter[str] = Counter()
    for r in rows:
        seen[r["tenant_id"]] += 1
        if r["ready"]:
            vtime = r["vtime"]
            if owed and (o := owed.get((r["tenant_id"], r["fairness_key"]))) is not None:
                vtime = advance(vtime, o[1], o[0])
            found = (r["fairness_key"], vtime, r["weight"], r["cap"])
            ready.setdefault(r["tenant_id"], []).append(found)
        else:
            empty.append((r["tenant_id"], r["fairness_key"]))
    return KeyRead(ready, empty, {t for t in tenants if seen[t] >= wants[t]})


@retry_deadlock
async def charge(db: Queries, job_type: str, charges: Charges) -> tuple[list[str], list[LaneKey]]:
    """Charge each lane its claimed jobs x stride and each key its claimed jobs x key
    stride (charge_lanes), after the claim; the charged lanes and keys left without a
    ready job, to be parked.  On Citus a statement per Citus shard."""
    rows = []
    tenants = {*charges.lanes, *(t for t, _ in charges.keys)}
    for shards, part in citus.split(db, sorted(tenants), str):
        arrays = _charge_arrays(charges, None if shards is None else set(part))
        if shards is not None:
            # Citus carries no NULL in an array through its plan: no floor is -infinity.
            arrays["floors"] = [float("-inf") if f is None else f for f in arrays["floors"]]
        rows += await db.fetch(*SQL.on(shards, "charge_lanes", job_type=job_type, **arrays))
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
    their buckets (lock_to_wake).  On Citus a statement per Citus shard, given their
    types' re-entry floors read first across every node (reentry_floors), and their
    types notified from the coordinator."""
    groups = citus.split(tx, jobs, lambda j: j["tenant_id"])
    reentry = {}
    if groups and groups[0][0] is not None:
        reentry = await reentry_floors(tx, [j["job_type"] for j in jobs])
    for shards, part in groups:
        await tx.fetchval(
            *SQL.on(
                shards,
                "wake_lanes",
                job_types=[j["job_type"] for j in part],
                tenant_ids=[j["tenant_id"] for j in part],
                fairness_keys=[j["fairness_key"] for j in part],
                **reentry,
            )
        )
    if reentry:
        for job_type, n in sorted(Counter(j["job_type"] for j in jobs).items()):
            await notify(tx, job_type, n)


async def release_key_holds_of(tx: Queries, jobs: Sequence[Mapping[str, Any]]) -> None:
    """After ``jobs`` (rows with their job_type, tenant_id and fairness_key) became ready
    again without a finish, in their transaction: their keys' holds let go where a cap or
    a FIFO head may have held them (release_key_holds_of).  Not on Citus, where key caps
    and FIFO keys are not supported."""
    if not jobs or citus.on_citus(tx):
        return
    await tx.fetchval(
        *SQL["release_key_holds_of"].bind(
            job_types=[j["job_type"] for j in jobs],
            tenants=[j["tenant_id"] for j in jobs],
            keys=[j["fairness_key"] for j in jobs],
        )
    )


async def notify(db: Queries, job_type: str, n: int) -> None:
    """Announce that ``n`` jobs of ``job_type`` became activatable (notify_ready): on
    Citus, from the coordinator, where every server listens."""
    await db.execute(*_NOTIFY.bind(payload=f"{job_type} {n}"))


async def hold(tx: Queries, job_type: str, tenant_ids: Sequence[str]) -> None:
    """Hold the lanes of ``tenant_ids`` (at their caps, counted under their cap locks in
    this transaction) out of the reads until their capacity frees (hold_lanes); on Citus
    a statement per Citus shard."""
    for shards, part in citus.split(tx, tenant_ids, str):
        await tx.execute(*SQL.on(shards, "hold_lanes", job_type=job_type, tenant_ids=part))


async def reentry_floors(db: Queries, job_types: Sequence[str]) -> dict[str, Any]:
    """On Citus: where a lane of each of ``job_types`` re-enters (reentry_floors, read
    across every node), as the arguments a statement that wakes lanes takes."""
    types = sorted(set(job_types))
    vtimes = [await db.fetchval(*SQL.citus["reentry_floors"].bind(job_type=t)) for t in types]
    return dict(reentry_types=types, reentry_vtimes=vtimes)
