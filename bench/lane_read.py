"""A lane read's cost by the number of lanes of its job type: ``python -m bench.lane_read``.

read_lanes is the first statement of every activation round.  It must stop at the lane
after the last one it needs, which holds only while its plan walks lanes_type_vtime_idx
in order.  For each lane count, one type's lanes (every tenant configured, no job ready:
the read asks for 32 lanes, more than PROBED_LANES, so it takes each lane as ready and
stops after 32) are read over and over through a pool, as the server runs the statement
(prepared, so PostgreSQL moves to its generic plan after five runs).  Two statements are
timed in alternating rounds: read_lanes as it is, and with a constant LIMIT, as it was
before the limit became a subquery.  Reported: the median and p95 per read, and which
plan each took (whether it sorts the lanes).  Prints a table, then the JSON (also written
to bench/results/lane_read.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg
import orjson

from app.db.lanes import CHARGE_ARRAYS, SCANNED_LANES
from app.db.lanes import SQL as LANES
from bench.harness import ROOT, Postgres, median, percentile, table

RESULTS = ROOT / "bench" / "results"
READ_LANES = LANES["read_lanes"]
CONSTANT_LIMIT = READ_LANES.text.replace(
    f"LIMIT (SELECT {SCANNED_LANES})", f"LIMIT {SCANNED_LANES}"
)
STATEMENTS = {"now": READ_LANES.text, "constant": CONSTANT_LIMIT}
# The type, how many lanes, none excluded, and no charges (the ten arrays of the charge).
NO_CHARGES: dict[str, list[Any]] = {name: [] for name in CHARGE_ARRAYS}
ARGS = READ_LANES.args(job_type="bench", limit=32, exclude=[], **NO_CHARGES)


async def preload(conn: asyncpg.Connection, lanes: int) -> None:
    await conn.execute(
        "INSERT INTO tenants (tenant_id) SELECT 't' || g FROM generate_series(1, $1) g", lanes
    )
    await conn.execute(
        "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active)"
        " SELECT 'bench', 't' || g, jobfair_shard('t' || g), g, true"
        " FROM generate_series(1, $1) g",
        lanes,
    )
    await conn.execute("ANALYZE")


async def sorts(conn: asyncpg.Connection, sql: str) -> bool:
    """Whether the statement's generic plan sorts the lanes by vtime."""
    async with conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        stmt = await conn.prepare(sql)
        plan = await stmt.explain(*ARGS)
    text = orjson.dumps(plan).decode()
    return '"Sort Key":["l.vtime"' in text


async def time_reads(pool: asyncpg.Pool, sql: str, n: int) -> list[float]:
    samples = []
    async with pool.acquire() as conn:
        for _ in range(n):
            t = time.perf_counter()
            await conn.fetch(sql, *ARGS)
            samples.append((time.perf_counter() - t) * 1000)
    return samples


async def measure(pg: Postgres, lanes: int, rounds: int, reads: int) -> dict[str, Any]:
    url = pg.fresh_db(f"lane_read_{lanes}")
    conn = await asyncpg.connect(url)
    try:
        await preload(conn, lanes)
        plans = {name: await sorts(conn, sql) for name, sql in STATEMENTS.items()}
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(url, min_size=1, max_size=1)
    try:
        samples: dict[str, list[float]] = {"now": [], "constant": []}
        for r in range(rounds):  # alternating, so that both see the same machine
            for name in ("now", "constant") if r % 2 == 0 else ("constant", "now"):
                # past the first five: custom plans
                samples[name] += (await time_reads(pool, STATEMENTS[name], reads))[5:]
    finally:
        await pool.close()
    row: dict[str, Any] = {"lanes": lanes}
    for name, s in samples.items():
        row[f"{name}_p50_ms"] = round(median(s), 3)
        row[f"{name}_p95_ms"] = round(percentile(s, 95), 3)
        row[f"{name}_sorts"] = plans[name]
    row["ratio_p50"] = round(row["constant_p50_ms"] / row["now_p50_ms"], 2)
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", default="100,300,1000,2000,5000,20000")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--reads", type=int, default=100)
    args = parser.parse_args()
    pg = Postgres(ROOT / ".jobfair" / "bench")
    rows = [await measure(pg, int(n), args.rounds, args.reads) for n in args.lanes.split(",")]
    columns = list(rows[0])
    print(table(rows, columns))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lane_read.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
