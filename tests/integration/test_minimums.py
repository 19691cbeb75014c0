"""Issue 44 §3: a tenant's guaranteed minimum (minActiveJobs, ADR 042) -- while it has
fewer ACTIVATED jobs and ready ones, its lanes are served before the weighted share, up to
the minimum, whatever their virtual time; minimums that exceed a round are shared by
weight; caps, rate limits and pauses win; the picks below a minimum are not charged."""

from __future__ import annotations

from collections import Counter

import httpx

from app.db import job_rows, operating
from app.domain import utcnow
from tests.acceptance.test_metrics import scrape, value
from tests.helpers import activate, assert_problem, complete, enqueue, tenants_of
from tests.integration.test_claim_lead import _claim_lead, _declined, _insert


async def _put(c: httpx.AsyncClient, tenant: str, **body: object) -> dict:
    r = await c.put(f"/v2/tenants/{tenant}", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def _ahead(store, tenant: str, vtime: float = 1e6) -> None:
    """The tenant's lanes far ahead of the others: weights alone would serve it last."""
    await store.execute("UPDATE lanes SET vtime = $2 WHERE tenant_id = $1", tenant, vtime)


async def test_a_minimum_is_answered_and_bad_values_are_refused(live, store):
    c = live.client
    got = await _put(c, "acme", weight=2, maxActiveJobs=10, minActiveJobs=4)
    assert (got["minActiveJobs"], got["maxActiveJobs"]) == (4, 10)
    assert (await c.get("/v2/tenants/acme")).json()["minActiveJobs"] == 4
    assert (await c.get("/v2/tenants/other")).json()["minActiveJobs"] is None
    for bad in (
        {"minActiveJobs": -1},
        {"minActiveJobs": 1.5},
        {"minActiveJobs": "2"},
        {"minActiveJobs": 2**31},
        {"minActiveJobs": True},
        {"minActiveJobs": 11, "maxActiveJobs": 10},
    ):
        problem = assert_problem(await c.put("/v2/tenants/acme", json=bad), 400)
        assert "minActiveJobs" in problem["detail"], problem
    got = (await c.get("/v2/tenants/acme")).json()
    assert (got["minActiveJobs"], got["maxActiveJobs"], got["weight"]) == (4, 10, 2)
    # A minimum alone (no cap) is fine; so is one equal to the cap.
    assert (await _put(c, "acme", minActiveJobs=7))["minActiveJobs"] == 7
    assert (await _put(c, "acme", minActiveJobs=5, maxActiveJobs=5))["minActiveJobs"] == 5


async def test_a_tenant_below_its_minimum_is_served_first_whatever_its_virtual_time(live, store):
    c = live.client
    await _put(c, "big", weight=10)
    await _put(c, "small", minActiveJobs=3)
    await enqueue(c, "mail", "big", 100)
    small = await enqueue(c, "mail", "small", 20)
    await _ahead(store, "small")
    first = await activate(c, "mail", 10)
    assert tenants_of(first) == Counter({"big": 7, "small": 3})
    # At its minimum now: weights decide again, and its virtual time keeps it out.
    assert tenants_of(await activate(c, "mail", 10)) == Counter({"big": 10})
    # One of its jobs ends: below its minimum by one, it gets one first.
    done = next(j for j in first if j["tenantId"] == "small")
    assert (await complete(c, done)).status_code == 204
    assert tenants_of(await activate(c, "mail", 5)) == Counter({"small": 1, "big": 4})
    assert done["jobKey"] in small


async def test_a_minimum_not_used_is_not_held_back(live):
    c = live.client
    await _put(c, "idle", minActiveJobs=50)
    await enqueue(c, "mail", "busy", 30)
    assert len(await activate(c, "mail", 30)) == 30  # idle has nothing: busy gets all


async def test_minimums_beyond_what_is_asked_are_shared_by_weight(live, store):
    c = live.client
    await _put(c, "a", weight=3, minActiveJobs=20)
    await _put(c, "b", weight=1, minActiveJobs=20)
    await enqueue(c, "mail", "a", 30)
    await enqueue(c, "mail", "b", 30)
    await enqueue(c, "mail", "c", 30)
    assert tenants_of(await activate(c, "mail", 8)) == Counter({"a": 6, "b": 2})


async def test_caps_rate_limits_and_pauses_win_over_a_minimum(live, store):
    c = live.client
    await _put(c, "capped", minActiveJobs=5, maxActiveJobs=5)
    await _put(c, "limited", minActiveJobs=5, rateLimit={"perSecond": 0.001, "burst": 2})
    await _put(c, "paused", minActiveJobs=5)
    assert (await c.post("/v2/tenants/paused/pause")).status_code == 200
    for tenant in ("capped", "limited", "paused", "other"):
        await enqueue(c, "mail", tenant, 10)
    await c.put("/v2/job-types/mail", json={"maxActiveJobs": 6})
    got = tenants_of(await activate(c, "mail", 20))
    # The type's cap of 6: the capped tenant's 5 and the limited one's tokens compete
    # by weight for it, before the other tenant gets any.
    assert sum(got.values()) == 6 and "paused" not in got and "other" not in got
    assert got["limited"] <= 2


async def test_the_picks_below_a_minimum_are_not_charged(live, store):
    c = live.client
    await _put(c, "small", minActiveJobs=4)
    await enqueue(c, "mail", "small", 10)
    await enqueue(c, "mail", "big", 10)
    await activate(c, "mail", 6)  # small's 4 first (uncharged), then 1 each by weight
    await live.services.activation.settle()
    vtimes = dict(await store.fetch("SELECT tenant_id, vtime FROM lanes"))
    assert vtimes["small"] == vtimes["big"] == 1.0, vtimes


async def test_the_lead_claim_leaves_a_type_to_the_rounds_while_a_tenant_has_a_minimum(store):
    [a_job] = await _insert(store, "a", 0, 1)
    await _insert(store, "b", 0, 1)
    await store.execute("UPDATE lanes SET vtime = 5 WHERE tenant_id = 'b'")
    await operating.upsert_tenant(store, "b", 1, None, None, 1)
    assert await _declined(store)
    await operating.upsert_tenant(store, "b", 1, None, None, None)
    assert (await _claim_lead(store)).job.job_key == a_job
    states = await job_rows.fences(store, [a_job])
    assert states[a_job].state == "ACTIVATED" and utcnow()


async def test_explain_and_stats_show_a_tenant_below_its_minimum(live, store):
    c = live.client
    await _put(c, "small", minActiveJobs=2)
    waiting = await enqueue(c, "mail", "small", 5)
    await enqueue(c, "mail", "big", 5)
    await _ahead(store, "small")
    explained = (await c.get(f"/v2/jobs/{waiting[0]}/explain")).json()
    assert {"reason": "belowMinimum", "active": 0, "minimum": 2} in explained["reasons"]
    assert not any(r["reason"] == "otherLanesFirst" for r in explained["reasons"])
    await live.services.stats.sample()
    await activate(c, "mail", 4)
    await live.services.stats.sample()
    lanes = {
        t["tenantId"]: t
        for t in (await c.get("/v2/stats", params={"type": "mail"})).json()["jobTypes"][0][
            "tenants"
        ]
    }
    assert (lanes["small"]["minActiveJobs"], lanes["small"]["tenantActive"]) == (2, 2)
    assert (lanes["big"]["minActiveJobs"], lanes["big"]["tenantActive"]) == (None, None)
    # At its minimum: no longer named as a reason.
    explained = (await c.get(f"/v2/jobs/{waiting[-1]}/explain")).json()
    assert not any(r["reason"] == "belowMinimum" for r in explained["reasons"])


async def test_metrics_show_a_minimum_against_the_tenants_active_jobs(live, store):
    c = live.client
    await _put(c, "small", minActiveJobs=2)
    await _put(c, "idle", minActiveJobs=3)  # below it, but with nothing ready
    await enqueue(c, "mail", "small", 5)
    await enqueue(c, "mail", "big", 5)
    await _ahead(store, "small")
    samples = await scrape(c)
    assert value(samples, "jobfair_tenant_min_active_jobs", tenant="small") == 2
    assert value(samples, "jobfair_tenant_active_jobs", tenant="small") == 0
    assert value(samples, "jobfair_tenant_below_minimum", tenant="small") == 1
    assert ("jobfair_tenant_min_active_jobs", frozenset({("tenant", "big")})) not in samples
    await activate(c, "mail", 4)
    samples = await scrape(c)
    assert value(samples, "jobfair_tenant_active_jobs", tenant="small") == 2
    assert value(samples, "jobfair_tenant_below_minimum", tenant="small") == 0
