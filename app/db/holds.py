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

from app.db import citus, history, lanes
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
    return await _release_chosen(tx, tenants, caps, await _held(tx, tenants))


async def _release_chosen(
    tx: Queries,
    tenants: Sequence[str],
    caps: dict[str, tuple[bool, bool]],
    held: dict[str, set[str]],
) -> int:
    """The release once the gate is held and the tenants' caps (capped, paused) and held
    lanes are read: those capped and not paused, or holding lanes while capped no
    longer, under their cap locks."""
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
    await notify_all(tx, [(NOTIFY_CHANNEL, t) for t in sorted(set(released))])
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
    """What the finishing statement's ``rows`` (job_key, job_type, tenant_id, via_stream,
    and history.sql's ``ended``) owe on Citus, in its transaction ``tx``: their history
    rows (history.log_ended), streams credited, capped types told, held lanes released.
    The gate, then one read of the caps (finished_caps); the held lanes are read only
    where a tenant is capped: a lane held while its tenant is capped no longer is
    released by the change that removed the cap (it releases again behind the gate taken
    exclusively, after every finish in flight: app.db.operating)."""
    if not rows:
        return
    await history.log_ended(tx, rows)
    tenants = sorted({r["tenant_id"] for r in rows})
    await tx.execute(*SQL["release_gate_shared"].bind())
    read = await tx.fetch(
        *SQL["finished_caps"].bind(
            tenant_ids=tenants,
            job_types=[r["job_type"] for r in rows],
            ended_tenants=[r["tenant_id"] for r in rows],
        )
    )
    caps = {r["name"]: (r["capped"], r["paused"]) for r in read if r["kind"] == "tenant"}
    streamed = [str(r["job_key"]) for r in rows if r.get("via_stream")]
    told = [
        (DONE_CHANNEL, ",".join(streamed[i : i + CREDIT_KEYS_PER_NOTIFY]))
        for i in range(0, len(streamed), CREDIT_KEYS_PER_NOTIFY)
    ]
    told += [(NOTIFY_CHANNEL, r["name"]) for r in read if r["kind"] == "type"]
    await notify_all(tx, told)
    if any(capped and not paused for capped, paused in caps.values()):
        await _release_chosen(tx, tenants, caps, await _held(tx, tenants))


async def notify(tx: Queries, channel: str, payload: str) -> None:
    await tx.execute(*SQL["notify"].bind(channel=channel, payload=payload))


async def notify_all(tx: Queries, told: Sequence[tuple[str, str]]) -> None:
    """NOTIFYs (channel, payload) from the coordinator, in one round trip (none: none)."""
    if told:
        await tx.fetchval(
            *SQL["notify_all"].bind(channels=[c for c, _ in told], payloads=[p for _, p in told])
        )
