"""A job's attempt history: the ``job_events`` rows its transitions write, and the read.

One row per ended activation -- an attempt: when it started, its worker and lease, how
it ended (completed, failed, retried, error-thrown, lease-expired, released, canceled)
and when -- plus one per revive and per cancel of a job not activated.  The statement
that ends the activation writes the row from its own ``RETURNING`` rows (a
data-modifying CTE): no round trip, no second transaction, and a transition that did
not happen (a stale worker's fenced-out finish) writes nothing.  The activation running
now is read from the job itself, and so is the "created" entry (its ``created_at``): the
claim and the create path write no history at all.

Rows are keyed (job_key, activation_count, step): the activation a row belongs to and
its place in it -- ``END``, ``REVIVED`` (FAILED -> CREATED after that activation),
``CANCELED`` -- so a job's history reads in order without trusting the clocks of several
server processes, and a second row for one step cannot exist.

Bounded: a job keeps the rows of its first ``FIRST_ACTIVATIONS`` activations and of its
latest ``LAST_ACTIVATIONS``.  The claim that starts activation n drops activation
n - LAST_ACTIVATIONS when that is past the first ones (``trim_cte``: a filter on the
claimed rows, so no probe before a job's 31st activation), so a job never has more than
2 x (FIRST + LAST) + 1 rows, whatever loop it is caught in (a lease that keeps expiring
costs no retries).  The history says it was cut (``truncated``) when the job has had
more activations than both windows hold.

Writing it costs the database a row and an index entry per activation (ADR 023);
JOBFAIR_JOB_HISTORY=false turns the writes off, through the connection setting
``HISTORY_SETTING`` that every one of them tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.db import sql
from app.db.base import Queries
from app.db.bounds import (
    FIRST_ACTIVATIONS,
    LAST_ACTIVATIONS,
)
from app.domain import JobState

# A kept activation answers at most three entries (activated, its end, revived), the job
# two more (created; canceled), of at most two rows per activation and one cancel.
MAX_ENTRIES = 3 * (FIRST_ACTIVATIONS + LAST_ACTIVATIONS) + 2
MAX_ROWS = 2 * (FIRST_ACTIVATIONS + LAST_ACTIVATIONS) + 1
SQL = sql.load("history")  # app/db/sql/history.sql


# log_cte, ended_cte and TRIM_CTE below are Python fragments that app.db.job_rows, bulk and
# claims still put into their statements, until those move to .sql files too; a .sql file
# names history.sql's fragments instead ({{history.on}}, {{history.leases}}, ...).
@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a job's history, as the API answers it."""

    at: datetime
    event: str
    activation_count: int
    worker: str | None = None
    deadline: datetime | None = None
    retries: int | None = None
    error_code: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class History:
    """A job's history, oldest first (its creation first, the activation running now
    last), whether middle activations were dropped, and the job's scope."""

    entries: list[Entry]
    truncated: bool
    tenant_id: str
    job_type: str


async def log_ended(tx: Queries, rows: Sequence[Any]) -> None:
    """On Citus, the history rows of the activations a finishing statement ended, from
    its answer ``rows`` (log_ended; on one PostgreSQL the statement wrote them itself:
    history.sql's ``logged``)."""
    if not rows:
        return
    await tx.execute(
        *SQL.citus["log_ended"].bind(
            now=rows[0]["ended_at"],
            job_keys=[r["job_key"] for r in rows],
            activation_counts=[r["activation_count"] for r in rows],
            steps=[r["step"] for r in rows],
            events=[r["event"] for r in rows],
            activated_at=[r["activated_at"] for r in rows],
            leases=[r["lease"] for r in rows],
            workers=[r["worker"] for r in rows],
            retries=[r["retries"] for r in rows],
            error_codes=[r["error_code"] for r in rows],
            error_messages=[r["error_message"] for r in rows],
        )
    )


async def read(db: Queries, job_key: int) -> History | None:
    """The job's history (job_history), or None if the job does not exist."""
    rows: list[Any] = await db.fetch(*SQL["job_history"].bind(job_key=job_key))
    if not rows:
        return None
    job = rows[0]
    entries = [Entry(job["created_at"], "created", 0)]
    for r in rows:
        if r["event"] is None:
            continue
        n = r["activation_count"]
        if r["started_at"] is not None:
            entries.append(Entry(r["started_at"], "activated", n, r["worker"], r["deadline"]))
        worker = r["worker"] if r["started_at"] is not None else None
        entries.append(
            Entry(
                r["at"],
                r["event"],
                n,
                worker,
                None,
                r["retries"],
                r["error_code"],
                r["error_message"],
            )
        )
    if job["state"] == JobState.ACTIVATED:
        entries.append(
            Entry(
                job["running_since"],
                "activated",
                job["activations"],
                job["running_worker"],
                job["running_deadline"],
            )
        )
    truncated = job["activations"] > FIRST_ACTIVATIONS + LAST_ACTIVATIONS
    return History(entries, truncated, job["tenant_id"], job["job_type"])
