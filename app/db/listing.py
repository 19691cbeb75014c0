"""The operators' reads of jobs by filter: the job browser's listing (keyset pages on the
key) and Camunda's search (offset pages, a bounded count).  Each statement is assembled
per call from the filter (so neither is in docs/sql, nor in an app/db/sql file); what each
reads and why is below.

They stay in Python because their text depends on the request, not only their arguments:
the listing has one UNION ALL branch per stored state asked for, each with its state as a
literal (a parameter would match no partial index), and only the filters given (written
as ``:x IS NULL OR ...``, a generic plan could use no index for them; a statement per
combination would be thousands); the search filters and sorts by the columns named in the
request.  Every value is still a parameter ($n), and every name a whitelisted literal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.db.base import Queries
from app.db.rows import (
    JOB_COLUMNS,
    JobRow,
    TypeConfig,
    job_row,
)
from app.domain import JobFilter, JobState

# Job search, assembled per call by search_jobs below (so not in docs/sql):
# Job search (Camunda's POST /v2/jobs/search): equality/IN filters on whitelisted
# columns, one sort key, offset paging.  An operator query: it may scan; the count is
# bounded (SEARCH_COUNT_LIMIT) so a huge table costs a bounded count.
SEARCH_COLUMNS = {
    "jobKey": "job_key",
    "type": "job_type",
    "tenantId": "tenant_id",
    "state": "state",
    "worker": "worker",
    "retries": "retries",
    "priority": "priority",
    "deadline": "deadline",
    "creationTime": "created_at",
    "endTime": "completed_at",
}
SEARCH_COUNT_LIMIT = 10_000


# Job listing (GET /v2/jobs), assembled per call by list_jobs below (so not in docs/sql):
#   SELECT u.*, t.aging_interval_ms, t.aging_step FROM (
#       SELECT * FROM (
#           (SELECT <job columns> FROM jobs
#            WHERE state = '<S>' [AND tenant_id = $] [AND job_type = $]
#              [AND tenant_id = ANY($) AND job_type = ANY($)]  -- the key's scope
#              [AND created_at >= $] [AND created_at < $] [AND job_key < $cursor]
#            ORDER BY job_key DESC LIMIT $n)
#           UNION ALL ... one branch per stored state asked for ...
#       ) b ORDER BY job_key DESC LIMIT $n) u
#   LEFT JOIN job_types t ON t.job_type = u.job_type ORDER BY u.job_key DESC
# Keyset paging on job_key, newest first: a page is the n keys below the cursor, however
# many jobs were added above it since.  The state is a literal in each branch, so that
# each branch's plan may use the partial index of its state (a parameter would match
# none), and the branches' key order merges without a sort (Merge Append):
#   COMPLETED, FAILED, ERROR_THROWN, CANCELED: jobs_done_tenant_idx for a tenant, one
#     range in key order; FAILED without a tenant: jobs_failed_idx; the others without
#     a tenant: jobs pkey from the newest down, filtered (a type is dense: a page of it
#     is found soon; a rare type reads the newer jobs of the others).
#   CREATED: jobs_ready_idx for a type (and tenant), sorted by key (reads the lane's
#     backlog), or jobs pkey from the newest down; delayed jobs (SCHEDULED):
#     jobs_scheduled_idx or jobs pkey.  ACTIVATED: jobs_active_tenant_idx,
#     jobs_active_type_idx, sorted (reads the jobs active).
#   createdAfter/createdBefore filter within a branch (no index: keys follow creation
#     only roughly, the key sequence being cached per connection).
# An operator query: no locks.
LISTED_STATES: dict[JobState, tuple[JobState, ...]] = {
    JobState.CREATED: (JobState.CREATED, JobState.SCHEDULED),
    JobState.ACTIVATED: (JobState.ACTIVATED,),
    JobState.COMPLETED: (JobState.COMPLETED,),
    JobState.FAILED: (JobState.FAILED,),
    JobState.ERROR_THROWN: (JobState.ERROR_THROWN,),
    JobState.CANCELED: (JobState.CANCELED,),
}


def list_statement(f: JobFilter, before_key: int | None, limit: int) -> tuple[str, list[Any]]:
    """The listing's statement for ``f`` (see above) and its arguments."""
    where: list[str] = []
    args: list[Any] = []

    def arg(value: Any, cast: str) -> str:
        args.append(value)
        return f"${len(args)}::{cast}"

    if f.tenant_id is not None:
        where.append(f"tenant_id = {arg(f.tenant_id, 'text')}")
    elif f.tenant_scope is not None:
        where.append(f"tenant_id = ANY({arg(sorted(f.tenant_scope), 'text[]')})")
    if f.job_type is not None:
        where.append(f"job_type = {arg(f.job_type, 'text')}")
    elif f.type_scope is not None:
        where.append(f"job_type = ANY({arg(sorted(f.type_scope), 'text[]')})")
    if f.created_after is not None:
        where.append(f"created_at >= {arg(f.created_after, 'timestamptz')}")
    if f.created_before is not None:
        where.append(f"created_at < {arg(f.created_before, 'timestamptz')}")
    if before_key is not None:
        where.append(f"job_key < {arg(before_key, 'bigint')}")
    n = arg(limit, "int")
    public = f.states if f.states is not None else frozenset(LISTED_STATES)
    stored = sorted({s for p in public for s in LISTED_STATES[p]})
    branches = [
        f"(SELECT {JOB_COLUMNS} FROM jobs WHERE "
        + " AND ".join([f"state = '{state.value}'", *where])
        + f" ORDER BY job_key DESC LIMIT {n})"
        for state in stored
    ]
    sql = (
        "SELECT u.*, t.aging_interval_ms AS type_aging_interval_ms,"
        " t.aging_step AS type_aging_step FROM ("
        f"SELECT * FROM ({' UNION ALL '.join(branches)}) b ORDER BY job_key DESC LIMIT {n}"
        ") u LEFT JOIN job_types t ON t.job_type = u.job_type ORDER BY u.job_key DESC"
    )
    return sql, args


