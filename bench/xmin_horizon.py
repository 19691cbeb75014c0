"""Throughput, latency and dead tuples while a transaction holds the xmin horizon (issue 43).

``python -m bench.xmin_horizon [--rate 1000] [--before 30] [--pin 150] [--after 60]
[--interval 5]``: one ``jobfair serve`` on a fresh database of the embedded PostgreSQL; a
producer through ``jobfair_client`` (``AsyncJobfair.create_jobs``, a batch every 100 ms,
--rate jobs a second offered, over 10 tenants) and one ``AsyncWorker(concurrency=50)``
completing each job at once.  After --before seconds a second connection opens a
transaction, takes an XID (``txid_current()``) and stays idle for --pin seconds -- while
it does, no dead row version anywhere in the database can be removed -- then ends it;
the run goes on --after seconds more.  Every --interval seconds a row: the phase, jobs
completed per second, each job's latency from its create call to its handler (p50,
p99), the backlog (CREATED jobs) and the dead tuples of ``jobs``, ``lanes`` and
``job_events`` (``pg_stat_user_tables``).  Then the phases' summary: the rate and p99
before, during and after the pin, the most dead tuples, and how long after the pin the
backlog took to fall back to what it was before.  Prints the tables and the JSON (also
bench/results/xmin_horizon.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import asyncpg
from jobfair_client import AsyncJobfair, AsyncWorker, Job, NewJob

from bench.harness import (
    ROOT,
    Postgres,
    machine_speed,
    percentile,
    server,
    speed_line,
    table,
    write_results,
)

TYPE = "xmin"
TENANTS = 10
TICK_S = 0.1
STATS = """
SELECT (SELECT count(*) FROM jobs WHERE state = 'CREATED') AS backlog,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs') AS jobs_dead,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'lanes') AS lanes_dead,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job_events')
         AS events_dead
"""


async def _run(base: str, url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    total_s = args.before + args.pin + args.after
    started = time.perf_counter()
    stop = started + total_s
    latencies: list[float] = []
    completed = 0

    def phase(at: float) -> str:
        if at < args.before:
            return "before"
        return "pinned" if at < args.before + args.pin else "after"

    async def handler(job: Job) -> None:
        nonlocal completed
        latencies.append(time.time() - job.variables["t"])
        completed += 1

    async def produce(jf: AsyncJobfair) -> None:
        per_tick = max(1, round(args.rate * TICK_S))
        made = 0
        while time.perf_counter() < stop:
            now = time.time()
            jobs = [
                NewJob(TYPE, tenant_id=f"t{(made + i) % TENANTS}", variables={"t": now})
                for i in range(per_tick)
            ]
            await jf.create_jobs(jobs)
            made += per_tick
            due = started + made / args.rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    async def pin() -> None:
        await asyncio.sleep(args.before)
        conn = await asyncpg.connect(url)
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.fetchval("SELECT txid_current()")  # an XID: the horizon held
            await asyncio.sleep(args.pin)
            await tx.rollback()
        finally:
            await conn.close()

    async def sample() -> list[dict[str, Any]]:
        rows = []
        conn = await asyncpg.connect(url)
        last, last_done = time.perf_counter(), 0
        try:
            while time.perf_counter() < stop:
                await asyncio.sleep(args.interval)
                now = time.perf_counter()
                seen, latencies[:] = latencies[:], []
                t = await conn.fetchrow(STATS)
                rows.append(
                    {
                        "atS": round(now - started),
                        "phase": phase(now - started - args.interval / 2),
                        "jobsPerSec": (completed - last_done) / (now - last),
                        "latencyP50Ms": 1000 * percentile(seen, 50) if seen else None,
                        "latencyP99Ms": 1000 * percentile(seen, 99) if seen else None,
                        "backlog": t["backlog"],
                        "jobsDead": t["jobs_dead"],
                        "lanesDead": t["lanes_dead"],
                        "eventsDead": t["events_dead"],
                    }
                )
                last, last_done = now, completed
        finally:
            await conn.close()
        return rows

    async with AsyncJobfair(base) as jf, AsyncJobfair(base) as wjf:
        worker = AsyncWorker(wjf, TYPE, handler, concurrency=50)
        running = asyncio.create_task(worker.run())
        rows, *_ = await asyncio.gather(sample(), produce(jf), pin())
        worker.stop()
        await running
    return rows


def _summary(rows: list[dict[str, Any]], interval: float) -> list[dict[str, Any]]:
    out = []
    for name in ("before", "pinned", "after"):
        part = [r for r in rows if r["phase"] == name]
        if not part:
            continue
        p99s = [r["latencyP99Ms"] for r in part if r["latencyP99Ms"] is not None]
        out.append(
            {
                "phase": name,
                "jobsPerSec": statistics.mean(r["jobsPerSec"] for r in part),
                "worstP99Ms": max(p99s) if p99s else None,
                "medianP99Ms": statistics.median(p99s) if p99s else None,
                "maxBacklog": max(r["backlog"] for r in part),
                "maxJobsDead": max(r["jobsDead"] for r in part),
                "maxLanesDead": max(r["lanesDead"] for r in part),
                "maxEventsDead": max(r["eventsDead"] for r in part),
            }
        )
    before = max((r["backlog"] for r in rows if r["phase"] == "before"), default=0)
    after = [r for r in rows if r["phase"] == "after"]
    back = next((r["atS"] for r in after if r["backlog"] <= max(before, 100)), None)
    pin_end = after[0]["atS"] - interval if after else None
    for s in out:
        if s["phase"] == "after":
            s["backlogGoneAfterS"] = None if back is None or pin_end is None else back - pin_end
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="jobs/s offered")
    parser.add_argument("--before", type=float, default=30)
    parser.add_argument("--pin", type=float, default=150, help="seconds the horizon is held")
    parser.add_argument("--after", type=float, default=60)
    parser.add_argument("--interval", type=float, default=5)
    args = parser.parse_args()
    speed = machine_speed()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    url = pg.fresh_db("bench_xmin")
    with server(url) as base:
        rows = asyncio.run(_run(base, url, args))
    summary = _summary(rows, args.interval)
    print(f"machine speed: {speed_line(speed)}; {args.rate} jobs/s offered")
    print(table(rows, list(rows[0])))
    print(table(summary, list(summary[-1])))
    out = {"args": vars(args), "cpus": os.cpu_count(), "speed": speed, "rows": rows}
    out["summary"] = summary
    write_results("xmin_horizon", out)


if __name__ == "__main__":
    main()
