"""Issue 3: long polls wake on work (NOTIFY), not on a timer, without a stampede."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from app.config import Settings
from tests.fixtures import quiet_settings

POLL = {"type": "lp", "maxJobs": 1, "timeout": 60_000}


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    """quiet_settings, with a test's own (``parametrize("settings", ..., indirect=True)``)."""
    return quiet_settings(**getattr(request, "param", {}))


async def metric(c: httpx.AsyncClient, name: str) -> float:
    text = (await c.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def until_waiting(c: httpx.AsyncClient, n: int) -> None:
    """Wait until the server holds n waiters (it exposes the count; no fixed sleep)."""
    deadline = time.monotonic() + 30
    while await metric(c, "jobfair_waiters") != n:
        assert time.monotonic() < deadline, f"waiters never reached {n}"
        await asyncio.sleep(0.02)


async def test_waiting_poll_gets_a_job_created_later_at_once(live):
    c = live.client
    poll = asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 10_000}))
    await until_waiting(c, 1)
    await asyncio.sleep(0.3)  # the scenario: the job arrives 300 ms into the wait
    created = time.monotonic()
    job = (await c.post("/v2/jobs", json={"type": "lp"})).json()
    r = await poll
    latency = time.monotonic() - created
    assert [j["jobKey"] for j in r.json()["jobs"]] == [job["jobKey"]]
    # Woken by NOTIFY, far sooner than the backup poll (~1 s) or the request timeout.
    assert latency < 0.5, latency


async def test_negative_request_timeout_answers_at_once(live):
    t0 = time.monotonic()
    r = await live.client.post("/v2/jobs/activate", json={**POLL, "requestTimeout": -1})
    assert r.json() == {"jobs": []}
    assert time.monotonic() - t0 < 0.3


async def test_a_call_that_does_not_wait_is_held_back_only_by_waiters_it_competes_with(live):
    """Found from outside: a long poll waiting for tenant a made every call that does not
    wait answer [], even one asking only for tenant b, whose job nobody waiting could
    take.  Waiters are owed first only what they could take."""
    c = live.client
    r = await c.post("/v2/jobs", json={"type": "owed", "tenantId": "b"})
    assert r.status_code == 201
    waiting = asyncio.create_task(
        c.post(
            "/v2/jobs/activate",
            json={**POLL, "type": "owed", "tenantIds": ["a"], "requestTimeout": 20_000},
        )
    )
    await until_waiting(c, 1)
    now = {**POLL, "type": "owed", "requestTimeout": -1}
    # Any tenant: it competes with the waiter for a's jobs, which are owed to it first.
    assert (await c.post("/v2/jobs/activate", json=now)).json() == {"jobs": []}
    [job] = (await c.post("/v2/jobs/activate", json={**now, "tenantIds": ["b"]})).json()["jobs"]
    assert job["tenantId"] == "b"
    await c.post("/v2/jobs", json={"type": "owed", "tenantId": "a"})
    [theirs] = (await waiting).json()["jobs"]
    assert theirs["tenantId"] == "a"


async def test_request_timeout_answers_empty_after_it(live):
    t0 = time.monotonic()
    r = await live.client.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 500})
    elapsed = time.monotonic() - t0
    assert r.json() == {"jobs": []}
    assert 0.45 <= elapsed < 1.5, elapsed


async def test_one_job_wakes_one_of_200_waiters_with_bounded_queries(live):
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
    async with httpx.AsyncClient(base_url=live.url, timeout=60, limits=limits) as many:
        polls = [
            asyncio.create_task(
                many.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 60_000})
            )
            for _ in range(200)
        ]
        await until_waiting(live.client, 200)
        before = await metric(live.client, "jobfair_wake_queries_total")
        job = (await live.client.post("/v2/jobs", json={"type": "lp"})).json()
        done, pending = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
        after = await metric(live.client, "jobfair_wake_queries_total")
        # One query for the woken waiter; a jittered backup poll may add one more.
        assert after - before <= 2, after - before
        [winner] = done
        assert [j["jobKey"] for j in winner.result().json()["jobs"]] == [job["jobKey"]]
        # Everyone else is still waiting, and the job was activated exactly once.
        assert len(pending) == 199 and await metric(live.client, "jobfair_waiters") == 199
        now = (await live.client.get(f"/v2/jobs/{job['jobKey']}")).json()
        assert now["activationCount"] == 1
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


