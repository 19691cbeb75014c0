"""What the stats say about fairness reads true (issue 40 section 1): the tenant whose jobs
are taken as they come has a row; a backlogged lane shows its entitlement now and that
nobody is being served; weights are shown beside shares; a lane held at a cap says so for
the window, and its entitlement counts the cap (it is not shown starved)."""

from __future__ import annotations

import asyncio

from tests.helpers import activate, complete, enqueue


def _lanes(stats: dict, job_type: str) -> dict[str, dict]:
    [t] = [t for t in stats["jobTypes"] if t["type"] == job_type]
    return {x["tenantId"]: x for x in t["tenants"]}


async def test_a_tenant_whose_jobs_are_taken_as_they_come_has_a_row(live):
    c = live.client
    await enqueue(c, "mail", "bigco", 200)
    await live.services.stats.sample()  # the window's start
    for _ in range(5):  # trickle: one job comes, and is taken at once (fair share)
        await enqueue(c, "mail", "trickle", 1)
        jobs = await activate(c, "mail", 2)
        assert {j["tenantId"] for j in jobs} == {"bigco", "trickle"}
        for j in jobs:
            assert (await complete(c, j)).status_code == 204
    stats = (await c.get("/v2/stats")).json()
    lanes = _lanes(stats, "mail")
    trickle = lanes["trickle"]
    assert (trickle["ready"], trickle["active"]) == (0, 0)
    assert trickle["activatedLastMinute"] == 5 and trickle["realizedShare"] == 0.5
    assert lanes["bigco"]["realizedShare"] == 0.5
    assert sum(x["activatedLastMinute"] for x in lanes.values()) == 10


async def test_a_backlog_nobody_serves_shows_its_entitlement_now_and_the_silence(live):
    c = live.client
    await c.put("/v2/tenants/heavy", json={"weight": 3})
    await enqueue(c, "report", "heavy", 20)
    await enqueue(c, "report", "light", 50)
    await live.services.stats.sample()
    await asyncio.sleep(1.1)  # the time itself is what is measured: no activation in it
    stats = (await c.get("/v2/stats")).json()
    [t] = stats["jobTypes"]
    lanes = _lanes(stats, "report")
    assert (lanes["heavy"]["weight"], lanes["light"]["weight"]) == (3, 1)
    assert lanes["heavy"]["configuredShare"] == 0.75 and lanes["light"]["configuredShare"] == 0.25
    assert lanes["heavy"]["entitledShare"] == 0.0  # nothing was made in the window
    assert t["noActivationForMs"] >= 1000 and t["noActivationSinceStart"] is True
    # Once served, the silence is over.
    await activate(c, "report", 4)
    stats = (await c.get("/v2/stats")).json()
    assert stats["jobTypes"][0]["noActivationForMs"] is None


async def test_a_lane_capped_at_one_reads_held_not_starved(live):
    c = live.client
    await c.put("/v2/tenants/one", json={"maxActiveJobs": 1})
    await enqueue(c, "render", "one", 50)
    await enqueue(c, "render", "free", 100)
    stats_service = live.services.stats
    await stats_service.sample()
    for _ in range(6):  # workers asking for 8 at a time, finishing each batch
        jobs = await activate(c, "render", 8)
        assert sum(j["tenantId"] == "one" for j in jobs) == 1
        await stats_service.sample()  # sampled while the lane is at its cap
        for j in jobs:
            assert (await complete(c, j)).status_code == 204
    stats = (await c.get("/v2/stats")).json()
    one = _lanes(stats, "render")["one"]
    assert one["activatedLastMinute"] == 6
    # Entitled to what its cap let it take, not to half: realised matches it.
    assert one["realizedShare"] == one["entitledShare"] == round(6 / 48, 4)
    assert one["heldInWindow"]["tenantCap"] >= 0.4
    # Now (nothing of it active) nothing holds it; at its cap, the hold names its figures.
    assert one["heldBy"] == []
    [job] = await activate(c, "render", 1, tenantIds=["one"])
    one = _lanes((await c.get("/v2/stats")).json(), "render")["one"]
    assert one["heldBy"] == [{"reason": "tenantCap", "active": 1, "limit": 1}]
    assert job["tenantId"] == "one"


async def test_a_failed_job_has_a_finished_at_and_no_completed_at(live):
    c = live.client
    await enqueue(c, "pdf", "acme", 2)
    failing, done = await activate(c, "pdf", 2)
    body = {"activationCount": failing["activationCount"], "retries": 0}
    assert (await c.post(f"/v2/jobs/{failing['jobKey']}/fail", json=body)).status_code == 204
    assert (await complete(c, done)).status_code == 204
    failed = (await c.get(f"/v2/jobs/{failing['jobKey']}")).json()
    assert failed["state"] == "FAILED"
    assert failed["completedAt"] is None and failed["finishedAt"] is not None
    completed = (await c.get(f"/v2/jobs/{done['jobKey']}")).json()
    assert completed["completedAt"] == completed["finishedAt"] is not None
