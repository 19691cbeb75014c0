"""Parking lanes and keys that are really empty, so that later reads need not probe them.

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

A lane's keys follow the same protocol on the same bucket lock (the lane's): makers wake
the keys of their jobs in the statement that wakes the lane, and a parker parks a key
only under the lane's bucket, once a later statement sees no CREATED job of it.  A lane
parked has no ready job, so its keys are parked with it.  So a key with ready jobs is
active, as its lane is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from app.db import citus, sql
from app.db.base import Sessions, retry_deadlock
from app.db.locks import LANE_LOCK_CLASS, lane_bucket, lock_sql
from app.scheduler import (
    LaneKey,
)

log = logging.getLogger(__name__)

log = logging.getLogger(__name__)

# A park whose try-lock found a bucket held by a producer waits this long for it; a
# background park that waited in vain tries again after PARK_RETRY_S, doubling.
PARK_WAIT_MS = 1000
PARK_RETRY_S = 0.5

SQL = sql.load("parking")  # app/db/sql/parking.sql


async def park(
    db: Sessions,
    job_type: str,
    tenant_ids: Sequence[str],
    *,
    keys: Sequence[LaneKey] = (),
    retries: int = 0,
) -> list[str]:
    """Mark lanes (``tenant_ids``) and keys (``keys``: tenant and key pairs) inactive
    that are really empty (see the module docstring); the lanes parked.  Those whose
    bucket a producer held for longer than PARK_WAIT are tried again up to ``retries``
    times, after PARK_RETRY_S, doubling: an emptied lane left active keeps its idle
    virtual time, and when jobs come back it takes every activation until it catches up
    (ADR 014) -- as an emptied key does inside its lane -- so background parks keep
    trying while two producers' batches overlap for seconds."""
    parked: list[str] = []
    for shards, targets in citus.split(db, _targets(tenant_ids, keys), lambda x: x[0]):
        parked += await _park(db, job_type, targets, retries, shards)
    return parked


async def _park(
    db: Sessions,
    job_type: str,
    targets: Sequence[_Target],
    retries: int,
    shards: Sequence[int] | None,
) -> list[str]:
    """park for ``targets``: on Citus, of the Citus shard of ``shards``."""
    parked, busy = await _park_once(db, job_type, targets, shards)
    pause = PARK_RETRY_S
    for _ in range(retries):
        if not busy:
            break
        await asyncio.sleep(pause)
        pause *= 2
        more, busy = await _park_once(db, job_type, busy, shards)
        parked += more
    if busy:
        log.info("parking %d lanes and keys of %r waited in vain", len(busy), job_type)
    return parked


# What to park: a lane (its tenant, and None) or one of its keys (tenant, key).
_Target = tuple[str, str | None]


def _targets(tenant_ids: Sequence[str], keys: Sequence[LaneKey]) -> list[_Target]:
    # Lanes first: a key of a lane parked is parked with it, and park_keys then passes it
    # by (not active); a key of a lane that is not empty is parked if it is.
    return [(t, None) for t in tenant_ids] + [(t, k) for t, k in keys]


async def _park_in(
    conn: Any, job_type: str, targets: Sequence[_Target], shards: Sequence[int] | None
) -> list[str]:
    """park_lanes and park_keys for ``targets``, whose buckets ``conn`` holds (on Citus,
    ``shards``: theirs, in one Citus shard)."""
    tenants = [t for t, k in targets if k is None]
    keys = [(t, k) for t, k in targets if k is not None]
    lanes = SQL.on(shards, "park_lanes", job_type=job_type, tenant_ids=tenants)
    rows = await conn.fetch(*lanes) if tenants else []
    if keys:
        await conn.fetch(
            *SQL.on(
                shards,
                "park_keys",
                job_type=job_type,
                tenant_ids=[t for t, _ in keys],
                keys=[k for _, k in keys],
            )
        )
    return [r["tenant_id"] for r in rows]


@retry_deadlock
async def _park_once(
    db: Sessions, job_type: str, targets: Sequence[_Target], shards: Sequence[int] | None
) -> tuple[list[str], list[_Target]]:
    """One try of park: the lanes parked, and the targets whose bucket stayed busy."""
    by_bucket: dict[int, list[_Target]] = {}
    for target in targets:
        by_bucket.setdefault(lane_bucket(job_type, target[0]), []).append(target)
    buckets = sorted(by_bucket)
    unlocked: list[_Target] = []
    async with db.connection() as conn:
        async with conn.transaction():
            got = await conn.fetchrow(
                lock_sql("pg_try_advisory_xact_lock", LANE_LOCK_CLASS, buckets)
            )
            locked = [x for b, ok in zip(buckets, got, strict=True) if ok for x in by_bucket[b]]
            parked = await _park_in(conn, job_type, locked, shards) if locked else []
        busy = [b for b, ok in zip(buckets, got, strict=True) if not ok]
        if busy:
            # A producer holds these buckets (for any lane of them).  Trying again
            # later could fail every time under a steady producer, and an empty
            # lane left active would keep its idle vtime (ADR 014): wait for them,
            # in a transaction of their own and in bucket order as producers lock
            # them (no deadlock), for at most PARK_WAIT.  New producers of these
            # buckets queue behind the park for that long at most.
            waited = [x for b in busy for x in by_bucket[b]]
            try:
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL lock_timeout = '{PARK_WAIT_MS}ms'")
                    await conn.execute(lock_sql("pg_advisory_xact_lock", LANE_LOCK_CLASS, busy))
                    parked = [*parked, *await _park_in(conn, job_type, waited, shards)]
            except asyncpg.LockNotAvailableError:
                unlocked = waited
    return parked, unlocked
