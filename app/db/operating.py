"""Operators' reads and writes: tenant and job-type configuration, the stats view, what
explain reads of a job's lane and key, and the database's health.  None is on a job's
path; the stats and explain may read the backlog (bounded where they count).  The
statements are app/db/sql/operators.sql's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from app.db import citus, holds, sql
from app.db.base import Queries, Sessions
from app.db.bounds import NOTIFY_CHANNEL
from app.db.rows import (
    JobTypeRow,
    LaneStats,
    TenantRow,
    TypeConfig,
)
from app.domain import JobState, public_state
from app.errors import InvalidArgument
from app.scheduler import FairnessBy, RateLimit

SQL = sql.load("operators")  # app/db/sql/operators.sql


async def type_config(db: Queries, job_type: str) -> TypeConfig:
    row = await db.fetchrow(*SQL["type_config"].bind(job_type=job_type))
    if row is None:
        return TypeConfig(None, None, None)
    return TypeConfig(row["max_active_jobs"], row["aging_interval_ms"], row["aging_step"])


def tenant_row(row: Any) -> TenantRow:
    """A tenant's row by its columns' names (tenant_columns; on Citus, tenant_stored and
    read_at after them)."""
    return TenantRow(**{name: row[name] for name in TenantRow._fields})


async def upsert_tenant(
    db: Sessions,
    tenant_id: str,
    weight: int,
    cap: int | None,
    rate: RateLimit | None = None,
    minimum: int | None = None,
) -> TenantRow:
    if minimum is not None and citus.on_citus(db):
        # Its lane reads join tenants to lanes of every node (docs/scaling.md).
        raise InvalidArgument("minActiveJobs: minimums are not supported on Citus")
    async with db.transaction() as tx:
        await tx.execute(*SQL["lock_tenant"].bind(tenant_id=tenant_id))
        row = await tx.fetchrow(
            *_spelled(tx)["upsert_tenant"].bind(
                tenant_id=tenant_id,
                weight=weight,
                cap=cap,
                rate_per_s=None if rate is None else rate.per_s,
                rate_burst=None if rate is None else rate.burst,
                minimum=minimum,
            )
        )
        if citus.on_citus(tx):
            await holds.release(tx, [tenant_id])
    await _release_after_finishes(db, tenant_id)
    return tenant_row(row)


async def _release_after_finishes(db: Sessions, tenant_id: str) -> None:
    """After a tenant's change committed (release_after_finishes)."""
    async with db.transaction() as tx:
        if citus.on_citus(tx):  # the gate by the statement, the release by app.db.holds
            await tx.execute(*SQL.citus["release_after_finishes"].bind())
            await holds.release(tx, [tenant_id])
        else:
            await tx.execute(*SQL["release_after_finishes"].bind(tenant_id=tenant_id))


def _spelled(db: Any) -> dict[str, sql.Statement]:
    """The operators' statements as ``db`` runs them (on Citus, held lanes released by
    app.db.holds after them)."""
    return SQL.citus if citus.on_citus(db) else SQL


async def get_tenant(db: Queries, tenant_id: str) -> TenantRow | None:
    row = await db.fetchrow(*SQL["get_tenant"].bind(tenant_id=tenant_id))
    return None if row is None else tenant_row(row)


async def list_tenants(db: Queries) -> list[TenantRow]:
    return [tenant_row(r) for r in await db.fetch(*SQL["list_tenants"].bind())]


async def delete_tenant(db: Sessions, tenant_id: str) -> bool:
    async with db.transaction() as tx:
        await tx.execute(*SQL["lock_tenant"].bind(tenant_id=tenant_id))
        gone = _spelled(tx)["delete_tenant"].bind(tenant_id=tenant_id)
        deleted = await tx.fetchval(*gone) is not None
        if citus.on_citus(tx):
            await holds.release(tx, [tenant_id])
    await _release_after_finishes(db, tenant_id)
    return deleted


