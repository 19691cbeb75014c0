"""Issue 24, metrics: counters move by exactly the events of each kind, the gauges say
what /v2/stats says, tenants beyond the top K fold into <other> with the sums kept, and
two server processes add up."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.config import Settings
from app.db import metric_reads
from app.domain import utcnow
from app.keys import Role
from app.main import create_app
from app.metrics.events import LABELS_LEAD_S, OTHER
from tests.fixtures import CITUS_POOL, Live, quiet_settings, serving, wait_ready
from tests.helpers import activate, complete, enqueue

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient, **kwargs: object) -> Samples:
    """/metrics, parsed as Prometheus parses it: (sample name, labels) -> value."""
    r = await client.get("/metrics", **kwargs)  # type: ignore[arg-type]
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"{key} twice"
            out[key] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def label(live: Live, *tenants: str) -> None:
    """Have the server label ``tenants`` by name from now on (as the leader would)."""
    now = utcnow()
    await metric_reads.publish_tenants(live.services.db, now, tenants, now)
    labels = live.services.background.labels
    assert labels is not None
    await labels.run_once(now)


async def fail(c: httpx.AsyncClient, job: dict, retries: int) -> None:
    r = await c.post(
        f"/v2/jobs/{job['jobKey']}/fail",
        json={"activationCount": job["activationCount"], "retries": retries},
    )
    assert r.status_code == 204, r.text


async def test_each_event_moves_its_counter_by_exactly_its_count(live: Live):
    c = live.client
    await label(live, "a", "b")
    before = await scrape(c)
    await enqueue(c, "ev", "a", 6)
    await enqueue(c, "ev", "b", 3)
    [doomed] = await enqueue(c, "ev", "b", 1)
    assert (await c.post(f"/v2/jobs/{doomed}/cancel")).status_code == 204
    jobs = await activate(c, "ev", 9)
    mine = [j for j in jobs if j["tenantId"] == "a"]
    assert len(jobs) == 9 and len(mine) == 6
    for j in mine[:2]:
        assert (await complete(c, j)).status_code == 204
    await fail(c, mine[2], retries=2)  # queued again
    await fail(c, mine[3], retries=0)  # FAILED
    r = await c.post(
        f"/v2/jobs/{mine[4]['jobKey']}/error",
        json={"activationCount": mine[4]["activationCount"], "errorCode": "E"},
    )
    assert r.status_code == 204
    # The four jobs still out (one of a, three of b) outlive their leases.
    expired = await live.services.background.lease.run_once(utcnow() + timedelta(minutes=2))
    assert expired == 4
    assert await activate(c, "nothing-here") == []
    after = await scrape(c)

    def lanes(name: str) -> dict[str, float]:
        return {t: moved(before, after, name, type="ev", tenant=t) for t in ("a", "b", OTHER)}

    assert lanes("jobfair_jobs_created_total") == {"a": 6, "b": 4, OTHER: 0}
    assert lanes("jobfair_jobs_canceled_total") == {"a": 0, "b": 1, OTHER: 0}
    assert lanes("jobfair_jobs_activated_total") == {"a": 6, "b": 3, OTHER: 0}
    assert lanes("jobfair_jobs_completed_total") == {"a": 2, "b": 0, OTHER: 0}
    assert lanes("jobfair_jobs_retried_total") == {"a": 1, "b": 0, OTHER: 0}
    assert lanes("jobfair_jobs_failed_total") == {"a": 1, "b": 0, OTHER: 0}
    assert lanes("jobfair_jobs_error_thrown_total") == {"a": 1, "b": 0, OTHER: 0}
    assert lanes("jobfair_jobs_lease_expired_total") == {"a": 1, "b": 3, OTHER: 0}
    assert moved(before, after, "jobfair_activate_requests_total", type="ev") == 1
    assert moved(before, after, "jobfair_activate_empty_total", type="ev") == 0
    assert moved(before, after, "jobfair_activate_requests_total", type="nothing-here") == 1
    assert moved(before, after, "jobfair_activate_empty_total", type="nothing-here") == 1
    # The histograms observed each event once.
    pickups = "jobfair_pickup_latency_seconds_count"
    assert moved(before, after, pickups, type="ev", tenant="a") == 6
    assert moved(before, after, pickups, type="ev", tenant="b") == 3
    processing = "jobfair_processing_seconds_count"
    for outcome, n in (("completed", 2), ("retried", 1), ("failed", 1), ("error_thrown", 1)):
        assert moved(before, after, processing, type="ev", outcome=outcome) == n, outcome
    requests = "jobfair_activate_request_seconds_count"
    assert moved(before, after, requests, type="ev", waited="false") == 1
    inf = {"type": "ev", "tenant": "a", "le": "+Inf"}
    assert moved(before, after, "jobfair_pickup_latency_seconds_bucket", **inf) == 6


async def test_a_long_poll_is_timed_by_how_its_wait_ended(live: Live):
    c = live.client
    before = await scrape(c)
    body = {"type": "lp", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 100}
    assert (await c.post("/v2/jobs/activate", json=body)).json()["jobs"] == []
    waiting = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**body, "requestTimeout": 30_000})
    )
    deadline = time.monotonic() + 30
    while (await scrape(c)).get(("jobfair_waiters", frozenset()), 0) < 1:
        # The gauge is the only sign the poll waits: there is no event to await.
        assert time.monotonic() < deadline, "the long poll never waited"
        await asyncio.sleep(0.01)
    await enqueue(c, "lp", "a", 1)
    assert len((await waiting).json()["jobs"]) == 1
    after = await scrape(c)
    waits = "jobfair_long_poll_wait_seconds_count"
    assert moved(before, after, waits, type="lp", outcome="timeout") == 1
    assert moved(before, after, waits, type="lp", outcome="jobs") == 1
    requests = "jobfair_activate_request_seconds_count"
    assert moved(before, after, requests, type="lp", waited="true") == 2
    assert moved(before, after, "jobfair_activate_empty_total", type="lp") == 1


async def test_gauges_say_what_the_stats_view_says(live: Live):
    """Two types by three tenants, one of them capped: ready, delayed and active jobs,
    the oldest ready age, the shares and the caps are /v2/stats's."""
    c = live.client
    await label(live, "t1", "t2", "t3")
    await c.put("/v2/tenants/t1", json={"weight": 2})
    await c.put("/v2/tenants/t3", json={"maxActiveJobs": 1})
    await live.services.stats.sample()  # the window's start
    await enqueue(c, "g1", "t1", 5)
    await enqueue(c, "g1", "t2", 3)
    await enqueue(c, "g1", "t3", 2)
    await enqueue(c, "g2", "t1", 1, delay=3_600_000)
    await enqueue(c, "g2", "t2", 2)
    await enqueue(c, "g2", "t3", 1)
    await activate(c, "g1", 4)
    await activate(c, "g2", 1)
    await live.services.activation.settle()  # every lane charged: both reads see alike
    stats = (await c.get("/v2/stats")).json()
    samples = await scrape(c)
    seen = 0
    for t in stats["jobTypes"]:
        for x in t["tenants"]:
            lane = {"type": t["type"], "tenant": x["tenantId"]}
            assert value(samples, "jobfair_ready_jobs", **lane) == x["ready"], lane
            assert value(samples, "jobfair_delayed_jobs", **lane) == x["delayed"], lane
            assert value(samples, "jobfair_active_jobs", **lane) == x["active"], lane
            age = value(samples, "jobfair_oldest_ready_age_seconds", **lane)
            assert abs(age * 1000 - (x["oldestPendingAgeMs"] or 0)) < 1000, lane
            realized = value(samples, "jobfair_realized_share", **lane)
            entitled = value(samples, "jobfair_entitled_share", **lane)
            assert round(realized, 4) == x["realizedShare"], lane
            assert round(entitled, 4) == x["entitledShare"], lane
            lag = samples.get(("jobfair_vtime_lag", frozenset(lane.items())))
            assert (None if lag is None else round(lag, 6)) == x["vtimeLag"], lane
            for cap in ("tenant", "type"):
                flag = value(samples, "jobfair_capped", **lane, cap=cap)
                assert flag == (1.0 if x["cappedBy"] == cap else 0.0), (lane, cap)
            assert value(samples, "jobfair_paused", **lane) == 0
            seen += 1
    assert seen == 6
    # The capped tenant is flagged, and every lane's shares add up per type.
    assert value(samples, "jobfair_capped", type="g1", tenant="t3", cap="tenant") == 1
    for job_type in ("g1", "g2"):
        assert abs(total(samples, "jobfair_realized_share", type=job_type) - 1) < 1e-9
        assert abs(total(samples, "jobfair_entitled_share", type=job_type) - 1) < 1e-9
    assert value(samples, "jobfair_aging_bound_seconds", type="g1") == 600  # 10 x 60 s
    assert value(samples, "jobfair_database_up") == 1


