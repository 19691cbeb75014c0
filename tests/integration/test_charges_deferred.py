"""Lane charges while the job table is degraded (ADR 036), on real PostgreSQL: written
at most every CHARGE_EVERY_S, and counted by the reads in between exactly as a write
would have left the lanes; the key reads add them too."""

from __future__ import annotations

import asyncio
from collections import Counter

from app.activation.charging import LaneCharges
from app.db import job_rows
from app.db.store import KeysAsk, Store
from app.domain import utcnow
from app.scheduler import Charges, advance

TYPE = "deferred"


def _charges(tenant: str, n: int, stride: float) -> Charges:
    return Charges(Counter({tenant: n}), {tenant: stride}, Counter({(tenant, ""): n}),
                   {(tenant, ""): stride})  # fmt: skip


async def _vtimes(store) -> dict[str, float]:
    rows = await store.fetch("SELECT tenant_id, vtime FROM lanes WHERE job_type = $1", TYPE)
    return {r["tenant_id"]: r["vtime"] for r in rows}


async def _key_vtime(store, tenant: str) -> float:
    return await store.fetchval(
        "SELECT vtime FROM lane_keys WHERE job_type = $1 AND tenant_id = $2", TYPE, tenant
    )


async def _charger(store) -> tuple[LaneCharges, list[asyncio.Future]]:
    jobs = [{"type": TYPE, "tenantId": t} for t in ("a", "b") for _ in range(5)]
    await job_rows.insert(store, jobs, utcnow())
    spawned: list[asyncio.Future] = []
    charges = LaneCharges(Store(store), lambda aw, _name: spawned.append(asyncio.ensure_future(aw)))
    return charges, spawned


async def test_degraded_a_read_counts_the_charges_it_does_not_write(store):
    charges, spawned = await _charger(store)
    hints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    charges.add(TYPE, _charges("a", 3, 0.5))
    await charges.written(TYPE)  # nothing was written before: at once
    written = await _vtimes(store)
    assert written["a"] == advance(0.0, 0.5, 3) and written["b"] == 0.0
    charges.add(TYPE, _charges("a", 2, 0.5))
    read = await charges.read(TYPE, 5, [], None)
    seen = {lane.tenant_id: lane.vtime for lane in read.ready}
    assert seen == {"a": advance(written["a"], 0.5, 2), "b": 0.0}
    assert await _vtimes(store) == written  # counted, not written
    owed = charges.owed_keys(TYPE)
    assert owed == {("a", ""): (2, 0.5)}
    keys = await Store(store).read_keys(KeysAsk(TYPE, {"a": 1}, [], owed))
    [(key, key_vtime, _weight)] = keys.ready["a"]
    assert key == "" and key_vtime == advance(await _key_vtime(store, "a"), 0.5, 2)
    await charges.written(TYPE)  # a caller that needs them written has them at once
    assert (await _vtimes(store))["a"] == seen["a"]
    assert await _key_vtime(store, "a") == key_vtime
    await asyncio.gather(*spawned)


async def test_degraded_the_writer_writes_once_the_interval_is_over(store, monkeypatch):
    monkeypatch.setattr("app.activation.charging.CHARGE_EVERY_S", 0.05)
    charges, spawned = await _charger(store)
    hints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    charges.add(TYPE, _charges("b", 1, 1.0))
    await charges.written(TYPE)
    charges.add(TYPE, _charges("b", 1, 1.0))
    assert (await _vtimes(store))["b"] == 1.0  # the second waits for the interval
    await asyncio.gather(*spawned)  # the writer, after it
    assert (await _vtimes(store))["b"] == 2.0


async def test_not_degraded_a_read_writes_the_charges_it_carries(store):
    charges, spawned = await _charger(store)
    charges.add(TYPE, _charges("a", 1, 1.0))
    await charges.written(TYPE)
    charges.add(TYPE, _charges("a", 1, 1.0))
    read = await charges.read(TYPE, 5, [], None)
    assert {lane.tenant_id: lane.vtime for lane in read.ready}["a"] == 2.0
    assert (await _vtimes(store))["a"] == 2.0
    assert charges.owed_keys(TYPE) is None
    await asyncio.gather(*spawned)


async def _active(store, tenant: str) -> bool:
    return await store.fetchval(
        "SELECT active FROM lanes WHERE job_type = $1 AND tenant_id = $2", TYPE, tenant
    )


async def test_degraded_lanes_found_empty_are_parked_together_later(store, monkeypatch):
    """Degraded, a lane found empty is parked with the type's others once PARK_EVERY_S is
    over (or at once when settled), not at once: each park crosses every dead entry of the
    lane under its bucket's exclusive lock."""
    monkeypatch.setattr("app.activation.charging.PARK_EVERY_S", 0.2)
    charges, spawned = await _charger(store)
    await store.execute("DELETE FROM jobs WHERE job_type = $1", TYPE)  # both lanes empty
    hints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    charges.park(TYPE, ["a"], [])
    charges.park(TYPE, ["b"], [("b", "")])
    assert len(spawned) == 1  # one park for both, later
    assert await _active(store, "a") and await _active(store, "b")
    await asyncio.gather(*spawned)
    assert not await _active(store, "a") and not await _active(store, "b")


async def test_degraded_a_flush_parks_at_once(store):
    charges, spawned = await _charger(store)
    await store.execute("DELETE FROM jobs WHERE job_type = $1", TYPE)
    hints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    charges.park(TYPE, ["a"], [])
    charges.flush()
    await asyncio.wait_for(asyncio.gather(*spawned), 0.5)  # PARK_EVERY_S is 1 s
    assert not await _active(store, "a")


async def test_not_degraded_a_lane_found_empty_is_parked_at_once(store):
    charges, spawned = await _charger(store)
    await store.execute("DELETE FROM jobs WHERE job_type = $1 AND tenant_id = 'a'", TYPE)
    charges.park(TYPE, ["a", "b"], [])
    await asyncio.gather(*spawned)
    assert not await _active(store, "a") and await _active(store, "b")  # b has jobs