async def upsert_key_weight(
    db: Sessions, tenant_id: str, fairness_key: str, weight: int, cap: int | None = None
) -> tuple[int, int | None]:
    """Set a key's weight and cap (``fairness_key`` as stored: '' for the default key);
    then its held keys are released (release_key_holds): a cap raised or removed lets
    them out, one lowered holds them again at their next claim."""
    row = await db.fetchrow(
        *SQL["upsert_key_weight"].bind(
            tenant_id=tenant_id, fairness_key=fairness_key, weight=weight, cap=cap
        )
    )
    await release_key_holds(db, [(tenant_id, fairness_key)])
    return row["weight"], row["max_active_jobs"]


async def get_key_weight(
    db: Queries, tenant_id: str, fairness_key: str
) -> tuple[int, int | None] | None:
    """A key's weight and cap, None when it has no row (it weighs 1, no cap)."""
    row = await db.fetchrow(
        *SQL["get_key_weight"].bind(tenant_id=tenant_id, fairness_key=fairness_key)
    )
    return None if row is None else (row["weight"], row["max_active_jobs"])


# Held keys released a transaction at a time: each takes one advisory lock a key, and
# PostgreSQL's lock table holds max_locks_per_transaction x max_connections of them
# for every session together (64 x 100 by default; 25,000 keys at once ran out of it).
KEY_RELEASE_CHUNK = 500


async def release_key_holds(db: Sessions, keys: Sequence[tuple[str, str]]) -> int:
    """After the caps of fairness keys (tenant, key) changed: behind the finishes in
    flight (the gate), every hold of them released, whatever the caps now
    (release_key_holds, ADR 040); how many.  Not on Citus, where key caps are not
    supported yet (docs/scheduling.md)."""
    if citus.on_citus(db):
        return 0
    async with db.transaction() as tx:
        await tx.execute(*SQL["wait_for_finishes"].bind())
        return await _release(tx, keys)


async def release_held_keys(db: Sessions, job_type: str | None = None) -> int:
    """The held keys of ``job_type`` released after its per-key cap changed (behind the
    finishes in flight), or -- no type: the leader's sweep -- the held keys of every type
    that have room under their caps now (a release is always safe: the next claim counts
    again).  At most KEY_RELEASE_CHUNK keys a transaction, by their order; how many."""
    if citus.on_citus(db):
        return 0
    released = 0
    after = ("", "", "")
    while True:
        async with db.transaction() as tx:
            cursor: dict[str, Any] = {"chunk": KEY_RELEASE_CHUNK}
            cursor.update(zip(("after_type", "after_tenant", "after_key"), after, strict=True))
            if job_type is None:
                rows = await tx.fetch(*SQL["held_keys_with_room"].bind(**cursor))
            else:
                await tx.execute(*SQL["wait_for_finishes"].bind())
                rows = await tx.fetch(*SQL["held_keys"].bind(job_type=job_type, **cursor))
            if not rows:
                return released
            released += await _release(tx, [(r["tenant_id"], r["fairness_key"]) for r in rows])
        if len(rows) < KEY_RELEASE_CHUNK:
            return released
        after = (rows[-1]["job_type"], rows[-1]["tenant_id"], rows[-1]["fairness_key"])


async def _release(tx: Queries, keys: Sequence[tuple[str, str]]) -> int:
    """release_key_holds of ``keys``, named with no type: every hold of them goes."""
    released: int = await tx.fetchval(
        *SQL["release_key_holds"].bind(
            tenants=[t for t, _ in keys], keys=[k for _, k in keys], types=[None] * len(keys)
        )
    )
    return released


async def delete_key_weight(db: Sessions, tenant_id: str, fairness_key: str) -> bool:
    """Back to weight 1 and no cap (its held keys released); whether it had a row."""
    deleted = SQL["delete_key_weight"].bind(tenant_id=tenant_id, fairness_key=fairness_key)
    had = await db.fetchval(*deleted) is not None
    await release_key_holds(db, [(tenant_id, fairness_key)])
    return had


async def pause_tenant(db: Sessions, tenant_id: str) -> TenantRow:
    """Pause a tenant (pause_tenant), then hold its lanes behind the finishes in flight
    (wait_for_finishes, hold_paused_lanes)."""
    spelled = _spelled(db)
    row = tenant_row(await db.fetchrow(*spelled["pause_tenant"].bind(tenant_id=tenant_id)))
    async with db.transaction() as tx:
        await tx.execute(*SQL["wait_for_finishes"].bind())
        for shards, _ in citus.split(tx, [tenant_id], str):
            await tx.execute(*SQL.on(shards, "hold_paused_lanes", tenant_id=tenant_id))
    return row


