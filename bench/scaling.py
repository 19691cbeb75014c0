"""Scaling out (issue 26, docs/scaling.md): replicas on one database, the lane read fanned
out over shards, and the CPU per job of each path for capacity planning.

``python -m bench.scaling replicas fanout capacity`` (any of them; all by default).

* ``replicas``: the same drain through 1, 2 and 3 ``jobfair serve`` processes on one
  database, the workers spread over them, in the order 1, 2, 3, 1, 2, 3 ... (``--rounds``):
  the machine is shared, and its noise comes in bursts.  Jobs/s, and the CPU per job of
  the servers (all replicas together) and of PostgreSQL, and the database connections
  each replica holds.
* ``fanout``: the lane read of one job type (read_lanes) over one database holding every
  lane, against the same lanes split by shard over ``--shards`` databases, read there in
  parallel and merged by virtual time: what a lane read costs once lanes are distributed
  by tenant (Citus).
* ``capacity``: CPU per job of enqueue (batches of 1,000), of pickup (one job created at
  a time and taken by a waiting long poll) and of the drain, each split between the
  server and PostgreSQL.

Prints a table per part and the JSON (also bench/results/scaling.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import asyncpg

from app import shards
from app.db.lanes import CHARGE_ARRAYS
from app.db.lanes import SQL as LANES
from bench.delivery import _pickup
from bench.harness import (
    ROOT,
    CpuMeter,
    Postgres,
    machine_speed,
    median,
    percentile,
    server,
    server_pid,
    speed_line,
    table,
)
from bench.preload import preload
from bench.run import _drain, _enqueue

TENANTS = [f"t{i}" for i in range(10)]


# -- replicas ---------------------------------------------------------------------------


async def _connections(url: str) -> int:
    """Connections to the database of ``url`` other than this one."""
    conn = await asyncpg.connect(url)
    try:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return n
    finally:
        await conn.close()


@contextmanager
def _servers(url: str, n: int, pool: int) -> Iterator[list[str]]:
    """``n`` ``jobfair serve`` processes on the database ``url``, started at once (each
    takes seconds to start: its pool opened and warmed); their base URLs."""
    managers = [server(url, pool=pool) for _ in range(n)]
    with ExitStack() as stack:
        with ThreadPoolExecutor(n) as starter:
            started = [(m, starter.submit(m.__enter__)) for m in managers]
        bases, failed = [], None
        for manager, future in started:
            try:
                bases.append(future.result())
            except Exception as exc:  # stop the others, then say why
                failed = failed or exc
            else:
                stack.push(manager.__exit__)
        if failed is not None:
            raise failed
        yield bases


async def _reload(url: str, jobs: int) -> None:
    """The backlog of a drain, after the previous one's rows are gone."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE jobs, lanes")
    finally:
        await conn.close()
    await preload(url, "bench", {t: jobs // len(TENANTS) for t in TENANTS})


def bench_replicas(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The replicas stay up from run to run (each drain uses the first n of them; the
    others sit idle, holding their connections): starting three took longer than a
    drain.  Between runs the tables are emptied and loaded again."""
    url = pg.fresh_db("bench_replicas")
    jobs = args.jobs - args.jobs % len(TENANTS)
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.replicas}
    with _servers(url, max(args.replicas), args.pool) as bases:
        per_replica = asyncio.run(_connections(url)) / len(bases)
        for r in range(args.rounds):
            for n in args.replicas:
                asyncio.run(_reload(url, jobs))
                meter = CpuMeter([server_pid(b) for b in bases[:n]], pg.postmaster_pid)
                rate = asyncio.run(_drain(bases[:n], args.workers, args.max_jobs, "batch", jobs))
                seconds, wall = meter.split()
                run = {
                    "jobsPerSec": rate,
                    "serverUsPerJob": 1e6 * seconds["server"] / jobs,
                    "postgresUsPerJob": 1e6 * seconds["postgres"] / jobs,
                    "busyPct": 100 * sum(seconds.values()) / (wall * (os.cpu_count() or 1)),
                }
                runs[n].append(run)
                print(
                    f"round {r + 1}, {n} replica(s): {rate:,.0f} jobs/s, "
                    f"server {run['serverUsPerJob']:.0f} µs/job, "
                    f"PostgreSQL {run['postgresUsPerJob']:.0f} µs/job",
                    flush=True,
                )
    rows = []
    for n, rs in runs.items():
        server_us = median([x["serverUsPerJob"] for x in rs])
        postgres_us = median([x["postgresUsPerJob"] for x in rs])
        rows.append(
            {
                "replicas": n,
                "workers": args.workers,
                "maxJobs": args.max_jobs,
                "jobsPerSec": median([x["jobsPerSec"] for x in rs]),
                "runs": [round(x["jobsPerSec"]) for x in rs],
                "serverUsPerJob": server_us,
                "postgresUsPerJob": postgres_us,
                "busyPct": median([x["busyPct"] for x in rs]),
                "connectionsPerReplica": per_replica,
                # With a core per replica and PostgreSQL on cores of its own, the replicas
                # would do n / (server µs per job) jobs/s, and each PostgreSQL core
                # 1 / (PostgreSQL µs per job).
                "replicasCeilingJobsPerSec": n * 1e6 / server_us,
                "perPostgresCoreJobsPerSec": 1e6 / postgres_us,
            }
        )
    return rows


# -- fan-out of the lane read -------------------------------------------------------------


async def _load_lanes(urls: list[str], tenants: int, per_lane: int) -> None:
    """``tenants`` lanes of job type ``bench``, each with ``per_lane`` ready jobs and a
    random virtual time; with several databases, each lane (and its jobs) goes to the
    database its shard maps to (shard mod n), as Citus would place it."""
    rng = random.Random(26)
    placed: list[list[tuple[str, float]]] = [[] for _ in urls]
    for t in range(tenants):
        tenant = f"t{t}"
        placed[shards.shard_of(tenant) % len(urls)].append((tenant, rng.random() * 1000))
    for url, lanes in zip(urls, placed, strict=True):
        conn = await asyncpg.connect(url)
        try:
            names = [t for t, _ in lanes]
            await conn.execute(
                """
                INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                                  run_at, queued_at, created_at)
                SELECT jobfair_job_key(jobfair_shard(t), nextval('job_key_seq')),
                       jobfair_shard(t), 'bench', t, 'CREATED', 50, 3, now(), now(), now()
                FROM unnest($1::text[]) t, generate_series(1, $2) g
                """,
                names,
                per_lane,
            )
            await conn.execute(
                """
                INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)
                SELECT 'bench', t, jobfair_shard(t), v, true
                FROM unnest($1::text[], $2::float8[]) AS x(t, v)
                """,
                names,
                [v for _, v in lanes],
            )
            await conn.execute("VACUUM ANALYZE jobs")
            await conn.execute("VACUUM ANALYZE lanes")
        finally:
            await conn.close()


async def _read(conn: asyncpg.Connection, k: int) -> list[tuple[float, str]]:
    no_charges = dict.fromkeys(CHARGE_ARRAYS, [])
    rows = await conn.fetch(
        *LANES["read_lanes"].bind(job_type="bench", limit=k, exclude=[], **no_charges)
    )
    return [(r["vtime"], r["tenant_id"]) for r in rows if r["ready"]]


async def _reads(urls: list[str], k: int, calls: int, postgres: int) -> dict[str, Any]:
    """``calls`` lane reads of the first ``k`` lanes: on each database at once and merged
    when there are several.  Latency per read and PostgreSQL's CPU per read."""
    # As the server's pool connects: generic plans (app.db.pool), so each read is not
    # planned anew.
    settings = {"plan_cache_mode": "force_generic_plan", "jit": "off"}
    conns = [await asyncpg.connect(u, server_settings=settings) for u in urls]
    try:
        for _ in range(20):  # plans made, caches warm
            await asyncio.gather(*(_read(c, k) for c in conns))
        samples = []
        meter = CpuMeter([], postgres)
        for _ in range(calls):
            t0 = time.perf_counter()
            parts = await asyncio.gather(*(_read(c, k) for c in conns))
            merged = sorted(lane for part in parts for lane in part)[:k]
            samples.append(1e3 * (time.perf_counter() - t0))
            assert len(merged) == k, (len(merged), k)
        seconds, _ = meter.split()
    finally:
        for c in conns:
            await c.close()
    return {
        "p50Ms": percentile(samples, 50),
        "p99Ms": percentile(samples, 99),
        "postgresUsPerRead": 1e6 * seconds["postgres"] / calls,
        "lanesRead": k * len(urls),
    }


def bench_fanout(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    layouts = {1: [pg.fresh_db("bench_fan_all")]}
    layouts[args.shards] = [pg.fresh_db(f"bench_fan_{i}") for i in range(args.shards)]
    for urls in layouts.values():
        asyncio.run(_load_lanes(urls, args.lanes, 2))
    results: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for k in (1, 10, 100):
            for n, urls in layouts.items():
                run = asyncio.run(_reads(urls, k, args.reads, pg.postmaster_pid))
                results.setdefault((n, k), []).append(run)
    rows = []
    for (n, k), rs in sorted(results.items(), key=lambda x: (x[0][1], x[0][0])):
        rows.append(
            {
                "databases": n,
                "lanes": args.lanes,
                "k": k,
                "lanesRead": rs[0]["lanesRead"],
                **{f: median([r[f] for r in rs]) for f in ("p50Ms", "p99Ms", "postgresUsPerRead")},
            }
        )
    for row in rows:
        one = next(r for r in rows if r["k"] == row["k"] and r["databases"] == 1)
        row["cpuVsOne"] = row["postgresUsPerRead"] / one["postgresUsPerRead"]
        row["p50VsOne"] = row["p50Ms"] / one["p50Ms"]
    return rows


# -- capacity ---------------------------------------------------------------------------


async def _wal_lsn(url: str) -> str:
    conn = await asyncpg.connect(url)
    try:
        lsn: str = await conn.fetchval("SELECT pg_current_wal_lsn()::text")
        return lsn
    finally:
        await conn.close()


async def _wal_since(url: str, lsn: str) -> float:
    conn = await asyncpg.connect(url)
    try:
        return float(
            await conn.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)", lsn
            )
        )
    finally:
        await conn.close()


