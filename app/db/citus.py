"""Jobfair on Citus: which tables are distributed and how, made so by ``jobfair migrate``
on a Citus coordinator, checked by ``jobfair serve`` at start (docs/scaling.md).

A tenant's rows lie together: ``jobs``, ``lanes``, ``lane_keys``, ``key_weights`` and
``job_events`` are distributed by ``shard`` (the tenant's, alembic 0008) and colocated;
the small tables every statement joins are reference tables, a copy on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from app.db import sql
from app.db.base import Queries
from app.db.connect import connect
from app.shards import SHARDS, shard_of

T = TypeVar("T")

SQL = sql.load("citus")  # app/db/sql/citus.sql

# Distributed by shard, colocated with the first.
DISTRIBUTED = ("jobs", "lanes", "job_events", "lane_keys", "key_weights")
# A copy on every node: small, and joined by the statements of the distributed ones.
REFERENCE = (
    "tenants",
    "job_types",
    "workers",
    "api_keys",
    "signing_keys",
    "metric_tenant_sets",
    "schema_compat",
    "alembic_version",
)


@dataclass(frozen=True, slots=True)
class Placement:
    table: str
    method: str | None  # 'h' hash-distributed, 'n' reference, None: local
    column: str | None
    colocation: int | None


async def version(db: Queries) -> str | None:
    """The Citus extension's version in this database (None: not Citus)."""
    version: str | None = await db.fetchval(*SQL["citus_version"].bind())
    return version


async def placements(db: Queries) -> dict[str, Placement]:
    rows = await db.fetch(*SQL["placements"].bind(tables=[*DISTRIBUTED, *REFERENCE]))
    return {
        r["table_name"]: Placement(r["table_name"], r["method"], r["column_name"], r["colocation"])
        for r in rows
    }


def problems(found: dict[str, Placement]) -> list[str]:
    """What is not as Jobfair needs it on Citus, one line each (none: all is)."""
    out = []
    group = found["jobs"].colocation if found["jobs"].method == "h" else None
    for table in DISTRIBUTED:
        p = found[table]
        if p.method != "h" or p.column != "shard":
            out.append(f"{table} is not distributed by shard")
        elif p.colocation != group:
            out.append(f"{table} is not colocated with jobs")
    out += [f"{t} is not a reference table" for t in REFERENCE if found[t].method != "n"]
    return out


# Citus shards per worker node when ``jobfair migrate`` distributes the tables and no
# count is given: a fan-out read costs every Citus shard a task, and on two workers a
# drain cost PostgreSQL 6,470 µs per job in 32 Citus shards (Citus's default), 3,260 in
# 8 and 2,320 in 4 (ADR 035).  Moving shards to new nodes keeps their ids; splitting
# them (more nodes than shards) needs a rolling restart (docs/scaling.md).
SHARDS_PER_WORKER = 2


async def distribute(db: Queries, shard_count: int | None = None) -> list[str]:
    """Make the tables what ``problems`` asks, those not already so (idempotent: a second
    run does nothing), in ``shard_count`` Citus shards (None: SHARDS_PER_WORKER per
    worker node); what it did, one line each.  On the coordinator, after the
    migrations."""
    if shard_count is None:
        workers = await db.fetchval(*SQL["worker_nodes"].bind())
        shard_count = SHARDS_PER_WORKER * max(1, workers)
    found = await placements(db)
    done = []
    for table in REFERENCE:
        if found[table].method is None:
            await db.fetchval(*SQL["make_reference"].bind(table=table))
            done.append(f"{table}: reference table")
    for i, table in enumerate(DISTRIBUTED):
        if found[table].method is None:
            colocate = None if i == 0 else DISTRIBUTED[0]
            count = shard_count if i == 0 else None
            await db.fetchval(
                *SQL["distribute"].bind(table=table, colocate_with=colocate, shard_count=count)
            )
            done.append(
                f"{table}: distributed by shard" + (f" in {count} Citus shards" if count else "")
            )
    left = problems(await placements(db))
    if left:
        raise RuntimeError("Citus: " + "; ".join(left))
    return done


