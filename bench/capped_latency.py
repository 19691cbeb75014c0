"""A capped job type drained through a slow database (issue 39, ADR 030):
``python -m bench.capped_latency [--base REF]``.

Three ``jobfair serve`` processes reach PostgreSQL through the chaos tests' proxy
(tests/chaos/pg_proxy.py) adding ``--latency-ms`` each way; a job type capped at 12, four
tenants (capped at 4, 6, none and 8, as the chaos load's) with ``--jobs`` ready jobs in
all; ``--workers`` long polls (maxJobs 2, requestTimeout 1 s) spread over the servers,
each completing its jobs as it gets them.  Measured per run: the drain's jobs a second,
how many long polls came back empty, and the most jobs of the type active at once.

With ``--base REF`` the servers of every other run are the code at REF (a git worktree
made under .jobfair/, on the same database migrated by this code: a rolling upgrade's
older server), alternating REF, this code, REF, ... (``--repeat`` pairs); medians.
Prints a table, then the JSON (also written to bench/results/capped_latency.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bench.harness import ROOT, Postgres, free_port, median, table
from tests.chaos.pg_proxy import PgProxy

RESULTS = ROOT / "bench" / "results"
TYPE = "capped"
TENANTS = {"acme": 4, "globex": 6, "initech": None, "umbrella": 8}


@contextlib.asynccontextmanager
async def serving(url: str, cwd: Path) -> AsyncIterator[str]:
    """A ``jobfair serve`` of the code in ``cwd`` on ``url``; its base URL once ready.
    (Polled without blocking the loop: the proxy it reaches the database through runs
    in it.)"""
    port = free_port()
    env = {**os.environ, "JOBFAIR_DB_POOL_SIZE": "8", "JOBFAIR_BACKUP_POLL_MS": "500"}
    command = [sys.executable, "-m", "app.cli", "serve", "--database-url", url]
    command += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL)  # noqa: ASYNC220 - returns at once
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(timeout=1) as c:
            while True:
                assert proc.poll() is None, f"the server of {cwd} exited"
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get(base + "/readyz")).status_code == 200:
                        break
                assert time.monotonic() < deadline, "the server did not become ready"
                await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)


async def preload(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO job_types (job_type, max_active_jobs) VALUES ($1, 12)", TYPE
        )
        for tenant, cap in TENANTS.items():
            await conn.execute(
                "INSERT INTO tenants (tenant_id, weight, max_active_jobs) VALUES ($1, 1, $2)",
                tenant,
                cap,
            )
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables)
            SELECT jobfair_job_key(jobfair_shard(t), nextval('job_key_seq')),
                   jobfair_shard(t), $1, t, 'CREATED', g % 101, 3, now(),
                   now() + g * interval '1 us', now(), '{}'::jsonb
            FROM unnest($2::text[]) t, generate_series(1, $3) g
            """,
            TYPE,
            list(TENANTS),
            jobs // len(TENANTS),
        )
        for sql in (
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
            " SELECT $1, t, jobfair_shard(t), 0, true FROM unnest($2::text[]) t",
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
            " SELECT $1, t, '', jobfair_shard(t), 0, true FROM unnest($2::text[]) t",
        ):
            await conn.execute(sql, TYPE, list(TENANTS))
        await conn.execute("VACUUM ANALYZE jobs")
    finally:
        await conn.close()


async def _worker(c: httpx.AsyncClient, base: str, left: list[int], empty: list[int]) -> None:
    body = {"type": TYPE, "maxJobs": 2, "timeout": 60_000, "requestTimeout": 1_000}
    while left[0] > 0:
        r = await c.post(base + "/v2/jobs/activate", json=body)
        r.raise_for_status()
        jobs = r.json()["jobs"]
        if not jobs:
            empty[0] += 1
        for job in jobs:
            done = await c.post(
                f"{base}/v2/jobs/{job['jobKey']}/complete",
                json={"activationCount": job["activationCount"]},
            )
            assert done.status_code == 204, done.text
            left[0] -= 1


async def _peak(url: str, stop: asyncio.Event, peak: list[int]) -> None:
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            n = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE state = 'ACTIVATED' AND job_type = $1", TYPE
            )
            peak[0] = max(peak[0], n)
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def one_run(pg: Postgres, name: str, code: Path, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(name)
    await preload(url, args.jobs)
    jobs = args.jobs // len(TENANTS) * len(TENANTS)
    async with PgProxy.serving(url) as proxy:
        async with contextlib.AsyncExitStack() as stack:
            bases = [await stack.enter_async_context(serving(proxy.url, code)) for _ in range(3)]
            proxy.latency_s = args.latency_ms / 1000
            left, empty, peak = [jobs], [0], [0]
            stop = asyncio.Event()
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(timeout=30, limits=limits) as c:
                peaking = asyncio.create_task(_peak(url, stop, peak))
                started = time.perf_counter()
                await asyncio.gather(
                    *(_worker(c, bases[i % 3], left, empty) for i in range(args.workers))
                )
                took = time.perf_counter() - started
                stop.set()
                await peaking
    return {
        "code": name.rsplit("_", 1)[0],
        "jobs/s": round(jobs / took, 1),
        "empty polls": empty[0],
        "peak active": peak[0],
        "seconds": round(took, 1),
    }


def worktree(ref: str) -> Path:
    path = ROOT / ".jobfair" / f"bench-base-{ref}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
    return path


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    codes = [("this", ROOT)]
    if args.base:
        codes = [(f"base-{args.base}", worktree(args.base)), *codes]
    rows = []
    for r in range(args.repeat):
        for label, path in codes:
            rows.append(await one_run(pg, f"{label}_{r}", path, args))
            print(table([rows[-1]], list(rows[-1])), flush=True)
    summary = [
        {
            "code": label,
            "jobs/s (median)": median([x["jobs/s"] for x in rows if x["code"] == label]),
            "empty polls (median)": median([x["empty polls"] for x in rows if x["code"] == label]),
            "peak active (median)": median([x["peak active"] for x in rows if x["code"] == label]),
        }
        for label, _ in codes
    ]
    return {"args": vars(args), "runs": rows, "summary": summary}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", help="a git ref to compare with, alternating runs")
    parser.add_argument("--jobs", type=int, default=1_200)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    result = asyncio.run(main(parser.parse_args()))
    print(table(result["summary"], list(result["summary"][0])))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "capped_latency.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
