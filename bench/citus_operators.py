"""What the operators' paths cost on Citus against one PostgreSQL (issue 42 §4): the stats,
the metrics, the listing, a job's history and its explanation, bulk retry and bulk
cancel, and the dashboard in Chromium, on one PostgreSQL 15 and on a Citus coordinator
with two worker nodes, all on this machine (they share its two cores).

``python -m bench.citus_operators [--tenants T] [--jobs-per-tenant N] [--calls C]
[--rounds R]`` (needs Citus installed: make citus).  Each layout is loaded alike: T
tenants with N ready jobs each (through SQL), then through the API 300 jobs activated
and failed for good (for bulk retry) and 300 completed (for history).  Then, in rounds
that alternate the layouts, each operation is called C times one after the other: its
median wall-clock time per call, and the PostgreSQL CPU per call of every node
together (process-tree CPU, bench.harness.CpuMeter).  The dashboard: the time from
navigation to the first tenant row drawn, once a round.  Medians over the rounds.
Prints a table and the JSON (also bench/results/citus_operators.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any

import httpx

from bench.citus import layouts
from bench.dashboard import browse
from bench.harness import CpuMeter, client, median, server, server_pid, table, write_results
from bench.preload import preload
from tests.citus.cluster import installed

Call = Callable[[httpx.AsyncClient, int], Awaitable[httpx.Response]]


def _operations(keys: dict[str, list[str]], tenants: list[str]) -> dict[str, Call]:
    """Each measured operation, as one call (its i-th: bulk calls take new jobs each
    time).  ``keys``: a completed job's and a ready job's keys."""
    done, ready = keys["completed"][0], keys["ready"][0]
    return {
        "GET /v2/stats": lambda c, i: c.get("/v2/stats"),
        "GET /metrics": lambda c, i: c.get("/metrics"),
        "GET /v2/jobs (first page of 50)": lambda c, i: c.get("/v2/jobs", params={"limit": 50}),
        "GET /v2/jobs?tenantId&state": lambda c, i: c.get(
            "/v2/jobs", params={"tenantId": tenants[i % len(tenants)], "state": "CREATED"}
        ),
        "GET /v2/jobs/{key}/history": lambda c, i: c.get(f"/v2/jobs/{done}/history"),
        "GET /v2/jobs/{key}/explain": lambda c, i: c.get(f"/v2/jobs/{ready}/explain"),
        "POST /v2/jobs/retry (10 jobs)": lambda c, i: c.post("/v2/jobs/retry", json={"limit": 10}),
        "POST /v2/jobs/cancel (10 jobs)": lambda c, i: c.post(
            "/v2/jobs/cancel", json={"tenantId": tenants[-1 - i % len(tenants)], "limit": 10}
        ),
    }


async def _seed(url: str, base: str, tenants: list[str], per_tenant: int) -> dict[str, list[str]]:
    """The layout's jobs: the ready backlog, 300 FAILED, 300 COMPLETED."""
    await preload(url, "ops", dict.fromkeys(tenants, per_tenant))
    keys: dict[str, list[str]] = {"completed": [], "ready": []}
    async with client(base) as c:
        for outcome in ("failed", "completed"):
            left = 300
            while left:
                body = {"type": "ops", "maxJobs": min(left, 50), "timeout": 60_000}
                r = await c.post("/v2/jobs/activate", json=body)
                r.raise_for_status()
                for job in r.json()["jobs"]:
                    count = {"activationCount": job["activationCount"]}
                    if outcome == "failed":
                        path, body = f"/v2/jobs/{job['jobKey']}/fail", {**count, "retries": 0}
                    else:
                        path, body = f"/v2/jobs/{job['jobKey']}/complete", count
                        keys["completed"].append(job["jobKey"])
                    assert (await c.post(path, json=body)).status_code == 204
                    left -= 1
        r = await c.get("/v2/jobs", params={"state": "CREATED", "limit": 1})
        keys["ready"] = [j["jobKey"] for j in r.json()["items"]]
    return keys


async def _measure(base: str, call: Call, calls: int, first: int) -> list[float]:
    async with client(base) as c:
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            r = await call(c, first + i)
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=200)
    parser.add_argument("--jobs-per-tenant", type=int, default=50)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not installed():
        raise SystemExit("Citus is not installed for PostgreSQL 15: make citus")
    tenants = [f"t{i:04d}" for i in range(args.tenants)]
    found: dict[str, dict[str, list[float]]] = {}
    with layouts(workers=(2,)) as where, ExitStack() as stack:
        bases = {name: stack.enter_context(server(url)) for name, (url, _) in where.items()}
        ops: dict[str, dict[str, Call]] = {}
        for name, (url, _) in where.items():
            keys = asyncio.run(_seed(url, bases[name], tenants, args.jobs_per_tenant))
            ops[name] = _operations(keys, tenants)
        for r in range(args.rounds):
            for name, (_, nodes) in where.items():
                base = bases[name]
                for op, call in ops[name].items():
                    meters = [CpuMeter(server_pid(base), pid) for _, pid in nodes]
                    times = asyncio.run(_measure(base, call, args.calls, r * args.calls))
                    cpu = sum(m.split()[0]["postgres"] for m in meters)
                    row = found.setdefault(f"{name}|{op}", {"ms": [], "pgUs": []})
                    row["ms"].append(statistics.median(times))
                    row["pgUs"].append(1e6 * cpu / args.calls)
                load_ms, refresh_ms = browse(base, 2)
                row = found.setdefault(f"{name}|dashboard (first tenant row drawn)", {"ms": []})
                row["ms"].append(load_ms)
                print(f"round {r + 1}, {name}: measured", flush=True)
    rows = []
    for key, got in found.items():
        layout, op = key.split("|")
        rows.append(
            {
                "layout": layout,
                "operation": op,
                "ms": median(got["ms"]),
                "pgUsPerCall": median(got["pgUs"]) if got.get("pgUs") else None,
            }
        )
    names = list(dict.fromkeys(r["layout"] for r in rows))
    shown = []
    for op in dict.fromkeys(r["operation"] for r in rows):
        line: dict[str, Any] = {"operation": op}
        for n in names:
            [r] = [x for x in rows if x["layout"] == n and x["operation"] == op]
            cpu = "" if r["pgUsPerCall"] is None else f", PG {r['pgUsPerCall']:,.0f} µs"
            line[n] = f"{r['ms']:,.1f} ms{cpu}"
        shown.append(line)
    print(table(shown, list(shown[0])))
    out = {"cpus": os.cpu_count(), "args": vars(args), "rows": rows}
    write_results("citus_operators", out)


if __name__ == "__main__":
    main()