@pytest.fixture
def top_two() -> Settings:
    return quiet_settings(metrics_top_tenants=2)


async def test_tenants_beyond_the_top_k_fold_into_other_and_the_sums_hold(
    db_url: str, top_two: Settings
):
    async with serving(create_app(top_two, db_url, background=False)) as live:
        c, services = live.client, live.services
        activity = {"k1": 8, "k2": 5, "k3": 3, "k4": 1, "k5": 0}
        for tenant in activity:
            await enqueue(c, "f", tenant, 10)
        await services.stats.sample()
        for tenant, n in activity.items():
            if n:
                await activate(c, "f", n, tenantIds=[tenant])
        await services.activation.settle()
        await services.stats.sample()
        ranker, labels = services.background.ranker, services.background.labels
        assert ranker is not None and labels is not None
        now = utcnow()
        assert await ranker.run_once(now) == 2
        await labels.run_once(now)
        assert services.metrics.labels.members == frozenset()  # not yet: in force later
        await labels.run_once(now + timedelta(seconds=LABELS_LEAD_S))
        assert services.metrics.labels.members == {"k1", "k2"}
        before = await scrape(c)
        for tenant in activity:
            await enqueue(c, "f", tenant, 1)
        after = await scrape(c)
        created = "jobfair_jobs_created_total"
        assert moved(before, after, created, type="f", tenant="k1") == 1
        assert moved(before, after, created, type="f", tenant="k2") == 1
        assert moved(before, after, created, type="f", tenant=OTHER) == 3
        assert total(after, created) - total(before, created) == 5
        for tenant in ("k3", "k4", "k5"):
            assert (
                "jobfair_ready_jobs",
                frozenset({("type", "f"), ("tenant", tenant)}),
            ) not in after
        stats = {
            x["tenantId"]: x for x in (await c.get("/v2/stats")).json()["jobTypes"][0]["tenants"]
        }
        folded = [stats[t] for t in ("k3", "k4", "k5")]
        assert value(after, "jobfair_ready_jobs", type="f", tenant=OTHER) == sum(
            x["ready"] for x in folded
        )
        assert value(after, "jobfair_active_jobs", type="f", tenant=OTHER) == 4
        assert total(after, "jobfair_ready_jobs", type="f") == sum(
            x["ready"] for x in stats.values()
        )
        oldest = value(after, "jobfair_oldest_ready_age_seconds", type="f", tenant=OTHER)
        assert abs(oldest * 1000 - max(x["oldestPendingAgeMs"] for x in folded)) < 1000
        assert value(after, "jobfair_labelled_tenants") == 2
        # The same set again publishes nothing new.
        assert len(await metric_reads.tenant_sets(services.db)) == 1
        await ranker.run_once(utcnow())
        assert len(await metric_reads.tenant_sets(services.db)) == 1


