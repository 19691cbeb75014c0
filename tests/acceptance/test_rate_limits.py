"""Issue 28 §2 through HTTP and on real PostgreSQL: rate limits inside fair share (ADR
028).  A tenant's token bucket bounds its activations exactly -- counted, over the
window, against the bucket's own clock (the database's) -- the others take the rest,
two server processes together give one limit, and a long poll on a limited tenant is
answered when a token comes back, woken by the bucket's timer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import httpx
import pytest

from app.config import Settings
from tests.acceptance.test_pause import queued
from tests.fixtures import Live, ServerProcess, quiet_settings, wait_ready
from tests.helpers import activate, enqueue, tenants_of

# Long enough that nothing in these tests is woken by the backup poll by chance: a
# waiter that gets its job was woken by the token timer (or a notification).
BACKUP_POLL_MS = 60_000


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(backup_poll_ms=BACKUP_POLL_MS)


async def _limit(c: httpx.AsyncClient, tenant: str, per_s: float, burst: float) -> None:
    body = {"rateLimit": {"perSecond": per_s, "burst": burst}}
    r = await c.put(f"/v2/tenants/{tenant}", json=body)
    assert r.status_code == 200, r.text
    # A new limit starts with a full bucket.
    assert r.json()["rateLimit"] == {"perSecond": per_s, "burst": burst, "tokens": burst}


async def _bucket_since(store, tenant: str) -> datetime:
    """The instant the tenant's bucket was last full (its limit set): the window's
    start, on the bucket's own clock."""
    at: datetime = await store.fetchval("SELECT rate_at FROM tenants WHERE tenant_id = $1", tenant)
    return at


async def _db_now(store) -> datetime:
    now: datetime = await store.fetchval("SELECT statement_timestamp()")
    return now


async def test_a_rate_limit_is_set_shown_kept_and_cleared(live: Live, store) -> None:
    c = live.client
    assert (await c.get("/v2/tenants/acme")).json()["rateLimit"] is None
    await _limit(c, "acme", 50, 100)
    assert (await c.get("/v2/tenants/acme")).json()["rateLimit"] == {
        "perSecond": 50,
        "burst": 100,
        "tokens": 100,
    }
    filled = await _bucket_since(store, "acme")
    # The same limit again keeps its bucket; another one starts a full bucket of its own.
    await _limit(c, "acme", 50, 100)
    assert await _bucket_since(store, "acme") == filled
    await _limit(c, "acme", 2.5, 3)
    assert await _bucket_since(store, "acme") > filled
    assert await store.fetchval("SELECT rate_tokens FROM tenants") == 3
    # A PUT without one clears it (a PUT sets the whole configuration).
    r = await c.put("/v2/tenants/acme", json={"weight": 2})
    assert r.json()["rateLimit"] is None
    row = await store.fetchrow("SELECT rate_per_s, rate_tokens, rate_at FROM tenants")
    assert tuple(row) == (None, None, None)
    # Job types alike, and in the list.
    r = await c.put("/v2/job-types/mail", json={"rateLimit": {"perSecond": 10, "burst": 1}})
    limited = {"perSecond": 10, "burst": 1, "tokens": 1}
    assert r.status_code == 200 and r.json()["rateLimit"] == limited
    [listed] = (await c.get("/v2/job-types")).json()["jobTypes"]
    assert listed["rateLimit"] == limited
    assert (await c.get("/v2/job-types/other")).json()["rateLimit"] is None


async def test_a_buckets_tokens_are_shown_as_activations_take_them(live: Live) -> None:
    """The tokens a GET shows are the bucket's now: a full one, less what activations
    took (at 0.001 a second, nothing comes back during the test), never below 0."""
    c = live.client
    await _limit(c, "acme", 0.001, 5)
    await _limit(c, "mail-sender", 0.001, 2)  # a tenant limit, not a job type's
    await enqueue(c, "mail", "acme", 4)
    got = await activate(c, "mail", 3)
    assert len(got) == 3
    tokens = (await c.get("/v2/tenants/acme")).json()["rateLimit"]["tokens"]
    assert 2 <= tokens < 2.01, tokens
    r = await c.put("/v2/job-types/mail", json={"rateLimit": {"perSecond": 0.001, "burst": 1}})
    assert r.json()["rateLimit"]["tokens"] == 1
    assert len(await activate(c, "mail", 3)) == 1  # the type's one token, then none
    shown = (await c.get("/v2/job-types/mail")).json()["rateLimit"]["tokens"]
    assert 0 <= shown < 0.01, shown
    tokens = (await c.get("/v2/tenants/acme")).json()["rateLimit"]["tokens"]
    assert 1 <= tokens < 1.01, tokens


