"""Workers seen: which worker names asked for jobs of each type, and when.

Written in batches by ``app.workers`` (one statement per flush, at most every few
seconds per server process), never on a request's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.db.base import Queries
from app.db.rows import WorkerRow

# -- name: record_workers
# Upserts (type, worker, last seen, last activated: NULL if it got nothing) rows, each
# time only moving forward (a slower process's older sighting changes nothing; GREATEST
# ignores NULLs).  In key order, so that two processes' flushes lock rows in one order.
# Index: workers pkey.  Locks: the rows.
RECORD_WORKERS = """
INSERT INTO workers AS w (job_type, worker, last_seen_at, last_activated_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[])
ORDER BY 1, 2
ON CONFLICT (job_type, worker) DO UPDATE
SET last_seen_at = GREATEST(w.last_seen_at, EXCLUDED.last_seen_at),
    last_activated_at = GREATEST(w.last_activated_at, EXCLUDED.last_activated_at)
"""

# -- name: list_workers
# Workers seen since $1, by type, the latest first; at most $2.  A sequential read of
# workers (one row per type and worker name, pruned by the retention sweep).
LIST_WORKERS = """
SELECT job_type, worker, last_seen_at, last_activated_at FROM workers
WHERE last_seen_at >= $1
ORDER BY job_type, last_seen_at DESC, worker LIMIT $2
"""

# -- name: list_workers_of_type
# As list_workers, for job type $3 only.  Index: workers pkey.
LIST_WORKERS_OF_TYPE = """
SELECT job_type, worker, last_seen_at, last_activated_at FROM workers
WHERE job_type = $3 AND last_seen_at >= $1
ORDER BY last_seen_at DESC, worker LIMIT $2
"""


async def record(db: Queries, rows: Sequence[WorkerRow]) -> None:
    """Upsert sightings (record_workers)."""
    if not rows:
        return
    await db.execute(
        RECORD_WORKERS,
        [r.job_type for r in rows],
        [r.worker for r in rows],
        [r.last_seen_at for r in rows],
        [r.last_activated_at for r in rows],
    )


async def seen_since(
    db: Queries, since: datetime, limit: int, job_type: str | None = None
) -> list[WorkerRow]:
    """Workers seen since ``since`` (list_workers, list_workers_of_type)."""
    if job_type is None:
        rows = await db.fetch(LIST_WORKERS, since, limit)
    else:
        rows = await db.fetch(LIST_WORKERS_OF_TYPE, since, limit, job_type)
    return [WorkerRow(*r) for r in rows]
