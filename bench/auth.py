"""What API keys cost (issue 22): drain and pickup with auth off, with a key of every
tenant and type, and with a key scoped to the drained tenants, in one run.

``python -m bench.auth [--rounds 3]``.  Each round runs every mode once, in an order
rotated per round, each on a fresh database and server (the machine's noise comes in
bursts; rotating spreads a burst over the modes).  The drain completes each job with
its own call (``POST /v2/jobs/{key}/complete``): one key check per job, the worst case
for what a check costs.  Prints a table and the JSON (also bench/results/auth.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from app.db import Database
from app.keys import KeyService, Role
from bench.delivery import _pickup
from bench.harness import (
    ROOT,
    CpuMeter,
    Postgres,
    latency_row,
    machine_speed,
    median,
    server,
    server_pid,
    table,
)
from bench.preload import preload
from bench.run import _drain

MODES = ("off", "key", "scoped key")
TENANTS = [f"t{i}" for i in range(10)]


async def _make_key(url: str, mode: str) -> str:
    db = await Database.connect(url, size=1, min_size=1)
    try:
        tenants = TENANTS if mode == "scoped key" else None
        types = ["bench", "pickup"] if mode == "scoped key" else None
        # One key for producer and workers: an admin key, scoped to the load in "scoped key"
        # (a scope holds whatever the role, so its checks run as for a worker).
        _, token = await KeyService(db).create(Role.ADMIN, tenants, types, None, None, "bench")
        return token
    finally:
        await db.close()


def _with_key(base: str, token: str | None) -> str:
    return base if token is None else base.replace("http://", f"http://{token}@")


def run(pg: Postgres, args: argparse.Namespace) -> dict[str, Any]:
    drains: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}  # server CPU µs per drained job
    pickups: dict[str, list[list[float]]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        order = MODES[r % len(MODES) :] + MODES[: r % len(MODES)]
        for mode in order:
            env = {"JOBFAIR_AUTH": "off" if mode == "off" else "required"}
            url = pg.fresh_db("bench_auth")
            asyncio.run(preload(url, "bench", {t: args.jobs // len(TENANTS) for t in TENANTS}))
            # A key made before the server starts, as an operator would.
            token = None if mode == "off" else asyncio.run(_make_key(url, mode))
            with server(url, env=env) as base:
                keyed = _with_key(base, token)
                meter = CpuMeter(server_pid(base), pg.postmaster_pid)
                drains[mode].append(
                    asyncio.run(_drain(keyed, args.workers, 10, "single", args.jobs))
                )
                seconds, _ = meter.split()
                cpu[mode].append(1e6 * seconds["server"] / args.jobs)
                after_answer, _ = asyncio.run(_pickup(keyed, "longpoll", args.pickup_jobs, 200))
                pickups[mode].append(after_answer)
            print(
                f"round {r + 1} {mode}: {drains[mode][-1]:.0f} jobs/s, "
                f"server {cpu[mode][-1]:.0f} µs CPU per job",
                flush=True,
            )
    base_drain = median(drains["off"])
    rows = []
    for mode in MODES:
        pickup = latency_row(pickups[mode])
        rows.append(
            {
                "auth": mode,
                "drainJobsPerSec": median(drains[mode]),
                "drainVsOff": round(median(drains[mode]) / base_drain, 3),
                "drainRuns": [round(x) for x in drains[mode]],
                # Each round's ratio to the "off" run of the same round.
                "drainPairedVsOff": [
                    round(x / o, 3) for x, o in zip(drains[mode], drains["off"], strict=True)
                ],
                "serverUsPerJob": median(cpu[mode]),
                "serverUsPerJobRuns": [round(x) for x in cpu[mode]],
                **{f"pickup{k[0].upper()}{k[1:]}": v for k, v in pickup.items()},
            }
        )
    return {"rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pickup-jobs", type=int, default=1000)
    args = p.parse_args()
    os.makedirs(ROOT / ".jobfair", exist_ok=True)
    pg = Postgres(ROOT / ".jobfair" / "bench")
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "speed": machine_speed()}}
    results["args"] = vars(args)
    results["auth"] = run(pg, args)["rows"]
    columns = [
        "auth",
        "drainJobsPerSec",
        "drainVsOff",
        "drainPairedVsOff",
        "serverUsPerJob",
        "serverUsPerJobRuns",
        "pickupP50Ms",
        "pickupP99Ms",
    ]
    print(table(results["auth"], columns))
    out = json.dumps(results, indent=2)
    (ROOT / "bench" / "results").mkdir(parents=True, exist_ok=True)
    (ROOT / "bench" / "results" / "auth.json").write_text(out)
    print("\n" + out)


if __name__ == "__main__":
    main()
