"""Issue 44 §1: caps per fairness key (ADR 040) are exact, work-conserving, released by
whatever ends an activation, and configured with clear 400s for bad input."""

from __future__ import annotations

import asyncio
import random

import httpx

from app.db.locks import KEY_CAP_LOCK_CLASS, TYPE_KEYS_LOCK_CLASS
from app.domain import utcnow
from app.sweepers import KeyHoldSweeper
from tests.acceptance.test_metrics import scrape
from tests.fixtures import wait_ready
from tests.helpers import activate, assert_problem, complete, enqueue

UNFINISHED = "SELECT count(*) FROM jobs WHERE state <> 'COMPLETED'"
MOST_PER_KEY = """
SELECT coalesce(max(n), 0) FROM (
    SELECT count(*) AS n FROM jobs WHERE state = 'ACTIVATED' AND job_type = ANY($1::text[])
    GROUP BY tenant_id, fairness_key) c
"""


async def _enqueue_keys(c: httpx.AsyncClient, job_type: str, tenant: str, keys: list[str], n: int):
    jobs = [
        {"type": job_type, "tenantId": tenant, "fairnessKey": keys[i % len(keys)]} for i in range(n)
    ]
    r = await c.post("/v2/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text


async def test_key_configuration_answers_its_cap_and_refuses_bad_input(live, store):
    c = live.client
    r = await c.put("/v2/tenants/acme/keys/cust-1", json={"weight": 3, "maxActiveJobs": 2})
    assert r.status_code == 200, r.text
    assert r.json()["maxActiveJobs"] == 2 and r.json()["weight"] == 3
    assert (await c.get("/v2/tenants/acme/keys/cust-1")).json()["maxActiveJobs"] == 2
    r = await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    assert r.status_code == 200 and r.json()["maxActivePerKey"] == 1
    assert (await c.get("/v2/job-types/mail")).json()["maxActivePerKey"] == 1
    for bad in (
        {"maxActiveJobs": -1},
        {"maxActiveJobs": 1.5},
        {"maxActiveJobs": "2"},
        {"maxActiveJobs": 2**31},
    ):
        problem = assert_problem(await c.put("/v2/tenants/acme/keys/cust-1", json=bad), 400)
        assert "maxActiveJobs" in problem["detail"]
    for bad in ({"maxActivePerKey": 0}, {"maxActivePerKey": True}, {"maxActivePerKey": 2**31}):
        problem = assert_problem(await c.put("/v2/job-types/mail", json=bad), 400)
        assert "maxActivePerKey" in problem["detail"]
    # Nothing changed by the refused ones.
    assert (await c.get("/v2/tenants/acme/keys/cust-1")).json()["maxActiveJobs"] == 2
    assert (await c.get("/v2/job-types/mail")).json()["maxActivePerKey"] == 1
    assert await store.fetchval("SELECT max_active_jobs FROM key_weights") == 2


async def test_a_key_at_its_cap_gives_its_picks_to_the_tenants_other_keys(live, store):
    c = live.client
    await c.put("/v2/tenants/acme/keys/big", json={"maxActiveJobs": 1})
    await enqueue(c, "mail", "acme", 20, fairnessKey="big")
    await enqueue(c, "mail", "acme", 20, fairnessKey="small")
    jobs = await activate(c, "mail", 10)
    keys = [j["fairnessKey"] for j in jobs]
    assert keys.count("big") == 1 and keys.count("small") == 9
    # Held, it stays out until its job ends; then its next job goes out, once.
    more = await activate(c, "mail", 10)
    assert [j["fairnessKey"] for j in more] == ["small"] * 10
    # Explained: the waiting job of big names its key's cap.
    waiting = await store.fetchval(
        "SELECT job_key FROM jobs WHERE state = 'CREATED' AND fairness_key = 'big' LIMIT 1"
    )
    explained = (await c.get(f"/v2/jobs/{waiting}/explain")).json()
    assert {"reason": "keyCap", "active": 1, "limit": 1} in explained["reasons"]
    assert explained["activatableNow"] is False
    # And the stats show the key's cap, its running job and its hold.
    stats = (await c.get("/v2/stats", params={"type": "mail"})).json()
    [lane] = stats["jobTypes"][0]["tenants"]
    shown = {k["fairnessKey"]: k for k in lane["keys"]}
    assert shown["big"]["maxActiveJobs"] == 1 and shown["big"]["held"] is True
    assert shown["big"]["active"] == 1 and shown["big"]["activeAllTypes"] == 1
    assert shown["small"]["maxActiveJobs"] is None and shown["small"]["active"] is None
    [big] = [j for j in jobs if j["fairnessKey"] == "big"]
    assert (await complete(c, big)).status_code == 204
    again = await activate(c, "mail", 5)
    assert [j["fairnessKey"] for j in again].count("big") == 1


async def test_a_tenant_whose_keys_are_all_at_their_caps_gives_its_turns_away(live):
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    await _enqueue_keys(c, "mail", "heavy", ["k1", "k2"], 40)
    # The type's per-key cap is every key's, light's too: one job a key, forty keys.
    await _enqueue_keys(c, "mail", "light", [f"l{i}" for i in range(40)], 40)
    first = await activate(c, "mail", 10)
    heavy = [j for j in first if j["tenantId"] == "heavy"]
    assert sorted(j["fairnessKey"] for j in heavy) == ["k1", "k2"]
    assert len(first) == 10  # never fewer while others have eligible jobs
    second = await activate(c, "mail", 10)
    assert {j["tenantId"] for j in second} == {"light"} and len(second) == 10


async def test_the_per_key_cap_of_a_type_counts_that_type_only_and_a_keys_own_cap_every_type(
    live, store
):
    c = live.client
    await c.put("/v2/job-types/a", json={"maxActivePerKey": 1})
    await enqueue(c, "a", "t", 5, fairnessKey="k")
    await enqueue(c, "b", "t", 5, fairnessKey="k")
    assert len(await activate(c, "a", 5)) == 1
    assert len(await activate(c, "b", 5)) == 5  # b has no per-key cap
    waiting = await store.fetchval(
        "SELECT job_key FROM jobs WHERE state = 'CREATED' AND job_type = 'a' LIMIT 1"
    )
    explained = (await c.get(f"/v2/jobs/{waiting}/explain")).json()
    assert {"reason": "perKeyCap", "active": 1, "limit": 1} in explained["reasons"]
    await c.put("/v2/tenants/t/keys/j", json={"maxActiveJobs": 2})
    await enqueue(c, "a", "t", 5, fairnessKey="j")
    await enqueue(c, "b", "t", 5, fairnessKey="j")
    got = await activate(c, "b", 5) + await activate(c, "a", 5)
    assert len(got) == 2  # j's cap spans both types
    assert (
        await store.fetchval(
            "SELECT count(*) FROM jobs WHERE state = 'ACTIVATED' AND fairness_key = 'j'"
        )
        == 2
    )


async def test_raising_or_removing_a_cap_releases_held_keys(live):
    c = live.client
    await c.put("/v2/tenants/t/keys/k", json={"maxActiveJobs": 1})
    await enqueue(c, "mail", "t", 5, fairnessKey="k")
    assert len(await activate(c, "mail", 5)) == 1
    assert await activate(c, "mail", 5) == []
    await c.put("/v2/tenants/t/keys/k", json={"maxActiveJobs": 3})
    assert len(await activate(c, "mail", 5)) == 2
    await c.delete("/v2/tenants/t/keys/k")
    assert len(await activate(c, "mail", 5)) == 2


async def test_a_waiting_worker_handed_a_new_job_respects_the_key_cap(live, store):
    """The hand-off and the one-pick claim claim nothing where a key cap is involved:
    the rounds count it."""
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    body = {"type": "mail", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 5_000}
    waiters = [asyncio.create_task(c.post("/v2/jobs/activate", json=body)) for _ in range(3)]
    await asyncio.sleep(0.3)  # the waiters are parked (no event exposes it over HTTP)
    for _ in range(3):
        r = await c.post("/v2/jobs", json={"type": "mail", "tenantId": "t", "fairnessKey": "k"})
        assert r.status_code == 201
    answers = await asyncio.gather(*waiters)
    assert sum(len(a.json()["jobs"]) for a in answers) == 1
    assert await store.fetchval(MOST_PER_KEY, ["mail"]) == 1


async def test_key_caps_hold_with_racing_workers_on_two_server_processes(spawn_server, store):
    """Workers on two processes activate, complete, fail (with retries) and let leases
    expire, while a sampler reads the database: no key ever has more ACTIVATED jobs than
    its caps, and every job is completed in the end."""
    servers = [spawn_server(JOBFAIR_DB_POOL_SIZE="10") for _ in range(2)]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    rng = random.Random(44)
    most = 0
    stop = asyncio.Event()
    try:
        for cl, server in zip(clients, servers, strict=True):
            await wait_ready(cl, server)
        a, b = clients
        await a.put("/v2/job-types/x", json={"maxActivePerKey": 2})
        await b.put("/v2/tenants/t1/keys/k0", json={"maxActiveJobs": 1})
        # A tenant cap beside the key caps: its locks come first in every claim.
        await b.put("/v2/tenants/t2", json={"weight": 2, "maxActiveJobs": 5})
        keys = [f"k{i}" for i in range(30)]
        for tenant in ("t1", "t2"):
            await _enqueue_keys(a, "x", tenant, keys, 150)

        async def sampler() -> None:
            nonlocal most
            while not stop.is_set():
                most = max(most, await store.fetchval(MOST_PER_KEY, ["x"]))
                k0 = await store.fetchval(
                    "SELECT count(*) FROM jobs WHERE state = 'ACTIVATED'"
                    " AND tenant_id = 't1' AND fairness_key = 'k0'"
                )
                assert k0 <= 1
                t2 = await store.fetchval(
                    "SELECT count(*) FROM jobs WHERE state = 'ACTIVATED' AND tenant_id = 't2'"
                )
                assert t2 <= 5
                await asyncio.sleep(0)

        async def worker(cl: httpx.AsyncClient) -> None:
            while await store.fetchval(UNFINISHED):
                lease = rng.choice([300, 60_000])
                jobs = await activate(cl, "x", rng.randint(1, 8), lease_ms=lease)
                if not jobs:
                    await asyncio.sleep(0.1)  # short leases left to run out, or held keys
                for job in jobs:
                    roll = rng.random()
                    if roll < 0.1 and lease == 300:
                        continue  # left to expire: the sweep ends it and frees its key
                    if roll < 0.2:
                        r = await cl.post(
                            f"/v2/jobs/{job['jobKey']}/fail",
                            json={"retries": 1, "activationCount": job["activationCount"]},
                        )
                    else:
                        r = await complete(cl, job)
                    # A lease of 300 ms may have run out: fenced, the job went back.
                    assert r.status_code == 204 or (lease == 300 and r.status_code == 409), r.text

        watch = asyncio.create_task(sampler())
        # Until every job is completed: a key left held with room would stop that (the
        # test's timeout), as would a job lost.
        await asyncio.wait_for(
            asyncio.gather(*(worker(clients[i % 2]) for i in range(8))), timeout=120
        )
        stop.set()
        await watch
        assert 1 <= most <= 2
        left = await store.fetch(
            "SELECT state, deadline < now() AS expired, count(*) FROM jobs"
            " WHERE state <> 'COMPLETED' GROUP BY 1, 2"
        )
        held = await store.fetch("SELECT tenant_id, fairness_key FROM lane_keys WHERE held")
        assert not left, (left, held)
    finally:
        stop.set()
        for cl in clients:
            await cl.aclose()
    for server in servers:
        server.proc.terminate()
        assert server.proc.wait(timeout=30) == 0, server.log.read_text()


async def test_the_leaders_sweep_releases_a_key_an_older_servers_finish_left_held(live, store):
    """A server older than alembic 0016 finishes jobs without releasing key holds (during
    a rolling upgrade): the leader's sweep lets such a key out within its interval."""
    c = live.client
    await c.put("/v2/tenants/t/keys/k", json={"maxActiveJobs": 1})
    await enqueue(c, "mail", "t", 3, fairnessKey="k")
    [job] = await activate(c, "mail", 5)
    assert await activate(c, "mail", 5) == []  # k is held now
    # The old server's completion: the job ends, the hold stays.
    await store.execute(
        "UPDATE jobs SET state = 'COMPLETED', completed_at = now(), deadline = NULL"
        " WHERE job_key = $1",
        int(job["jobKey"]),
    )
    assert await activate(c, "mail", 5) == []
    assert await KeyHoldSweeper(store).run_once(utcnow()) == 1
    assert len(await activate(c, "mail", 5)) == 1


async def test_metrics_count_the_keys_held_at_their_caps(live):
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    for key in ("a", "b", "c"):
        await enqueue(c, "mail", "t", 2, fairnessKey=key)
    await activate(c, "mail", 2)  # two keys at their caps, held
    samples = await scrape(c)
    assert samples[("jobfair_keys_held", frozenset({("type", "mail")}))] == 2


async def test_the_sweep_releases_only_keys_with_room_a_chunk_at_a_time(live, store):
    """Thousands of held keys: those with room go (in transactions of KEY_RELEASE_CHUNK
    keys, each of which is a lock: the sweep took them all at once and ran PostgreSQL out
    of shared memory), those at their caps stay held."""
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    keys = [f"k{i}" for i in range(1_200)]
    await _enqueue_keys(c, "mail", "t", keys, 2 * len(keys))
    got = await activate(c, "mail", 1_000) + await activate(c, "mail", 1_000)
    assert len(got) == 1_200
    assert await store.fetchval("SELECT count(*) FROM lane_keys WHERE held") == 1_200
    # An older server's completions of 700 of them: ended, their keys still held.
    ended = [int(j["jobKey"]) for j in got[:700]]
    await store.execute(
        "UPDATE jobs SET state = 'COMPLETED', completed_at = now(), deadline = NULL"
        " WHERE job_key = ANY($1::bigint[])",
        ended,
    )
    assert await KeyHoldSweeper(store).run_once(utcnow()) == 700
    assert await store.fetchval("SELECT count(*) FROM lane_keys WHERE held") == 500
    assert len(await activate(c, "mail", 1_000)) == 700


async def test_a_lowered_per_key_cap_waits_for_the_claims_counting_under_the_old_one(live, store):
    """A claim counting a key under maxActivePerKey 3 while the type is changed to 1: the
    change waits for it (it answered 200 before such a claim committed, which then took
    the key past the new cap), and every claim after it counts under 1."""
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 3})
    await enqueue(c, "mail", "t", 10, fairnessKey="k")
    key_lock = "hashtext('t' || chr(31) || 'k')"
    async with store.connection() as blocker:
        await blocker.execute(f"SELECT pg_advisory_lock({KEY_CAP_LOCK_CLASS}, {key_lock})")
        claim = asyncio.create_task(activate(c, "mail", 10))
        await _until_waiting(store, KEY_CAP_LOCK_CLASS)  # the claim waits for the key
        change = asyncio.create_task(c.put("/v2/job-types/mail", json={"maxActivePerKey": 1}))
        await _until_waiting(store, TYPE_KEYS_LOCK_CLASS)  # the change waits for the claim
        assert not change.done()
        await blocker.execute(f"SELECT pg_advisory_unlock({KEY_CAP_LOCK_CLASS}, {key_lock})")
    assert len(await claim) == 3  # counted under the cap it read, before the change
    assert (await change).status_code == 200
    assert await activate(c, "mail", 10) == []  # 3 running, the cap 1 now


