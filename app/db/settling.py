"""Worker-time settlements written (ADR 029): what ended leases owe their lanes and keys."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from app.db import sql
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
    db: Queries, job_type: str, lanes: Mapping[str, Settled], keys: Mapping[LaneKey, Settled]
) -> int:
    """Write worker-time settlements (settle_lanes): how many lanes and keys moved (a
    key's ``n`` is not used: keys keep no estimate)."""
    tenants = sorted(lanes)
    pairs = sorted(keys)
    moved: int = await db.fetchval(
        *SQL["settle_lanes"].bind(
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