async def list_jobs(
    db: Queries, f: JobFilter, before_key: int | None, limit: int
) -> list[tuple[JobRow, TypeConfig]]:
    """Up to ``limit`` jobs matching ``f`` with keys below ``before_key`` (None: from the
    newest), newest first, each with its type's configuration (for its record)."""
    sql, args = list_statement(f, before_key, limit)
    rows = await db.fetch(sql, *args)
    return [
        (job_row(r), TypeConfig(None, r["type_aging_interval_ms"], r["type_aging_step"]))
        for r in rows
    ]


async def search_jobs(
    db: Queries,
    filters: dict[str, list[Any]],
    sort: Sequence[tuple[str, bool]],
    limit: int,
    offset: int,
) -> tuple[list[JobRow], int, bool]:
    """``filters``: API field -> accepted values; ``sort``: (API field, descending).
    Returns (jobs, total counted up to SEARCH_COUNT_LIMIT, more than that)."""
    where, args = [], []
    for field, values in filters.items():
        args.append(values)
        cast = "bigint[]" if field == "jobKey" else ("int[]" if field == "retries" else "text[]")
        where.append(f"{SEARCH_COLUMNS[field]} = ANY(${len(args)}::{cast})")
    clause = ("WHERE " + " AND ".join(where)) if where else ""
    order = ", ".join(
        f"{SEARCH_COLUMNS[f]} {'DESC' if desc else 'ASC'} NULLS LAST" for f, desc in sort
    )
    order = f"ORDER BY {order + ', ' if order else ''}job_key"
    rows = await db.fetch(
        f"SELECT {JOB_COLUMNS} FROM jobs {clause} {order} "
        f"LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
        *args,
        limit,
        offset,
    )
    total = await db.fetchval(
        f"SELECT count(*) FROM (SELECT 1 FROM jobs {clause} "
        f"LIMIT {SEARCH_COUNT_LIMIT + 1}) bounded",
        *args,
    )
    return [job_row(r) for r in rows], min(total, SEARCH_COUNT_LIMIT), total > SEARCH_COUNT_LIMIT