@pytest.fixture
def no_waiting() -> Settings:
    return quiet_settings(max_waiters=0)


async def test_503_answers_are_counted_by_reason(db_url: str, no_waiting: Settings):
    async with serving(create_app(no_waiting, db_url, background=False)) as live:
        before = await scrape(live.client)
        body = {"type": "w", "maxJobs": 1, "timeout": 1000, "requestTimeout": 5000}
        r = await live.client.post("/v2/jobs/activate", json=body)
        assert r.status_code == 503
        after = await scrape(live.client)
        answers = "jobfair_http_503_answers_total"
        assert moved(before, after, answers, reason="resource_exhausted") == 1
        assert moved(before, after, answers, reason="store_unavailable") == 0


async def test_process_state_is_exported(live: Live):
    samples = await scrape(live.client)
    pool = value(samples, "jobfair_db_pool_size")
    # The pool's size as the tests set it (smaller on Citus: tests/fixtures.py).
    assert pool >= 1 and value(samples, "jobfair_db_pool_max") == (CITUS_POOL or 30)
    assert value(samples, "jobfair_db_pool_in_use") + value(samples, "jobfair_db_pool_idle") == pool
    assert value(samples, "jobfair_db_pool_waiting") == 0
    assert value(samples, "jobfair_server_processes") == 1
    assert value(samples, "jobfair_jobs_table_degraded") == 0
    for name in ("jobfair_waiters", "jobfair_streams", "jobfair_activation_queries_total"):
        assert (name, frozenset()) in samples, name


