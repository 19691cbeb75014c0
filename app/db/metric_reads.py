"""What the metrics read of the database besides the stats view (``app.db.operating``):
every lane's state for the share window, and the tenants labelled by name.  Operator
reads, off a job's path; only the leader writes, a few rows a minute at most.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.db import citus, sql
from app.db.base import Queries, Sessions
from app.db.rows import KeySampleRow, LaneSampleRow, LaneStats, TenantSet

SQL = sql.load("metrics")  # app/db/sql/metrics.sql


async def lane_samples(db: Queries) -> list[LaneSampleRow]:
    return [LaneSampleRow(*r) for r in await db.fetch(*SQL["lane_samples"].bind())]


async def capped_active(db: Queries) -> dict[tuple[str, str], int]:
    """Per ("tenant", id) and ("type", name) with a cap: its active jobs, up to the cap."""
    spelled = SQL.citus if citus.on_citus(db) else SQL
    rows = await db.fetch(*spelled["capped_active"].bind())
    return {(r["kind"], r["name"]): r["active"] for r in rows}


async def failed_fifo_heads(db: Queries) -> dict[str, int]:
    """Per FIFO job type, its keys stopped behind a FAILED head (failed_fifo_heads);
    nothing on Citus, which refuses FIFO types (ADR 041)."""
    if citus.on_citus(db):
        return {}
    return {r["job_type"]: r["n"] for r in await db.fetch(*SQL["failed_fifo_heads"].bind())}


async def key_samples(
    db: Queries, top: int, tracked: Sequence[tuple[str, str, str]]
) -> list[KeySampleRow]:
    """Every lane's keys as the key window samples them (key_samples): the ``top`` most
    active ever and the ``tracked`` ones (type, tenant, key as stored)."""
    spelled = SQL.citus if citus.on_citus(db) else SQL
    rows = await db.fetch(
        *spelled["key_samples"].bind(
            top=top,
            job_types=[t for t, _, _ in tracked],
            tenant_ids=[n for _, n, _ in tracked],
            keys=[k for _, _, k in tracked],
        )
    )
    return [KeySampleRow(*r) for r in rows]


async def lane_counts(db: Queries) -> list[LaneStats]:
    """Every lane with jobs ready, delayed or active, as the stats view counts them, with
    no oldest key and with caps and tenant totals left to the caller (None)."""
    lanes: dict[tuple[str, str], list[Any]] = {}
    for r in await db.fetch(*SQL["lane_counts"].bind()):
        got = lanes.get((r[0], r[1]))
        if got is None:
            lanes[(r[0], r[1])] = [r[2], r[3], r[4], r[5]]
        else:
            got[0] += r[2]
            got[1] += r[3]
            got[2] += r[4]
            got[3] = got[3] or r[5]
    return [
        LaneStats(job_type, tenant, ready, delayed, active, oldest, None, None, None, None)
        for (job_type, tenant), (ready, delayed, active, oldest) in sorted(lanes.items())
    ]


async def tenant_sets(db: Queries) -> list[TenantSet]:
    return [
        TenantSet(r["effective_at"], frozenset(r["tenants"]))
        for r in await db.fetch(*SQL["metric_tenant_sets"].bind())
    ]


async def publish_tenants(
    db: Sessions, effective_at: datetime, tenants: Sequence[str], now: datetime
) -> None:
    """Publish a set in force from ``effective_at``, and drop those superseded ``now``."""
    async with db.transaction() as tx:
        await tx.execute(
            *SQL["publish_metric_tenants"].bind(effective_at=effective_at, tenants=sorted(tenants))
        )
        await tx.execute(*SQL["prune_metric_tenants"].bind(now=now))
