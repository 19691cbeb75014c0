"""Worker-time settlements written (ADR 029): what ended leases owe their lanes and keys."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from app.db import citus, sql
from app.db.base import Queries, retry_deadlock
from app.scheduler import (
    ESTIMATE_ALPHA,
    LaneKey,
    Settled,
)

log = logging.getLogger(__name__)

SQL = sql.load("settling")  # app/db/sql/settling.sql


@retry_deadlock
async def settle(
    db: Queries,
    job_type: str,
    lanes: Mapping[str, Settled],
    keys: Mapping[LaneKey, Settled],
) -> int:
    """Write worker-time settlements (settle_lanes): how many lanes and keys moved (a
    key's ``n`` is not used: keys keep no estimate).  On Citus a statement per Citus
    shard."""
    moved = 0
    for shards, part in citus.split(db, sorted({*lanes, *(t for t, _ in keys)}), str):
        mine = set(part)
        moved += await _settle(
            db,
            job_type,
            {t: s for t, s in lanes.items() if t in mine},
            {tk: s for tk, s in keys.items() if tk[0] in mine},
            shards,
        )
    return moved


async def _settle(
    db: Queries,
    job_type: str,
    lanes: Mapping[str, Settled],
    keys: Mapping[LaneKey, Settled],
    shards: Sequence[int] | None,
) -> int:
    tenants = sorted(lanes)
    pairs = sorted(keys)
    moved: int = await db.fetchval(
        *SQL.on(
            shards,
            "settle_lanes",
            job_type=job_type,
            tenant_ids=tenants,
            units=[lanes[t].units for t in tenants],
            observed=[lanes[t].n for t in tenants],
            held=[lanes[t].held_s for t in tenants],
            lane_refunds=[lanes[t].refund for t in tenants],
            key_tenants=[t for t, _ in pairs],
            keys=[k for _, k in pairs],
            key_units=[keys[tk].units for tk in pairs],
            key_held=[keys[tk].held_s for tk in pairs],
            key_refunds=[keys[tk].refund for tk in pairs],
            estimate_alpha=ESTIMATE_ALPHA,
        )
    )
    return moved