@pytest.mark.parametrize("settings", [{"backup_poll_ms": 3_600_000}], indirect=True)
async def test_polls_joining_a_type_found_empty_ask_the_database_nothing(live):
    """The first poll found the type empty; until a job of the type is announced, later
    polls join the queue without an activation query of their own (before, each one
    cost a query that could only come back empty).  No backup poll runs meanwhile (an
    hour apart here): on a busy machine the 20 polls took long enough for two."""
    c = live.client
    first = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 20_000})
    )
    await until_waiting(c, 1)
    before = await metric(c, "jobfair_activation_queries_total")
    later = []
    for i in range(20):
        later.append(
            asyncio.create_task(
                c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 20_000})
            )
        )
        await until_waiting(c, 2 + i)
    assert await metric(c, "jobfair_activation_queries_total") == before
    job = (await c.post("/v2/jobs", json={"type": "lp"})).json()
    assert [j["jobKey"] for j in (await first).json()["jobs"]] == [job["jobKey"]]
    for p in later:
        p.cancel()
    await asyncio.gather(*later, return_exceptions=True)


async def test_a_trickle_of_jobs_costs_one_activation_round_each(live):
    """Each NOTIFY says how many jobs it announces: once the head waiter took the one
    job, the dispatcher knows the type is dry again and does not read to find out
    (before, every job cost a second round for the next waiter, which found nothing)."""
    c = live.client
    polls = []
    for i in range(4):
        polls.append(
            asyncio.create_task(
                c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 20_000})
            )
        )
        await until_waiting(c, i + 1)
    before = await metric(c, "jobfair_activation_queries_total")
    leads = await metric(c, "jobfair_activation_lead_claims_total")
    for poll in polls[:3]:
        job = (await c.post("/v2/jobs", json={"type": "lp"})).json()
        assert [j["jobKey"] for j in (await poll).json()["jobs"]] == [job["jobKey"]]
    # One round per job; a jittered backup poll (every ~1 s) may add one.
    assert await metric(c, "jobfair_activation_queries_total") - before <= 3 + 1
    # Each was one job announced to an idle type: read and claimed in one statement.
    assert await metric(c, "jobfair_activation_lead_claims_total") - leads == 3
    polls[3].cancel()
    await asyncio.gather(polls[3], return_exceptions=True)


async def test_waiters_are_served_in_arrival_order(live):
    c = live.client
    first = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "worker": "first", "requestTimeout": 5000})
    )
    await until_waiting(c, 1)
    second = asyncio.create_task(
        c.post("/v2/jobs/activate", json={**POLL, "worker": "second", "requestTimeout": 5000})
    )
    await until_waiting(c, 2)
    await c.post("/v2/jobs", json={"type": "lp"})
    r = await first
    assert r.json()["jobs"][0]["worker"] == "first"
    await c.post("/v2/jobs", json={"type": "lp"})
    assert (await second).json()["jobs"][0]["worker"] == "second"


async def test_a_lost_listen_connection_costs_at_most_the_backup_poll(live):
    c = live.client
    notifier = live.services.notifier
    pid = notifier.conn.get_server_pid()
    await live.services.db.execute("SELECT pg_terminate_backend($1::int)", pid)
    poll = asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 10_000}))
    await until_waiting(c, 1)
    t0 = time.monotonic()
    job = (await c.post("/v2/jobs", json={"type": "lp"})).json()
    r = await poll
    assert r.json()["jobs"][0]["jobKey"] == job["jobKey"]
    # Backup poll is 1 s +-25 %, the reconnect also wakes everyone: well under 2 s.
    assert time.monotonic() - t0 < 2.0
    deadline = time.monotonic() + 10
    while await metric(c, "jobfair_listen_connections_total") < 2:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_client_gone_during_a_long_poll_activates_nothing(live):
    c = live.client
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as leaving:
        poll = asyncio.create_task(
            leaving.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 20_000})
        )
        await until_waiting(c, 1)
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
    await until_waiting(c, 0)  # the server noticed and dropped the waiter
    job = (await c.post("/v2/jobs", json={"type": "lp"})).json()
    await asyncio.sleep(0.2)  # a wrongly kept waiter would have been woken by now
    now = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
    assert now["state"] == "CREATED" and now["activationCount"] == 0
