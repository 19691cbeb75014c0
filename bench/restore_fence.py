"""How long ``jobfair restored`` takes (docs/backup.md): ``python -m bench.restore_fence
[--jobs 200000] [--repeat 3]``.  ``--jobs`` unfinished jobs in a fresh database of an
embedded PostgreSQL; the fence (app.db.maintenance.fence_after_restore) run ``--repeat``
times on them.  Seconds per run and per 100,000 jobs; a table, then the JSON (also
bench/results/restore_fence.json)."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from app.db import Database, job_rows, maintenance
from app.db.bounds import RESTORE_COUNT_GAP, RESTORE_KEY_GAP
from app.domain import utcnow
from bench.harness import ROOT, Postgres, median, table, write_results


async def main(args: argparse.Namespace) -> dict[str, Any]:
    pg = Postgres(ROOT / ".jobfair" / "bench")
    db = await Database.connect(pg.fresh_db("restore_fence"), size=2, min_size=1)
    try:
        for i in range(0, args.jobs, 10_000):
            batch = [
                {"type": "x", "tenantId": f"t{j % 50}"} for j in range(min(10_000, args.jobs - i))
            ]
            await job_rows.insert(db, batch, utcnow())
        runs = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            _, fenced = await maintenance.fence_after_restore(
                db, RESTORE_KEY_GAP, RESTORE_COUNT_GAP
            )
            took = time.perf_counter() - started
            runs.append({"jobs fenced": fenced, "seconds": round(took, 2)})
            print(table([runs[-1]], list(runs[-1])), flush=True)
    finally:
        await db.close()
    summary = {
        "jobs": args.jobs,
        "median s": median([r["seconds"] for r in runs]),
        "s per 100,000 jobs": round(median([r["seconds"] for r in runs]) / args.jobs * 1e5, 2),
    }
    print(table([summary], list(summary)), flush=True)
    return {"args": vars(args), "runs": runs, "summary": summary}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    write_results("restore_fence", asyncio.run(main(parser.parse_args())))
