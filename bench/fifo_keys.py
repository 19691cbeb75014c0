"""What FIFO keys cost (issue 44 §2, ADR 041):
``python -m bench.fifo_keys [--repeat 4] [--only index|fifo]``.

Two questions, each answered by alternating pairs (ABBA) on fresh databases of one embedded
PostgreSQL, through one ``jobfair serve`` process:

- ``index``: what the FIFO heads' index (``jobs_waiting_key_idx``, maintained for every job
  of every type) costs a type that does not use it. ``--jobs`` jobs of a plain type are
  created over HTTP in batches of 500, then drained by ``--workers`` workers (activate
  ``--max-jobs``, complete each) with the index, and with it dropped: creates a second,
  drained jobs a second, and PostgreSQL's CPU per job (its process tree) over the creates
  and over both.
- ``sequence``: what drawing job keys one at a time costs (alembic 0019, ``CACHE 1``)
  against blocks of a thousand a session: ``--jobs`` jobs created by four producers at
  once over HTTP in batches of 500; creates a second and PostgreSQL's CPU per create.
- ``fifo``: what a FIFO type costs against the nearest type by priority, every key capped
  at 1 (``maxActivePerKey`` 1: one job a key at a time, in priority order): ``--keys``
  keys over ten tenants with ``--per-key`` jobs each, drained as above; activation
  latency as the workers see it, and jobs a second.

Medians of the runs; tables, then the JSON (also bench/results/fifo_keys.json).
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
    cpu_seconds,
    median,
    percentile,
    process_tree,
    server,
    table,
    write_results,
)

TENANTS = [f"tenant-{i}" for i in range(10)]
BATCH = 500


async def create(c: httpx.AsyncClient, job_type: str, keys: int, per_key: int) -> float:
    """Every job over HTTP, key after key in turn; the seconds it took."""
    jobs = [
        {"type": job_type, "tenantId": TENANTS[k % 10], "fairnessKey": f"key-{k}"}
        for _ in range(per_key)
        for k in range(keys)
    ]
    started = time.perf_counter()
    for i in range(0, len(jobs), BATCH):
        r = await c.post("/v2/jobs/batch", json={"jobs": jobs[i : i + BATCH]})
        assert r.status_code == 201, r.text
    return time.perf_counter() - started


async def drain(
    c: httpx.AsyncClient, job_type: str, total: int, args: argparse.Namespace
) -> tuple[float, list[float]]:
    """Workers activate and complete until ``total`` jobs are done; the seconds it took
    and each activation's latency (ms)."""
    latencies: list[float] = []
    done = [0]
    body = {"type": job_type, "maxJobs": args.max_jobs, "timeout": 60_000, "requestTimeout": -1}

    async def worker() -> None:
        while done[0] < total:
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

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.workers)))
    return time.perf_counter() - started, latencies


async def index_run(pg: Postgres, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"fifo_{label}")
    if label.startswith("without"):
        conn = await asyncpg.connect(url)
        await conn.execute("DROP INDEX jobs_waiting_key_idx")
        await conn.close()
    keys = 1000
    with server(url, pool=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            postgres = process_tree(pg.postmaster_pid)
            cpu0 = cpu_seconds(postgres)
            made = await create(c, "plain", keys, args.jobs // keys)
            cpu_made = cpu_seconds(process_tree(pg.postmaster_pid)) - cpu0
            took, _ = await drain(c, "plain", args.jobs, args)
            cpu = cpu_seconds(process_tree(pg.postmaster_pid)) - cpu0
    return {
        "workload": label.split("_")[0],
        "creates/s": round(args.jobs / made),
        "drained/s": round(args.jobs / took),
        "PostgreSQL µs/create": round(cpu_made / args.jobs * 1e6, 1),
        "PostgreSQL µs/job": round(cpu / args.jobs * 1e6, 1),
    }


async def sequence_run(pg: Postgres, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"fifo_{label}")
    if label.startswith("cache-1000"):
        conn = await asyncpg.connect(url)
        await conn.execute("ALTER SEQUENCE job_key_seq CACHE 1000")
        await conn.close()
    with server(url, pool=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            postgres = process_tree(pg.postmaster_pid)
            cpu0 = cpu_seconds(postgres)
            # Four producers at once: sessions draw keys side by side.
            made = max(
                await asyncio.gather(
                    *(create(c, "plain", 250, args.jobs // 1000) for _ in range(4))
                )
            )
            cpu = cpu_seconds(process_tree(pg.postmaster_pid)) - cpu0
    return {
        "workload": label.split("_")[0],
        "creates/s": round(args.jobs / made),
        "PostgreSQL µs/create": round(cpu / args.jobs * 1e6, 1),
    }


async def fifo_run(pg: Postgres, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"fifo_{label}")
    config = {"keyOrdering": "fifo"} if label.startswith("fifo") else {"maxActivePerKey": 1}
    with server(url, pool=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            assert (await c.put("/v2/job-types/keyed", json=config)).status_code == 200
            await create(c, "keyed", args.keys, args.per_key)
            took, latencies = await drain(c, "keyed", args.keys * args.per_key, args)
    return {
        "workload": label.split("_")[0],
        "activation p50 ms": round(percentile(latencies, 50), 2),
        "activation p99 ms": round(percentile(latencies, 99), 2),
        "jobs/s": round(args.keys * args.per_key / took, 1),
    }


def summarize(rows: list[dict[str, Any]], workloads: tuple[str, str]) -> list[dict[str, Any]]:
    columns = [c for c in rows[0] if c != "workload"]
    return [
        {"workload": w, **{c: median([x[c] for x in rows if x["workload"] == w]) for c in columns}}
        for w in workloads
    ]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    out: dict[str, Any] = {"args": vars(args)}
    for name, run, workloads in (
        ("index", index_run, ("with-index", "without-index")),
        ("fifo", fifo_run, ("fifo", "per-key-1")),
        ("sequence", sequence_run, ("cache-1", "cache-1000")),
    ):
        if args.only and name != args.only:
            continue
        rows = []
        for r in range(args.repeat):
            # Alternating pairs, in turn first and second (ABBA): a run's place in its
            # pair (the checkpoint of the one before, say) weighs on both alike.
            for workload in workloads if r % 2 == 0 else workloads[::-1]:
                rows.append(await run(pg, f"{workload}_{r}", args))
                print(table([rows[-1]], list(rows[-1])), flush=True)
        summary = summarize(rows, workloads)
        print(table(summary, list(summary[0])), flush=True)
        out[name] = {"runs": rows, "summary": summary}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--per-key", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-jobs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--only", choices=["index", "fifo", "sequence"], default=None)
    write_results("fifo_keys", asyncio.run(main(parser.parse_args())))
