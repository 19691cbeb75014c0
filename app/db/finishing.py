"""Finishing: the statements that end activations -- complete, fail, throw an error, or
give back jobs a caller never received -- each fenced by the activation count.

Every one of them, in the statement that ends the activations, writes the activation's
end into the job's history (``app.db.history``), gives streams their credit back
(``jobfair_done``), wakes activators of capped types or tenants (capacity freed) and
releases the held lanes of tenants that have room again (``jobfair_release_holds``; the
protocol is in ``app.db.lanes``).  The statements are app/db/sql/finishing.sql's; those
parts are its fragments (``credited``, ``freed``, ``unheld``, and history.sql's
``leases``), which maintenance's release_expired puts in too.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from app.db import lanes, parking, sql
from app.db.base import Queries, Sessions, retry_deadlock
from app.db.rows import Ended, JobRow
from app.domain import JobState, utcnow

SQL = sql.load("finishing")  # app/db/sql/finishing.sql


def _ended(row: Any, state: JobState) -> Ended:
    return Ended(
        row["job_key"],
        row["job_type"],
        row["tenant_id"],
        state,
        row["activated_at"],
        row["fairness_key"],
        row["charged"],
        row["lane_charge"],
        row["key_charge"],
    )


@retry_deadlock
async def complete(
    db: Queries, items: Sequence[tuple[int, int, str | None]], now: datetime
) -> list[Ended]:
    """Complete (key, activationCount, variables JSON or None) items in one statement
    (complete_jobs); the jobs completed.  Its release of held lanes can deadlock with
    another completion's (a fresh clone's test_held_lanes race hit it: eight activators
    completing over 30 tenants at cap 1); the statement is its own transaction, rolled
    back whole, so it is sent again.  A key named twice is judged once: callers
    that may name a job twice send the namings in separate statements."""
    rows = await db.fetch(
        *SQL["complete_jobs"].bind(
            job_keys=[i[0] for i in items],
            activation_counts=[i[1] for i in items],
            variables=[i[2] for i in items],
            now=now,
        )
    )
    return [_ended(r, JobState.COMPLETED) for r in rows]


@retry_deadlock
async def fail(
    db: Sessions,
    job_key: int,
    activation_count: int,
    *,
    retries: int | None,
    error_message: str | None,
    run_at: datetime,
    variables: str | None,
    now: datetime,
) -> Ended | None:
    """Fail the job's activation (fail_job): retried (CREATED, or SCHEDULED until
    ``run_at``) while retries are left, else FAILED.  A job made ready again wakes its
    lane in the same transaction.  None when the fence did not match."""
    async with db.transaction() as tx:
        row = await tx.fetchrow(
            *SQL["fail_job"].bind(
                job_key=job_key,
                activation_count=activation_count,
                retries=retries,
                error_message=error_message,
                run_at=run_at,
                variables=variables,
                now=now,
            )
        )
        if row is None:
            return None
        ended = _ended(row, JobState(row["state"]))
        if ended.state is JobState.CREATED:
            await lanes.lock_to_wake(tx, [(ended.job_type, ended.tenant_id)])
            await lanes.wake(tx, [row])
        return ended


@retry_deadlock  # as complete: one statement, its own transaction
async def throw_error(
    db: Queries,
    job_key: int,
    activation_count: int,
    error_code: str,
    error_message: str | None,
    variables: str | None,
    now: datetime,
) -> Ended | None:
    """ACTIVATED -> ERROR_THROWN (throw_error); the job, or None if the fence did not
    match."""
    row = await db.fetchrow(
        *SQL["throw_error"].bind(
            job_key=job_key,
            activation_count=activation_count,
            error_code=error_code,
            error_message=error_message,
            variables=variables,
            now=now,
        )
    )
    if row is None:
        return None
    return _ended(row, JobState.ERROR_THROWN)


@retry_deadlock
async def release(db: Sessions, jobs: Sequence[JobRow]) -> list[Ended]:
    """Give back activations their caller never received (release_jobs), fenced by their
    activationCount, their lanes woken; the jobs that went back."""
    if not jobs:
        return []
    async with db.transaction() as tx:
        await lanes.lock_to_wake(tx, [(j.job_type, j.tenant_id) for j in jobs])
        rows = await tx.fetch(
            *SQL["release_jobs"].bind(
                job_keys=[j.job_key for j in jobs],
                activation_counts=[j.activation_count for j in jobs],
                now=utcnow(),
            )
        )
        await lanes.wake(tx, rows)
    return [_ended(r, JobState.CREATED) for r in rows]


async def cancel(db: Sessions, job_key: int, now: datetime) -> Ended | None:
    """Cancel a CREATED, SCHEDULED or ACTIVATED job (cancel_job); then park its lane if
    that emptied it (an empty lane left active would keep its idle vtime, ADR 014).  The
    job (its ``charged`` None unless an activation by worker time ended), or None if it
    was in none of those states."""
    row = await db.fetchrow(*SQL["cancel_job"].bind(job_key=job_key, now=now))
    if row is None:
        return None
    tenant = row["tenant_id"]
    await parking.park(db, row["job_type"], [tenant], keys=[(tenant, row["fairness_key"])])
    return _ended(row, JobState.CANCELED)