async def _drain_for(
    c: httpx.AsyncClient, job_type: str, seconds: float, max_jobs: int
) -> tuple[list[dict], int]:
    """Activate ``max_jobs`` at a time for ``seconds`` (wall clock: how long the load
    runs, never asserted); the jobs, and how many calls came back short."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    got: list[dict] = []
    short = 0
    while loop.time() < end:
        jobs = await activate(c, job_type, max_jobs)
        short += len(jobs) < max_jobs
        got += jobs
    return got, short


async def test_a_limited_tenant_gets_at_most_burst_plus_rate_x_window_and_the_others_the_rest(
    live: Live, store
) -> None:
    """A limited to 20/s with a burst of 20, beside B unlimited, both backlogged: over ~3 s
    A's activations are at most 20 + 20 x the window (its own bucket's clock), and at
    least 80 % of 20 x the window (the limit is reached, not undershot); every call is
    full (B takes what A may not).  Calls of 25: a bucket refilled to its burst between
    two calls loses what it would have gained, and with calls of 5 and a burst of 5 that
    happened whenever calls were 250 ms apart (48 of 48.5 once, on a loaded machine)."""
    c = live.client
    per_s, burst = 20, 20
    await enqueue(c, "rl", "A", 500)
    await enqueue(c, "rl", "B", 30_000)
    await _limit(c, "A", per_s, burst)
    since = await _bucket_since(store, "A")
    got, short = await _drain_for(c, "rl", 3.0, 25)
    window_s = (await _db_now(store) - since).total_seconds()
    by = tenants_of(got)
    assert by["A"] <= burst + per_s * window_s, (by, window_s)
    assert by["A"] >= 0.8 * per_s * window_s, (by, window_s)
    assert short == 0 and by["B"] == len(got) - by["A"], by
    # The bucket as left: never below zero, never above the burst.
    tokens = await store.fetchval("SELECT rate_tokens FROM tenants WHERE tenant_id = 'A'")
    assert 0 <= tokens <= burst
    # No credit banked: A, held back by its bucket, was lifted to B's virtual time
    # as it moved on (without the lift it would stand at its ~65 activations against
    # its thousands), so it is within a round's picks (a call's 25) of it.
    await live.services.activation.settle()
    vt = dict(await store.fetch("SELECT tenant_id, vtime FROM lanes WHERE job_type = 'rl'"))
    assert vt["A"] >= vt["B"] - 25, vt


async def test_a_job_types_limit_bounds_every_tenant_together(live: Live, store) -> None:
    c = live.client
    await enqueue(c, "slow", "A", 300)
    await enqueue(c, "slow", "B", 300)
    r = await c.put("/v2/job-types/slow", json={"rateLimit": {"perSecond": 30, "burst": 10}})
    assert r.status_code == 200, r.text
    since = await store.fetchval("SELECT rate_at FROM job_types WHERE job_type = 'slow'")
    got, _ = await _drain_for(c, "slow", 2.0, 10)
    window_s = (await _db_now(store) - since).total_seconds()
    assert len(got) <= 10 + 30 * window_s, (len(got), window_s)
    assert len(got) >= 0.8 * 30 * window_s, (len(got), window_s)
    by = tenants_of(got)
    assert abs(by["A"] - by["B"]) <= 10, by  # the type's rate shared fairly


async def test_two_server_processes_together_respect_one_limit(
    spawn_server: Callable[..., ServerProcess], store
) -> None:
    servers = [spawn_server(), spawn_server()]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    try:
        await asyncio.gather(*(wait_ready(cl, s) for cl, s in zip(clients, servers, strict=True)))
        c = clients[0]
        per_s, burst = 25, 5
        await enqueue(c, "rl2", "A", 500)
        await enqueue(c, "rl2", "B", 8000)
        await _limit(c, "A", per_s, burst)
        since = await _bucket_since(store, "A")
        results = await asyncio.gather(*(_drain_for(cl, "rl2", 3.0, 5) for cl in clients))
        window_s = (await _db_now(store) - since).total_seconds()
    finally:
        for cl in clients:
            await cl.aclose()
    each = [tenants_of(jobs)["A"] for jobs, _ in results]
    assert all(n > 0 for n in each), each  # both processes took A's tokens
    assert sum(each) <= burst + per_s * window_s, (each, window_s)
    assert sum(each) >= 0.8 * per_s * window_s, (each, window_s)
    assert all(short == 0 for _, short in results)


async def test_a_long_poll_on_a_limited_tenant_is_answered_when_a_token_comes_back(
    live: Live,
) -> None:
    """A's one token taken, an immediate call gets nothing (the limit holds); a long poll
    then gets A's next job when its token is due, woken by the bucket's timer -- the
    backup poll is a minute away and no job was created meanwhile."""
    c = live.client
    await _limit(c, "A", 2, 1)
    await enqueue(c, "lp", "A", 3)
    assert len(await activate(c, "lp", 3)) == 1
    assert await activate(c, "lp", 3) == []
    hub = live.services.activation.waiters
    polls, token_wakes = hub.backup_polls, hub.token_wakes
    r = await c.post(
        "/v2/jobs/activate",
        json={"type": "lp", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 20_000},
    )
    assert r.status_code == 200, r.text
    assert [j["tenantId"] for j in r.json()["jobs"]] == ["A"]
    assert hub.token_wakes > token_wakes and hub.backup_polls == polls


@pytest.mark.parametrize("where", ["tenant", "job type"])
async def test_a_long_poll_on_a_limited_tenant_is_answered_soon_after_its_limit_is_lifted(
    live: Live, where: str
) -> None:
    """A long poll waiting on a bucket that refills in 1,000 s is answered soon after the
    limit is lifted, not at the bucket's next token: a process rests a used-up bucket
    (gives it nothing without reading it) for RESTING_AT_MOST_S at most, and its waiters
    look again then (a token wake), so a lifted or raised limit applies within that time
    (ADR 028).  The backup poll is a minute away and the poll's own timeout 20 s: had the
    waiter waited for the bucket, it would have answered nothing."""
    c = live.client
    path = "/v2/tenants/A" if where == "tenant" else "/v2/job-types/lift"
    r = await c.put(path, json={"rateLimit": {"perSecond": 0.001, "burst": 1}})
    assert r.status_code == 200, r.text
    await enqueue(c, "lift", "A", 3)
    assert len(await activate(c, "lift", 3)) == 1
    hub = live.services.activation.waiters
    polls, token_wakes = hub.backup_polls, hub.token_wakes
    poll = asyncio.ensure_future(
        c.post(
            "/v2/jobs/activate",
            json={"type": "lift", "maxJobs": 2, "timeout": 60_000, "requestTimeout": 20_000},
        )
    )
    await queued(live, 1)
    assert (await c.put(path, json={})).status_code == 200
    r = await poll
    assert r.status_code == 200, r.text
    assert [j["tenantId"] for j in r.json()["jobs"]] == ["A", "A"]
    assert hub.token_wakes > token_wakes and hub.backup_polls == polls


async def test_a_stream_on_a_limited_tenant_gets_each_job_as_its_token_comes_back(
    live: Live, store
) -> None:
    """Streams wait as long polls do: with credit for 5 and A limited to 4/s (burst 1),
    the stream gets its first job from the burst and the next three as their tokens come
    due, woken by the bucket's timer (the backup poll is a minute away, and no job is
    created meanwhile); never more than the bucket allowed by the time of the last."""
    from tests.acceptance.test_streams import Events

    c = live.client
    await _limit(c, "A", 4, 1)
    since = await _bucket_since(store, "A")
    await enqueue(c, "st", "A", 10)
    hub = live.services.activation.waiters
    token_wakes = hub.token_wakes
    url = "/v2/jobs/stream?type=st&maxJobs=5&timeout=60000&worker=w"
    async with c.stream("GET", url) as r:
        assert r.status_code == 200
        events = Events(r)
        got = [await events.next_job(wait_s=10) for _ in range(4)]
        window_s = (await _db_now(store) - since).total_seconds()
        events.reader.cancel()
    assert [j["tenantId"] for j in got] == ["A"] * 4
    assert len(got) <= 1 + 4 * window_s
    assert hub.token_wakes >= token_wakes + 2  # the timer, not a poll, woke them
