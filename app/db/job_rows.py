"""Jobs: inserting them (with their lanes woken), reading them, and the read-modify-write
of a PATCH (the service decides, under the row lock it holds).  Canceling ends an
activation too, so it is ``app.db.finishing``'s.

Its statements are app/db/sql/jobs.sql; those that answer job records list
``JOB_COLUMNS`` (``app.db.rows``).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from app.db import citus, lanes, sql
from app.db.base import Queries, Sessions, retry_deadlock, transaction_on
from app.db.locks import buckets_of, share_buckets_sql
from app.db.rows import (
    Inserted,
    JobFence,
    JobRow,
    StoredJob,
    TypeConfig,
    job_row,
)
from app.domain import DEFAULT_PRIORITY, DEFAULT_RETRIES, DEFAULT_TENANT, JobState, tenant_of

SQL = sql.load("jobs")  # app/db/sql/jobs.sql


def ready_at_once(job: Mapping[str, Any], now: datetime) -> bool:
    """Whether a job to insert is CREATED (not SCHEDULED) at ``now`` (INSERT_JOBS decides
    the same in SQL)."""
    run_at = job.get("runAt")
    if run_at is not None:
        return datetime.fromisoformat(run_at) <= now
    return not job.get("delay")


def locks_for(jobs: Sequence[Mapping[str, Any]], now: datetime) -> str | None:
    """The statement taking the shared bucket locks of the lanes ``jobs`` make ready, if
    any (a transaction's ``first``)."""
    buckets = buckets_of((j["type"], tenant_of(j)) for j in jobs if ready_at_once(j, now))
    return share_buckets_sql(buckets) if buckets else None


def _keyed(jobs: Sequence[Mapping[str, Any]]) -> bool:
    return any(j.get("idempotencyKey") is not None for j in jobs)


def insert_args(jobs: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """What the insert statements take of ``jobs`` (as the API spells them) at ``now``."""
    return dict(
        jobs=orjson.dumps(jobs).decode(),
        now=now,
        default_tenant=DEFAULT_TENANT,
        default_priority=DEFAULT_PRIORITY,
        default_retries=DEFAULT_RETRIES,
    )


class KeysBefore0008:
    """Whether a job made before alembic 0008 with an idempotency key may be left
    outside its tenant's shard, where the unique index does not find its key: a keyed
    insert then looks for it there too (before_0008), which costs a keyed job about a
    quarter more of PostgreSQL's time (ADR 045).  A pool's, found by its first insert and
    then every RECHECK_S while some remain; once none does, none can come back (every key
    made since is above 2**62), and it is not looked for again."""

    RECHECK_S = 300.0

    def __init__(self) -> None:
        self.none_left = False
        self._checked = -math.inf

    async def remain(self, q: Queries) -> bool:
        if self.none_left:
            return False
        now = time.monotonic()
        if now - self._checked >= self.RECHECK_S:
            self._checked = now
            self.none_left = not await q.fetchval(*SQL["keys_before_0008"].bind())
        return not self.none_left


async def _keys_before_0008(q: Queries) -> bool:
    """Whether a keyed insert on ``q``'s database must look outside the tenant's shard
    (a connection without its pool's KeysBefore0008 always does)."""
    found: KeysBefore0008 | None = getattr(q, "keys_before_0008", None)
    return True if found is None else await found.remain(q)


async def insert_into(
    tx: Queries, jobs: Sequence[Mapping[str, Any]], now: datetime, *, quiet: bool = False
) -> tuple[list[int], list[int]]:
    """In the caller's transaction, which holds ``locks_for(jobs)``: insert_jobs (or,
    ``quiet``, insert_job_quiet).  The keys in input order, and the 1-based positions not
    inserted (their idempotency key was taken).  On Citus a statement per Citus shard,
    after the re-entry floors of the ready jobs' types are read across every node, and
    the types notified from the coordinator (unless ``quiet``)."""
    name = "insert_job_quiet" if quiet else "insert_jobs"
    if not citus.on_citus(tx):
        old = await _keys_before_0008(tx) if _keyed(jobs) else True
        row = await tx.fetchrow(*SQL[name].bind(**insert_args(jobs, now), keys_before_0008=old))
        return row["job_keys"], row["not_inserted"]
    ready = [j["type"] for j in jobs if ready_at_once(j, now)]
    reentry = await lanes.reentry_floors(tx, ready)
    keys = [0] * len(jobs)
    not_inserted: list[int] = []
    for shards, part in citus.split(tx, range(len(jobs)), lambda i: tenant_of(jobs[i])):
        args = insert_args([jobs[i] for i in part], now)
        row = await tx.fetchrow(*SQL.on(shards, name, **args, **reentry))
        for i, key in zip(part, row["job_keys"], strict=True):
            keys[i] = key
        not_inserted += [part[o - 1] + 1 for o in row["not_inserted"]]
    if not quiet:
        skipped = set(not_inserted)
        told = Counter(
            j["type"] for i, j in enumerate(jobs, 1) if i not in skipped and ready_at_once(j, now)
        )
        for job_type, n in sorted(told.items()):
            await notify_ready(tx, job_type, n)
    return keys, sorted(not_inserted)


@retry_deadlock
async def insert(db: Sessions, jobs: Sequence[Mapping[str, Any]], now: datetime) -> list[Inserted]:
    """Insert jobs given as the API spells them (validated ``schemas.CreateJob`` dicts: a
    field left out takes its default here, in SQL)."""
    async with db.connection() as conn:
        locks = locks_for(jobs, now)
        if citus.on_citus(conn):  # a statement per Citus shard, and the NOTIFY: together
            async with transaction_on(conn, locks):
                keys, not_inserted = await insert_into(conn, jobs, now)
        elif locks is None:  # only jobs for later: one statement is its own transaction
            keys, not_inserted = await insert_into(conn, jobs, now)
        else:
            async with transaction_on(conn, locks):
                keys, not_inserted = await insert_into(conn, jobs, now)
        out = [Inserted(key, True) for key in keys]
        if not_inserted:
            # Their idempotency key was taken: answer with the job that holds it.  A new
            # statement sees jobs committed concurrently under the same key.
            taken = [jobs[o - 1] for o in not_inserted]
            found = await conn.fetch(
                *SQL["find_idempotent"].bind(
                    tenant_ids=[tenant_of(j) for j in taken],
                    idempotency_keys=[j["idempotencyKey"] for j in taken],
                )
            )
            existing = {(f["tenant_id"], f["idempotency_key"]): f["job_key"] for f in found}
            for o, j in zip(not_inserted, taken, strict=True):
                out[o - 1] = Inserted(existing[(tenant_of(j), j["idempotencyKey"])], False)
    return out


@retry_deadlock
async def insert_one(db: Sessions, job: Mapping[str, Any], now: datetime) -> StoredJob | None:
    """One job, and its record as stored: two round trips and a commit when it is ready
    at once (BEGIN with the locks, the insert, COMMIT), one when it is for later.  None
    when its idempotency key was taken (``insert`` then answers the job holding it)."""
    name = "insert_job" if job.get("idempotencyKey") is None else "insert_job_keyed"
    if citus.on_citus(db):
        return await _insert_one_on_citus(db, name, job, now)
    args = insert_args([job], now)
    if name == "insert_job_keyed":
        args["keys_before_0008"] = await _keys_before_0008(db)
    insert = SQL[name].bind(**args)
    locks = locks_for([job], now)
    if locks is None:
        row = await db.fetchrow(*insert)
    else:
        async with db.transaction(first=locks) as tx:
            row = await tx.fetchrow(*insert)
    return None if row is None else _stored(row)


def _stored(row: Mapping[str, Any]) -> StoredJob:
    config = TypeConfig(None, row["type_aging_interval_ms"], row["type_aging_step"])
    return StoredJob(job_row(row), config)


async def _insert_one_on_citus(
    db: Sessions, name: str, job: Mapping[str, Any], now: datetime
) -> StoredJob | None:
    """insert_one on Citus: the floor read first, the insert on the tenant's node and the
    NOTIFY from the coordinator (if it was inserted) in one transaction."""
    ready = ready_at_once(job, now)
    reentry = await lanes.reentry_floors(db, [job["type"]] if ready else [])
    [(shards, _)] = citus.split(db, [tenant_of(job)], str)
    async with db.transaction(first=locks_for([job], now)) as tx:
        row = await tx.fetchrow(*SQL.on(shards, name, **insert_args([job], now), **reentry))
        if ready and row is not None:
            await notify_ready(tx, job["type"], 1)
    return None if row is None else _stored(row)


async def notify_ready(db: Queries, job_type: str, n: int) -> None:
    """Announce by hand that ``n`` jobs of ``job_type`` became activatable (notify_ready)."""
    await db.execute(*SQL["notify_ready"].bind(payload=f"{job_type} {n}"))


async def idempotent(db: Queries, jobs: Sequence[Mapping[str, Any]]) -> list[int]:
    """The keys of jobs already created under the idempotency keys ``jobs`` carry."""
    named = [j for j in jobs if j.get("idempotencyKey") is not None]
    if not named:
        return []
    found = await db.fetch(
        *SQL["find_idempotent"].bind(
            tenant_ids=[tenant_of(j) for j in named],
            idempotency_keys=[j["idempotencyKey"] for j in named],
        )
    )
    return [f["job_key"] for f in found]


async def get(db: Queries, job_key: int) -> StoredJob | None:
    row = await db.fetchrow(*SQL["get_job"].bind(job_key=job_key))
    if row is None:
        return None
    config = TypeConfig(None, row["type_aging_interval_ms"], row["type_aging_step"])
    return StoredJob(job_row(row), config)


async def fences(db: Queries, job_keys: Sequence[int]) -> dict[int, JobFence]:
    """The state and activation count of each of ``job_keys`` that exists."""
    rows = await db.fetch(*SQL["job_states"].bind(job_keys=list(job_keys)))
    return {
        r["job_key"]: JobFence(r["job_key"], JobState(r["state"]), r["activation_count"])
        for r in rows
    }


async def scopes(db: Queries, job_keys: Sequence[int]) -> dict[int, tuple[str, str]]:
    """The (tenant, type) of each of ``job_keys`` that exists."""
    rows = await db.fetch(*SQL["job_scopes"].bind(job_keys=list(job_keys)))
    return {r["job_key"]: (r["tenant_id"], r["job_type"]) for r in rows}


async def lock(tx: Queries, job_key: int) -> JobRow | None:
    """The job, its row locked until the transaction ends (a PATCH reads, then writes)."""
    row = await tx.fetchrow(*SQL["lock_job"].bind(job_key=job_key))
    return None if row is None else job_row(row)


async def update(
    tx: Queries,
    job: JobRow,
    *,
    retries: int,
    deadline: datetime | None,
    priority: int,
    state: JobState,
    now: datetime,
) -> None:
    """Write a PATCH's new values over ``job`` (locked by ``lock`` in this transaction),
    waking its lane when the job becomes ready again (a revived incident)."""
    revived = state is JobState.CREATED and job.state is not JobState.CREATED
    if revived:
        await lanes.lock_to_wake(tx, [(job.job_type, job.tenant_id)])
    await tx.execute(
        *SQL["update_job"].bind(
            job_key=job.job_key,
            retries=retries,
            deadline=deadline,
            priority=priority,
            state=state,
            now=now,
            revived=revived,
        )
    )
    if revived:
        await lanes.wake(tx, [job._asdict()])
        await lanes.release_key_holds_of(tx, [job._asdict()])
