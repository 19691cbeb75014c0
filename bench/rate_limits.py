"""Rate limits inside fair share (issue 28 §2, ADR 028): ``python -m bench.rate_limits``.

* **beside**: tenant A rate-limited (``--rate`` a second, burst ``--burst``) beside two
  unlimited tenants B and C, all three backlogged, against the same load with no limit,
  alternating runs (none, limited, none, limited, ...; ``--repeat`` pairs).  Each run: a
  fresh database preloaded with ``--jobs`` ready jobs per tenant, one ``jobfair serve``
  process, ``--workers`` concurrent activators calling ``maxJobs`` 10 without waiting, for
  ``--seconds``.  Reported per run: A's rate over the window (by its bucket's clock, the
  database's: from the instant its limit was set to the end), B's and C's, the total
  throughput, and the activation call's p50 and p99.  The issue's targets: A at the
  rate ± 5 %, the others the rest, the total within ± 5 % of the unlimited runs'.
* **replicas**: the same limit with three ``jobfair serve`` processes on one database,
  the activators spread over them: A's rate summed over the three (target ± 5 %).
* **cost**: what "exact" costs one activation (ADR 028): calls of ``maxJobs`` 10 through
  the activation service, in process, with tenant A's limit set so high it never binds
  (the claim takes A's cap lock, reads the bucket and writes it back) against no limit,
  alternating in rounds; p50 and p99 per call.

Activations only (the leases are long, nothing is completed): the figure is what the
scheduler gives, not a worker's round trip.  Prints tables, then the JSON (also written
to bench/results/rate_limits.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from contextlib import AsyncExitStack, ExitStack
from datetime import datetime
from typing import Any

import asyncpg
import httpx

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import Database
from bench.harness import ROOT, Postgres, client, median, percentile, server, table

RESULTS = ROOT / "bench" / "results"
TYPE = "bench"
TENANTS = ("A", "B", "C")


async def preload(url: str, per_tenant: int) -> None:
    """``per_tenant`` ready jobs for each of A, B and C, with their lanes and keys."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables)
            SELECT jobfair_job_key(jobfair_shard(t), nextval('job_key_seq')),
                   jobfair_shard(t), $1, t, 'CREATED', 50, 3, now(),
                   now() + g * interval '1 us', now(), '{"n": 1}'::jsonb
            FROM unnest($2::text[]) t, generate_series(1, $3) g
            """,
            TYPE,
            list(TENANTS),
            per_tenant,
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
            " SELECT $1, t, jobfair_shard(t), 0, true FROM unnest($2::text[]) t",
            TYPE,
            list(TENANTS),
        )
        await conn.execute(
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
            " SELECT $1, t, '', jobfair_shard(t), 0, true FROM unnest($2::text[]) t",
            TYPE,
            list(TENANTS),
        )
        for table_name in ("jobs", "lanes", "lane_keys"):
            await conn.execute(f"VACUUM ANALYZE {table_name}")
    finally:
        await conn.close()


async def _limit(c: httpx.AsyncClient, per_s: float, burst: float) -> None:
    r = await c.put("/v2/tenants/A", json={"rateLimit": {"perSecond": per_s, "burst": burst}})
    r.raise_for_status()


async def _activator(
    c: httpx.AsyncClient, end: float, got: Counter[str], latencies: list[float]
) -> None:
    body = {"type": TYPE, "maxJobs": 10, "timeout": 600_000, "requestTimeout": -1}
    loop = asyncio.get_running_loop()
    while loop.time() < end:
        t = time.perf_counter()
        r = await c.post("/v2/jobs/activate", json=body)
        latencies.append((time.perf_counter() - t) * 1000)
        r.raise_for_status()
        got.update(j["tenantId"] for j in r.json()["jobs"])


async def _load(
    url: str, bases: list[str], limited: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """One run: A limited (or not), ``--workers`` activators spread over ``bases`` for
    ``--seconds``; the figures."""
    conn = await asyncpg.connect(url)
    got: Counter[str] = Counter()
    latencies: list[float] = []
    try:
        async with client(bases[0]) as first:
            if limited:
                await _limit(first, args.rate, args.burst)
        since: datetime = await conn.fetchval("SELECT statement_timestamp()")
        if limited:
            since = await conn.fetchval("SELECT rate_at FROM tenants WHERE tenant_id = 'A'")
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(client(b)) for b in bases]
            end = asyncio.get_running_loop().time() + args.seconds
            await asyncio.gather(
                *(
                    _activator(clients[i % len(clients)], end, got, latencies)
                    for i in range(args.workers)
                )
            )
        until: datetime = await conn.fetchval("SELECT statement_timestamp()")
    finally:
        await conn.close()
    window_s = (until - since).total_seconds()
    total = sum(got.values())
    row: dict[str, Any] = {"limit": f"{args.rate:g}/s" if limited else "none"}
    for t in TENANTS:
        row[f"{t}/s"] = round(got[t] / window_s, 1)
    row["A error %"] = round(100 * (got["A"] / window_s - args.rate) / args.rate, 1)
    row["A burst-free/s"] = round((got["A"] - (args.burst if limited else 0)) / window_s, 1)
    row["total/s"] = round(total / window_s, 0)
    row["p50 ms"] = round(percentile(latencies, 50), 2)
    row["p99 ms"] = round(percentile(latencies, 99), 2)
    row["window s"] = round(window_s, 2)
    for t in TENANTS:
        assert got[t] < args.jobs, f"tenant {t} ran dry: raise --jobs"
    return row


async def beside(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for r in range(2 * args.repeat):
        limited = r % 2 == 1
        url = pg.fresh_db(f"rate_beside_{r}")
        await preload(url, args.jobs)
        with server(url) as base:
            rows.append(await _load(url, [base], limited, args))
    return rows


async def replicas(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    url = pg.fresh_db("rate_replicas")
    await preload(url, args.jobs)
    with ExitStack() as stack:
        bases = [stack.enter_context(server(url)) for _ in range(3)]
        row = await _load(url, bases, True, args)
    row["servers"] = 3
    return [row]


async def cost(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    url = pg.fresh_db("rate_cost")
    await preload(url, 20 * args.calls * args.rounds)
    db = await Database.connect(url, size=4, min_size=2)
    service = Rounds(db, Settings())
    req = ActivateRequest(TYPE, 10, 600_000, "bench")
    samples: dict[str, list[float]] = {"none": [], "never binding": []}
    try:
        for r in range(2 * args.rounds):
            name = "none" if r % 2 == 0 else "never binding"
            if name == "none":
                await db.execute(
                    "UPDATE tenants SET rate_per_s = NULL, rate_burst = NULL,"
                    " rate_tokens = NULL, rate_at = NULL"
                )
            else:
                await db.execute(
                    "INSERT INTO tenants (tenant_id, rate_per_s, rate_burst, rate_tokens, rate_at)"
                    " VALUES ('A', 1e6, 1e6, 1e6, statement_timestamp())"
                    " ON CONFLICT (tenant_id) DO UPDATE SET rate_per_s = 1e6, rate_burst = 1e6,"
                    " rate_tokens = 1e6, rate_at = statement_timestamp()"
                )
            for i in range(args.calls):
                t = time.perf_counter()
                rows, _ = await service.activate(req)
                took = (time.perf_counter() - t) * 1000
                assert len(rows) == 10
                if r >= 2 or i >= 2:  # plans warmed first
                    samples[name].append(took)
            await service.settle()
    finally:
        await db.close()
    out = []
    for name, s in samples.items():
        out.append(
            {
                "A's limit": name,
                "calls": len(s),
                "p50 ms": round(median(s), 3),
                "p99 ms": round(percentile(s, 99), 3),
            }
        )
    out.append(
        {
            "A's limit": "ratio",
            "p50 ms": round(out[1]["p50 ms"] / out[0]["p50 ms"], 2),
            "p99 ms": round(out[1]["p99 ms"] / out[0]["p99 ms"], 2),
        }
    )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["beside", "replicas", "cost"])
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--burst", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    parts = {"beside": beside, "replicas": replicas, "cost": cost}
    result: dict[str, Any] = {"args": vars(args)}
    for name in args.parts:
        result[name] = await parts[name](pg, args)
        print(table(result[name], list(result[name][0])))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "rate_limits.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
