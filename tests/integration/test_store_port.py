"""Activation's one narrow interface to the store (app.db.store.Store), driven as the
rounds drive it, on a real database: a round through the port alone, and ``begin()``
answering the same interface inside one transaction (a capped claim's locks, count,
claim and hold commit together or not at all)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.db.store import ClaimAsk, CountAsk, InsertAsk, KeysAsk, LaneAsk, Share, Store
from app.domain import JobState, utcnow

TYPE = "port"


async def _jobs(store: Store, tenant: str, n: int) -> list[int]:
    jobs = [{"type": TYPE, "tenantId": tenant} for _ in range(n)]
    made = await store.insert(InsertAsk(jobs, utcnow()))
    return [m.job_key for m in made]


def _claim(counts: dict[tuple[str, str], int], **more) -> ClaimAsk:
    now = utcnow()
    n = sum(counts.values())
    return ClaimAsk(TYPE, counts, now, [Share("w", 60_000, n)], False, 10, 60_000, **more)


async def test_a_round_through_the_port_alone_reads_claims_and_charges(store) -> None:
    port = Store(store)
    keys = await _jobs(port, "a", 3) + await _jobs(port, "b", 2)
    read = await port.read_lanes(LaneAsk(TYPE, 8, [], None))
    assert sorted(lane.tenant_id for lane in read.ready) == ["a", "b"]
    by_key = await port.read_keys(KeysAsk(TYPE, {"a": 1, "b": 1}, []))
    assert {t: [k for k, _, _, _ in ks] for t, ks in by_key.ready.items()} == {"a": [""], "b": [""]}
    got = await port.claim(_claim({("a", ""): 2, ("b", ""): 2}))
    assert sorted(c.job.tenant_id for c in got) == ["a", "a", "b", "b"]
    assert {c.job.worker for c in got} == {"w"} and {c.share for c in got} == {1}
    fences = await port.fences(keys)
    claimed = {c.job.job_key for c in got}
    assert all(
        (f.state, f.activation_count) == (JobState.ACTIVATED, 1)
        for k, f in fences.items()
        if k in claimed
    )
    assert sum(f.state is JobState.CREATED for f in fences.values()) == 1


async def test_a_capped_claim_in_begin_commits_its_claim_and_hold_together(store) -> None:
    await store.execute("INSERT INTO tenants (tenant_id, max_active_jobs) VALUES ('a', 2)")
    port = Store(store)
    await _jobs(port, "a", 4)
    count = CountAsk(TYPE, False, ["a"], None, ["a"], False, [])
    async with port.begin() as tx:
        counted = await tx.lock_and_count(count)
        assert counted.room == {"a": 2}
        got = await tx.claim(_claim({("a", ""): 2}, hold=counted.room))
        assert len(got) == 2
    # Committed: the jobs are leased, the tenant's lane is held at its cap, and a read
    # through the port no longer sees it.
    assert await store.fetchval("SELECT held FROM lanes WHERE tenant_id = 'a'") is True
    assert (await port.read_lanes(LaneAsk(TYPE, 8, [], None))).ready == []


async def test_a_body_that_raises_in_begin_leaves_nothing_claimed_or_held(store) -> None:
    await store.execute("INSERT INTO tenants (tenant_id, max_active_jobs) VALUES ('a', 1)")
    port = Store(store)
    [key] = await _jobs(port, "a", 1)
    count = CountAsk(TYPE, False, ["a"], None, ["a"], False, [])
    with pytest.raises(RuntimeError):
        async with port.begin() as tx:
            counted = await tx.lock_and_count(count)
            assert len(await tx.claim(_claim({("a", ""): 1}, hold=counted.room))) == 1
            raise RuntimeError("the round failed after its claim")
    assert (await port.fences([key]))[key] == (key, JobState.CREATED, 0)
    assert await store.fetchval("SELECT held FROM lanes WHERE tenant_id = 'a'") is False
    # ... and the job is there for the next claim, whose lease is its own.
    [again] = await port.claim(_claim({("a", ""): 1}))
    assert again.job.job_key == key
    assert again.job.deadline is not None and again.job.deadline > utcnow() + timedelta(seconds=50)
