"""Soak: DESIGN §2 says dead tuples stay bounded, "so a long soak does not slow down".

Jobs are produced and finished at one steady rate over a standing backlog for minutes,
through one server with its background work on its own timers (lease sweeps, promotion,
retention: by default 7 days, so finished jobs stay in the table; ``--soak-retention-s``
shortens it, and the retention sweep then runs four times per retention period).  Workers are
paced to the producer's rate, so an activation's latency is its cost, not a queue.  Each
interval reports the latencies, what was done, and what the tables carry.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
import orjson

from bench.harness import Postgres, percentile, server
from bench.wire import Connection

WORKERS = 8
MAX_JOBS = 10
TENANTS = 10
TICK_S = 0.1

TABLES = """
SELECT (SELECT count(*) FROM jobs WHERE state = 'CREATED') AS pending,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs') AS jobs_dead,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'lanes') AS lanes_dead,
       (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'jobs')
         AS jobs_autovacuums,
       pg_relation_size('jobs') AS jobs_bytes,
       pg_relation_size('jobs_ready_idx') AS ready_idx_bytes,
       pg_relation_size('jobs_pkey') AS pkey_bytes
"""


class _Pace:
    """Lets its callers take ``rate`` jobs per second in all, from the start."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.perf_counter()
        self.taken = 0

    async def take(self, n: int) -> None:
        self.taken += n
        due = self.start + self.taken / self.rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def _soak(
    base: str, url: str, seconds: float, rate: int, interval: float
) -> list[dict[str, Any]]:
    stop = time.perf_counter() + seconds
    activate_ms: list[float] = []
    complete_ms: list[float] = []
    done = 0
    produced = 0
    pace = _Pace(rate)

    async def produce() -> None:
        nonlocal produced
        c = await Connection.open(base)
        per_tick = max(1, round(rate * TICK_S))
        produce_pace = _Pace(rate)
        while time.perf_counter() < stop:
            jobs = [
                {
                    "type": "bench",
                    "tenantId": f"t{(produced + i) % TENANTS}",
                    "priority": ((produced + i) % 3) * 25,
                    "variables": {"n": produced + i},
                }
                for i in range(per_tick)
            ]
            r = await c.post("/v2/jobs/batch", {"jobs": jobs})
            assert r.status == 201, r.body
            produced += per_tick
            await produce_pace.take(per_tick)
        await c.close()

    async def work(i: int) -> None:
        nonlocal done
        c = await Connection.open(base)
        body = orjson.dumps(
            {
                "type": "bench",
                "maxJobs": MAX_JOBS,
                "timeout": 300_000,
                "worker": f"soak{i}",
                "requestTimeout": -1,
            }
        )
        while time.perf_counter() < stop:
            await pace.take(MAX_JOBS)
            t0 = time.perf_counter()
            jobs = (await c.post("/v2/jobs/activate", body)).json()["jobs"]
            t1 = time.perf_counter()
            activate_ms.append((t1 - t0) * 1000)
            if not jobs:
                continue
            finished = [
                {"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in jobs
            ]
            r = await c.post("/v2/jobs/complete", {"jobs": finished})
            assert r.status == 200, r.body
            complete_ms.append((time.perf_counter() - t1) * 1000)
            done += len(jobs)
        await c.close()

    async def sample() -> list[dict[str, Any]]:
        rows = []
        conn = await asyncpg.connect(url)
        t_start = last = time.perf_counter()
        last_done = 0
        try:
            while time.perf_counter() < stop:
                await asyncio.sleep(min(interval, max(0.0, stop - time.perf_counter())))
                now = time.perf_counter()
                acts, comps = activate_ms[:], complete_ms[:]
                activate_ms.clear()
                complete_ms.clear()
                t = dict(await conn.fetchrow(TABLES))
                rows.append(
                    {
                        "atS": round(now - t_start),
                        "jobsPerSec": (done - last_done) / (now - last),
                        "activateP50Ms": percentile(acts, 50) if acts else None,
                        "activateP99Ms": percentile(acts, 99) if acts else None,
                        "completeP99Ms": percentile(comps, 99) if comps else None,
                        "pending": t["pending"],
                        "jobsDeadTuples": t["jobs_dead"],
                        "lanesDeadTuples": t["lanes_dead"],
                        "jobsAutovacuums": t["jobs_autovacuums"],
                        "jobsMB": t["jobs_bytes"] / 2**20,
                        "readyIndexMB": t["ready_idx_bytes"] / 2**20,
                        "pkeyMB": t["pkey_bytes"] / 2**20,
                    }
                )
                last, last_done = now, done
        finally:
            await conn.close()
        return rows

    tasks = [produce(), *(work(i) for i in range(WORKERS))]
    rows, *_ = await asyncio.gather(sample(), *tasks)
    return rows  # type: ignore[no-any-return]


def bench_soak(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.preload import preload

    url = pg.fresh_db("bench_soak")
    per_tenant = args.soak_backlog // TENANTS
    asyncio.run(preload(url, "bench", {f"t{i}": per_tenant for i in range(TENANTS)}))
    env = {}
    if args.soak_retention_s is not None:
        env["JOBFAIR_RETENTION_S"] = str(args.soak_retention_s)
        env["JOBFAIR_RETENTION_SWEEP_INTERVAL_MS"] = str(args.soak_retention_s * 1000 // 4)
    with server(url, workers=args.server_workers[-1], env=env) as base:
        return asyncio.run(_soak(base, url, args.soak_seconds, args.soak_rate, args.soak_interval))