@pytest.fixture
def keys_required() -> Settings:
    # Two labelled tenants at most: a third is folded into <other>.
    return quiet_settings(auth="required", metrics_top_tenants=2)


async def test_a_scoped_key_scrapes_its_own_tenants_and_types_alone(
    db_url: str, keys_required: Settings
):
    async with serving(create_app(keys_required, db_url, background=False)) as live:
        services = live.services
        _, admin = await services.keys.create(Role.ADMIN, None, None, None, None, "test")
        _, scoped = await services.keys.create(Role.WORKER, ["a"], None, None, None, "test")
        assert (await live.client.get("/metrics")).status_code == 401  # as before
        now = utcnow()
        await metric_reads.publish_tenants(services.db, now, ["a", "b"], now)
        assert services.background.labels is not None
        await services.background.labels.run_once(now)
        for tenant in ("a", "b", "c"):
            r = await live.client.post(
                "/v2/jobs",
                json={"type": "s", "tenantId": tenant},
                headers={"Authorization": f"Bearer {admin}"},
            )
            assert r.status_code == 201
        everything = await scrape(live.client, headers={"Authorization": f"Bearer {admin}"})
        assert {t for (n, ls) in everything for k, t in ls if k == "tenant"} >= {"a", "b", OTHER}
        mine = await scrape(live.client, headers={"Authorization": f"Bearer {scoped}"})
        assert {t for (n, ls) in mine for k, t in ls if k == "tenant"} == {"a"}
        assert value(mine, "jobfair_jobs_created_total", type="s", tenant="a") == 1
        assert ("jobfair_waiters", frozenset()) in mine
        # Series of a type alone add up every tenant's events: not for a tenant-scoped key.
        body = {"type": "s", "maxJobs": 1, "timeout": 1000, "requestTimeout": -1}
        admin_auth = {"Authorization": f"Bearer {admin}"}
        r = await live.client.post("/v2/jobs/activate", json=body, headers=admin_auth)
        assert r.status_code == 200
        everything = await scrape(live.client, headers=admin_auth)
        mine = await scrape(live.client, headers={"Authorization": f"Bearer {scoped}"})
        type_wide = [
            "jobfair_activate_requests_total",
            "jobfair_activate_request_seconds_count",
            "jobfair_processing_seconds_count",
        ]
        assert total(everything, type_wide[0], type="s") == 1
        for name in type_wide:
            assert not [k for k in mine if k[0] == name], name


async def test_two_server_processes_add_up_to_the_jobs_created(spawn_server):
    """``--workers 2``: jobs created over many connections (the kernel spreads them over
    both processes), then every scrape, whichever process answers it, counts them all;
    and after the drain, every completion."""
    server = spawn_server("--workers", "2")
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as ready:
        await wait_ready(ready, server)
    n, producers = 200, 20

    async def produce(i: int) -> None:
        # A client of its own: a connection, and a source port, of its own.
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for _ in range(n // producers):
                job = {"type": "two", "tenantId": f"p{i % 4}"}
                assert (await c.post("/v2/jobs", json=job)).status_code == 201

    await asyncio.gather(*(produce(i) for i in range(producers)))

    async def scrapes(k: int) -> list[Samples]:
        out = []
        for _ in range(k):
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
                out.append(await scrape(c))
        return out

    for samples in await scrapes(6):
        assert total(samples, "jobfair_jobs_created_total", type="two") == n
        assert value(samples, "jobfair_server_processes") == 2
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        done = 0
        while jobs := await activate(c, "two", 50):
            r = await c.post(
                "/v2/jobs/complete",
                json={
                    "jobs": [
                        {"jobKey": j["jobKey"], "activationCount": j["activationCount"]}
                        for j in jobs
                    ]
                },
            )
            assert r.status_code == 200
            done += len(jobs)
        assert done == n
    for samples in await scrapes(4):
        assert total(samples, "jobfair_jobs_activated_total", type="two") == n
        assert total(samples, "jobfair_jobs_completed_total", type="two") == n
        assert total(samples, "jobfair_ready_jobs", type="two") == 0
