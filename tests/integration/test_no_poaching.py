"""DESIGN §1.5: 20,000 jobs drained by 16 concurrent activators, each activated once."""

from __future__ import annotations

import asyncio
from collections import Counter

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import job_rows
from app.domain import utcnow
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
    assert await store.fetchval("SELECT count(*) FROM jobs WHERE state = 'CREATED'") == 0
    counts = await store.fetch("SELECT activation_count, count(*) FROM jobs GROUP BY 1")
    assert [tuple(r) for r in counts] == [(1, 20_000)]


async def test_16_activators_each_on_its_own_connections_take_each_job_once(store):
    """Through one server, concurrent calls share claims (ADR 009); sixteen activation
    services, as sixteen processes would, race their claims on their own connections."""
    jobs = [{"type": "drain", "tenantId": t} for t in "abcd" for _ in range(2_000)]
    for i in range(0, len(jobs), 1_000):
        await job_rows.insert(store, jobs[i : i + 1_000], utcnow())
    seen: Counter[int] = Counter()

    async def activator(service: Rounds) -> None:
        while (got := await service.activate(ActivateRequest("drain", 100, 60_000)))[0]:
            seen.update(r.job_key for r in got[0])

    await asyncio.gather(*(activator(Rounds(store, Settings())) for _ in range(16)))
    assert len(seen) == 8_000
    assert max(seen.values()) == 1
    counts = await store.fetch("SELECT activation_count, count(*) FROM jobs GROUP BY 1")
    assert [tuple(r) for r in counts] == [(1, 8_000)]
