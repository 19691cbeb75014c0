"""DESIGN §1.4: caps are hard under concurrent activation, in one and in two processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import free_port
from tests.helpers import activate, complete, enqueue


async def _active(store, column, value):
    return await store.pool.fetchval(
        f"SELECT count(*) FROM jobs WHERE state = 'ACTIVATED' AND {column} = $1", value
    )


async def test_tenant_cap_holds_when_20_activations_race(live, store):
    c = live.client
    await c.put("/v2/tenants/capped", json={"weight": 1, "maxActiveJobs": 5})
    await enqueue(c, "work", "capped", 200)
    await enqueue(c, "other", "capped", 200)  # the cap spans job types
    results = await asyncio.gather(
        *(activate(c, "work" if i % 2 else "other", 3) for i in range(20))
    )
    handed_out = sum(len(r) for r in results)
    assert handed_out == 5
    assert await _active(store, "tenant_id", "capped") == 5
    # Freed capacity is used by the next activation.
    jobs = [j for r in results for j in r]
    for job in jobs[:2]:
        assert (await complete(c, job)).status_code == 204
    again = await activate(c, "work", 10) + await activate(c, "other", 10)
    assert len(again) == 2
    assert await _active(store, "tenant_id", "capped") == 5


async def test_job_type_cap_holds_across_tenants(live, store):
    c = live.client
    await c.put("/v2/job-types/render", json={"maxActiveJobs": 7})
    for t in ("a", "b", "c"):
        await enqueue(c, "render", t, 50)
    results = await asyncio.gather(*(activate(c, "render", 4) for _ in range(20)))
    assert sum(len(r) for r in results) == 7
    assert await _active(store, "job_type", "render") == 7
    assert await activate(c, "render", 10) == []


async def test_capped_tenant_is_skipped_and_others_served(live):
    c = live.client
    await c.put("/v2/tenants/busy", json={"weight": 1, "maxActiveJobs": 2})
    await enqueue(c, "mail", "busy", 100)
    await enqueue(c, "mail", "calm", 100)
    jobs = await activate(c, "mail", 20)
    tenants = [j["tenantId"] for j in jobs]
    assert tenants.count("busy") == 2 and tenants.count("calm") == 18


async def test_zero_cap_pauses_a_tenant(live):
    c = live.client
    await c.put("/v2/tenants/paused", json={"weight": 1, "maxActiveJobs": 0})
    await enqueue(c, "mail", "paused", 5)
    assert await activate(c, "mail", 5) == []
    await c.delete("/v2/tenants/paused")
    assert len(await activate(c, "mail", 5)) == 5


@pytest.fixture
def two_servers(db_url, tmp_path):
    procs, urls = [], []
    env = {**os.environ, "JOBFAIR_DATABASE_URL": db_url, "JOBFAIR_DB_POOL_SIZE": "25"}
    logs = []
    for i in range(2):
        port = free_port()
        log = open(tmp_path / f"server{i}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app.cli",
                    "serve",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        proc_logs[procs[-1].pid] = tmp_path / f"server{i}.log"
        urls.append(f"http://127.0.0.1:{port}")
    yield procs, urls
    for p in procs:
        p.terminate()
    codes = [p.wait(timeout=20) for p in procs]
    for log in logs:
        log.close()
    assert codes == [0, 0], [proc_logs[p.pid].read_text() for p in procs]


proc_logs: dict = {}


async def _wait_ready(client: httpx.AsyncClient, proc) -> None:
    while True:
        assert proc.poll() is None, proc_logs[proc.pid].read_text()
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)


async def test_caps_hold_across_two_server_processes(two_servers, store):
    procs, urls = two_servers
    clients = [httpx.AsyncClient(base_url=u, timeout=30) for u in urls]
    try:
        for cl, p in zip(clients, procs, strict=True):
            await _wait_ready(cl, p)
        a, b = clients
        await a.put("/v2/tenants/t1", json={"weight": 1, "maxActiveJobs": 6})
        await b.put("/v2/job-types/x", json={"maxActiveJobs": 9})
        await enqueue(a, "x", "t1", 100)
        await enqueue(b, "x", "t2", 100)
        calls = [activate(clients[i % 2], "x", 3) for i in range(20)]
        results = await asyncio.gather(*calls)
        assert sum(len(r) for r in results) == 9
        assert await _active(store, "tenant_id", "t1") <= 6
        assert await _active(store, "job_type", "x") == 9
    finally:
        for cl in clients:
            await cl.aclose()