async def resume_tenant(db: Sessions, tenant_id: str) -> TenantRow | None:
    """Resume a tenant (resume_tenant), then release its lanes (release_resumed); None
    if it has no configuration (it was never paused)."""
    row = await db.fetchrow(*_spelled(db)["resume_tenant"].bind(tenant_id=tenant_id))
    if row is None:
        return None
    async with db.transaction() as tx:
        if citus.on_citus(tx):  # the gate, the release, the types told: a step each
            await tx.execute(*SQL.citus["release_resumed"].bind())
            await holds.release(tx, [tenant_id])
            [(shards, _)] = citus.split(tx, [tenant_id], str)
            types = await tx.fetch(*SQL.on(shards, "active_types_of", tenant_id=tenant_id))
            for r in types:
                await holds.notify(tx, NOTIFY_CHANNEL, r["job_type"])
        else:
            await tx.execute(*SQL["release_resumed"].bind(tenant_id=tenant_id))
    return tenant_row(row)


async def pause_job_type(db: Queries, job_type: str) -> JobTypeRow:
    paused = _spelled(db)["pause_job_type"].bind(job_type=job_type)
    return JobTypeRow(*await db.fetchrow(*paused))


async def resume_job_type(db: Sessions, job_type: str) -> JobTypeRow | None:
    if not citus.on_citus(db):
        row = await db.fetchrow(*SQL["resume_job_type"].bind(job_type=job_type))
        return None if row is None else JobTypeRow(*row)
    async with db.transaction() as tx:  # the type told from the coordinator
        row = await tx.fetchrow(*SQL.citus["resume_job_type"].bind(job_type=job_type))
        if row is not None:
            await holds.notify(tx, NOTIFY_CHANNEL, job_type)
    return None if row is None else JobTypeRow(*row)


async def upsert_job_type(
    db: Sessions,
    job_type: str,
    cap: int | None,
    interval_ms: int | None,
    step: int | None,
    rate: RateLimit | None = None,
    fairness_by: FairnessBy = FairnessBy.ACTIVATIONS,
    per_key: int | None = None,
    key_ordering: str | None = None,
) -> JobTypeRow:
    if key_ordering is not None and citus.on_citus(db):
        # Its counts and releases read the keys' jobs under locks Citus does not give
        # them (docs/scaling.md): refused rather than ordered only mostly.
        raise InvalidArgument("keyOrdering: FIFO keys are not supported on Citus")
    upsert = _spelled(db)["upsert_job_type"].bind(
        job_type=job_type,
        cap=cap,
        interval_ms=interval_ms,
        step=step,
        rate_per_s=None if rate is None else rate.per_s,
        rate_burst=None if rate is None else rate.burst,
        fairness_by=None if fairness_by is FairnessBy.ACTIVATIONS else fairness_by.value,
        per_key=per_key,
        key_ordering=key_ordering,
    )
    if citus.on_citus(db):
        row = await db.fetchrow(*upsert)
    else:
        async with db.transaction() as tx:
            await tx.execute(*SQL["lock_type_keys"].bind(job_type=job_type))
            row = await tx.fetchrow(*upsert)
    await release_held_keys(db, job_type)  # a per-key cap changed lets them out
    return JobTypeRow(*row)


async def get_job_type(db: Queries, job_type: str) -> JobTypeRow | None:
    row = await db.fetchrow(*SQL["get_job_type"].bind(job_type=job_type))
    return None if row is None else JobTypeRow(*row)


async def list_job_types(db: Queries) -> list[JobTypeRow]:
    return [JobTypeRow(*r) for r in await db.fetch(*SQL["list_job_types"].bind())]


async def stats(db: Queries, job_type: str | None = None) -> list[LaneStats]:
    rows = await (
        db.fetch(*_spelled(db)["stats"].bind())
        if job_type is None
        else db.fetch(*_spelled(db)["stats_of_type"].bind(job_type=job_type))
    )
    return [LaneStats.of(r) for r in rows]


