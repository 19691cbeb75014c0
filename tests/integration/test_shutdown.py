"""Issue 3 (chaos): SIGTERM under load answers waiters, releases undelivered jobs and
exits 0; no job is left ACTIVATED for a client that never received it."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx

from tests.fixtures import wait_ready


async def test_sigterm_during_load_leaves_no_job_activated_unreceived(spawn_server, store):
    server = spawn_server()
    proc = server.proc
    received: set[str] = set()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            await wait_ready(c, server)
            jobs = [{"type": "busy", "tenantId": f"t{i % 3}"} for i in range(300)]
            assert (await c.post("/v2/jobs/batch", json={"jobs": jobs})).status_code == 201

            async def idle_poll() -> float:
                t0 = time.monotonic()
                r = await c.post(
                    "/v2/jobs/activate",
                    json={"type": "idle", "maxJobs": 1, "timeout": 60000, "requestTimeout": 60_000},
                )
                assert r.json() == {"jobs": []}
                return time.monotonic() - t0

            async def worker() -> None:
                # Activates and completes until the server goes away.
                try:
                    while True:
                        r = await c.post(
                            "/v2/jobs/activate",
                            json={
                                "type": "busy",
                                "maxJobs": 5,
                                "timeout": 60000,
                                "requestTimeout": 5000,
                            },
                        )
                        got = r.json()["jobs"]
                        received.update(j["jobKey"] for j in got)
                        for j in got:
                            await c.post(
                                f"/v2/jobs/{j['jobKey']}/complete",
                                json={"activationCount": j["activationCount"]},
                            )
                except (httpx.TransportError, KeyError, json.JSONDecodeError):
                    return

            async def streamer() -> None:
                try:
                    async with c.stream(
                        "GET", "/v2/jobs/stream?type=busy&maxJobs=3&timeout=60000"
                    ) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data:"):
                                received.add(json.loads(line[5:])["jobKey"])
                except httpx.TransportError:
                    return

            polls = [asyncio.create_task(idle_poll()) for _ in range(3)]
            workers = [asyncio.create_task(worker()) for _ in range(3)]
            stream = asyncio.create_task(streamer())
            await asyncio.sleep(1.0)  # let the load run
            proc.send_signal(signal.SIGTERM)
            waited = await asyncio.gather(*polls)
            assert max(waited) < 15  # answered at shutdown, not at their 60 s timeout
            await asyncio.gather(*workers, stream)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    active = {
        str(r[0]) for r in await store.fetch("SELECT job_key FROM jobs WHERE state = 'ACTIVATED'")
    }
    assert active <= received, active - received
