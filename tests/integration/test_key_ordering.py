"""Issue 44 §2: a type whose keys are FIFO (keyOrdering "fifo", ADR 041) activates each
fairness key's jobs one at a time, in creation order, whatever their priorities; a
retried or expired head stays the head, a FAILED head blocks its key until an operator
cancels or revives it, and keys are still served by weight."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import httpx

from app.db.claims import SQL as CLAIMS
from app.db.lanes import CHARGE_ARRAYS
from app.db.lanes import SQL as LANES
from app.db.metric_reads import SQL as METRICS
from app.db.operating import SQL as OPERATORS
from app.domain import utcnow
from app.sweepers import KeyHoldSweeper, LeaseSweeper, Promoter, RetentionSweeper
from tests.acceptance.test_metrics import scrape, value
from tests.fixtures import wait_ready
from tests.helpers import activate, assert_problem, complete
from tests.integration.test_claim import _jobs_scans, _plan


async def _enqueue(c: httpx.AsyncClient, job_type: str, tenant: str, jobs: list[dict]) -> list[int]:
    r = await c.post(
        "/v2/jobs/batch", json={"jobs": [{"type": job_type, "tenantId": tenant, **j} for j in jobs]}
    )
    assert r.status_code == 201, r.text
    return [int(k) for k in r.json()["jobKeys"]]


async def test_key_ordering_is_answered_and_bad_values_are_refused(live, store):
    c = live.client
    r = await c.put("/v2/job-types/mail", json={"keyOrdering": "fifo", "maxActivePerKey": 3})
    assert r.status_code == 200, r.text
    assert r.json()["keyOrdering"] == "fifo"
    assert (await c.get("/v2/job-types/mail")).json()["keyOrdering"] == "fifo"
    assert (await c.get("/v2/job-types/other")).json()["keyOrdering"] is None
    for bad in ({"keyOrdering": "FIFO"}, {"keyOrdering": "lifo"}, {"keyOrdering": 1},
                {"keyOrdering": True}, {"keyOrdering": ""}, {"keyOrdering": ["fifo"]}):  # fmt: skip
        problem = assert_problem(await c.put("/v2/job-types/mail", json=bad), 400)
        assert "keyOrdering" in problem["detail"], problem
    assert await store.fetchval("SELECT key_ordering FROM job_types") == "fifo"
    # Set back to null: by priority again.
    r = await c.put("/v2/job-types/mail", json={"keyOrdering": None})
    assert r.json()["keyOrdering"] is None


async def test_each_key_gives_its_oldest_job_alone_whatever_the_priorities(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    # Later jobs have higher priorities: by priority they would go first.
    a = await _enqueue(c, "x", "t", [{"fairnessKey": "a", "priority": p} for p in (0, 50, 100)])
    b = await _enqueue(c, "x", "t", [{"fairnessKey": "b", "priority": p} for p in (10, 90)])
    first = await activate(c, "x", 10)
    assert sorted(int(j["jobKey"]) for j in first) == sorted([a[0], b[0]])
    assert await activate(c, "x", 10) == []  # each key's head is out: nothing else
    by_key = {j["fairnessKey"]: j for j in first}
    assert (await complete(c, by_key["a"])).status_code == 204
    [nxt] = await activate(c, "x", 10)
    assert int(nxt["jobKey"]) == a[1]
    assert (await complete(c, nxt)).status_code == 204
    assert (await complete(c, by_key["b"])).status_code == 204
    got = await activate(c, "x", 10)
    assert sorted(int(j["jobKey"]) for j in got) == sorted([a[2], b[1]])


async def _fail(c: httpx.AsyncClient, job: dict, **body: object) -> None:
    r = await c.post(
        f"/v2/jobs/{job['jobKey']}/fail", json={"activationCount": job["activationCount"], **body}
    )
    assert r.status_code == 204, r.text


async def test_a_retried_or_expired_head_stays_the_head_of_its_key(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    keys = await _enqueue(c, "x", "t", [{"fairnessKey": "k"}] * 3)
    [head] = await activate(c, "x", 5)
    assert int(head["jobKey"]) == keys[0]
    # Failed with a retry and a back-off: SCHEDULED, and still the head.
    await _fail(c, head, retries=2, retryBackOff=60_000)
    assert await activate(c, "x", 5) == []
    waiting = (await c.get(f"/v2/jobs/{keys[1]}/explain")).json()
    assert {"reason": "keyHead", "head": str(keys[0]), "headState": "CREATED"} in waiting[
        "reasons"
    ], waiting
    # Due now: the promoter makes it CREATED, and its key's hold goes with it.
    await store.execute(
        "UPDATE jobs SET run_at = now() - interval '1 s' WHERE job_key = $1", keys[0]
    )
    assert await Promoter(store, 1000).run_once(utcnow()) == 1
    [again] = await activate(c, "x", 5)
    assert int(again["jobKey"]) == keys[0] and again["activationCount"] == 2
    # A lease that runs out: back to CREATED, the head still.
    await store.execute(
        "UPDATE jobs SET deadline = now() - interval '1 s' WHERE job_key = $1", keys[0]
    )
    assert await LeaseSweeper(store, 1000).run_once(utcnow()) == 1
    [third] = await activate(c, "x", 5)
    assert int(third["jobKey"]) == keys[0] and third["activationCount"] == 3
    # Failed with a retry and no back-off: CREATED at once, the head.
    await _fail(c, third, retries=1)
    [fourth] = await activate(c, "x", 5)
    assert int(fourth["jobKey"]) == keys[0]
    assert (await complete(c, fourth)).status_code == 204
    [nxt] = await activate(c, "x", 5)
    assert int(nxt["jobKey"]) == keys[1]


async def test_a_failed_head_blocks_its_key_until_an_operator_cancels_or_revives_it(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    keys = await _enqueue(c, "x", "t", [{"fairnessKey": "k"}] * 3)
    other = await _enqueue(c, "x", "t", [{"fairnessKey": "free"}] * 2)
    jobs = await activate(c, "x", 5)
    head = next(j for j in jobs if j["fairnessKey"] == "k")
    await _fail(c, head, retries=0, errorMessage="boom")  # an incident: FAILED
    free = next(j for j in jobs if j["fairnessKey"] == "free")
    assert (await complete(c, free)).status_code == 204
    # Never skipped: the key gives nothing while its head is FAILED; the other key goes on.
    got = await activate(c, "x", 5)
    assert [int(j["jobKey"]) for j in got] == [other[1]]
    explained = (await c.get(f"/v2/jobs/{keys[1]}/explain")).json()
    assert {"reason": "keyHead", "head": str(keys[0]), "headState": "FAILED"} in explained[
        "reasons"
    ]
    assert explained["activatableNow"] is False
    # The metrics count the key stopped behind its FAILED head (an operator's alert).
    assert value(await scrape(c), "jobfair_fifo_keys_failed_head", type="x") == 1
    # Revived (PATCH retries), it is the head again and goes out first.
    r = await c.patch(f"/v2/jobs/{keys[0]}", json={"changeset": {"retries": 1}})
    assert r.status_code == 204, r.text
    [revived] = await activate(c, "x", 5)
    assert int(revived["jobKey"]) == keys[0]
    assert value(await scrape(c), "jobfair_fifo_keys_failed_head", type="x") == 0
    await _fail(c, revived, retries=0)
    assert await activate(c, "x", 5) == []
    # Canceled by an operator, it lets the key go on, in order.
    assert (await c.post(f"/v2/jobs/{keys[0]}/cancel")).status_code == 204
    assert (await c.get(f"/v2/jobs/{keys[0]}")).json()["state"] == "CANCELED"
    [nxt] = await activate(c, "x", 5)
    assert int(nxt["jobKey"]) == keys[1]
    assert value(await scrape(c), "jobfair_fifo_keys_failed_head", type="x") == 0
    # A FAILED job behind an ACTIVATED head is not a head; once that one is done, it is.
    await store.execute("UPDATE jobs SET state = 'FAILED' WHERE job_key = $1", keys[2])
    assert value(await scrape(c), "jobfair_fifo_keys_failed_head", type="x") == 0
    assert (await complete(c, nxt)).status_code == 204
    assert value(await scrape(c), "jobfair_fifo_keys_failed_head", type="x") == 1


async def test_bulk_revive_lets_a_held_key_go_on(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    keys = await _enqueue(c, "x", "t", [{"fairnessKey": "k"}] * 2)
    [head] = await activate(c, "x", 5)
    await _fail(c, head, retries=0)
    assert await activate(c, "x", 5) == []  # and the key is held now
    assert await store.fetchval("SELECT held FROM lane_keys WHERE fairness_key = 'k'")
    r = await c.post("/v2/jobs/retry", json={"tenantId": "t", "retries": 1})
    assert r.status_code == 200, r.text
    assert not await store.fetchval("SELECT held FROM lane_keys WHERE fairness_key = 'k'")
    [again] = await activate(c, "x", 5)
    assert int(again["jobKey"]) == keys[0]


INTERVALS = """
SELECT j.tenant_id, j.fairness_key, e.job_key, e.activation_count, e.started_at, e.at, e.event
FROM job_events e JOIN jobs j ON j.job_key = e.job_key AND j.shard = e.shard
WHERE e.started_at IS NOT NULL AND j.job_type = 'x'
ORDER BY e.started_at
"""
MOST_PER_KEY = """
SELECT coalesce(max(n), 0) FROM (
    SELECT count(*) AS n FROM jobs WHERE state = 'ACTIVATED' AND job_type = 'x'
    GROUP BY tenant_id, fairness_key) c
