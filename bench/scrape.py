"""What a /metrics scrape costs as tenants grow: ``python -m bench.scrape``.

For 10, 1,000 and 10,000 tenants, each with a backlog of ready jobs of one job type
(and a history of finished jobs, as retention keeps them), one server process is
scraped over and over; between scrapes every lane's activation count moves on (as
activations would move it), so each scrape folds a share window that has something in
it.  The tenant labels are the top K (50 by default) as the leader would publish them.
Reported per tenant count: the scrape's wall time (median, p95), the CPU it took in the
server and in PostgreSQL, the answer's size and how many series it carries.  Prints a
table, then the JSON (also written to bench/results/scrape.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg
import httpx

from bench.harness import ROOT, CpuMeter, Postgres, median, percentile, server, server_pid, table

RESULTS = ROOT / "bench" / "results"


async def preload(url: str, tenants: int, ready: int, finished: int, top: int) -> None:
    """A backlog of ``ready`` jobs per tenant, ``finished`` completed ones in all, every
    tenant's lane, and the labelled set (t1 .. t<top>) in force already."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables)
            SELECT jobfair_job_key(jobfair_shard('t' || t), nextval('job_key_seq')),
                   jobfair_shard('t' || t), 'scrape', 't' || t, 'CREATED', 50, 3, now(),
                   now() - g * interval '1 s', now(), '{}'::jsonb
            FROM generate_series(1, $1) t, generate_series(1, $2) g
            """,
            tenants,
            ready,
        )
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, activated_at, completed_at,
                              variables)
            SELECT jobfair_job_key(jobfair_shard(t), nextval('job_key_seq')), jobfair_shard(t),
                   'scrape', t, 'COMPLETED', 50, 3, now(), now(), now(), now(), now(),
                   '{}'::jsonb
            FROM generate_series(1, $2) g, LATERAL (SELECT 't' || (1 + g % $1) AS t) x
            """,
            tenants,
            finished,
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active) "
            "SELECT 'scrape', 't' || t, jobfair_shard('t' || t), t * 0.001, true"
            " FROM generate_series(1, $1) t",
            tenants,
        )
        await conn.execute(
            "INSERT INTO metric_tenant_sets (effective_at, tenants) "
            "VALUES (now() - interval '1 minute', "
            "ARRAY(SELECT 't' || t FROM generate_series(1, $1) t))",
            min(top, tenants),
        )
        await conn.execute("VACUUM ANALYZE jobs")
        await conn.execute("VACUUM ANALYZE lanes")
    finally:
        await conn.close()


async def scrapes(base: str, url: str, n: int, meter: CpuMeter) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    times, sizes, series = [], [], []
    cpu = {"server": 0.0, "postgres": 0.0}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            assert (await client.get("/metrics")).status_code == 200  # the window's start
            for _ in range(n):
                await conn.execute(
                    "UPDATE lanes SET activated_total = activated_total + (random() * 5)::int"
                )
                before, _ = meter.split()
                t0 = time.perf_counter()
                r = await client.get("/metrics")
                took = time.perf_counter() - t0
                after, _ = meter.split()
                assert r.status_code == 200, r.text
                times.append(took * 1000)
                sizes.append(len(r.content))
                series.append(sum(1 for line in r.text.splitlines() if not line.startswith("#")))
                for part in cpu:
                    cpu[part] += (after[part] - before[part]) * 1000 / n
    finally:
        await conn.close()
    return {
        "p50Ms": median(times),
        "p95Ms": percentile(times, 95),
        "serverCpuMs": cpu["server"],
        "postgresCpuMs": cpu["postgres"],
        "bytes": median(sizes),
        "series": median(series),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tenants", type=int, nargs="+", default=[10, 1_000, 10_000])
    p.add_argument("--ready", type=int, default=10, help="ready jobs per tenant")
    p.add_argument("--finished", type=int, default=100_000, help="completed jobs in all")
    p.add_argument("--top", type=int, default=50, help="JOBFAIR_METRICS_TOP_TENANTS")
    p.add_argument("--scrapes", type=int, default=20)
    args = p.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    rows = []
    for tenants in args.tenants:
        url = pg.fresh_db("bench_scrape")
        asyncio.run(preload(url, tenants, args.ready, args.finished, args.top))
        env = {"JOBFAIR_METRICS_TOP_TENANTS": str(args.top)}
        with server(url, env=env) as base:
            meter = CpuMeter(server_pid(base), pg.postmaster_pid)
            got = asyncio.run(scrapes(base, url, args.scrapes, meter))
        rows.append({"tenants": tenants, "backlog": tenants * args.ready, **got})
    print(
        table(
            rows,
            [
                "tenants",
                "backlog",
                "p50Ms",
                "p95Ms",
                "serverCpuMs",
                "postgresCpuMs",
                "bytes",
                "series",
            ],
        )
    )
    out = json.dumps({"args": vars(args), "scrape": rows}, indent=2)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scrape.json").write_text(out)
    print("\n" + out)


if __name__ == "__main__":
    main()