class _Measured:
    """CPU of the server and PostgreSQL, and WAL written, from construction to ``row``."""

    def __init__(self, url: str, base: str, postgres: int) -> None:
        self.url = url
        self.lsn = asyncio.run(_wal_lsn(url))
        self.meter = CpuMeter(server_pid(base), postgres)

    def row(self, jobs: int, rate: float) -> dict[str, Any]:
        seconds, _ = self.meter.split()
        return {
            "jobsPerSec": rate,
            "serverUsPerJob": 1e6 * seconds["server"] / jobs,
            "postgresUsPerJob": 1e6 * seconds["postgres"] / jobs,
            "walBytesPerJob": asyncio.run(_wal_since(self.url, self.lsn)) / jobs,
        }


async def _empty(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE jobs, lanes")
    finally:
        await conn.close()


def bench_capacity(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each round: one server on a fresh database, each path in turn, the tables emptied
    between them."""
    runs: dict[str, list[dict[str, Any]]] = {}
    jobs = args.jobs - args.jobs % len(TENANTS)
    for _ in range(args.rounds):
        url = pg.fresh_db("bench_capacity")
        with server(url) as base:
            # Enqueue: 4 producers, batches of 1,000 jobs (bench.run's enqueue); it makes
            # one batch more first (a warm-up), counted here.
            m = _Measured(url, base, pg.postmaster_pid)
            rate = asyncio.run(_enqueue(base, 4, args.enqueue_batches, 1000))
            runs.setdefault("enqueue, batches of 1,000", []).append(
                m.row((4 * args.enqueue_batches + 1) * 1000, rate)
            )
            # Pickup: one job per POST /v2/jobs, taken by one of 4 waiting long polls and
            # completed with a call of its own, paced at most at --pickup-rate (100 warm-up
            # jobs first, counted here): the producer waits for each answer, so the rate is
            # what it reached.
            asyncio.run(_empty(url))
            m = _Measured(url, base, pg.postmaster_pid)
            started = time.perf_counter()
            asyncio.run(_pickup(base, "longpoll", args.pickup_jobs, args.pickup_rate))
            made = args.pickup_jobs + 100
            runs.setdefault("pickup, one job at a time", []).append(
                m.row(made, made / (time.perf_counter() - started))
            )
            # Drain: activations of 10 and 100 jobs, each completed in one call.
            for max_jobs in (10, 100):
                asyncio.run(_reload(url, jobs))
                m = _Measured(url, base, pg.postmaster_pid)
                rate = asyncio.run(_drain(base, args.workers, max_jobs, "batch", jobs))
                runs.setdefault(f"drain, maxJobs {max_jobs}, batch completion", []).append(
                    m.row(jobs, rate)
                )
    rows = []
    for path, rs in runs.items():
        server_us = median([r["serverUsPerJob"] for r in rs])
        postgres_us = median([r["postgresUsPerJob"] for r in rs])
        rows.append(
            {
                "path": path,
                "jobsPerSec": median([r["jobsPerSec"] for r in rs]),
                "serverUsPerJob": server_us,
                "postgresUsPerJob": postgres_us,
                "postgresSharePct": 100 * postgres_us / (server_us + postgres_us),
                "jobsPerServerCore": 1e6 / server_us,
                "jobsPerPostgresCore": 1e6 / postgres_us,
                "walBytesPerJob": median([r["walBytesPerJob"] for r in rs]),
            }
        )
    return rows


BENCHES = {
    "replicas": (
        bench_replicas,
        [
            "replicas",
            "workers",
            "maxJobs",
            "jobsPerSec",
            "runs",
            "serverUsPerJob",
            "postgresUsPerJob",
            "busyPct",
            "connectionsPerReplica",
            "replicasCeilingJobsPerSec",
            "perPostgresCoreJobsPerSec",
        ],
    ),
    "fanout": (
        bench_fanout,
        [
            "databases",
            "lanes",
            "k",
            "lanesRead",
            "p50Ms",
            "p99Ms",
            "p50VsOne",
            "postgresUsPerRead",
            "cpuVsOne",
        ],
    ),
    "capacity": (
        bench_capacity,
        [
            "path",
            "jobsPerSec",
            "serverUsPerJob",
            "postgresUsPerJob",
            "postgresSharePct",
            "jobsPerServerCore",
            "jobsPerPostgresCore",
            "walBytesPerJob",
        ],
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("benches", nargs="*", default=[], choices=[[], *BENCHES], help="all if none")
    p.add_argument("--rounds", type=int, default=3, help="runs per figure (median reported)")
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--workers", type=int, default=12, help="drain workers (over the replicas)")
    p.add_argument("--max-jobs", type=int, default=10, help="the replicas drain's maxJobs")
    p.add_argument("--jobs", type=int, default=10_000, help="jobs per drain")
    p.add_argument("--pool", type=int, default=20, help="each replica's JOBFAIR_DB_POOL_SIZE")
    p.add_argument("--shards", type=int, default=4, help="databases of the fan-out")
    p.add_argument("--lanes", type=int, default=40_000, help="lanes (tenants) of the fan-out")
    p.add_argument("--reads", type=int, default=500, help="lane reads per fan-out figure")
    p.add_argument("--enqueue-batches", type=int, default=5, help="per producer")
    p.add_argument("--pickup-jobs", type=int, default=300)
    p.add_argument("--pickup-rate", type=int, default=500)
    args = p.parse_args()
    os.makedirs(ROOT / ".jobfair", exist_ok=True)
    pg = Postgres(ROOT / ".jobfair" / "bench")
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "speedBefore": machine_speed()}
    results: dict[str, Any] = {"machine": machine, "args": vars(args)}
    print(f"machine speed before: {speed_line(machine['speedBefore'])}", flush=True)
    for name in args.benches or list(BENCHES):
        fn, columns = BENCHES[name]
        t0 = time.monotonic()
        rows = fn(pg, args)
        results[name] = rows
        print(f"\n## {name} ({time.monotonic() - t0:.0f} s)\n")
        print(table(rows, columns), flush=True)
    machine["speedAfter"] = machine_speed()
    print(f"\nmachine speed after: {speed_line(machine['speedAfter'])}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
