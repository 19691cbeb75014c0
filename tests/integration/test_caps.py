"""DESIGN §1.4: caps are hard under concurrent activation, in one and in two processes."""

from __future__ import annotations

import asyncio

import httpx

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import job_rows, operating
from app.domain import utcnow
from tests.fixtures import wait_ready
from tests.helpers import activate, complete, enqueue


async def _active(store, column, value):
    return await store.fetchval(
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


async def test_job_type_cap_holds_when_20_activators_race_on_their_own_connections(store):
    """One process activates callers of a type together (ADR 009), so 20 calls to one
    server may make a single claim.  Twenty activation services, as twenty processes
    would, each claim on its own pooled connection at once."""
    await operating.upsert_job_type(store, "render", 7, None, None)
    await job_rows.insert(
        store, [{"type": "render", "tenantId": t} for t in "abc" for _ in range(50)], utcnow()
    )
    services = [Rounds(store, Settings()) for _ in range(20)]
    results = await asyncio.gather(
        *(s.activate(ActivateRequest("render", 4, 60_000)) for s in services)
    )
    assert sum(len(rows) for rows, _ in results) == 7
    assert await _active(store, "job_type", "render") == 7


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


async def test_caps_hold_across_two_server_processes(spawn_server, store):
    servers = [spawn_server(JOBFAIR_DB_POOL_SIZE="25") for _ in range(2)]
    clients = [httpx.AsyncClient(base_url=s.url, timeout=30) for s in servers]
    try:
        for cl, server in zip(clients, servers, strict=True):
            await wait_ready(cl, server)
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
    for server in servers:  # a graceful stop exits 0
        server.proc.terminate()
        assert server.proc.wait(timeout=30) == 0, server.log.read_text()
