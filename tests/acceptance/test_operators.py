"""Operator routes: tenants, job types, stats, health; and the retention sweeper."""

from __future__ import annotations

from datetime import timedelta

from app import migrations
from app.domain import utcnow
from tests.helpers import activate, assert_problem, complete, enqueue


async def test_tenant_configuration_round_trip(live):
    c = live.client
    assert (await c.get("/v2/tenants/acme")).json() == {
        "tenantId": "acme",
        "weight": 1,
        "maxActiveJobs": None,
    }
    r = await c.put("/v2/tenants/acme", json={"weight": 5, "maxActiveJobs": 10})
    assert r.status_code == 200
    assert r.json() == {"tenantId": "acme", "weight": 5, "maxActiveJobs": 10}
    await c.put("/v2/tenants/<default>", json={})
    listed = (await c.get("/v2/tenants")).json()["tenants"]
    assert [t["tenantId"] for t in listed] == ["<default>", "acme"]
    assert (await c.delete("/v2/tenants/acme")).status_code == 204
    assert (await c.get("/v2/tenants/acme")).json()["weight"] == 1
    assert_problem(await c.delete("/v2/tenants/acme"), 404)


async def test_job_type_configuration_round_trip(live):
    c = live.client
    got = (await c.get("/v2/job-types/billing/invoice")).json()
    assert got == {
        "type": "billing/invoice",
        "maxActiveJobs": None,
        "agingIntervalMs": 60_000,
        "agingStep": 10,
    }
    r = await c.put("/v2/job-types/billing/invoice", json={"maxActiveJobs": 3, "agingStep": 0})
    assert r.json() == {
        "type": "billing/invoice",
        "maxActiveJobs": 3,
        "agingIntervalMs": 60_000,
        "agingStep": 0,
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
    states = sorted(r[0] for r in await store.pool.fetch("SELECT state FROM jobs"))
    assert states == ["ACTIVATED", "CREATED"]
    assert_problem(await c.get(f"/v2/jobs/{jobs[0]['jobKey']}"), 404)
