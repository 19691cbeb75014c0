"""Two levels of fair share (issue 28 §1, ADR 027): ``python -m bench.fair_keys``.

* **cost**: activation latency with a tenant of 100,000 fairness keys beside 10,000
  tenants, against the same backlog with every job on its tenant's one key (the one-level
  case).  Two databases, preloaded alike (``--tenants`` small tenants of a few jobs each,
  and tenant ``big`` of weight ``--big-weight``, so that most rounds reach its lane);
  calls of ``maxJobs`` 1 (the one-pick claim), 10 and 100 through the activation service,
  as a server makes them, alternating between the two in rounds so that both see the
  same machine.  Reported: p50 and p99 per call, and the two-level p99 over the
  one-level p99 (the target: at most 2).
* **shares**: the issue's two scenarios through the activation service: tenant A with
  1,000 keys against tenant B with one, equal weights, 10,000 activations (each 50 %
  within 1 point, A's keys equal); weights 1:2:7 with ten keys of weights 1..10 each (every
  tenant and key within 1 point of what it is entitled to).
* **sampling**: what the key window's sample (``key_samples``) costs the database at that
  many keys.

Prints tables, then the JSON (also written to bench/results/fair_keys.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import asyncpg

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import Database, job_rows, metric_reads
from app.domain import utcnow
from bench.harness import ROOT, Postgres, median, percentile, table

RESULTS = ROOT / "bench" / "results"
TYPE = "bench"


async def preload(url: str, tenants: int, per_tenant: int, big_jobs: int, keys: int) -> None:
    """``tenants`` tenants of ``per_tenant`` ready jobs, and ``big`` with ``big_jobs``
    spread over ``keys`` keys (1: its default key alone), with their lanes and keys."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables)
            SELECT jobfair_job_key(jobfair_shard('t' || t), nextval('job_key_seq')),
                   jobfair_shard('t' || t), $1, 't' || t, 'CREATED', 50, 3, now(),
                   now() + g * interval '1 us', now(), '{"n": 1}'::jsonb
            FROM generate_series(1, $2) t, generate_series(1, $3) g
            """,
            TYPE,
            tenants,
            per_tenant,
        )
        await conn.execute(
            """
            INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries,
                              run_at, queued_at, created_at, variables, fairness_key)
            SELECT jobfair_job_key(jobfair_shard('big'), nextval('job_key_seq')),
                   jobfair_shard('big'), $1, 'big', 'CREATED', 50, 3, now(),
                   now() + g * interval '1 us', now(), '{"n": 1}'::jsonb,
                   CASE WHEN $3 = 1 THEN '' ELSE 'u' || (g % $3) END
            FROM generate_series(1, $2) g
            """,
            TYPE,
            big_jobs,
            keys,
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
            " SELECT $1, t, jobfair_shard(t), 0, true"
            " FROM (SELECT 't' || g AS t FROM generate_series(1, $2) g UNION ALL SELECT 'big') x",
            TYPE,
            tenants,
        )
        await conn.execute(
            "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
            " SELECT DISTINCT job_type, tenant_id, fairness_key, shard, 0::float8, true"
            " FROM jobs WHERE state = 'CREATED'"
        )
        for table_name in ("jobs", "lanes", "lane_keys"):
            await conn.execute(f"VACUUM ANALYZE {table_name}")
    finally:
        await conn.close()


async def _calls(service: Rounds, max_jobs: int, n: int) -> list[float]:
    samples = []
    req = ActivateRequest(TYPE, max_jobs, 600_000, "bench")
    for _ in range(n):
        t = time.perf_counter()
        if max_jobs == 1:
            rows, _ = await service.activate_one_pick(req)
        else:
            rows, _ = await service.activate(req)
        samples.append((time.perf_counter() - t) * 1000)
        assert len(rows) == max_jobs, (len(rows), max_jobs)
    await service.settle()
    return samples


async def cost(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    shapes = {"one level": 1, "two levels": args.keys}
    services: dict[str, Rounds] = {}
    dbs: list[Database] = []
    for name, keys in shapes.items():
        url = pg.fresh_db(f"fair_keys_{keys}")
        await preload(url, args.tenants, args.per_tenant, args.big_jobs, keys)
        db = await Database.connect(url, size=4, min_size=2)
        dbs.append(db)
        await db.execute(
            "INSERT INTO tenants (tenant_id, weight) VALUES ('big', $1)", args.big_weight
        )
        services[name] = Rounds(db, Settings())
    rows = []
    try:
        for max_jobs in (1, 10, 100):
            samples: dict[str, list[float]] = {name: [] for name in shapes}
            for r in range(args.rounds):
                order = list(shapes) if r % 2 == 0 else list(reversed(shapes))
                for name in order:
                    got = await _calls(services[name], max_jobs, args.calls)
                    samples[name] += got[2:] if r == 0 else got  # warm plans first
            row: dict[str, Any] = {"maxJobs": max_jobs}
            for name, s in samples.items():
                short = name.split()[0]
                row[f"{short}_p50_ms"] = round(median(s), 2)
                row[f"{short}_p99_ms"] = round(percentile(s, 99), 2)
            row["p99_ratio"] = round(row["two_p99_ms"] / row["one_p99_ms"], 2)
            row["p50_ratio"] = round(row["two_p50_ms"] / row["one_p50_ms"], 2)
            rows.append(row)
        # What the metrics' key sample costs the database at that many keys.
        db = dbs[1]
        times = []
        for _ in range(5):
            t = time.perf_counter()
            await metric_reads.key_samples(db, 10, [])
            times.append((time.perf_counter() - t) * 1000)
        keys = await db.fetchval("SELECT count(*) FROM lane_keys")
        rows.append({"maxJobs": "key sample", "two_p50_ms": round(median(times), 1), "keys": keys})
    finally:
        for db in dbs:
            await db.close()
    return rows


async def _drain(service: Rounds, calls: int, n: int) -> list[Any]:
    got = []
    for _ in range(calls):
        rows, _ = await service.activate(ActivateRequest(TYPE, n, 600_000, "bench"))
        got += rows
    await service.settle()
    return got


async def shares(pg: Postgres) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # 1. A with 1,000 keys, B with one.
    url = pg.fresh_db("fair_keys_sybil")
    db = await Database.connect(url, size=4, min_size=2)
    try:
        jobs = [{"type": TYPE, "tenantId": "A", "fairnessKey": f"u{i % 1000}"} for i in range(6000)]
        jobs += [{"type": TYPE, "tenantId": "B"} for _ in range(6000)]
        await job_rows.insert(db, jobs, utcnow())
        got = await _drain(Rounds(db, Settings()), 100, 100)
    finally:
        await db.close()
    tenants = Counter(r.tenant_id for r in got)
    keys = Counter(r.fairness_key for r in got if r.tenant_id == "A")
    out.append(
        {
            "scenario": "A 1,000 keys vs B 1 key",
            "activations": len(got),
            "A %": round(100 * tenants["A"] / len(got), 2),
            "B %": round(100 * tenants["B"] / len(got), 2),
            "A's keys": len(keys),
            "per key min..max": f"{min(keys.values())}..{max(keys.values())}",
            "worst error pp": round(100 * abs(tenants["A"] / len(got) - 0.5), 2),
        }
    )
    # 2. 1:2:7, ten keys of weights 1..10 each.
    url = pg.fresh_db("fair_keys_layered")
    db = await Database.connect(url, size=4, min_size=2)
    weights = {"small": 1, "medium": 2, "large": 7}
    total = 10_000
    try:
        jobs = []
        for tenant, w in weights.items():
            await db.execute("INSERT INTO tenants (tenant_id, weight) VALUES ($1, $2)", tenant, w)
            for k in range(1, 11):
                await db.execute(
                    "INSERT INTO key_weights (tenant_id, fairness_key, shard, weight)"
                    " VALUES ($1, $2, jobfair_shard($1), $3)",
                    tenant,
                    f"k{k}",
                    k,
                )
                owed = total * w / 10 * k / 55
                jobs += [{"type": TYPE, "tenantId": tenant, "fairnessKey": f"k{k}"}] * (
                    int(owed * 1.2) + 5
                )
        await job_rows.insert(db, jobs, utcnow())
        got = await _drain(Rounds(db, Settings()), 100, 100)
    finally:
        await db.close()
    by_tenant = Counter(r.tenant_id for r in got)
    by_key = Counter((r.tenant_id, r.fairness_key) for r in got)
    tenant_err = max(abs(by_tenant[t] / total - w / 10) for t, w in weights.items())
    key_err = max(
        abs(by_key[(t, f"k{k}")] / total - w / 10 * k / 55)
        for t, w in weights.items()
        for k in range(1, 11)
    )
    out.append(
        {
            "scenario": "1:2:7, keys 1..10 each",
            "activations": len(got),
            "A %": round(100 * by_tenant["small"] / total, 2),
            "B %": round(100 * by_tenant["large"] / total, 2),
            "A's keys": 30,
            "per key min..max": f"{min(by_key.values())}..{max(by_key.values())}",
            "worst error pp": round(100 * max(tenant_err, key_err), 2),
        }
    )
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--per-tenant", type=int, default=5)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--big-jobs", type=int, default=200_000)
    parser.add_argument("--big-weight", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    result = {"cost": await cost(pg, args), "shares": await shares(pg), "args": vars(args)}
    print(table(result["cost"], list(result["cost"][0])))
    print(table(result["shares"], list(result["shares"][0])))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fair_keys.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