async def ping(db: Queries) -> None:
    await db.fetchval(*SQL["ping"].bind())


async def schema_revision(db: Queries) -> tuple[str | None, str | None]:
    """The migration the database is at (None: never migrated), and the oldest revision
    whose servers it still serves (None: before alembic 0009, which records it)."""
    try:
        revision: str | None = await db.fetchval(*SQL["schema_version"].bind())
    except asyncpg.UndefinedTableError:
        return None, None
    try:
        oldest: str | None = await db.fetchval(*SQL["oldest_server"].bind())
    except asyncpg.UndefinedTableError:
        return revision, None
    return revision, oldest


async def jobs_ahead(
    db: Queries, job_key: int, now: datetime, interval_ms: int, step: int, bound: int
) -> tuple[int, int]:
    """A ready job's jobs ahead in its key, and its lane's ready jobs (jobs_ahead), each
    counted up to ``bound``."""
    row = await db.fetchrow(
        *SQL["jobs_ahead"].bind(
            job_key=job_key, now=now, interval_ms=interval_ms, step=step, bound=bound
        )
    )
    return (0, 0) if row is None else (row["ahead_in_key"], row["ready_in_lane"])


async def lane_keys_of(
    db: Queries, job_type: str, tenant_id: str
) -> list[tuple[str, float, bool, int]]:
    """A lane's keys (lane_keys_of): (key as stored, vtime, active, weight)."""
    [(shards, _)] = citus.split(db, [tenant_id], str)
    rows = await db.fetch(*SQL.on(shards, "lane_keys_of", job_type=job_type, tenant_id=tenant_id))
    return [(r["fairness_key"], r["vtime"], r["active"], r["weight"]) for r in rows]


async def key_caps_of(
    db: Queries, job_type: str, tenant_id: str, fairness_key: str
) -> tuple[int | None, int, int | None, int]:
    """A key's own cap and its ACTIVATED jobs, its type's per-key cap and its ACTIVATED
    jobs of the type (key_caps_of)."""
    row = await db.fetchrow(
        *SQL["key_caps_of"].bind(job_type=job_type, tenant_id=tenant_id, fairness_key=fairness_key)
    )
    return row["cap"], row["active"], row["per_key"], row["type_active"]


async def key_head(
    db: Queries, job_type: str, tenant_id: str, fairness_key: str
) -> tuple[int, str] | None:
    """A key's head in a FIFO type, and its state (key_head); None: no job not done."""
    row = await db.fetchrow(
        *SQL["key_head"].bind(job_type=job_type, tenant_id=tenant_id, fairness_key=fairness_key)
    )
    return None if row is None else (row["job_key"], row["state"])


async def key_caps_listed(
    db: Queries, keys: Sequence[tuple[str, str, str]]
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Per (type, tenant, key as stored): its caps, whether it is held, and its ACTIVATED
    jobs where a cap applies (key_caps_listed; none on Citus, where key caps are not
    supported yet)."""
    if not keys or citus.on_citus(db):
        return {}
    rows = await db.fetch(
        *SQL["key_caps_listed"].bind(
            job_types=[y for y, _, _ in keys],
            tenant_ids=[t for _, t, _ in keys],
            keys=[k for _, _, k in keys],
        )
    )
    return {
        (r["job_type"], r["tenant_id"], r["fairness_key"]): {
            "maxActiveJobs": r["cap"],
            "maxActivePerKey": r["per_key"],
            "active": r["active"],
            "activeAllTypes": r["active_all_types"],
            "held": r["held"],
            "head": None if r["head"] is None else str(r["head"]),
            "headState": None
            if r["head_state"] is None
            else public_state(JobState(r["head_state"])).value,
        }
        for r in rows
    }


async def held_key_counts(db: Queries) -> dict[str, int]:
    """Per job type, its fairness keys held at their caps now (held_key_counts)."""
    rows = await db.fetch(*SQL["held_key_counts"].bind())
    return {r["job_type"]: r["n"] for r in rows}


async def last_asked(db: Queries, job_type: str) -> datetime | None:
    """When a named worker last asked for jobs of ``job_type`` (None: none in a day)."""
    at: datetime | None = await db.fetchval(*SQL["last_asked"].bind(job_type=job_type))
    return at
