"""Jobfair on Citus against one PostgreSQL (issue 42, docs/scaling.md): the same drain on
one PostgreSQL 15 and on a Citus coordinator with one and with two worker nodes, all
nodes on this machine -- they share its two cores with the server and the load
generator, so the jobs/s say little and the CPU per job of each node is what carries
over: how a job's PostgreSQL work grows and splits once the tables are distributed.

``python -m bench.citus [--jobs N] [--rounds R]`` (needs Citus installed: make citus).
The three layouts are up at once and drained in the order 1 PG, C+1, C+2, 1 PG, ...
(the machine is shared and its noise comes in bursts); medians of the rounds.  Each
drain: ``--jobs`` jobs over 20 tenants loaded through SQL, one ``jobfair serve`` (one
process, a pool of 20), ``--workers`` long-polling workers taking 10 jobs a call and
completing them in one call each.  Prints a table and the JSON (also
bench/results/citus.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import asyncpg

from app import migrations
from app.db import citus as on_citus
from bench.harness import (
    CpuMeter,
    machine_speed,
    median,
    postmaster_pid,
    server,
    server_pid,
    speed_line,
    table,
    write_results,
)
from bench.preload import preload
from bench.run import _drain
from tests.chaos.external_pg import external_cluster
from tests.citus.cluster import citus_cluster, installed

TENANTS = [f"t{i}" for i in range(20)]


@contextmanager
def layouts(
    workers: tuple[int, ...] = (1, 2),
) -> Iterator[dict[str, tuple[str, list[tuple[str, int]]]]]:
    """Each layout's URL and its nodes (name, postmaster pid), migrated (and distributed):
    one PostgreSQL, and a coordinator with each of ``workers`` worker nodes."""
    with ExitStack() as stack:
        plain = stack.enter_context(external_cluster("jobfair-bench-pg-"))
        found = {"1 PostgreSQL": (plain.url(), [("postgres", postmaster_pid(plain.pgdata))])}
        for n in workers:
            cluster = stack.enter_context(citus_cluster(workers=n))
            nodes = [("coordinator", postmaster_pid(cluster.coordinator.pgdata))]
            nodes += [
                (f"worker {i + 1}", postmaster_pid(w.pgdata)) for i, w in enumerate(cluster.workers)
            ]
            found[f"coordinator + {n}"] = (cluster.url(), nodes)
        for url, _ in found.values():
            migrations.upgrade(url)
            asyncio.run(on_citus.distribute_at(url))
        yield found


async def _reload(url: str, jobs: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE jobs, lanes, lane_keys, job_events")
    finally:
        await conn.close()
    await preload(url, "bench", {t: jobs // len(TENANTS) for t in TENANTS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    if not installed():
        raise SystemExit("Citus is not installed for PostgreSQL 15: make citus")
    jobs = args.jobs - args.jobs % len(TENANTS)
    before = machine_speed()
    runs: dict[str, list[dict[str, Any]]] = {}
    with layouts() as where, ExitStack() as stack:
        bases = {name: stack.enter_context(server(url)) for name, (url, _) in where.items()}
        for r in range(args.rounds):
            for name, (url, nodes) in where.items():
                asyncio.run(_reload(url, jobs))
                meters = {node: CpuMeter(server_pid(bases[name]), pid) for node, pid in nodes}
                rate = asyncio.run(_drain([bases[name]], args.workers, 10, "batch", jobs))
                split = {node: m.split()[0] for node, m in meters.items()}
                run = {
                    "jobsPerSec": rate,
                    "serverUsPerJob": 1e6 * next(iter(split.values()))["server"] / jobs,
                    "nodesUsPerJob": {n: 1e6 * s["postgres"] / jobs for n, s in split.items()},
                }
                runs.setdefault(name, []).append(run)
                per_node = ", ".join(f"{n} {v:.0f}" for n, v in run["nodesUsPerJob"].items())
                print(f"round {r + 1}, {name}: {rate:,.0f} jobs/s; PostgreSQL µs/job: {per_node}",
                      flush=True)  # fmt: skip
    after = machine_speed()
    rows = []
    for name, rs in runs.items():
        nodes = list(rs[0]["nodesUsPerJob"])
        per_node = {n: median([r["nodesUsPerJob"][n] for r in rs]) for n in nodes}
        rows.append(
            {
                "layout": name,
                "jobs": jobs,
                "jobsPerSec": median([r["jobsPerSec"] for r in rs]),
                "runs": [round(r["jobsPerSec"]) for r in rs],
                "serverUsPerJob": median([r["serverUsPerJob"] for r in rs]),
                "postgresUsPerJob": sum(per_node.values()),
                "nodesUsPerJob": per_node,
            }
        )
    print(f"machine speed before: {speed_line(before)}; after: {speed_line(after)}")
    shown = [
        {
            "layout": r["layout"],
            "jobs/s (runs)": f"{r['jobsPerSec']:,.0f} ({' · '.join(f'{x:,}' for x in r['runs'])})",
            "server µs/job": f"{r['serverUsPerJob']:.0f}",
            "PostgreSQL µs/job (all nodes)": f"{r['postgresUsPerJob']:.0f}",
            "per node": ", ".join(f"{n} {v:.0f}" for n, v in r["nodesUsPerJob"].items()),
        }
        for r in rows
    ]
    print(table(shown, list(shown[0])))
    out = {"machineSpeed": {"before": before, "after": after}, "cpus": os.cpu_count(), "rows": rows}
    write_results("citus", out)


if __name__ == "__main__":
    main()
