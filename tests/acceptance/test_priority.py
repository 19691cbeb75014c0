"""DESIGN §1.2–1.3: priority, FIFO within a priority, and aging, through HTTP."""

from __future__ import annotations

import asyncio

from tests.helpers import activate


async def _create(c, job_type, priority, tenant="acme"):
    r = await c.post("/v2/jobs", json={"type": job_type, "tenantId": tenant, "priority": priority})
    assert r.status_code == 201, r.text
    return r.json()["jobKey"]


async def test_priority_then_fifo(live):
    c = live.client
    keys = [await _create(c, "p", p) for p in (10, 90, 50, 90, 10, 100, 0)]
    order = [(await activate(c, "p"))[0]["jobKey"] for _ in keys]
    # 100, the two 90s in creation order, 50, the two 10s in creation order, 0.
    assert order == [keys[5], keys[1], keys[3], keys[2], keys[0], keys[4], keys[6]]


async def test_priority_order_within_one_batch_activation(live):
    c = live.client
    keys = [await _create(c, "q", p) for p in (10, 90, 50)]
    jobs = await activate(c, "q", 3)
    assert [j["jobKey"] for j in jobs] == [keys[1], keys[2], keys[0]]


async def test_without_aging_a_new_high_priority_job_wins(live):
    c = live.client
    old = await _create(c, "n", 0)
    new = await _create(c, "n", 90)
    assert (await activate(c, "n"))[0]["jobKey"] == new
    assert (await activate(c, "n"))[0]["jobKey"] == old


async def test_aging_lets_an_old_low_priority_job_overtake(live):
    c = live.client
    r = await c.put("/v2/job-types/aged", json={"agingIntervalMs": 150, "agingStep": 50})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "type": "aged",
        "maxActiveJobs": None,
        "agingIntervalMs": 150,
        "agingStep": 50,
        "rateLimit": None,
        "fairnessBy": "activations",
        "maxActivePerKey": None,
        "keyOrdering": None,
        "paused": False,
        "configured": True,
    }
    old = await _create(c, "aged", 0)
    assert (await c.get(f"/v2/jobs/{old}")).json()["effectivePriority"] < 100
    # Aging is a matter of wall-clock time: after two intervals the old job's effective
    # priority is min(100, 0 + 2 * 50) = 100.
    await asyncio.sleep(0.31)
    assert (await c.get(f"/v2/jobs/{old}")).json()["effectivePriority"] == 100
    new = await _create(c, "aged", 90)
    newer = (await c.get(f"/v2/jobs/{new}")).json()
    assert newer["effectivePriority"] == 90 and newer["priority"] == 90
    first = (await activate(c, "aged"))[0]
    assert first["jobKey"] == old
    assert first["priority"] == 0  # the priority as enqueued stays visible
    assert (await activate(c, "aged"))[0]["jobKey"] == new


async def test_effective_priority_is_capped_at_100_and_never_below_priority(live):
    c = live.client
    await c.put("/v2/job-types/cap100", json={"agingIntervalMs": 1, "agingStep": 100})
    key = await _create(c, "cap100", 30)
    await asyncio.sleep(0.01)
    job = (await c.get(f"/v2/jobs/{key}")).json()
    assert job["effectivePriority"] == 100 and job["priority"] == 30
