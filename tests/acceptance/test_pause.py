"""Issue 24: pause and resume a tenant or a job type.  Paused work is not activated (long
polls, streams, hand-offs), shows as paused in the stats, wakes its waiters when it is
resumed, and resumes in its fair place: neither a burst nor starvation."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from app.config import Settings
from app.main import create_app
from tests.acceptance.test_streams import Events
from tests.fixtures import quiet_settings, serving
from tests.helpers import activate, assert_problem, complete, enqueue, tenants_of


@pytest.fixture
def settings() -> Settings:
    # No backup poll within a test: a waiter that wakes was woken by a notification.
    return quiet_settings(backup_poll_ms=600_000)


async def queued(live, n: int = 1) -> None:
    """Until ``n`` requests wait in the server's queues (a waiter has no event of its
    own to await from outside)."""
    deadline = time.monotonic() + 30
    while live.services.activation.waiters.waiting < n:  # noqa: ASYNC110
        assert time.monotonic() < deadline, f"never {n} waiting"
        await asyncio.sleep(0.01)


async def test_a_paused_tenant_gets_nothing_and_its_record_says_so(live):
    c = live.client
    await enqueue(c, "p", "acme", 3)
    await enqueue(c, "p", "globex", 3)
    r = await c.post("/v2/tenants/acme/pause")
    assert r.status_code == 200
    assert r.json() == {
        "tenantId": "acme",
        "weight": 1,
        "maxActiveJobs": None,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": True,
        "configured": True,
    }
    assert (await c.post("/v2/tenants/acme/pause")).json()["paused"] is True  # idempotent
    got = await activate(c, "p", 10)
    assert tenants_of(got) == Counter({"globex": 3})
    assert await activate(c, "p", 10, tenantIds=["acme"]) == []
    # A job created while a worker waits is not handed to it either.
    poll = asyncio.create_task(
        c.post(
            "/v2/jobs/activate",
            json={"type": "p", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 500},
        )
    )
    await queued(live)
    r = await c.post("/v2/jobs", json={"type": "p", "tenantId": "acme"})
    assert r.json()["state"] == "CREATED"
    assert (await poll).json() == {"jobs": []}
    # A PUT keeps the pause; the stats show it.
    r = await c.put("/v2/tenants/acme", json={"weight": 2})
    assert r.json()["paused"] is True
    stats = (await c.get("/v2/stats")).json()["jobTypes"][0]
    by = {t["tenantId"]: t for t in stats["tenants"]}
    assert by["acme"]["paused"] is True and by["globex"]["paused"] is False
    assert by["acme"]["ready"] == 4 and by["acme"]["configuredShare"] == 0.0
    assert stats["paused"] is False
    r = await c.post("/v2/tenants/acme/resume")
    assert r.json()["paused"] is False and r.json()["weight"] == 2
    assert (await c.post("/v2/tenants/acme/resume")).json()["paused"] is False
    assert len(await activate(c, "p", 10)) == 4
    # A tenant never paused resumes to its defaults, unconfigured.
    r = await c.post("/v2/tenants/nobody/resume")
    assert r.json() == {
        "tenantId": "nobody",
        "weight": 1,
        "maxActiveJobs": None,
        "minActiveJobs": None,
        "rateLimit": None,
        "paused": False,
        "configured": False,
    }


async def test_a_paused_job_type_answers_nothing_and_a_put_keeps_the_pause(live):
    c = live.client
    await enqueue(c, "t", "acme", 2)
    r = await c.post("/v2/job-types/t/pause")
    assert r.json() == {
        "type": "t",
        "maxActiveJobs": None,
        "agingIntervalMs": 60_000,
        "agingStep": 10,
        "rateLimit": None,
        "fairnessBy": "activations",
        "maxActivePerKey": None,
        "keyOrdering": None,
        "paused": True,
        "configured": True,
    }
    assert await activate(c, "t", 10) == []
    r = await c.post(
        "/v2/jobs/activation",
        json={"type": "t", "maxJobsToActivate": 5, "timeout": 1000, "requestTimeout": -1},
    )
    assert r.json()["jobs"] == []
    r = await c.put("/v2/job-types/t", json={"maxActiveJobs": 5})
    assert r.json()["paused"] is True
    stats = (await c.get("/v2/stats", params={"type": "t"})).json()["jobTypes"][0]
    assert stats["paused"] is True and stats["ready"] == 2
    # A type with "/" in its name, and a type named like the action.
    assert (await c.post("/v2/job-types/a/b/pause")).json()["type"] == "a/b"
    assert (await c.post("/v2/job-types/pause/pause")).json()["type"] == "pause"
    assert (await c.get("/v2/job-types/a/b")).json()["paused"] is True
    assert (await c.post("/v2/job-types/t/resume")).json()["paused"] is False
    assert len(await activate(c, "t", 10)) == 2


async def test_pausing_names_that_are_not_names_is_400(live):
    c = live.client
    assert_problem(await c.post("/v2/tenants/bad%20tenant/pause"), 400)
    assert_problem(await c.post("/v2/tenants/" + "x" * 40 + "/resume"), 400)
    assert_problem(await c.post("/v2/job-types/bad%20type/pause"), 400)
    assert_problem(await c.post("/v2/job-types/t%0A/pause"), 404)  # no route matches
    assert_problem(await c.get("/v2/tenants/acme/pause"), 405)
    tenants = (await c.get("/v2/tenants")).json()["tenants"]
    assert tenants == []


async def _poll(c, job_type: str, timeout_ms: int = 10_000, **fields):
    return await c.post(
        "/v2/jobs/activate",
        json={
            "type": job_type,
            "maxJobs": 1,
            "timeout": 60_000,
            "requestTimeout": timeout_ms,
            **fields,
        },
    )


async def test_resuming_a_tenant_wakes_the_long_poll_waiting_for_its_jobs(live):
    c = live.client
    await c.post("/v2/tenants/acme/pause")
    [key] = await enqueue(c, "w", "acme", 1)
    poll = asyncio.create_task(_poll(c, "w"))
    await queued(live)
    started = time.monotonic()
    await c.post("/v2/tenants/acme/resume")
    r = await asyncio.wait_for(poll, 5)
    assert [j["jobKey"] for j in r.json()["jobs"]] == [key]
    assert time.monotonic() - started < 5  # woken, not timed out (no backup poll)


async def test_resuming_a_job_type_wakes_its_long_poll_and_its_stream(live):
    c = live.client
    await c.post("/v2/job-types/w/pause")
    keys = await enqueue(c, "w", "acme", 2)
    poll = asyncio.create_task(_poll(c, "w", worker="poller"))
    url = "/v2/jobs/stream?type=w&maxJobs=1&timeout=60000&worker=streamer"
    async with c.stream("GET", url) as stream:
        events = Events(stream)
        with pytest.raises(TimeoutError):
            await events.next_job(wait_s=1.0)
        assert not poll.done()
        await c.post("/v2/job-types/w/resume")
        streamed = await events.next_job()
        polled = (await asyncio.wait_for(poll, 5)).json()["jobs"]
        assert sorted([streamed["jobKey"], polled[0]["jobKey"]]) == sorted(keys)
        events.reader.cancel()


async def test_a_paused_tenants_jobs_are_not_streamed_until_it_is_resumed(live):
    c = live.client
    await c.post("/v2/tenants/acme/pause")
    [mine] = await enqueue(c, "st", "acme", 1)
    url = "/v2/jobs/stream?type=st&maxJobs=5&timeout=60000"
    async with c.stream("GET", url) as stream:
        events = Events(stream)
        [other] = await enqueue(c, "st", "globex", 1)
        assert (await events.next_job())["jobKey"] == other
        with pytest.raises(TimeoutError):
            await events.next_job(wait_s=1.0)
        await c.post("/v2/tenants/acme/resume")
        assert (await events.next_job())["jobKey"] == mine
        events.reader.cancel()


async def test_a_resumed_tenant_gets_its_weighted_share_neither_a_burst_nor_starvation(live):
    """Weights 3:1, both backlogged.  Paused, the heavy tenant gets nothing while the
    light one takes 40; resumed, it re-enters at the light one's virtual time: the next
    40 activations split 30:10, as they would had it never been paused (keeping its old
    virtual time, it would have taken all 40; starting behind, none)."""
    c = live.client
    await c.put("/v2/tenants/heavy", json={"weight": 3})
    await enqueue(c, "f", "heavy", 200)
    await enqueue(c, "f", "light", 200)
    warm = await activate(c, "f", 20)
    assert tenants_of(warm) == Counter({"heavy": 15, "light": 5})
    await c.post("/v2/tenants/heavy/pause")
    paused: Counter[str] = Counter()
    for _ in range(4):
        paused += tenants_of(await activate(c, "f", 10))
    assert paused == Counter({"light": 40})
    await live.services.activation.settle()  # the light lane's charges written
    await c.post("/v2/tenants/heavy/resume")
    after: Counter[str] = Counter()
    for _ in range(4):
        after += tenants_of(await activate(c, "f", 10))
    assert 29 <= after["heavy"] <= 31 and after["heavy"] + after["light"] == 40


async def test_a_pause_and_its_resume_hold_across_server_processes(live, db_url, settings):
    """State in the database: a pause made through one server holds on another, and
    the resume's notification wakes the other's waiting long poll."""
    async with serving(create_app(settings, db_url, background=False)) as other:
        await live.client.post("/v2/tenants/acme/pause")
        [key] = await enqueue(live.client, "x", "acme", 1)
        assert await activate(other.client, "x", 5) == []
        poll = asyncio.create_task(_poll(other.client, "x"))
        await queued(other)
        await live.client.post("/v2/tenants/acme/resume")
        r = await asyncio.wait_for(poll, 5)
        assert [j["jobKey"] for j in r.json()["jobs"]] == [key]


async def test_a_paused_tenants_finishing_jobs_do_not_release_its_lanes(live):
    """A tenant paused with jobs running, at its cap: their completions free capacity,
    which releases held lanes of capped tenants, but not of a paused one."""
    c = live.client
    await c.put("/v2/tenants/acme", json={"maxActiveJobs": 2})
    await enqueue(c, "r", "acme", 5)
    running = await activate(c, "r", 5)
    assert len(running) == 2
    await c.post("/v2/tenants/acme/pause")
    for job in running:
        assert (await complete(c, job)).status_code == 204
    assert await activate(c, "r", 5) == []
    held = await live.services.db.fetchval(
        "SELECT held FROM lanes WHERE job_type = 'r' AND tenant_id = 'acme'"
    )
    assert held is True
    await c.post("/v2/tenants/acme/resume")
    assert len(await activate(c, "r", 5)) == 2  # its cap again


async def test_the_metrics_flag_the_lanes_of_a_paused_tenant_or_job_type(live):
    from tests.acceptance.test_metrics import label, scrape, value

    c = live.client
    await enqueue(c, "m", "acme", 1)
    await enqueue(c, "m", "globex", 1)
    await enqueue(c, "n", "globex", 1)
    await label(live, "acme", "globex")
    await c.post("/v2/tenants/acme/pause")
    await c.post("/v2/job-types/n/pause")
    samples = await scrape(c)
    assert value(samples, "jobfair_paused", type="m", tenant="acme") == 1
    assert value(samples, "jobfair_paused", type="m", tenant="globex") == 0
    assert value(samples, "jobfair_paused", type="n", tenant="globex") == 1
    await c.post("/v2/tenants/acme/resume")
    await c.post("/v2/job-types/n/resume")
    samples = await scrape(c)
    assert value(samples, "jobfair_paused", type="m", tenant="acme") == 0
    assert value(samples, "jobfair_paused", type="n", tenant="globex") == 0
