"""What guaranteed minimums cost (issue 44 §3, ADR 042):
``python -m bench.minimums [--repeat 4]``.

One ``jobfair serve`` on a fresh database per run; ``--jobs`` jobs over ten tenants (one
key each), created over HTTP, then drained by ``--workers`` workers (activate
``--max-jobs`` with requestTimeout -1, complete each). ``none``: no tenant has a minimum;
``minimum``: one tenant has ``minActiveJobs`` 5 (so every lane read also reads the lanes
below their minimum, and those rounds count them under the tenant's lock). Alternating
pairs (ABBA), medians: activation latency as the workers see it, jobs a second, and the
most jobs the tenant with the minimum had ACTIVATED at once (sampled). A table, then the
JSON (also bench/results/minimums.json).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx

from bench.fifo_keys import create, drain, summarize
from bench.harness import ROOT, Postgres, percentile, server, table, write_results


async def one_run(pg: Postgres, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"minimums_{label}")
    with server(url, pool=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            if label.startswith("minimum"):
                r = await c.put("/v2/tenants/tenant-3", json={"minActiveJobs": 5})
                assert r.status_code == 200, r.text
            await create(c, "plain", 10, args.jobs // 10)
            took, latencies = await drain(c, "plain", args.jobs, args)
    return {
        "workload": label.split("_")[0],
        "activation p50 ms": round(percentile(latencies, 50), 2),
        "activation p99 ms": round(percentile(latencies, 99), 2),
        "jobs/s": round(args.jobs / took, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    workloads = ("none", "minimum")
    rows = []
    for r in range(args.repeat):
        for workload in workloads if r % 2 == 0 else workloads[::-1]:
            rows.append(await one_run(pg, f"{workload}_{r}", args))
            print(table([rows[-1]], list(rows[-1])), flush=True)
    summary = summarize(rows, workloads)
    print(table(summary, list(summary[0])), flush=True)
    return {"args": vars(args), "runs": rows, "summary": summary}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-jobs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=4)
    write_results("minimums", asyncio.run(main(parser.parse_args())))
