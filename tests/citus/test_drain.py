"""Two ``jobfair serve`` on a Citus coordinator drain jobs of dozens of tenants spread over
two worker nodes (make citus): weighted shares between tenants on different nodes within
a few points, a tenant's cap never exceeded, one server SIGKILLed mid-drain and started
again, and every job completed exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import asyncpg
import httpx
import pytest

from tests.citus.cluster import installed
from tests.fixtures import wait_ready

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not installed(), reason="Citus is not installed (make citus)"),
    pytest.mark.skipif(
        os.environ.get("JOBFAIR_TEST_CITUS") != "1", reason="make citus sets JOBFAIR_TEST_CITUS=1"
    ),
]

WEIGHTS = {"heavy-1": 1, "heavy-2": 2, "heavy-7": 7}
HEAVY = 300  # jobs each
LIGHT = [f"light-{i}" for i in range(24)]
PER_LIGHT = 10
CAPPED, CAP, PER_CAPPED = "capped", 2, 40
LEASE_MS = 4_000


async def _nodes_of(url: str, tenants: list[str]) -> set[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT DISTINCT nodeport FROM pg_dist_shard_placement WHERE shardid IN"
            " (SELECT get_shard_id_for_distribution_column('jobs', jobfair_shard(t))"
            "  FROM unnest($1::text[]) t)",
            tenants,
        )
        return {r["nodeport"] for r in rows}
    finally:
        await conn.close()


async def test_two_servers_drain_fairly_with_a_cap_through_a_kill(
    citus, db_url: str, spawn_server
) -> None:
    servers = [spawn_server("--workers", "1"), spawn_server("--workers", "1")]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    for c, s in zip(clients, servers, strict=True):
        await wait_ready(c, s)
    tenants = [*WEIGHTS, *LIGHT, CAPPED]
    assert len(await _nodes_of(db_url, tenants)) == 2, "the tenants lie on both worker nodes"

    c = clients[0]
    for tenant, weight in WEIGHTS.items():
        r = await c.put(f"/v2/tenants/{tenant}", json={"weight": weight})
        assert r.status_code == 200, r.text
    r = await c.put(f"/v2/tenants/{CAPPED}", json={"weight": 1, "maxActiveJobs": CAP})
    assert r.status_code == 200, r.text
    jobs = [{"type": "drain", "tenantId": t} for t in WEIGHTS for _ in range(HEAVY)]
    jobs += [{"type": "drain", "tenantId": t} for t in LIGHT for _ in range(PER_LIGHT)]
    jobs += [{"type": "drain", "tenantId": CAPPED} for _ in range(PER_CAPPED)]
    created: list[int] = []
    for i in range(0, len(jobs), 250):
        r = await clients[i // 250 % 2].post("/v2/jobs/batch", json={"jobs": jobs[i : i + 250]})
        assert r.status_code == 201, r.text
        created += [int(k) for k in r.json()["jobKeys"]]
    assert len(set(created)) == len(jobs)

    order: list[str] = []  # tenants in activation order
    completed: Counter[int] = Counter()
    capped_held = 0
    capped_max = 0
    killed = asyncio.Event()
    a_third = asyncio.Event()  # a third of the jobs completed: time to kill a server
    total = len(jobs)

    async def worker(n: int) -> None:
        nonlocal capped_held, capped_max
        while len(completed) < total:
            client = clients[n % 2] if not killed.is_set() or n % 2 else clients[1 - n % 2]
            try:
                r = await client.post(
                    "/v2/jobs/activate",
                    json={"type": "drain", "maxJobs": 5, "timeout": LEASE_MS,
                          "requestTimeout": 500, "worker": f"w{n}"},
                )  # fmt: skip
            except httpx.TransportError:
                await asyncio.sleep(0.05)
                continue
            if r.status_code != 200:
                assert r.status_code == 503, r.text
                continue
            got = r.json()["jobs"]
            for job in got:
                order.append(job["tenantId"])
                if job["tenantId"] == CAPPED:
                    capped_held += 1
                    capped_max = max(capped_max, capped_held)
            await asyncio.sleep(0.005)
            for job in got:
                for _ in range(20):
                    try:
                        done = await clients[1].post(
                            f"/v2/jobs/{job['jobKey']}/complete",
                            json={"activationCount": job["activationCount"]},
                        )
                    except httpx.TransportError:
                        continue
                    if done.status_code != 503:
                        break
                if job["tenantId"] == CAPPED:  # held until its completion is answered
                    capped_held -= 1
                if done.status_code == 204:
                    completed[int(job["jobKey"])] += 1
                    if len(completed) >= total // 3:
                        a_third.set()
                else:  # a lease swept back while it was held: fenced
                    assert done.status_code == 409, done.text

    async def kill_midway() -> None:
        await a_third.wait()
        os.kill(servers[0].proc.pid, signal.SIGKILL)
        servers[0].proc.wait()
        killed.set()
        again = spawn_server("--workers", "1")
        await clients[0].aclose()
        clients[0] = httpx.AsyncClient(base_url=again.url, timeout=30)
        await wait_ready(clients[0], again)
        killed.clear()

    await asyncio.wait_for(
        asyncio.gather(*(worker(n) for n in range(6)), kill_midway()), timeout=600
    )
    for client in clients:
        await client.aclose()

    assert set(completed) == set(created)
    assert max(completed.values()) == 1, "a job completed twice"
    assert capped_max <= CAP
    conn = await asyncpg.connect(db_url)
    try:
        states = await conn.fetch("SELECT state, count(*) FROM jobs GROUP BY state")
    finally:
        await conn.close()
    assert {r["state"]: r["count"] for r in states} == {"COMPLETED": total}
    # While all three heavy tenants were backlogged (the first HEAVY activations of
    # theirs: the weight-7 one is not drained before), their shares follow the weights.
    heavy = [t for t in order if t in WEIGHTS][:HEAVY]
    shares = {t: heavy.count(t) / len(heavy) for t in WEIGHTS}
    for tenant, weight in WEIGHTS.items():
        assert abs(shares[tenant] - weight / 10) <= 0.05, shares