async def _until_waiting(store, lock_class: int) -> None:
    """Until a session waits for an advisory lock of ``lock_class`` (pg_locks)."""
    while not await store.fetchval(  # noqa: ASYNC110 (another session's lock: no event here)
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid = ($1::bigint & 4294967295)::oid",
        lock_class,
    ):
        await asyncio.sleep(0.01)


async def test_a_job_waits_for_no_round_limit_behind_hundreds_of_tenants_whose_keys_are_held(
    live,
):
    """300 tenants whose every key is at its cap stay backlogged ahead (in virtual time)
    of a tenant whose one new job may run: a call for one job finds it (it got [] after
    256 rounds, one such lane excluded a round)."""
    c = live.client
    await c.put("/v2/job-types/mail", json={"maxActivePerKey": 1})
    jobs = [
        {"type": "mail", "tenantId": f"t{i}", "fairnessKey": "k"}
        for i in range(300)
        for _ in (1, 2)
    ]
    assert (await c.post("/v2/jobs/batch", json={"jobs": jobs})).status_code == 201
    assert len(await activate(c, "mail", 1_000)) == 300  # one a key: every key held now
    # A tenant served 30 jobs since: its virtual time is past theirs.
    await _enqueue_keys(c, "mail", "late", [f"f{i}" for i in range(30)], 30)
    assert len(await activate(c, "mail", 30)) == 30
    await enqueue(c, "mail", "late", 1, fairnessKey="fresh")
    [job] = await activate(c, "mail", 1)
    assert job["tenantId"] == "late"


async def test_metrics_show_a_keys_cap_against_its_active_jobs(live):
    c = live.client
    await c.put("/v2/tenants/t/keys/k", json={"maxActiveJobs": 2})
    await enqueue(c, "mail", "t", 3, fairnessKey="k")
    await enqueue(c, "mail", "t", 1, fairnessKey="free")
    await activate(c, "mail", 4)  # k at its cap (2 of 3), held; free drained
    await live.services.stats.sample()
    samples = await scrape(c)
    k = frozenset({("type", "mail"), ("tenant", "t"), ("key", "k")})
    assert samples[("jobfair_key_max_active_jobs", k)] == 2
    assert samples[("jobfair_key_active_jobs", k)] == 2
    assert samples[("jobfair_key_held", k)] == 1
    free = frozenset({("type", "mail"), ("tenant", "t"), ("key", "free")})
    assert ("jobfair_key_max_active_jobs", free) not in samples
    assert samples[("jobfair_key_held", free)] == 0
