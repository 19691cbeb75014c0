"""Operator routes: tenants, job types, stats, health; and the retention sweeper."""

from __future__ import annotations

from datetime import timedelta

from app import migrations
from app.domain import utcnow
from tests.helpers import activate, assert_problem, backdate, complete, enqueue


async def test_tenant_configuration_round_trip(live):
    c = live.client
    assert (await c.get("/v2/tenants/acme")).json() == {
        "tenantId": "acme",
        "weight": 1,
        "maxActiveJobs": None,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": False,
        "configured": False,
    }
    r = await c.put("/v2/tenants/acme", json={"weight": 5, "maxActiveJobs": 10})
    assert r.status_code == 200
    assert r.json() == {
        "tenantId": "acme",
        "weight": 5,
        "maxActiveJobs": 10,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": False,
        "configured": True,
    }
    await c.put("/v2/tenants/<default>", json={})
    listed = (await c.get("/v2/tenants")).json()["tenants"]
    assert [t["tenantId"] for t in listed] == ["<default>", "acme"]
    assert (await c.delete("/v2/tenants/acme")).status_code == 204
    back = (await c.get("/v2/tenants/acme")).json()
    assert (back["weight"], back["configured"]) == (1, False)
    assert_problem(await c.delete("/v2/tenants/acme"), 404)


async def test_job_type_configuration_round_trip(live):
    c = live.client
    got = (await c.get("/v2/job-types/billing/invoice")).json()
    assert got == {
        "type": "billing/invoice",
        "maxActiveJobs": None,
        "agingIntervalMs": 60_000,
        "agingStep": 10,
        "rateLimit": None,
        "fairnessBy": "activations",
        "maxActivePerKey": None,
        "keyOrdering": None,
        "paused": False,
        "configured": False,
    }
    r = await c.put("/v2/job-types/billing/invoice", json={"maxActiveJobs": 3, "agingStep": 0})
    assert r.json() == {
        "type": "billing/invoice",
        "maxActiveJobs": 3,
        "agingIntervalMs": 60_000,
        "agingStep": 0,
        "rateLimit": None,
        "fairnessBy": "activations",
        "maxActivePerKey": None,
        "keyOrdering": None,
        "paused": False,
        "configured": True,
    }
    assert (await c.get("/v2/job-types")).json()["jobTypes"] == [r.json()]


async def test_stats_show_pending_active_age_and_shares(live):
    c = live.client
    await c.put("/v2/tenants/big", json={"weight": 3})
    await enqueue(c, "s", "big", 40)
    await enqueue(c, "s", "small", 40)
    await c.post("/v2/jobs", json={"type": "s", "tenantId": "small", "delay": 60_000})
    await live.services.stats.sample()
    jobs = await activate(c, "s", 20)
    await complete(c, jobs[0])
    stats = (await c.get("/v2/stats")).json()
    [t] = stats["jobTypes"]
    assert t["type"] == "s" and t["pending"] == 61 and t["active"] == 19
    assert t["oldestPendingAgeMs"] >= 0
    by = {x["tenantId"]: x for x in t["tenants"]}
    assert by["big"]["pending"] == 25 and by["small"]["pending"] == 36
    assert by["big"]["activatedLastMinute"] == 15 and by["small"]["activatedLastMinute"] == 5
    assert by["big"]["realizedShare"] == 0.75 and by["big"]["configuredShare"] == 0.75
    assert by["small"]["realizedShare"] == 0.25


def _without_ages(stats: dict) -> dict:
    """Stats without the ages and times, which move between two reads."""
    moving = {"oldestPendingAgeMs", "noActivationForMs", "heldInWindow", "windowMs"}
    out = {k: v for k, v in stats.items() if k not in moving}
    if "tenants" in out:
        out["tenants"] = [_without_ages(x) for x in out["tenants"]]
    return out


