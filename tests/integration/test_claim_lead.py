"""The one-pick claim (store.claim_lead) on real PostgreSQL: it takes exactly the job the
full rounds would take first -- read_lanes, scheduler.allocate's first pick, CLAIM of one
job from that lane -- and claims nothing where it cannot know that (caps, held heads)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from app import scheduler
from app.db import claims, job_rows, lanes, operating
from app.db.bounds import PROBED_LANES
from app.db.claims import SQL as CLAIMS
from app.db.claims import LeadAsk, Share
from app.domain import utcnow
from app.scheduler import Lane, allocate
from tests.integration.test_claim import _assert_linear, _jobs_scans, _nodes, _plan

TYPE = "lead"
DEFAULT_STEP, DEFAULT_INTERVAL_MS = 10, 60_000


async def _insert(store, tenant: str, priority: int, n: int) -> list[int]:
    jobs = [{"type": TYPE, "tenantId": tenant, "priority": priority} for _ in range(n)]
    return [i.job_key for i in await job_rows.insert(store, jobs, utcnow())]


async def _full_rounds_first(store, tenant_ids=None) -> int | None:
    """The job the full rounds would activate first, found in a transaction that is
    rolled back: the lanes read, one stride pick, CLAIM of one job from that lane."""
    read = await lanes.read(store, TYPE, 9, [], tenant_ids)
    cfg, ready = read.config, read.ready
    picks = allocate([Lane(r.tenant_id, r.vtime, r.weight) for r in ready], 1).picks
    if not picks:
        return None
    now = utcnow()
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            [row] = await conn.fetch(
                *CLAIMS["claim"].bind(
                    job_type=TYPE,
                    tenants=[picks[0]],
                    keys=[""],
                    counts=[1],
                    now=now,
                    workers=["w"],
                    deadlines=[now + timedelta(minutes=1)],
                    aging_step=cfg.aging_step if cfg.aging_step is not None else DEFAULT_STEP,
                    aging_interval_ms=cfg.aging_interval_ms or DEFAULT_INTERVAL_MS,
                    via_stream=False,
                    starts=[1],
                    hint_priorities=[None],
                    since=[None],
                )
            )
        finally:
            await tx.rollback()
    return int(row["job_key"])


async def _lead(store, tenant_ids=None):
    """The claimed row (or None), and whether the answer says the type is dry."""
    ask = LeadAsk(tenant_ids, Share("w", 60_000, 1), False, DEFAULT_STEP, DEFAULT_INTERVAL_MS)
    return await claims.claim_lead(store, TYPE, ask, utcnow())


async def _claim_lead(store, tenant_ids=None):
    got = await _lead(store, tenant_ids)
    assert not (got.job is not None and got.dry)
    return got


async def _declined(store, tenant_ids=None) -> bool:
    """Claimed nothing, and said the type is not dry (the full rounds must decide)."""
    got = await _lead(store, tenant_ids)
    return got.job is None and not got.dry


async def _dry(store, tenant_ids=None) -> bool:
    got = await _lead(store, tenant_ids)
    return got.job is None and got.dry


async def test_each_lead_claim_takes_the_full_rounds_first_job(store):
    """Weights 1, 2 and 5, lanes at different virtual times, one lane active but empty,
    priorities, and an old low-priority job that aging lifts above the new high ones.
    Claimed and charged one by one until the type is dry, the lead claim takes the very
    job the full rounds would have taken, every time."""
    for tenant, weight in (("a", 1), ("b", 2), ("c", 5), ("e", 1)):
        await operating.upsert_tenant(store, tenant, weight, None)
    await _insert(store, "a", 0, 4)
    await _insert(store, "b", 90, 3)
    [old] = await _insert(store, "b", 0, 1)
    await _insert(store, "c", 50, 6)
    [gone] = await _insert(store, "e", 0, 1)
    await store.execute(
        "UPDATE jobs SET queued_at = queued_at - interval '10 minutes' WHERE job_key = $1", old
    )
    # e's only job is finished: its lane stays active, and first in virtual time.
    await store.execute(
        "UPDATE jobs SET state = 'COMPLETED', completed_at = now() WHERE job_key = $1", gone
    )
    await store.execute(
        "UPDATE lanes SET vtime = CASE tenant_id WHEN 'e' THEN 0 WHEN 'a' THEN 1.5"
        " WHEN 'b' THEN 1.0 ELSE 2.0 END WHERE job_type = $1",
        TYPE,
    )
    taken = []
    while (expected := await _full_rounds_first(store)) is not None:
        got = await _claim_lead(store)
        row = got.job
        assert row is not None
        assert row.job_key == expected
        assert row.state == "ACTIVATED" and row.worker == "w"
        tenant = row.tenant_id
        assert got.lane_weight == {"a": 1, "b": 2, "c": 5}[tenant]
        await lanes.charge(
            store,
            TYPE,
            scheduler.Charges(Counter({tenant: 1}), {tenant: 1 / got.lane_weight}, Counter(), {}),
        )
        taken.append(row.job_key)
    assert len(taken) == 14
    assert old in taken[:2]  # aged to 100: b's first job, ahead of its priority-90 jobs
    assert await _dry(store)  # e's lane is active and empty: dry all the same


async def test_a_tenant_filter_leads_with_its_own_lanes(store):
    await _insert(store, "a", 0, 2)
    [b_job] = await _insert(store, "b", 0, 1)
    await store.execute("UPDATE lanes SET vtime = 5 WHERE tenant_id = 'b'")
    row = (await _claim_lead(store, ["b", "z"])).job
    assert row.job_key == b_job
    assert await _dry(store, ["b"])
    assert not await _dry(store)  # a's jobs are there


async def test_caps_leave_the_claim_to_the_full_rounds(store):
    [a_job] = await _insert(store, "a", 0, 1)
    [b_job] = await _insert(store, "b", 0, 1)
    await store.execute("UPDATE lanes SET vtime = 5 WHERE tenant_id = 'b'")
    # A cap on the type, whatever the lanes: nothing claimed.
    await operating.upsert_job_type(store, TYPE, 10, None, None)
    assert await _declined(store)
    await operating.upsert_job_type(store, TYPE, None, None, None)
    # A cap on the lead lane's tenant: nothing claimed.
    await operating.upsert_tenant(store, "a", 1, 10)
    assert await _declined(store)
    # A cap on a later lane's tenant does not touch the first pick.
    await operating.upsert_tenant(store, "a", 1, None)
    await operating.upsert_tenant(store, "b", 1, 10)
    assert (await _claim_lead(store)).job.job_key == a_job
    states = await job_rows.fences(store, [a_job, b_job])
    assert [states[k].state for k in (a_job, b_job)] == ["ACTIVATED", "CREATED"]


async def test_a_lead_lane_held_by_another_activator_claims_nothing(store):
    """Every ready job of the lead lane is locked by a claim not yet committed: the lead
    claim passes no job of another lane over it, it answers None (the full rounds then
    exclude the lane and go on)."""
    await _insert(store, "a", 0, 2)
    await _insert(store, "b", 0, 1)
    await store.execute("UPDATE lanes SET vtime = 5 WHERE tenant_id = 'b'")
    now = utcnow()
    async with store.connection() as other:
        tx = other.transaction()
        await tx.start()
        held = await other.fetch(
            *CLAIMS["claim"].bind(
                job_type=TYPE,
                tenants=["a"],
                keys=[""],
                counts=[2],
                now=now,
                workers=["x"],
                deadlines=[now],
                aging_step=10,
                aging_interval_ms=60_000,
                via_stream=False,
                starts=[1],
                hint_priorities=[None],
                since=[None],
            )
        )
        assert len(held) == 2
        assert await _declined(store)
        await tx.rollback()
    assert (await _claim_lead(store)).job.tenant_id == "a"


async def test_dry_only_when_every_active_lane_was_probed_empty(store):
    """Sixteen lanes (PROBED_LANES) are probed: with that many active and empty, more may
    lie beyond them, and the answer leaves it to the full rounds."""
    keys = []
    for i in range(PROBED_LANES):
        keys += await _insert(store, f"t{i:02}", 0, 1)
    await store.execute(
        "UPDATE jobs SET state = 'COMPLETED', completed_at = now() WHERE job_key = ANY($1)",
        keys[1:],
    )
    assert (await _claim_lead(store)).job.job_key == keys[0]
    assert await _declined(store)  # 16 active lanes, all empty: maybe not all of them
    await store.execute("UPDATE lanes SET active = false WHERE tenant_id = 't15'")
    assert await _dry(store)  # 15: every one probed


async def test_the_lead_claim_reads_by_index_whatever_the_backlog(store):
    """The generic plan, as the pool runs it: lanes by lanes_type_vtime_idx (and by key,
    for a lane's worker-time estimate, ADR 029), jobs by the ready index and by key --
    never a scan of the backlog."""
    await _insert(store, "a", 0, 3_000)
    await store.execute("ANALYZE jobs")
    now = utcnow()
    lead = CLAIMS["claim_lead"].bind(
        job_type=TYPE,
        now=now,
        workers=["w"],
        deadlines=[now],
        default_aging_step=10,
        default_aging_interval_ms=60_000,
        via_stream=False,
        starts=[1],
    )
    nodes = await _plan(store, *lead)
    assert _jobs_scans(nodes) == {"jobs_ready_idx", "jobs_pkey"}
    assert {n.get("Index Name") for n in nodes if n.get("Relation Name") == "lanes"} == {
        "lanes_type_vtime_idx",
        "lanes_pkey",
    }
    activated = next(n for n in nodes if n["Node Type"] == "ModifyTable")
    _assert_linear(_nodes(activated))
