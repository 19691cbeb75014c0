"""What the clients' own idempotency keys cost a producer (issue 45 §4):
``python -m bench.idempotent_creates [--repeat 4] [--jobs 20000]``.

Jobfair's Python client gives every job created without an ``idempotency_key`` one of
its own (``auto-`` and 32 hex digits), so that a create whose answer is lost is sent again
and made once.  The key is stored with the job and checked for each create (the tenant's
idempotency index).  Alternating pairs (ABBA) on fresh databases of one embedded
PostgreSQL, through one ``jobfair serve`` process, with the keys (``keyed``) and without
(``bare``, ``idempotent_creates=False``):

- ``batch``: ``--jobs`` jobs created by four producers at once, ``create_jobs`` of 500;
- ``single``: ``--jobs // 10`` jobs created by eight producers at once, one
  ``create_job`` call each.

Creates a second and PostgreSQL's CPU per create (its process tree); medians of the
runs; tables, then the JSON (also bench/results/idempotent_creates.json).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from jobfair_client import AsyncJobfair, NewJob

from bench.harness import (
    ROOT,
    Postgres,
    cpu_seconds,
    median,
    process_tree,
    server,
    table,
    write_results,
)

TENANTS = [f"tenant-{i}" for i in range(10)]
BATCH = 500


async def batches(jf: AsyncJobfair, n: int) -> None:
    for i in range(0, n, BATCH):
        await jf.create_jobs(
            [NewJob("plain", tenant_id=TENANTS[(i + j) % 10]) for j in range(min(BATCH, n - i))]
        )


async def singles(jf: AsyncJobfair, n: int) -> None:
    for i in range(n):
        await jf.create_job("plain", tenant_id=TENANTS[i % 10])


async def run(pg: Postgres, shape: str, label: str, args: argparse.Namespace) -> dict[str, Any]:
    url = pg.fresh_db(f"idem_{shape}_{label}")
    keyed = label.startswith("keyed")
    producers, n = (4, args.jobs) if shape == "batch" else (8, args.jobs // 10)
    with server(url, pool=10) as base:
        async with AsyncJobfair(base, idempotent_creates=keyed) as jf:
            postgres = process_tree(pg.postmaster_pid)
            cpu0 = cpu_seconds(postgres)
            started = time.perf_counter()
            each = batches if shape == "batch" else singles
            await asyncio.gather(*(each(jf, n // producers) for _ in range(producers)))
            took = time.perf_counter() - started
            cpu = cpu_seconds(process_tree(pg.postmaster_pid)) - cpu0
    return {
        "workload": label.split("_")[0],
        "creates/s": round(n / took),
        "PostgreSQL µs/create": round(cpu / n * 1e6, 1),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    out: dict[str, Any] = {"args": vars(args)}
    workloads = ("keyed", "bare")
    for shape in ("batch", "single"):
        rows = []
        for r in range(args.repeat):
            # Alternating pairs, in turn first and second (ABBA).
            for workload in workloads if r % 2 == 0 else workloads[::-1]:
                rows.append(await run(pg, shape, f"{workload}_{r}", args))
                print(shape, table([rows[-1]], list(rows[-1])), flush=True)
        columns = [c for c in rows[0] if c != "workload"]
        summary = []
        for w in workloads:
            mine = [x for x in rows if x["workload"] == w]
            summary.append({"workload": w, **{c: median([x[c] for x in mine]) for c in columns}})
        print(shape, table(summary, list(summary[0])), flush=True)
        out[shape] = {"runs": rows, "summary": summary}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=4)
    write_results("idempotent_creates", asyncio.run(main(parser.parse_args())))
