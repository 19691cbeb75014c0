"""DESIGN §1.1: weighted fair share between tenants, through HTTP."""

from __future__ import annotations

from collections import Counter

from tests.helpers import activate, enqueue, tenants_of


async def test_trickle_tenant_is_not_stuck_behind_a_flood(live):
    c = live.client
    await enqueue(c, "email", "flood", 1000)
    await enqueue(c, "email", "trickle", 10)
    order = []
    for _ in range(20):
        [job] = await activate(c, "email", 1)
        order.append(job["tenantId"])
    assert order.count("trickle") == 10, order


async def test_weights_1_2_7_hold_over_5000_activations(live):
    c = live.client
    weights = {"small": 1, "medium": 2, "large": 7}
    for tenant, w in weights.items():
        r = await c.put(f"/v2/tenants/{tenant}", json={"weight": w})
        assert r.status_code == 200, r.text
        # Always backlogged: more jobs than the 5,000 activations could drain.
        await enqueue(c, "report", tenant, 4000)
    got: Counter[str] = Counter()
    for _ in range(100):
        jobs = await activate(c, "report", 50)
        assert len(jobs) == 50
        got += tenants_of(jobs)
    total = sum(got.values())
    assert total == 5000
    for tenant, w in weights.items():
        share = got[tenant] / total
        assert abs(share - w / 10) <= 0.01, (tenant, share, got)


async def test_tenant_back_from_idle_gets_no_burst(live):
    c = live.client
    await enqueue(c, "sync", "a", 3000)
    await enqueue(c, "sync", "b", 3000)
    # c works once, then idles while a and b get 2,000 activations.
    await enqueue(c, "sync", "c", 1)
    first = await activate(c, "sync", 3)
    assert tenants_of(first)["c"] == 1
    for _ in range(20):
        await activate(c, "sync", 100)
    # c comes back with a big backlog: it re-enters at the current virtual time, so over
    # the next 300 activations it gets its third (and not the 2,000 it "missed").
    await enqueue(c, "sync", "c", 2000)
    got: Counter[str] = Counter()
    for _ in range(10):
        got += tenants_of(await activate(c, "sync", 30))
    assert abs(got["c"] - 100) <= 2, got
    assert abs(got["a"] - 100) <= 2, got


async def test_tenant_filter_restricts_activation(live):
    c = live.client
    await enqueue(c, "t", "x", 5)
    await enqueue(c, "t", "y", 5)
    jobs = await activate(c, "t", 10, tenantIds=["y"])
    assert tenants_of(jobs) == Counter({"y": 5})
