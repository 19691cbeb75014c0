"""Maintenance: what the leader's sweepers do -- expired leases back to the queue,
delayed jobs promoted when due, finished jobs pruned after their retention.

Each works in bounded batches (``limit``), so a sweep never holds locks on, or reads,
more than a batch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from app.db import citus, holds, lanes, sql
from app.db.base import Queries, Sessions, retry_deadlock
from app.db.rows import ExpiredLease
from app.shards import shard_of_key

SQL = sql.load("maintenance")  # app/db/sql/maintenance.sql


@retry_deadlock
async def _ready_by_keys(
    db: Sessions, select: tuple[Any, ...], update: str, **update_args: Any
) -> list[asyncpg.Record]:
    """Select candidates (``select``: a bound statement), take their lanes' shared bucket
    locks, then update them (the statement ``update``, given their keys as ``job_keys``)
    and wake their lanes; the rows updated.  On Citus the update's NOTIFYs and release of
    held lanes follow it (app.db.holds)."""
    async with db.connection() as conn:
        candidates = await conn.fetch(*select)
        if not candidates:
            return []
        async with conn.transaction():
            await lanes.lock_to_wake(conn, [(r["job_type"], r["tenant_id"]) for r in candidates])
            keys = [r["job_key"] for r in candidates]
            rows = []
            for shards, part in citus.split_by_shard(conn, keys, shard_of_key):
                rows += await conn.fetch(*SQL.on(shards, update, job_keys=part, **update_args))
            if update == "release_expired" and citus.on_citus(conn):
                await holds.after_finish(conn, rows)
            await lanes.wake(conn, rows)
            if update == "promote_scheduled":
                await lanes.release_key_holds_of(conn, rows)
        return list(rows)


async def release_expired(
    db: Sessions, now: datetime, limit: int, since: datetime | None = None
) -> list[ExpiredLease]:
    """Up to ``limit`` expired leases back to CREATED (release_expired), of those that
    ended at ``since`` or later (None: any): their jobs."""
    expired = SQL["expired_leases"].bind(
        now=now, limit=limit, since=datetime.min.replace(tzinfo=UTC) if since is None else since
    )
    rows = await _ready_by_keys(db, expired, "release_expired", now=now)
    fields = (
        "job_key",
        "job_type",
        "tenant_id",
        "activation_count",
        "worker",
        "activated_at",
        "fairness_key",
        "charged",
        "lane_charge",
        "key_charge",
    )
    return [ExpiredLease(*(r[f] for f in fields)) for r in rows]


async def promote_scheduled(db: Sessions, now: datetime, limit: int) -> int:
    """Up to ``limit`` due delayed jobs to CREATED (promote_scheduled)."""
    due = SQL["due_scheduled"].bind(now=now, limit=limit)
    return len(await _ready_by_keys(db, due, "promote_scheduled", now=now))


async def prune_terminal(db: Sessions, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` jobs finished before ``before`` (prune_terminal)."""
    pruned: int = await db.fetchval(*SQL["prune_terminal"].bind(before=before, limit=limit))
    return pruned


async def prune_workers(db: Sessions, before: datetime) -> int:
    """Forget worker names last seen before ``before`` (prune_workers)."""
    status = await db.execute(*SQL["prune_workers"].bind(before=before))
    return int(status.split()[-1])


async def dead_rows(db: Queries) -> tuple[int, int]:
    """The job table's dead row versions as the statistics last counted them, and the
    vacuums of it that have finished (dead_rows)."""
    row = await db.fetchrow(*SQL["dead_rows"].bind())
    return int(row["dead"]), int(row["vacuums"])


async def vacuum_settings(db: Queries) -> tuple[float, bool]:
    """autovacuum_naptime in seconds, and whether autovacuum is on (vacuum_settings)."""
    row = await db.fetchrow(*SQL["vacuum_settings"].bind())
    return float(row["naptime_s"]), bool(row["autovacuum"])


async def servers_connected(db: Queries) -> int:
    """How many connections of Jobfair servers or commands (application_name
    "jobfair/...", app.db.connect) other than this one are open to this database."""
    n: int = await db.fetchval(*SQL["servers_connected"].bind())
    return n


async def fence_after_restore(db: Sessions, key_gap: int, count_gap: int) -> tuple[int, int]:
    """After a restore from a backup, before any server starts (``jobfair restored``): job
    keys drawn from ``key_gap`` on, and every unfinished job's activationCount moved on by
    ``count_gap``, in one transaction (restore_skip_keys, restore_fence_counts); the next
    job key and how many jobs were fenced."""
    async with db.transaction() as tx:
        next_key = await tx.fetchval(*SQL["restore_skip_keys"].bind(gap=key_gap))
        status = await tx.execute(*SQL["restore_fence_counts"].bind(gap=count_gap))
    return int(next_key), int(status.split()[-1])
