"""The claim statement on real PostgreSQL when another activation holds rows it wanted:
it takes the next ones in order, and does not come up short while jobs are there."""

from __future__ import annotations

from datetime import timedelta

from app.domain import utcnow
from app.store import CLAIM


async def _insert(store, priority: int, n: int) -> list[int]:
    jobs = [{"type": "claim", "tenantId": "t", "priority": priority} for _ in range(n)]
    return [i.job_key for i in await store.insert_jobs(jobs, utcnow())]


async def test_a_claim_passes_rows_held_by_another_and_tops_up_from_the_next_priority(store):
    high = await _insert(store, 50, 3)
    low = await _insert(store, 0, 5)
    now = utcnow()
    args = (now, "w", now + timedelta(minutes=1), 10, 60_000, False)
    async with store.pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        # Another activation has locked every job of the top priority, not yet committed:
        # to this claim they still look CREATED, so its best three are all of them.
        held = await other.fetch(CLAIM, "claim", ["t"], [3], *args)
        assert sorted(r["job_key"] for r in held) == high
        got = await store.claim(
            "claim",
            {"t": 3},
            now=now,
            worker="w2",
            lease_ms=60_000,
            aging_step=10,
            aging_interval_ms=60_000,
            type_cap=None,
            tenant_caps={},
            headroom=lambda *_: {},
        )
        await tx.rollback()
    # The share the held priority could not give comes from the next one, oldest first.
    assert sorted(r["job_key"] for r in got) == low[:3]
