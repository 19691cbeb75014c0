"""Workers seen: which worker names asked for jobs of each type, and when.

Written in batches by ``app.workers`` (one statement per flush, at most every few
seconds per server process), never on a request's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.db import sql
from app.db.base import Queries
from app.db.rows import WorkerRow

SQL = sql.load("workers")  # app/db/sql/workers.sql


async def record(db: Queries, rows: Sequence[WorkerRow]) -> None:
    """Upsert sightings (record_workers)."""
    if not rows:
        return
    await db.execute(
        *SQL["record_workers"].bind(
            job_types=[r.job_type for r in rows],
            workers=[r.worker for r in rows],
            seen=[r.last_seen_at for r in rows],
            activated=[r.last_activated_at for r in rows],
        )
    )


async def seen_since(
    db: Queries, since: datetime, limit: int, job_type: str | None = None
) -> list[WorkerRow]:
    """Workers seen since ``since`` (list_workers, list_workers_of_type)."""
    if job_type is None:
        rows = await db.fetch(*SQL["list_workers"].bind(since=since, limit=limit))
    else:
        of_type = SQL["list_workers_of_type"]
        rows = await db.fetch(*of_type.bind(since=since, limit=limit, job_type=job_type))
    return [WorkerRow(*r) for r in rows]