async def distribute_at(url: str, shard_count: int | None = None) -> list[str]:
    """One connection to ``url``: on a Citus coordinator, ``distribute``; elsewhere
    nothing.  What it did."""
    conn = await connect(url)
    try:
        if await version(conn) is None:
            return []
        return await distribute(conn, shard_count)
    finally:
        await conn.close()


async def placements_at(url: str) -> dict[str, Placement]:
    """One connection to ``url`` (a Citus database): how each table is held."""
    conn = await connect(url)
    try:
        return await placements(conn)
    finally:
        await conn.close()


async def problems_at(url: str) -> list[str]:
    """One connection to ``url``: what is not as Jobfair needs it on Citus (none where the
    database has no Citus)."""
    conn = await connect(url)
    try:
        if await version(conn) is None:
            return []
        return problems(await placements(conn))
    finally:
        await conn.close()


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Which Citus shard holds each of Jobfair's shard values (``shard_ids[shard]``), read
    from the coordinator at start.  A statement that locks or writes rows runs on Citus
    only when every row it touches is in one Citus shard (the router planner): the store
    sends one statement per group of tenants that ``groups`` makes, each naming its
    shards (app/db/sql/shards.sql).  Citus hashes a value to the same shard for as long
    as its shards are not split; moving a shard to another node changes nothing here."""

    shard_ids: tuple[int, ...]

    def group_of(self, tenant_id: str) -> int:
        return self.shard_ids[shard_of(tenant_id)]

    def groups(
        self, items: Iterable[T], shard_of_item: Callable[[T], int]
    ) -> list[tuple[list[int], list[T]]]:
        """``items`` in groups of one Citus shard each, with their shard values
        (``shard_of_item(item)``), in the order each group is first met, the items in
        their order."""
        found: dict[int, tuple[set[int], list[T]]] = {}
        for item in items:
            shard = shard_of_item(item)
            shards, group = found.setdefault(self.shard_ids[shard], (set(), []))
            shards.add(shard)
            group.append(item)
        return [(sorted(shards), group) for shards, group in found.values()]


def split(
    db: object, items: Iterable[T], tenant: Callable[[T], str]
) -> list[tuple[list[int] | None, list[T]]]:
    """``items`` in the groups a statement is sent for, each with the shards to name
    (app.db.sql.Statements.on): on one PostgreSQL one group of all, shards None; on Citus
    (``db``, the Database or one of its connections, carries a ShardMap) one per Citus
    shard.  A group is never empty; no items, no group."""
    return split_by_shard(db, items, lambda item: shard_of(tenant(item)))


def split_by_shard(
    db: object, items: Iterable[T], shard: Callable[[T], int]
) -> list[tuple[list[int] | None, list[T]]]:
    """As split, for items that name their shard value (``shard(item)``: a job key's
    low bits, app.shards.shard_of_key)."""
    items = list(items)
    found: ShardMap | None = getattr(db, "shard_map", None)
    if found is None:
        return [(None, items)] if items else []
    return [(shards, group) for shards, group in found.groups(items, shard)]


def on_citus(db: object) -> bool:
    """Whether ``db`` (the Database or one of its connections) is a Citus coordinator's."""
    return getattr(db, "shard_map", None) is not None


async def shard_map(db: Queries) -> ShardMap | None:
    """The database's ShardMap if it is a Citus coordinator with Jobfair's tables
    distributed (None: one PostgreSQL, or tables not distributed yet)."""
    if await version(db) is None or problems(await placements(db)):
        return None
    rows = await db.fetch(*SQL["shard_ids"].bind(shards=SHARDS))
    ids = [0] * SHARDS
    for r in rows:
        ids[r["shard"]] = r["shard_id"]
    return ShardMap(tuple(ids))
