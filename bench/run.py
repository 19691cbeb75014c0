"""Jobfair benchmarks: ``make bench`` (all) or ``python -m bench.run enqueue drain ...``.

Prints one JSON document (also written to bench/results/latest.json) and a table per
benchmark.  Everything goes over HTTP to server processes started here, on the embedded
PostgreSQL under .jobfair/bench.  See docs/benchmarks.md for how to read the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from bench import delivery, soak
from bench.harness import (
    ROOT,
    CpuMeter,
    Postgres,
    latency_row,
    machine_speed,
    median,
    percentile,
    plain_server,
    server,
    server_pid,
    speed_line,
    table,
)
from bench.preload import preload, preload_many_tenants
from bench.wire import Connection

RESULTS = ROOT / "bench" / "results"


# -- set-up helpers ---------------------------------------------------------------------


# -- 1. enqueue -------------------------------------------------------------------------


async def _enqueue(base: str, producers: int, batches_each: int, batch: int) -> float:
    body = {
        "jobs": [
            {"type": "bench", "tenantId": f"t{i % 10}", "variables": {"i": i}} for i in range(batch)
        ]
    }
    payload = orjson.dumps(body)
    conns = [await Connection.open(base) for _ in range(producers)]
    await conns[0].post("/v2/jobs/batch", payload)  # warm-up

    async def producer(i: int) -> None:
        for _ in range(batches_each):
            r = await conns[i].post("/v2/jobs/batch", payload)
            assert r.status == 201, r.body

    t0 = time.perf_counter()
    await asyncio.gather(*(producer(i) for i in range(producers)))
    elapsed = time.perf_counter() - t0
    for c in conns:
        await c.close()
    return producers * batches_each * batch / elapsed


def bench_enqueue(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for producers in (1, 4):
        for workers in args.server_workers:
            url = pg.fresh_db("bench_enqueue")
            with server(url, workers=workers) as base:
                runs = [
                    asyncio.run(_enqueue(base, producers, args.enqueue_batches, 1000))
                    for _ in range(args.repeat)
                ]
            rows.append(
                {
                    "producers": producers,
                    "serverWorkers": workers,
                    "jobsPerSec": median(runs),
                    "runs": runs,
                }
            )
    return rows


# -- 2. drain ---------------------------------------------------------------------------


HANDLERS = 10  # a worker's handler pool in the "parallel" completion mode


async def _drain(
    base: str | Sequence[str], workers: int, max_jobs: int, completion: str, total: int
) -> float:
    """Jobs/s of ``workers`` activate-and-complete loops.  ``completion``: "batch" (one
    ``POST /v2/jobs/complete`` per activation), "single" (one call per job, one after the
    other) or "parallel" (one call per job, made by a pool of ``HANDLERS`` connections at
    once, as a worker running its jobs' handlers concurrently does).  Several ``base``
    URLs (replicas on one database): the i-th worker calls the (i mod n)-th."""
    done = 0
    pool = HANDLERS if completion == "parallel" else 1
    bases = [base] if isinstance(base, str) else list(base)
    conns = [
        [await Connection.open(bases[i % len(bases)]) for _ in range(pool)] for i in range(workers)
    ]

    async def complete_each(c: Connection, jobs: list[dict[str, Any]]) -> None:
        for j in jobs:
            r = await c.post(
                f"/v2/jobs/{j['jobKey']}/complete", {"activationCount": j["activationCount"]}
            )
            assert r.status == 204, r.body

    async def worker(i: int) -> None:
        nonlocal done
        c = conns[i][0]
        activate = {
            "type": "bench",
            "maxJobs": max_jobs,
            "timeout": 300_000,
            "worker": f"w{i}",
            "requestTimeout": -1,
        }
        while True:
            jobs = (await c.post("/v2/jobs/activate", activate)).json()["jobs"]
            if not jobs:
                return
            if completion == "batch":
                finished = [
                    {"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in jobs
                ]
                r = await c.post("/v2/jobs/complete", {"jobs": finished})
                assert r.status == 200
            else:
                await asyncio.gather(
                    *(complete_each(h, jobs[k::pool]) for k, h in enumerate(conns[i]))
                )
            done += len(jobs)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(workers)))
    elapsed = time.perf_counter() - t0
    for c in (c for pool_ in conns for c in pool_):
        await c.close()
    assert done == total, (done, total)
    return done / elapsed


def bench_drain(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for workers in args.drain_workers:
        for max_jobs in (10, 100):
            for completion in args.completions:
                for sw in args.server_workers:
                    total = args.drain_jobs if completion == "batch" else args.drain_jobs // 2
                    runs = []
                    cpu: dict[str, list[float]] = {}
                    for _ in range(args.repeat):
                        url = pg.fresh_db("bench_drain")
                        asyncio.run(
                            preload(url, "bench", {f"t{i}": total // 10 for i in range(10)})
                        )
                        with server(url, workers=sw) as base:
                            meter = CpuMeter(server_pid(base), pg.postmaster_pid)
                            wal_before = asyncio.run(_wal_bytes(url))
                            runs.append(
                                asyncio.run(_drain(base, workers, max_jobs, completion, total))
                            )
                            for name, value in _cpu_per_job(meter, total).items():
                                cpu.setdefault(name, []).append(value)
                            wal = asyncio.run(_wal_bytes(url)) - wal_before
                            cpu.setdefault("walBytesPerJob", []).append(wal / total)
                    rows.append(
                        {
                            "workers": workers,
                            "maxJobs": max_jobs,
                            "completion": completion,
                            "serverWorkers": sw,
                            "jobsPerSec": median(runs),
                            "runs": runs,
                            **{name: median(values) for name, values in cpu.items()},
                        }
                    )
    return rows


async def _wal_bytes(url: str) -> int:
    """Where PostgreSQL's write-ahead log is, in bytes: the difference of two readings is
    what a run wrote (the whole server's, so a checkpoint's full-page images count too).
    Unlike CPU time it does not move with the machine's load."""
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))
    finally:
        await conn.close()


