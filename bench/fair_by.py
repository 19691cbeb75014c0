"""Fairness by worker time and by cost (issue 28 §3 and §5, ADR 029):
``python -m bench.fair_by``.

* **worker_time**: issue 28 §5's row.  Tenants A and B, equal weights, both backlogged
  throughout; A's jobs take ``--slow-ms`` (100) of work, B's ``--fast-ms`` (10).
  ``--workers`` concurrent workers (each: activate one job, work, complete) for
  ``--seconds`` against one ``jobfair serve`` process, the job type fair by
  ``workerTime``, then by ``activations``, alternating (``--repeat`` pairs), each run on a
  fresh database.  Reported per run: the seconds A's and B's leases were held (activation
  to completion, as the server times them), A's share of them and the ratio A:B (target
  1:1 ± 5 % by worker time), the jobs each got, and the total jobs/s.
* **cost**: A's jobs cost 4, B's 1, one activator taking one job at a time (so the
  bound of ADR 029 is one job's cost), ``--picks`` activations, by ``cost`` then by
  ``activations``: each tenant's jobs and summed cost.  By cost the sums are equal.

Prints tables, then the JSON (also written to bench/results/fair_by.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg
import httpx

from bench.harness import ROOT, Postgres, client, median, server, table

RESULTS = ROOT / "bench" / "results"
TYPE = "bench"


async def _enqueue(c: httpx.AsyncClient, tenant: str, n: int, **fields: Any) -> None:
    for start in range(0, n, 5_000):
        jobs = [{"type": TYPE, "tenantId": tenant, **fields}] * min(5_000, n - start)
        (await c.post("/v2/jobs/batch", json={"jobs": jobs})).raise_for_status()


async def _fair_by(c: httpx.AsyncClient, mode: str) -> None:
    (await c.put(f"/v2/job-types/{TYPE}", json={"fairnessBy": mode})).raise_for_status()


async def _worker(c: httpx.AsyncClient, end: float, work_s: dict[str, float]) -> None:
    body = {"type": TYPE, "maxJobs": 1, "timeout": 60_000, "requestTimeout": -1}
    while time.monotonic() < end:
        r = await c.post("/v2/jobs/activate", json=body)
        r.raise_for_status()
        for job in r.json()["jobs"]:
            await asyncio.sleep(work_s[job["tenantId"]])  # the work
            done = {"activationCount": job["activationCount"]}
            (await c.post(f"/v2/jobs/{job['jobKey']}/complete", json=done)).raise_for_status()


async def _worker_time_run(url: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    work_s = {"A": args.slow_ms / 1000, "B": args.fast_ms / 1000}
    # Enough that neither tenant runs dry: all the workers on one tenant's jobs.
    jobs = {t: int(args.workers * args.seconds / s * 1.2) + 100 for t, s in work_s.items()}
    with server(url) as base:
        async with client(base) as c:
            await _fair_by(c, mode)
            for tenant, n in jobs.items():
                await _enqueue(c, tenant, n)
            t0 = time.monotonic()
            end = t0 + args.seconds
            await asyncio.gather(*(_worker(c, end, work_s) for _ in range(args.workers)))
            elapsed = time.monotonic() - t0
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT tenant_id, count(*) AS n,"
            " sum(extract(epoch FROM completed_at - activated_at))::float8 AS held"
            " FROM jobs WHERE state = 'COMPLETED' GROUP BY tenant_id"
        )
        left = dict(
            await conn.fetch(
                "SELECT tenant_id, count(*) FROM jobs WHERE state = 'CREATED' GROUP BY tenant_id"
            )
        )
    finally:
        await conn.close()
    got = {r["tenant_id"]: r for r in rows}
    assert all(left.get(t, 0) > 0 for t in work_s), f"a tenant ran dry: {left}"
    held_a, held_b = got["A"]["held"], got["B"]["held"]
    return {
        "fairnessBy": mode,
        "A held s": round(held_a, 2),
        "B held s": round(held_b, 2),
        "A share": round(held_a / (held_a + held_b), 4),
        "A:B": round(held_a / held_b, 3),
        "A jobs": got["A"]["n"],
        "B jobs": got["B"]["n"],
        "jobs/s": round((got["A"]["n"] + got["B"]["n"]) / elapsed, 1),
    }


async def worker_time(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for r in range(2 * args.repeat):
        mode = "workerTime" if r % 2 == 0 else "activations"
        rows.append(await _worker_time_run(pg.fresh_db(f"fair_by_wt_{r}"), mode, args))
    for mode in ("workerTime", "activations"):
        mine = [row["A share"] for row in rows if row["fairnessBy"] == mode]
        rows.append({"fairnessBy": f"{mode} (median)", "A share": round(median(mine), 4)})
    return rows


async def cost(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for r, mode in enumerate(("cost", "activations")):
        url = pg.fresh_db(f"fair_by_cost_{r}")
        with server(url) as base:
            async with client(base) as c:
                await _fair_by(c, mode)
                await _enqueue(c, "A", args.picks, cost=4)
                await _enqueue(c, "B", args.picks, cost=1)
                body = {"type": TYPE, "maxJobs": 1, "timeout": 600_000, "requestTimeout": -1}
                jobs = {"A": 0, "B": 0}
                units = {"A": 0.0, "B": 0.0}
                for _ in range(args.picks):
                    r_ = await c.post("/v2/jobs/activate", json=body)
                    [job] = r_.json()["jobs"]
                    jobs[job["tenantId"]] += 1
                    units[job["tenantId"]] += job["cost"]
        rows.append(
            {
                "fairnessBy": mode,
                "A jobs": jobs["A"],
                "B jobs": jobs["B"],
                "A cost": units["A"],
                "B cost": units["B"],
                "A cost share": round(units["A"] / (units["A"] + units["B"]), 4),
            }
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", default=["worker_time", "cost"])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--slow-ms", type=float, default=100)
    parser.add_argument("--fast-ms", type=float, default=10)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--picks", type=int, default=1000)
    args = parser.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    parts = {"worker_time": worker_time, "cost": cost}
    result: dict[str, Any] = {"args": vars(args)}
    for name in args.parts:
        result[name] = await parts[name](pg, args)
        print(table(result[name], list(result[name][0])))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fair_by.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
