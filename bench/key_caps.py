"""What caps per fairness key cost an activation (issue 44, ADR 040):
``python -m bench.key_caps [--keys 100000] [--per-key 2] [--repeat 3]``.

One ``jobfair serve`` process on a fresh database preloaded (in SQL) with ``--keys``
fairness keys over ten tenants, each key with ``--per-key`` ready jobs. Two workloads on
identical data, alternating (``--repeat`` pairs): ``capped``, the job type's
``maxActivePerKey`` 1 (every key at most one job running), and ``uncapped``, none.
``--workers`` workers each activate ``--max-jobs`` jobs (requestTimeout -1), then
complete them one call each; measured: each activation's latency as the worker sees it
over ``--activations`` activations, the jobs a second, and the most jobs one key had
ACTIVATED at once (sampled). Medians of the runs; a table, then the JSON (also written to
bench/results/key_caps.json).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
import httpx

from bench.harness import (
    ROOT,
    Postgres,
    median,
    percentile,
    server,
    table,
    write_results,
)

TYPE = "keyed"
TENANTS = [f"tenant-{i}" for i in range(10)]


async def preload(url: str, keys: int, per_key: int, capped: bool) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO job_types (job_type, max_active_per_key) VALUES ($1, $2)",
            TYPE,
            1 if capped else None,
        )
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables, fairness_key)
            SELECT jobfair_job_key(jobfair_shard(t), nextval('job_key_seq')),
                   jobfair_shard(t), $1, t, 'CREATED', 0, 3, now(),
                   now() + (k * $4 + j) * interval '1 us', now(), '{}'::jsonb, 'key-' || k
            FROM unnest($2::text[]) WITH ORDINALITY AS u(t, i),
                 generate_series(0, $3 / 10 - 1) k, generate_series(1, $4) j
            """,
            TYPE,
            TENANTS,
            keys,
            per_key,
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
            " SELECT $1, t, jobfair_shard(t), 0, true FROM unnest($2::text[]) t",
            TYPE,
            TENANTS,
        )
        await conn.execute(
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
            " SELECT $1, t, 'key-' || k, jobfair_shard(t), 0, true"
            " FROM unnest($2::text[]) t, generate_series(0, $3 / 10 - 1) k",
            TYPE,
            TENANTS,
            keys,
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


MOST_PER_KEY = """
SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs WHERE state = 'ACTIVATED'
                                 GROUP BY tenant_id, fairness_key) c
"""


async def one_run(pg: Postgres, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"key_caps_{label}")
    await preload(url, args.keys, args.per_key, label.startswith("capped"))
    latencies: list[float] = []
    done = [0]
    most = [0]
    stop = asyncio.Event()

    async def sample() -> None:
        conn = await asyncpg.connect(url)
        try:
            while not stop.is_set():
                most[0] = max(most[0], await conn.fetchval(MOST_PER_KEY))
                await asyncio.sleep(0.2)
        finally:
            await conn.close()

    with server(url, pool=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            body = {"type": TYPE, "maxJobs": args.max_jobs, "timeout": 60_000, "requestTimeout": -1}

            async def worker() -> None:
                while len(latencies) < args.activations:
                    t0 = time.perf_counter()
                    r = await c.post("/v2/jobs/activate", json=body)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    r.raise_for_status()
                    for job in r.json()["jobs"]:
                        fin = await c.post(
                            f"/v2/jobs/{job['jobKey']}/complete",
                            json={"activationCount": job["activationCount"]},
                        )
                        assert fin.status_code == 204, fin.text
                        done[0] += 1

            sampler = asyncio.create_task(sample())
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(args.workers)))
            took = time.perf_counter() - started
            stop.set()
            await sampler
    return {
        "workload": label.split("_")[0],
        "activation p50 ms": round(percentile(latencies, 50), 2),
        "activation p99 ms": round(percentile(latencies, 99), 2),
        "jobs/s": round(done[0] / took, 1),
        "most per key": most[0],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    rows = []
    for r in range(args.repeat):
        for workload in ("capped", "uncapped"):
            rows.append(await one_run(pg, f"{workload}_{r}", args))
            print(table([rows[-1]], list(rows[-1])), flush=True)
    columns = ["activation p50 ms", "activation p99 ms", "jobs/s"]
    summary = [
        {"workload": w, **{c: median([x[c] for x in rows if x["workload"] == w]) for c in columns}}
        for w in ("capped", "uncapped")
    ]
    capped, uncapped = summary
    ratio = round(capped["activation p99 ms"] / uncapped["activation p99 ms"], 2)
    print(table(summary, ["workload", *columns]))
    print(f"activation p99, capped / uncapped: {ratio}")
    return {"args": vars(args), "runs": rows, "summary": summary, "p99 ratio": ratio}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--per-key", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--max-jobs", type=int, default=10)
    parser.add_argument("--activations", type=int, default=2_000)
    parser.add_argument("--repeat", type=int, default=3)
    write_results("key_caps", asyncio.run(main(parser.parse_args())))