def _cpu_per_job(meter: CpuMeter, jobs: int) -> dict[str, float]:
    """Microseconds of CPU per job spent by the server, PostgreSQL and the load generator,
    and how busy the machine's cores were: whether a drain was bound by CPU or by
    waiting (durable commits, round trips)."""
    seconds, wall = meter.split()
    row = {f"{name}UsPerJob": 1e6 * s / jobs for name, s in seconds.items()}
    row["busyPct"] = 100 * sum(seconds.values()) / (wall * (os.cpu_count() or 1))
    return row


# -- 3. backlog independence ------------------------------------------------------------


async def _latency(base: str, calls: int, max_jobs: int) -> list[float]:
    samples = []
    c = await Connection.open(base)
    body = orjson.dumps(
        {"type": "bench", "maxJobs": max_jobs, "timeout": 300_000, "requestTimeout": -1}
    )
    for _ in range(50):  # warm-up
        await c.post("/v2/jobs/activate", body)
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await c.post("/v2/jobs/activate", body)
        samples.append((time.perf_counter() - t0) * 1000)
        assert len(r.json()["jobs"]) == max_jobs
    await c.close()
    return samples


def bench_backlog(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Activation latency over a small and a large backlog, ``--repeat`` times each,
    alternating, each run on a fresh database; ``p99VsSmall`` divides each run's p99 by
    the p99 of the small-backlog run just before it (the target's ratio, measured a
    minute apart rather than across the whole benchmark)."""
    backlogs = (10_000, args.big_backlog)
    runs: dict[tuple[int, int], list[list[float]]] = {(b, k): [] for b in backlogs for k in (1, 10)}
    for _ in range(args.repeat):
        for backlog in backlogs:
            url = pg.fresh_db("bench_backlog")
            asyncio.run(preload(url, "bench", {f"t{i}": backlog // 10 for i in range(10)}))
            with server(url) as base:
                runs[backlog, 1].append(asyncio.run(_latency(base, args.latency_calls, 1)))
                runs[backlog, 10].append(asyncio.run(_latency(base, args.latency_calls // 4, 10)))
    rows = []
    for (backlog, max_jobs), samples in runs.items():
        row = {"backlog": backlog, "maxJobs": max_jobs, **latency_row(samples)}
        small = [percentile(s, 99) for s in runs[backlogs[0], max_jobs]]
        row["p99VsSmall"] = median([p / q for p, q in zip(row["p99Runs"], small, strict=True)])
        rows.append(row)
    return rows


# -- 4. many tenants --------------------------------------------------------------------


def bench_tenants(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    total = args.tenant_jobs
    for tenants in (1, 100, 10_000):
        runs = []
        for _ in range(args.repeat):
            url = pg.fresh_db("bench_tenants")
            asyncio.run(preload_many_tenants(url, "bench", tenants, max(1, total // tenants)))
            with server(url) as base:
                runs.append(
                    asyncio.run(_drain(base, 8, 100, "batch", (total // tenants) * tenants))
                )
        rows.append(
            {
                "tenants": tenants,
                "workers": 8,
                "maxJobs": 100,
                "completion": "batch",
                "jobsPerSec": median(runs),
                "runs": runs,
            }
        )
    base_rate = rows[0]["jobsPerSec"]
    for r in rows:
        r["vsOneTenant"] = r["jobsPerSec"] / base_rate
    return rows


# -- 4b. emptied lanes (work conservation) -----------------------------------------------


async def _drain_emptied(base: str, callers: int, small: int, big: int) -> dict[str, Any]:
    """Issue 19's shape: ``big`` jobs of `<default>` and one job each of ``small`` other
    tenants, created in one batch; ``callers`` activate (maxJobs 10, at once) until all
    are out.  Counts the answers that came back short while more jobs were left than the
    other callers could hold (each a breach of work conservation), and the empty ones."""
    c = await Connection.open(base)
    jobs = [{"type": "bench", "tenantId": f"s{i}"} for i in range(small)]
    jobs += [{"type": "bench"} for _ in range(big)]
    for start in range(0, len(jobs), 10_000):
        r = await c.post("/v2/jobs/batch", {"jobs": jobs[start : start + 10_000]})
        assert r.status == 201, r.body
    await c.close()
    conns = [await Connection.open(base) for _ in range(callers)]
    total = small + big
    left = total
    empty = short = answers = 0
    body = {"type": "bench", "maxJobs": 10, "timeout": 300_000, "requestTimeout": -1}

    async def caller(conn: Connection) -> None:
        nonlocal left, empty, short, answers
        while left > 0:
            got = len((await conn.post("/v2/jobs/activate", body)).json()["jobs"])
            answers += 1
            empty += got == 0
            short += got < min(10, left - 10 * (callers - 1))
            left -= got

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(conn) for conn in conns))
    elapsed = time.perf_counter() - t0
    for conn in conns:
        await conn.close()
    return {"seconds": elapsed, "answers": answers, "empty": empty, "short": short}


def bench_emptied(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for small, big in ((2_000, 1_000), (10_000, 10_000)):
        for callers in (1, 16):
            runs = []
            for _ in range(args.repeat):
                url = pg.fresh_db("bench_emptied")
                with server(url) as base:
                    runs.append(asyncio.run(_drain_emptied(base, callers, small, big)))
            seconds = [r["seconds"] for r in runs]
            rows.append(
                {
                    "smallTenants": small,
                    "bigJobs": big,
                    "callers": callers,
                    "jobsPerSec": median([(small + big) / s for s in seconds]),
                    "seconds": median(seconds),
                    "answers": median([r["answers"] for r in runs]),
                    "emptyAnswers": max(r["empty"] for r in runs),
                    "shortAnswers": max(r["short"] for r in runs),
                }
            )
    return rows


# -- 5. fairness accuracy ---------------------------------------------------------------


async def _fairness(base: str, activations: int) -> dict[str, int]:
    got: Counter[str] = Counter()
    conns = [await Connection.open(base) for _ in range(8)]
    for tenant, w in (("w1", 1), ("w2", 2), ("w7", 7)):
        await conns[0].request("PUT", f"/v2/tenants/{tenant}", {"weight": w})

    async def worker(i: int) -> None:
        c = conns[i]
        while sum(got.values()) < activations:
            jobs = (
                await c.post(
                    "/v2/jobs/activate",
                    {
                        "type": "bench",
                        "maxJobs": 50,
                        "timeout": 300_000,
                        "requestTimeout": -1,
                    },
                )
            ).json()["jobs"]
            got.update(j["tenantId"] for j in jobs)
            await c.post(
                "/v2/jobs/complete",
                {
                    "jobs": [
                        {"jobKey": j["jobKey"], "activationCount": j["activationCount"]}
                        for j in jobs
                    ]
                },
            )

    await asyncio.gather(*(worker(i) for i in range(8)))
    for c in conns:
        await c.close()
    return dict(got)


def bench_fairness(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    url = pg.fresh_db("bench_fairness")
    n = args.fairness_activations
    asyncio.run(preload(url, "bench", {"w1": n, "w2": n, "w7": n}))
    with server(url) as base:
        got = asyncio.run(_fairness(base, n))
    total = sum(got.values())
    rows = []
    for tenant, w in (("w1", 1), ("w2", 2), ("w7", 7)):
        realized = got.get(tenant, 0) / total
        rows.append(
            {
                "tenant": tenant,
                "weight": w,
                "configuredPct": w * 10.0,
                "realizedPct": realized * 100,
                "errorPp": abs(realized * 100 - w * 10),
            }
        )
    return rows


# -- 6. the machine's ceiling --------------------------------------------------------------


async def _hammer(base: str, connections: int, seconds: float) -> float:
    """Requests/s of ``POST /v2/jobs/1/complete`` from ``connections`` keep-alive clients."""
    conns = [await Connection.open(base) for _ in range(connections)]
    answered = 0
    stop = time.perf_counter() + seconds

    async def client(c: Connection) -> None:
        nonlocal answered
        while time.perf_counter() < stop:
            await c.post("/v2/jobs/1/complete", {"activationCount": 1})
            answered += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for c in conns:
        await c.close()
    return answered / elapsed


def bench_ceiling(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    """An empty route under uvicorn, no database, as FastAPI and as bare ASGI: the most
    requests/s this machine answers with this load generator.  One complete call per job
    can never beat it."""
    rows = []
    apps = {"empty FastAPI route": "bench.ceiling_app:app", "bare ASGI": "bench.ceiling_app:bare"}
    for name, target in apps.items():
        for sw in args.server_workers:
            runs = []
            for _ in range(args.repeat):
                with plain_server(target, workers=sw) as base:
                    runs.append(asyncio.run(_hammer(base, 32, args.ceiling_seconds)))
            rows.append(
                {"app": name, "serverWorkers": sw, "requestsPerSec": median(runs), "runs": runs}
            )
    return rows


BENCHES = {
    "pickup": (
        delivery.bench_pickup,
        [
            "mode",
            "runs",
            "samples",
            "ratePerSec",
            "p50Ms",
            "p95Ms",
            "p99Ms",
            "p99Runs",
            "fromPostP50Ms",
            "fromPostP99Ms",
        ],
    ),
    "idle": (delivery.bench_idle, ["longPolls", "streams", "seconds", "serverCpuPctOfOneCore"]),
    "stream_drain": (
        delivery.bench_stream_drain,
        ["streams", "credit", "completion", "serverWorkers", "jobsPerSec", "runs"],
    ),
    "enqueue": (bench_enqueue, ["producers", "serverWorkers", "jobsPerSec"]),
    "drain": (
        bench_drain,
        [
            "workers",
            "maxJobs",
            "completion",
            "serverWorkers",
            "jobsPerSec",
            "runs",
            "serverUsPerJob",
            "postgresUsPerJob",
            "loadgenUsPerJob",
            "busyPct",
            "walBytesPerJob",
        ],
    ),
    "backlog": (
        bench_backlog,
        ["backlog", "maxJobs", "samples", "p50Ms", "p99Ms", "p99VsSmall", "p99Runs"],
    ),
    "tenants": (
        bench_tenants,
        ["tenants", "workers", "maxJobs", "jobsPerSec", "vsOneTenant", "runs"],
    ),
    "emptied": (
        bench_emptied,
        [
            "smallTenants",
            "bigJobs",
            "callers",
            "jobsPerSec",
            "seconds",
            "answers",
            "emptyAnswers",
            "shortAnswers",
        ],
    ),
    "fairness": (bench_fairness, ["tenant", "weight", "configuredPct", "realizedPct", "errorPp"]),
    "ceiling": (bench_ceiling, ["app", "serverWorkers", "requestsPerSec"]),
    "soak": (
        soak.bench_soak,
        [
            "atS",
            "jobsPerSec",
            "activateP50Ms",
            "activateP99Ms",
            "completeP99Ms",
            "pending",
            "jobsDeadTuples",
            "lanesDeadTuples",
            "jobsAutovacuums",
            "jobsMB",
            "readyIndexMB",
            "pkeyMB",
        ],
    ),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("benches", nargs="*", default=list(BENCHES), choices=[[], *BENCHES])
    p.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per figure, each on a fresh database (median reported, runs listed); "
        "fairness and idle run once",
    )
    p.add_argument("--server-workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--enqueue-batches", type=int, default=40)
    p.add_argument("--drain-workers", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--drain-jobs", type=int, default=40_000)
    p.add_argument(
        "--completions",
        nargs="+",
        default=["single", "parallel", "batch"],
        choices=["single", "parallel", "batch"],
    )
    p.add_argument("--big-backlog", type=int, default=1_000_000)
    p.add_argument("--latency-calls", type=int, default=2000)
    p.add_argument("--tenant-jobs", type=int, default=100_000)
    p.add_argument("--fairness-activations", type=int, default=20_000)
    p.add_argument("--pickup-jobs", type=int, default=2000)
    p.add_argument("--pickup-rate", type=int, default=200)
    p.add_argument("--idle-polls", type=int, default=1000)
    p.add_argument("--idle-streams", type=int, default=1000)
    p.add_argument("--idle-seconds", type=float, default=60)
    p.add_argument("--ceiling-seconds", type=float, default=10)
    p.add_argument("--soak-seconds", type=float, default=300)
    p.add_argument("--soak-rate", type=int, default=1000, help="jobs/s produced and finished")
    p.add_argument("--soak-interval", type=float, default=30, help="seconds per reported row")
    p.add_argument("--soak-backlog", type=int, default=100_000)
    p.add_argument(
        "--soak-retention-s", type=int, default=None, help="server's JOBFAIR_RETENTION_S"
    )
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
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = json.dumps(results, indent=2)
    (RESULTS / "latest.json").write_text(out)
    print("\n" + out)


if __name__ == "__main__":
    main()
