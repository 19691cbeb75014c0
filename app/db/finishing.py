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

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from app.db import citus, holds, lanes, parking, sql
from app.db.base import Queries, Sessions, retry_deadlock
from app.db.rows import Ended, JobRow
from app.domain import JobState, utcnow
from app.shards import shard_of_key

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
    rows = []
    for shards, part in citus.split_by_shard(db, items, lambda i: shard_of_key(i[0])):
        args = dict(
            job_keys=[i[0] for i in part],
            activation_counts=[i[1] for i in part],
            variables=[i[2] for i in part],
            now=now,
        )
        rows += await _finish(db, "complete_jobs", args, shards)
    return [_ended(r, JobState.COMPLETED) for r in rows]


async def _finish(
    db: Queries, name: str, args: dict[str, Any], shards: Sequence[int] | None = None
) -> list[Any]:
    """A finishing statement that is its own transaction: on Citus, in a transaction with
    what it owes after it (app.db.holds.after_finish); ``shards``: its jobs' (in one
    Citus shard) where the statement names them (complete_jobs)."""
    if not citus.on_citus(db):
        rows: list[Any] = await db.fetch(*SQL[name].bind(**args))
        return rows
    statement = SQL.on(shards, name, **args) if shards else SQL.citus[name].bind(**args)
    async with _transaction(db) as tx:
        rows = await tx.fetch(*statement)
        await holds.after_finish(tx, rows)
    return rows


@asynccontextmanager
async def _transaction(db: Any) -> AsyncIterator[Queries]:
    """A transaction on ``db``: the Database's (a connection of its own) or, on a
    connection, one there (a savepoint if it is in one)."""
    if hasattr(db, "connection"):
        async with db.transaction() as tx:
            yield tx
    else:
        async with db.transaction():
            yield db


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
            *_spelled(tx)["fail_job"].bind(
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
        if citus.on_citus(tx):
            await holds.after_finish(tx, [row])
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
    args = dict(
        job_key=job_key,
        activation_count=activation_count,
        error_code=error_code,
        error_message=error_message,
        variables=variables,
        now=now,
    )
    rows = await _finish(db, "throw_error", args)
    if not rows:
        return None
    return _ended(rows[0], JobState.ERROR_THROWN)


@retry_deadlock
async def release(db: Sessions, jobs: Sequence[JobRow]) -> list[Ended]:
    """Give back activations their caller never received (release_jobs), fenced by their
    activationCount, their lanes woken; the jobs that went back."""
    if not jobs:
        return []
    async with db.transaction() as tx:
        await lanes.lock_to_wake(tx, [(j.job_type, j.tenant_id) for j in jobs])
        rows = []
        for shards, part in citus.split_by_shard(tx, jobs, lambda j: shard_of_key(j.job_key)):
            rows += await tx.fetch(
                *SQL.on(
                    shards,
                    "release_jobs",
                    job_keys=[j.job_key for j in part],
                    activation_counts=[j.activation_count for j in part],
                    now=utcnow(),
                )
            )
        if citus.on_citus(tx):
            await holds.after_finish(tx, rows)
        await lanes.wake(tx, rows)
    return [_ended(r, JobState.CREATED) for r in rows]


def _spelled(db: Any) -> dict[str, sql.Statement]:
    """The finishing statements as ``db`` runs them (on Citus, without their NOTIFYs
    and release: app.db.holds)."""
    return SQL.citus if citus.on_citus(db) else SQL


async def cancel(db: Sessions, job_key: int, now: datetime) -> Ended | None:
    """Cancel a CREATED, SCHEDULED, ACTIVATED or FAILED job (cancel_job); then park its lane if
    that emptied it (an empty lane left active would keep its idle vtime, ADR 014).  The
    job (its ``charged`` None unless an activation by worker time ended), or None if it
    was in none of those states."""
    rows = await _finish(db, "cancel_job", dict(job_key=job_key, now=now))
    if not rows:
        return None
    row = rows[0]
    tenant = row["tenant_id"]
    await parking.park(db, row["job_type"], [tenant], keys=[(tenant, row["fairness_key"])])
    return _ended(row, JobState.CANCELED)
