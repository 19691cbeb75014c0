"""Bulk operations for operators: revive FAILED jobs, cancel a tenant's CREATED ones.

Each statement here works on one bounded batch and is its own transaction, so a bulk
operation over a million jobs never holds more than a batch of row locks, and what it
did stays done if a later batch fails.  The service (``app.browser``) repeats batches
up to the caller's limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.db import citus, lanes, parking, sql
from app.db.base import Queries, Sessions, retry_deadlock
from app.domain import FailedFilter
from app.shards import shard_of_key

SQL = sql.load("bulk")  # app/db/sql/bulk.sql


async def failed_batch(
    db: Queries, f: FailedFilter, after_key: int, limit: int
) -> list[tuple[int, str, str]]:
    """The next ``limit`` FAILED jobs after ``after_key`` matching ``f`` (failed_batch):
    (key, type, tenant)."""
    rows = await db.fetch(
        *SQL["failed_batch"].bind(
            after_key=after_key,
            limit=limit,
            tenant_id=f.tenant_id,
            job_type=f.job_type,
            created_after=f.created_after,
            created_before=f.created_before,
        )
    )
    return [(r["job_key"], r["job_type"], r["tenant_id"]) for r in rows]


@retry_deadlock
async def revive(
    db: Sessions, jobs: Sequence[tuple[int, str, str]], retries: int, now: datetime
) -> int:
    """Revive these FAILED jobs (revive_failed) in one transaction, their lanes woken
    (the protocol: the buckets' shared locks first, then the jobs, then the lanes); how
    many were still FAILED."""
    if not jobs:
        return 0
    async with db.transaction() as tx:
        await lanes.lock_to_wake(tx, [(t, n) for _, t, n in jobs])
        keys = [k for k, _, _ in jobs]
        rows = []
        for shards, part in citus.split_by_shard(tx, keys, shard_of_key):
            rows += await tx.fetch(
                *SQL.on(shards, "revive_failed", job_keys=part, retries=retries, now=now)
            )
        await lanes.wake(tx, rows)
        await lanes.release_key_holds_of(tx, rows)
    return len(rows)


async def cancel_ready(
    db: Queries, job_type: str, tenant_id: str, limit: int, now: datetime
) -> tuple[int, list[str]]:
    """Cancel up to ``limit`` ready jobs of one lane (cancel_ready): how many, and the
    fairness keys they had."""
    [(shards, _)] = citus.split(db, [tenant_id], str)
    row = await db.fetchrow(
        *SQL.on(
            shards, "cancel_ready", job_type=job_type, tenant_id=tenant_id, limit=limit, now=now
        )
    )
    return row["n"], list(row["keys"])


async def cancel_delayed(
    db: Queries, tenant_id: str, job_type: str | None, limit: int, now: datetime
) -> int:
    """Cancel up to ``limit`` delayed jobs of a tenant (cancel_delayed)."""
    [(shards, _)] = citus.split(db, [tenant_id], str)
    n: int = await db.fetchval(
        *SQL.on(
            shards, "cancel_delayed", tenant_id=tenant_id, job_type=job_type, limit=limit, now=now
        )
    )
    return n


async def tenant_lanes(db: Queries, tenant_id: str) -> list[str]:
    """The job types of the tenant's active lanes (tenant_lanes)."""
    return [r["job_type"] for r in await db.fetch(*SQL["tenant_lanes"].bind(tenant_id=tenant_id))]


async def any_created(db: Queries, tenant_id: str, job_type: str | None) -> bool:
    """Whether the tenant has a CREATED (or delayed) job, of ``job_type`` if given."""
    found: bool = await db.fetchval(
        *SQL["any_created"].bind(tenant_id=tenant_id, job_type=job_type)
    )
    return found


async def park(db: Sessions, job_type: str, tenant_id: str, keys: Sequence[str] = ()) -> None:
    """Park the lane if the cancels emptied it, else those of its ``keys`` they emptied
    (parking.park)."""
    await parking.park(db, job_type, [tenant_id], keys=[(tenant_id, k) for k in keys])
