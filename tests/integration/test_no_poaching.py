"""DESIGN §1.5: 20,000 jobs drained by 16 concurrent activators, each activated once."""

from __future__ import annotations

import asyncio
from collections import Counter

from tests.helpers import activate, enqueue


async def test_20000_jobs_16_activators_each_job_exactly_once(live, store):
    c = live.client
    for t in ("a", "b", "c", "d"):
        await enqueue(c, "drain", t, 5000)
    seen: Counter[str] = Counter()

    async def activator() -> None:
        while jobs := await activate(c, "drain", 100):
            seen.update(j["jobKey"] for j in jobs)

    await asyncio.gather(*(activator() for _ in range(16)))
    assert len(seen) == 20_000
    assert max(seen.values()) == 1
    assert await store.pool.fetchval("SELECT count(*) FROM jobs WHERE state = 'CREATED'") == 0
    counts = await store.pool.fetch("SELECT activation_count, count(*) FROM jobs GROUP BY 1")
    assert [tuple(r) for r in counts] == [(1, 20_000)]
