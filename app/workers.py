"""Workers seen: the worker names that ask for jobs of each type, kept cheap.

An activation request or a stream that names its ``worker`` is noted in memory
(``seen``: a dict write, no I/O); a background loop writes what was noted since its last
pass in one statement (``flush``, every ``FLUSH_INTERVAL_MS``), so the hot path never
waits for it and a worker polling a thousand times a second costs one row write per
pass.  ``GET /v2/workers`` flushes this process's notes first, then reads the table,
which every process writes.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from app.db import Database, worker_rows
from app.db.rows import WorkerRow

log = logging.getLogger(__name__)

FLUSH_INTERVAL_MS = 2_000
# Worker names noted between two flushes, at most: a client that sends a new name per
# request cannot grow this process's memory without bound (the rest wait for a pass).
MAX_PENDING = 10_000
# What "recently" means for GET /v2/workers; the retention sweep forgets older names.
SEEN_WINDOW = timedelta(hours=24)
MAX_LISTED = 10_000


class WorkerSightings:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.interval_ms = FLUSH_INTERVAL_MS
        self.name = "workers-seen"
        self._pending: dict[tuple[str, str], WorkerRow] = {}
        self.dropped = 0  # names not noted because MAX_PENDING were waiting

    def seen(self, job_type: str, worker: str | None, now: datetime, activated: bool) -> None:
        """``worker`` asked for jobs of ``job_type`` at ``now`` (and got some)."""
        if not worker:
            return
        key = (job_type, worker)
        last = self._pending.get(key)
        if last is None and len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        got = now if activated else (last.last_activated_at if last is not None else None)
        self._pending[key] = WorkerRow(job_type, worker, now, got)

    async def flush(self) -> int:
        """Write what was noted since the last flush; how many rows.  On failure the
        notes are kept for the next pass (newer ones noted meanwhile win)."""
        if not self._pending:
            return 0
        taken, self._pending = self._pending, {}
        try:
            await worker_rows.record(self.db, sorted(taken.values()))
        except BaseException:
            for key, row in taken.items():
                self._pending.setdefault(key, row)
            raise
        return len(taken)

    async def run_once(self, now: datetime) -> int:
        return await self.flush()

    async def recent(self, now: datetime, job_type: str | None = None) -> list[WorkerRow]:
        """The workers seen in the last SEEN_WINDOW, this process's latest notes
        included."""
        await self.flush()
        return await worker_rows.seen_since(self.db, now - SEEN_WINDOW, MAX_LISTED, job_type)