"""


async def test_fifo_keys_hold_with_racing_workers_on_two_server_processes(spawn_server, store):
    """Workers on two processes activate, complete, fail (with retries, with back-offs,
    and with none left) and let leases expire; an operator revives or cancels the FAILED
    heads.  From the database: no key ever had two jobs ACTIVATED (the history's
    activations of each key never overlap, and a sampler never saw two), each key's jobs
    were first activated and completed in creation order, and every job ended."""
    servers = [spawn_server(JOBFAIR_DB_POOL_SIZE="10") for _ in range(2)]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    rng = random.Random(41)
    most = 0
    stop = asyncio.Event()
    try:
        for cl, server in zip(clients, servers, strict=True):
            await wait_ready(cl, server)
        a, b = clients
        await a.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
        await b.put("/v2/tenants/t2", json={"weight": 3})
        await b.put("/v2/tenants/t1/keys/k0", json={"weight": 5})
        created: dict[tuple[str, str], list[int]] = defaultdict(list)
        for tenant in ("t1", "t2"):
            keys = [f"k{i}" for i in range(100)]
            jobs = [{"fairnessKey": keys[i % 100], "priority": rng.randint(0, 100)}
                    for i in range(1000)]  # fmt: skip
            for job, key in zip(jobs, await _enqueue(a, "x", tenant, jobs), strict=True):
                created[(tenant, job["fairnessKey"])].append(key)

        async def unfinished() -> int:
            n: int = await store.fetchval(
                "SELECT count(*) FROM jobs WHERE state NOT IN ('COMPLETED', 'CANCELED')"
            )
            return n

        async def sampler() -> None:
            nonlocal most
            while not stop.is_set():
                most = max(most, await store.fetchval(MOST_PER_KEY))
                await asyncio.sleep(0)

        async def operator() -> None:
            turn = 0
            while not stop.is_set():
                await asyncio.sleep(0.3)
                failed = await store.fetch("SELECT job_key FROM jobs WHERE state = 'FAILED'")
                for row in failed:
                    turn += 1
                    if turn % 3 == 0:
                        r = await a.post(f"/v2/jobs/{row['job_key']}/cancel")
                    else:
                        r = await b.patch(
                            f"/v2/jobs/{row['job_key']}", json={"changeset": {"retries": 1}}
                        )
                    assert r.status_code == 204, r.text

        async def worker(cl: httpx.AsyncClient) -> None:
            while await unfinished():
                lease = rng.choice([400, 60_000])
                jobs = await activate(cl, "x", rng.randint(1, 8), lease_ms=lease)
                if not jobs:
                    await asyncio.sleep(0.05)  # heads out, backing off, or FAILED
                for job in jobs:
                    roll = rng.random()
                    if roll < 0.05 and lease == 400:
                        continue  # left to expire: the sweep ends it, the head still
                    if roll < 0.15:
                        body = {"retries": rng.choice([0, 1, 1, 2]),
                                "retryBackOff": rng.choice([0, 0, 200])}  # fmt: skip
                        r = await cl.post(
                            f"/v2/jobs/{job['jobKey']}/fail",
                            json={**body, "activationCount": job["activationCount"]},
                        )
                    else:
                        r = await complete(cl, job)
                    # A lease of 400 ms may have run out: fenced, the job went back.
                    assert r.status_code == 204 or (lease == 400 and r.status_code == 409), r.text

        watch = asyncio.create_task(sampler())
        ops = asyncio.create_task(operator())
        await asyncio.wait_for(
            asyncio.gather(*(worker(clients[i % 2]) for i in range(8))), timeout=240
        )
        stop.set()
        await watch
        await ops
        assert most == 1
        # The history: each key's activations, by their start, never overlap.
        by_key: dict[tuple[str, str], list] = defaultdict(list)
        for e in await store.fetch(INTERVALS):
            by_key[(e["tenant_id"], e["fairness_key"])].append(e)
        assert len(by_key) == 200
        for key, events in by_key.items():
            for before, after in zip(events, events[1:], strict=False):
                assert after["started_at"] > before["at"], (key, dict(before), dict(after))
            # First activations in creation order, whatever the priorities.
            firsts = [e["job_key"] for e in events if e["activation_count"] == 1]
            assert firsts == sorted(firsts) == [k for k in created[key] if k in firsts], key
            completed = [e["job_key"] for e in events if e["event"] == "completed"]
            assert completed == sorted(completed), key
        outcomes = await store.fetch("SELECT state, count(*) FROM jobs GROUP BY state")
        assert {r["state"] for r in outcomes} <= {"COMPLETED", "CANCELED"}, outcomes
        retried = await store.fetchval(
            "SELECT count(*) FROM job_events WHERE event IN ('retried', 'lease-expired', 'failed')"
        )
        assert retried > 50  # the shapes were there
    finally:
        stop.set()
        for cl in clients:
            await cl.aclose()
    for server in servers:
        server.proc.terminate()
        assert server.proc.wait(timeout=30) == 0, server.log.read_text()


async def test_stats_show_each_fifo_keys_head(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    keys = await _enqueue(c, "x", "t", [{"fairnessKey": "a"}] * 2 + [{"fairnessKey": "b"}])
    await live.services.stats.sample()
    [first, _] = await activate(c, "x", 5)
    await live.services.stats.sample()
    stats = (await c.get("/v2/stats", params={"type": "x"})).json()
    [lane] = stats["jobTypes"][0]["tenants"]
    shown = {k["fairnessKey"]: k for k in lane["keys"]}
    assert (shown["a"]["head"], shown["a"]["headState"]) == (str(keys[0]), "ACTIVATED")
    assert (shown["b"]["head"], shown["b"]["headState"]) == (str(keys[2]), "ACTIVATED")
    assert first["jobKey"] in (str(keys[0]), str(keys[2]))
    # Not FIFO: no head shown.
    await c.put("/v2/job-types/x", json={})
    stats = (await c.get("/v2/stats", params={"type": "x"})).json()
    assert all(k["head"] is None for k in stats["jobTypes"][0]["tenants"][0]["keys"])


async def test_the_fifo_statements_read_the_heads_index_and_nothing_else_does(live, store):
    """The generic plans, as the pool runs them: the FIFO claim, the count under the key
    locks and explain's head read descend jobs_waiting_key_idx, whatever the backlog; the
    lanes' ready probes, which say "state = 'CREATED'", keep to jobs_ready_idx (its
    predicate is spelled IS TRUE so that they cannot be planned on it)."""
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    await _enqueue(c, "x", "t", [{"fairnessKey": f"k{i % 10}"} for i in range(3_000)])
    await store.execute("ANALYZE jobs")
    now = utcnow()
    fifo = CLAIMS["claim_fifo_holding"].bind(
        job_type="x", tenants=["t"], keys=["k1"], counts=[1], now=now, workers=["w"],
        deadlines=[now], aging_step=10, aging_interval_ms=60_000, via_stream=False,
        starts=[1], hint_priorities=[None], since=[None], hold_tenants=[], hold_room=[],
    )  # fmt: skip
    assert _jobs_scans(await _plan(store, *fifo)) == {"jobs_waiting_key_idx", "jobs_pkey"}
    head = OPERATORS["key_head"].bind(job_type="x", tenant_id="t", fairness_key="k1")
    # Its ACTIVATED head by an index of ACTIVATED jobs (as few as the leases out).
    scans = _jobs_scans(await _plan(store, *head))
    assert "jobs_waiting_key_idx" in scans and scans <= {
        "jobs_waiting_key_idx", "jobs_active_key_idx", "jobs_active_type_idx",
        "jobs_active_tenant_idx",
    }, scans  # fmt: skip
    read = LANES["read_lanes"].bind(
        job_type="x", limit=10, exclude=[], **{name: [] for name in CHARGE_ARRAYS}
    )
    assert "jobs_waiting_key_idx" not in _jobs_scans(await _plan(store, *read))
    # The metrics' FAILED heads: the FAILED jobs alone, each probed on the indexes.
    scans = _jobs_scans(await _plan(store, *METRICS["failed_fifo_heads"].bind()))
    assert "jobs_failed_idx" in scans and scans <= {
        "jobs_failed_idx", "jobs_waiting_key_idx", "jobs_active_key_idx",
        "jobs_active_type_idx", "jobs_active_tenant_idx",
    }, scans  # fmt: skip


async def test_jobs_created_one_after_another_through_two_servers_go_out_in_that_order(
    live, spawn_server, store
):
    """A producer creating a key's jobs one at a time, each answered before the next,
    through two servers in turn (their sessions drew job keys in blocks of a thousand
    before alembic 0019, so a later job got a smaller key and went first)."""
    other = spawn_server()
    c = live.client
    async with httpx.AsyncClient(base_url=other.url, timeout=30) as d:
        await wait_ready(d, other)
        await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
        created = []
        for i in range(8):
            server = (c, d)[i % 2]
            r = await server.post(
                "/v2/jobs", json={"type": "x", "tenantId": "t", "fairnessKey": "k"}
            )
            assert r.status_code == 201, r.text
            created.append(r.json()["jobKey"])
        went = []
        for _ in created:
            [job] = await activate(c, "x", 5)
            went.append(job["jobKey"])
            assert (await complete(c, job)).status_code == 204
        assert went == created
    other.proc.terminate()
    assert other.proc.wait(timeout=30) == 0, other.log.read_text()


async def test_retention_keeps_a_failed_head_that_blocks_its_key(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    keys = await _enqueue(c, "x", "t", [{"fairnessKey": "k"}] * 2)
    [head] = await activate(c, "x", 5)
    await _fail(c, head, retries=0)
    await store.execute("UPDATE jobs SET completed_at = now() - interval '30 days'")
    assert await RetentionSweeper(store, 1000, 86_400).run_once(utcnow()) == 0
    await KeyHoldSweeper(store).run_once(utcnow())
    assert await activate(c, "x", 5) == []  # still blocked behind its FAILED head
    # Not FIFO any more: the incident is pruned as any other.
    await c.put("/v2/job-types/x", json={})
    assert await RetentionSweeper(store, 1000, 86_400).run_once(utcnow()) == 1
    assert [int(j["jobKey"]) for j in await activate(c, "x", 5)] == [keys[1]]


async def test_a_bulk_cancel_of_a_delayed_head_lets_its_key_go_on(live, store):
    c = live.client
    await c.put("/v2/job-types/x", json={"keyOrdering": "fifo"})
    later = "2099-01-01T00:00:00Z"
    await _enqueue(c, "x", "t", [{"fairnessKey": "k", "runAt": later}, {"fairnessKey": "k"}])
    assert await activate(c, "x", 5) == []  # behind its delayed head, and held
    assert await store.fetchval("SELECT held FROM lane_keys WHERE fairness_key = 'k'")
    # Both canceled: the ready one behind, then the delayed head.
    r = await c.post("/v2/jobs/cancel", json={"tenantId": "t", "type": "x"})
    assert r.status_code == 200 and r.json()["count"] == 2, r.text
    [new] = await _enqueue(c, "x", "t", [{"fairnessKey": "k"}])
    assert not await store.fetchval("SELECT held FROM lane_keys WHERE fairness_key = 'k'")
    assert [int(j["jobKey"]) for j in await activate(c, "x", 5)] == [new]
