"""DESIGN §1.6: activation is work conserving.  An activation never answers with fewer
jobs than ``min(maxJobs, eligible jobs not held by a concurrent claim)``: one caller at a
time never gets ``[]`` while an eligible job exists, whatever the number and history of
lanes -- thousands of lanes emptied a moment ago included (issue 19 §1)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.helpers import activate


async def _create(client, jobs):
    for start in range(0, len(jobs), 10_000):
        r = await client.post("/v2/jobs/batch", json={"jobs": jobs[start : start + 10_000]})
        assert r.status_code == 201, r.text


def _many_small_beside_one_big(job_type: str, small: int, big: int) -> list[dict]:
    """``big`` jobs of `<default>` and one job each of ``small`` other tenants, created in
    one batch, the small ones first (as the reproduction in issue 19 did)."""
    return [{"type": job_type, "tenantId": f"t{i:05d}"} for i in range(small)] + [
        {"type": job_type} for _ in range(big)
    ]


async def _drain_one_at_a_time(client, job_type: str, total: int, max_jobs: int = 10):
    """Activate until ``total`` jobs are out; every answer must be full while at least
    maxJobs jobs remain, and never empty while any remains."""
    out = 0
    answers = 0
    while out < total:
        jobs = await activate(client, job_type, max_jobs)
        answers += 1
        left = total - out
        assert len(jobs) == min(max_jobs, left), (
            f"answer {answers}: {len(jobs)} jobs with {left} ready (after {out} out)"
        )
        out += len(jobs)
    assert await activate(client, job_type, max_jobs) == []
    return answers


async def test_emptied_lanes_never_answer_empty_one_caller(live):
    await _create(live.client, _many_small_beside_one_big("wc", 2_000, 1_000))
    await _drain_one_at_a_time(live.client, "wc", 3_000)


@pytest.mark.extended  # 11 s; test_tenants_capped_at_zero_do_not_crowd_the_reads stays
async def test_ten_thousand_emptied_lanes_beside_a_big_tenant(live):
    await _create(live.client, _many_small_beside_one_big("wc10k", 10_000, 10_000))
    await _drain_one_at_a_time(live.client, "wc10k", 20_000, max_jobs=100)


async def test_a_long_poll_after_the_small_lanes_emptied_gets_a_job(live):
    c = live.client
    await _create(c, _many_small_beside_one_big("wclp", 2_000, 1_000))
    # Drain the small lanes (and some of the big one), then ask with a long poll.
    out = Counter()
    while out["small"] < 2_000:
        for j in await activate(c, "wclp", 10):
            out["small" if j["tenantId"] != "<default>" else "big"] += 1
    body = {"type": "wclp", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 5_000}
    r = await c.post("/v2/jobs/activate", json=body)
    assert r.status_code == 200, r.text
    [job] = r.json()["jobs"]
    assert job["tenantId"] == "<default>"


async def test_sixteen_callers_at_once_get_every_job_exactly_once(live):
    c = live.client
    await _create(c, _many_small_beside_one_big("wc16", 2_000, 1_000))
    seen: Counter[str] = Counter()
    short_while_ready = 0
    remaining = 3_000

    async def caller() -> None:
        nonlocal remaining, short_while_ready
        while remaining > 0:
            jobs = await activate(c, "wc16", 10)
            # Of the jobs not yet counted, the 15 other callers hold at most 150 in
            # claims not yet answered; the rest were eligible for this call.
            if len(jobs) < min(10, remaining - 15 * 10):
                short_while_ready += 1
            for j in jobs:
                seen[j["jobKey"]] += 1
            remaining -= len(jobs)
            if not jobs:
                await asyncio.sleep(0)  # let the claims in flight finish

    await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(16))), 120)
    assert len(seen) == 3_000
    assert set(seen.values()) == {1}
    assert short_while_ready == 0


async def test_a_type_cap_that_trimmed_nothing_does_not_end_the_call(live):
    """Found by the model test: with a type cap of 8 and 8 asked, the first round's
    stride picks gave 4 to a lane holding 1 job; the call stopped as if at the cap, with
    5 of the 6 ready jobs."""
    c = live.client
    r = await c.put("/v2/job-types/wccap", json={"maxActiveJobs": 8})
    assert r.status_code == 200, r.text
    await _create(
        c, [{"type": "wccap", "tenantId": "a"}] * 5 + [{"type": "wccap", "tenantId": "b"}]
    )
    assert len(await activate(c, "wccap", 8)) == 6


async def test_tenants_capped_at_zero_do_not_crowd_the_reads(live):
    """Found from outside: 2,400 tenants capped at 0, each with a ready job, sat before
    the one uncapped tenant in vtime order; each round excluded only a read's worth of
    them, and the call stopped after its rounds with []."""
    c = live.client
    tenants = [f"z{i:04d}" for i in range(2_400)]
    # Set-up straight in the table (2,400 PUTs would be most of the test's time).
    await live.services.db.execute(
        "INSERT INTO tenants (tenant_id, weight, max_active_jobs) SELECT unnest($1::text[]), 1, 0",
        tenants,
    )
    await _create(c, [{"type": "wccap0", "tenantId": t} for t in tenants])
    await _create(c, [{"type": "wccap0", "tenantId": "zz"}] * 20)
    for _ in range(3):
        [job] = await activate(c, "wccap0", 1)
        assert job["tenantId"] == "zz"
