"""What a statement that ends activations does after its rows on Citus, where it cannot do
it in the statement: release the held lanes of capped tenants that have room again
(``jobfair_release_holds``' steps, one statement each), tell capped types' waiters that
capacity was freed, and give streams their credit back -- the NOTIFYs sent from the
coordinator, where every server listens (a NOTIFY in a statement Citus runs on a worker
node is heard only there).  On one PostgreSQL the finishing statements do all of it
themselves (app/db/sql/finishing.sql: credited, freed, unheld) and nothing here runs.

The protocol is jobfair_release_holds' (app.db.lanes, ADR 016): the release gate shared;
the tenants to release chosen after it (capped and not paused, or holding lanes while
capped no longer); their cap locks, in key order; then the release, each lane
re-entering at its type's floor if it fell behind it; all in the transaction that freed
the capacity, held until it commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.db import citus, lanes
from app.db.base import Queries
from app.db.bounds import CREDIT_KEYS_PER_NOTIFY, DONE_CHANNEL, NOTIFY_CHANNEL
from app.shards import shard_of

SQL = lanes.SQL.citus


async def release(tx: Queries, tenant_ids: Sequence[str]) -> int:
    """jobfair_release_holds on Citus, in ``tx``: the held lanes of ``tenant_ids`` that
    may go, let go; how many."""
    tenants = sorted(set(tenant_ids))
    if not tenants:
        return 0
    await tx.execute(*SQL["release_gate_shared"].bind())
    caps = {
        r["tenant_id"]: (r["capped"], r["paused"])
        for r in await tx.fetch(*SQL["caps_of"].bind(tenant_ids=tenants))
    }
    held = await _held(tx, tenants)
    chosen = sorted(
        t
        for t in tenants
        if not caps.get(t, (False, False))[1] and (caps.get(t, (False, False))[0] or t in held)
    )
    if not chosen:
        return 0
    await tx.execute(*SQL["lock_caps_of"].bind(tenant_ids=chosen))
    held = await _held(tx, chosen)  # read again under the locks
    if not held:
        return 0
    reentry = await lanes.reentry_floors(tx, sorted({t for types in held.values() for t in types}))
    released: list[str] = []
    for shards, part in citus.split(tx, sorted(held), str):
        rows = await tx.fetch(*SQL["unhold_lanes"].bind(tenant_ids=part, shards=shards, **reentry))
        released += [r["job_type"] for r in rows]
    for job_type in sorted(set(released)):
        await notify(tx, NOTIFY_CHANNEL, job_type)
    return len(released)


async def _held(tx: Queries, tenants: Sequence[str]) -> dict[str, set[str]]:
    """The held lanes' types of each of ``tenants`` that has any."""
    rows = await tx.fetch(
        *SQL["held_of"].bind(
            tenant_ids=list(tenants), shards=sorted({shard_of(t) for t in tenants})
        )
    )
    found: dict[str, set[str]] = {}
    for r in rows:
        found.setdefault(r["tenant_id"], set()).add(r["job_type"])
    return found


async def after_finish(tx: Queries, rows: Sequence[Any]) -> None:
    """What the finishing statement's ``rows`` (job_key, job_type, tenant_id, via_stream)
    owe on Citus, in its transaction ``tx``: streams credited, capped types told,
    held lanes released."""
    if not rows:
        return
    streamed = [str(r["job_key"]) for r in rows if r.get("via_stream")]
    for i in range(0, len(streamed), CREDIT_KEYS_PER_NOTIFY):
        await notify(tx, DONE_CHANNEL, ",".join(streamed[i : i + CREDIT_KEYS_PER_NOTIFY]))
    capped = await tx.fetch(
        *SQL["capped_types"].bind(
            job_types=[r["job_type"] for r in rows], tenant_ids=[r["tenant_id"] for r in rows]
        )
    )
    for r in capped:
        await notify(tx, NOTIFY_CHANNEL, r["job_type"])
    await release(tx, [r["tenant_id"] for r in rows])


async def notify(tx: Queries, channel: str, payload: str) -> None:
    await tx.execute(*SQL["notify"].bind(channel=channel, payload=payload))