async def test_stats_count_delayed_jobs_apart_and_mark_lanes_held_back_by_a_cap(live):
    """Per lane: ready and delayed jobs apart (a delayed job is neither in the oldest
    ready age nor in the configured shares), the oldest ready job's key, and which cap,
    if any, holds the lane back; ``?type=`` gives one type."""
    c, pool = live.client, live.services.db
    await live.services.stats.sample()  # the baseline of "last minute"
    await c.put("/v2/tenants/capped", json={"maxActiveJobs": 2})
    await c.put("/v2/job-types/full", json={"maxActiveJobs": 1})
    # An hour-old job with a runAt still ahead, beside a job ready for a minute.
    [delayed] = await enqueue(c, "st", "late", 1, delay=3_600_000)
    [waiting] = await enqueue(c, "st", "late", 1)
    await backdate(pool, [int(delayed)], timedelta(hours=1))
    await backdate(pool, [int(waiting)], timedelta(minutes=1), "queued_at", "created_at")
    ready = await enqueue(c, "st", "capped", 4)
    await enqueue(c, "st", "sleepy", 1, delay=3_600_000)  # only delayed jobs
    assert len(await activate(c, "st", 10, tenantIds=["capped"])) == 2  # its cap
    await enqueue(c, "full", "other", 2)
    assert len(await activate(c, "full", 2)) == 1  # the type's cap
    stats = (await c.get("/v2/stats")).json()
    assert [t["type"] for t in stats["jobTypes"]] == ["full", "st"]
    st = (await c.get("/v2/stats", params={"type": "st"})).json()
    [t] = st["jobTypes"]
    assert _without_ages(t) == _without_ages(stats["jobTypes"][1])
    assert (t["pending"], t["ready"], t["delayed"], t["active"]) == (5, 3, 2, 2)
    assert 60_000 <= t["oldestPendingAgeMs"] < 3_600_000  # the ready job's minute
    assert t["oldestReadyJobKey"] == waiting
    by = {x["tenantId"]: x for x in t["tenants"]}
    capped, late = by["capped"], by["late"]
    assert (capped["ready"], capped["delayed"], capped["cappedBy"]) == (2, 0, "tenant")
    assert capped["oldestReadyJobKey"] == ready[2]  # the first two went out, FIFO
    assert (late["pending"], late["ready"], late["delayed"], late["cappedBy"]) == (2, 1, 1, None)
    assert late["oldestPendingAgeMs"] >= 60_000 and late["oldestReadyJobKey"] == waiting
    sleepy = by["sleepy"]
    assert (sleepy["ready"], sleepy["delayed"], sleepy["oldestPendingAgeMs"]) == (0, 1, None)
    assert sleepy["oldestReadyJobKey"] is None and sleepy["configuredShare"] == 0.0
    assert capped["configuredShare"] == late["configuredShare"] == 0.5
    [full] = stats["jobTypes"][0]["tenants"]
    assert (full["ready"], full["active"], full["cappedBy"]) == (1, 1, "type")
    assert (await c.get("/v2/stats", params={"type": "none"})).json()["jobTypes"] == []
    assert_problem(await c.get("/v2/stats", params={"type": "bad type"}), 400)


async def test_health_and_readiness(live):
    assert (await live.client.get("/healthz")).json() == {"status": "ok"}
    r = await live.client.get("/readyz")
    assert r.status_code == 200 and r.json()["schema"] == migrations.head_revision()
    m = await live.client.get("/metrics")
    assert "jobfair_activation_queries_total" in m.text


async def test_retention_prunes_old_terminal_jobs_only(live, store):
    c = live.client
    await enqueue(c, "r", "acme", 3)
    jobs = await activate(c, "r", 2)
    await complete(c, jobs[0])
    retention = live.services.background.retention
    assert await retention.run_once(utcnow()) == 0
    later = utcnow() + timedelta(seconds=retention.retention_s + 1)
    assert await retention.run_once(later) == 1
    states = sorted(r[0] for r in await store.fetch("SELECT state FROM jobs"))
    assert states == ["ACTIVATED", "CREATED"]
    assert_problem(await c.get(f"/v2/jobs/{jobs[0]['jobKey']}"), 404)
