"""``python -m bench.peers``: Jobfair against PgQueuer and Procrastinate in one run.

Four workloads (see bench/peers/__init__.py), each figure the median of ``--repeat``
runs, every run on a fresh database of the same embedded PostgreSQL (.jobfair/bench),
the systems alternating within each repetition (J, P, R, J, P, R, ...) so that the
machine's noise falls on all of them alike.  Prints a table per workload with the ratio
Jobfair / best peer, then the whole JSON document, also written to
bench/results/peers.json.  Smoke run: ``--scale 0.1 --repeat 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import ROOT as _ROOT

# Jobfair's side goes through the Python client, as a user's code would: the one in this
# checkout (the tests find it the same way, through pyproject's pythonpath).
sys.path.insert(0, str(_ROOT / "clients" / "python"))

from bench.harness import (  # noqa: E402
    ROOT,
    Postgres,
    latency_row,
    machine_speed,
    median,
    speed_line,
    table,
)
from bench.peers import jobfair, pgqueuer_, procrastinate_  # noqa: E402
from bench.peers.common import Sizes  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SYSTEMS = {"jobfair": jobfair, "pgqueuer": pgqueuer_, "procrastinate": procrastinate_}
PEERS = ("pgqueuer", "procrastinate")
WORKLOADS = ("W1", "W2", "W3", "W4")
DRAIN_CONCURRENCY = (10, 50)
# W2 at 50 in flight through Jobfair's other clients' workers too.
CLIENT_DRAINS: dict[str, Callable[..., dict[str, Any]]] = {
    "jobfair-ts": jobfair.drain_ts,
    "jobfair-java": jobfair.drain_java,
}
CPU = ["serverUsPerJob", "postgresUsPerJob", "loadgenUsPerJob", "busyPct"]


def _runs(args: argparse.Namespace, pg: Postgres, sizes: Sizes) -> dict[str, dict[str, list]]:
    """Every run's result, by figure ("W1", "W2@10", ...) and system."""
    runs: dict[str, dict[str, list]] = {}

    def record(figure: str, system: str, fn: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        result = fn()
        runs.setdefault(figure, {}).setdefault(system, []).append(result)
        shown = result.get("jobsPerSec", result.get("bLastPosition", ""))
        if isinstance(shown, float):
            shown = f"{shown:,.0f} jobs/s"
        print(f"  {figure:6} {system:14} {time.monotonic() - t0:5.1f} s  {shown}", flush=True)

    for rep in range(args.repeat):
        print(f"repetition {rep + 1} of {args.repeat}", flush=True)
        for workload in args.only:
            for c in DRAIN_CONCURRENCY if workload == "W2" else (0,):
                figure = f"W2@{c}" if workload == "W2" else workload
                for name in args.systems:
                    mod = SYSTEMS[name]
                    if workload == "W1":
                        record(figure, name, lambda m=mod: m.enqueue(pg, sizes))
                    elif workload == "W2":
                        record(figure, name, lambda m=mod, c=c: m.drain(pg, sizes, c))
                        if name == "jobfair":  # the Python worker over SSE too
                            record(
                                figure,
                                "jobfair-sse",
                                lambda c=c: jobfair.drain(pg, sizes, c, mode="stream"),
                            )
                        if name == "jobfair" and c == 50 and args.clients:
                            for client, fn in CLIENT_DRAINS.items():
                                record(figure, client, lambda f=fn: f(pg, sizes, 50))
                    elif workload == "W3":
                        record(figure, name, lambda m=mod: m.pickup(pg, sizes))
                        if name == "jobfair":
                            record(
                                figure,
                                "jobfair-sse",
                                lambda: jobfair.pickup(pg, sizes, mode="stream"),
                            )
                    else:
                        record(figure, name, lambda m=mod: m.fairness(pg, sizes))
    return runs


def _ratio(rows: list[dict[str, Any]], key: str, higher_is_better: bool) -> dict[str, Any]:
    """Each Jobfair row's ``key`` against the best peer's (jobfair-ts and jobfair-java
    get one too)."""
    peers = [r for r in rows if r["system"] in PEERS]
    if not peers:
        return {}
    pick = max if higher_is_better else min
    best = pick(peers, key=lambda r: r[key])
    out: dict[str, Any] = {"bestPeer": best["system"]}
    for r in rows:
        if r["system"].startswith("jobfair"):
            r["vsBestPeer"] = r[key] / best[key] if best[key] else float("nan")
            out[r["system"]] = r["vsBestPeer"]
    return out


def _throughput(figure: str, by_system: dict[str, list]) -> dict[str, Any]:
    rows = []
    for system, results in by_system.items():
        row: dict[str, Any] = {"system": system}
        if figure.startswith("W2@"):
            row["inFlight"] = int(figure[3:])
        row["jobsPerSec"] = median([r["jobsPerSec"] for r in results])
        row["runs"] = [r["jobsPerSec"] for r in results]
        row.update({k: median([r[k] for r in results]) for k in CPU})
        rows.append(row)
    return {"rows": rows, "ratio": _ratio(rows, "jobsPerSec", True)}


def _pickup(by_system: dict[str, list]) -> dict[str, Any]:
    rows = []
    for system, results in by_system.items():
        pickup = latency_row([r["pickup"] for r in results])
        create = latency_row([r["create"] for r in results])
        rows.append(
            {
                "system": system,
                **{f"pickup{k[0].upper()}{k[1:]}": v for k, v in pickup.items()},
                **{f"create{k[0].upper()}{k[1:]}": v for k, v in create.items()},
            }
        )
    return {"rows": rows, "ratio": _ratio(rows, "pickupP99Ms", False)}


def _fairness(by_system: dict[str, list]) -> dict[str, Any]:
    rows = []
    for system, results in by_system.items():
        positions = [r["bLastPosition"] for r in results]
        rows.append(
            {
                "system": system,
                "bLastPosition": median(positions),
                "runs": positions,
                "jobs": results[0]["jobs"],
            }
        )
    return {"rows": rows, "ratio": _ratio(rows, "bLastPosition", False)}


COLUMNS = {
    "W1": ["system", "jobsPerSec", "vsBestPeer", "runs", *CPU],
    "W2": ["system", "inFlight", "jobsPerSec", "vsBestPeer", "runs", *CPU],
    "W3": [
        "system",
        "pickupP50Ms",
        "pickupP95Ms",
        "pickupP99Ms",
        "vsBestPeer",
        "createP50Ms",
        "createP95Ms",
        "createP99Ms",
        "pickupSamples",
    ],
    "W4": ["system", "bLastPosition", "vsBestPeer", "runs", "jobs"],
}
TITLES = {
    "W1": "W1 enqueue: {enqueue:,} jobs in batches of 500, one producer (jobs/s)",
    "W2": "W2 drain: {drain:,} ready jobs after {drain_warmup:,} of warm-up, a handler that "
    "does nothing (jobs/s)",
    "W3": "W3 pickup: {pickup:,} jobs one at a time at {pickup_rate}/s to an idle worker "
    "(ms from the create call's start to the handler's; and the create call's own)",
    "W4": "W4 fairness: {fair_a:,} jobs of A, then {fair_b} of B, 10 in flight "
    "(position of B's last job in handler start order)",
}
RATIO_OF = {
    "W1": "jobs/s",
    "W2": "jobs/s",
    "W3": "pickup p99 (lower is better)",
    "W4": "positions (lower is fairer)",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=3, help="runs per figure (median reported)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the job counts")
    p.add_argument("--only", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument(
        "--no-clients",
        dest="clients",
        action="store_false",
        help="leave out W2 at 50 through the TypeScript and Java clients' workers",
    )
    args = p.parse_args()
    sizes = Sizes.scaled(args.scale)
    os.makedirs(ROOT / ".jobfair", exist_ok=True)
    pg = Postgres(ROOT / ".jobfair" / "bench")
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "speedBefore": machine_speed()}
    print(f"machine speed before: {speed_line(machine['speedBefore'])}", flush=True)
    t0 = time.monotonic()
    runs = _runs(args, pg, sizes)
    machine["speedAfter"] = machine_speed()
    results: dict[str, Any] = {
        "machine": machine,
        "args": vars(args),
        "sizes": vars(sizes),
        "seconds": round(time.monotonic() - t0),
    }
    for workload in args.only:
        if workload == "W2":
            parts = [_throughput(f"W2@{c}", runs[f"W2@{c}"]) for c in DRAIN_CONCURRENCY]
            ratios = {
                f"inFlight{c}": part["ratio"]
                for c, part in zip(DRAIN_CONCURRENCY, parts, strict=True)
            }
            results["W2"] = {"rows": [r for part in parts for r in part["rows"]], "ratio": ratios}
        elif workload == "W1":
            results["W1"] = _throughput("W1", runs["W1"])
        elif workload == "W3":
            results["W3"] = _pickup(runs["W3"])
        else:
            results["W4"] = _fairness(runs["W4"])
        print(f"\n## {TITLES[workload].format(**vars(sizes))}\n")
        print(table(results[workload]["rows"], COLUMNS[workload]))
        ratios = results[workload]["ratio"]
        for label, ratio in ratios.items() if workload == "W2" else [("", ratios)]:
            if "jobfair" in ratio:
                at = f" at {label[8:]} in flight" if label else ""
                print(
                    f"Jobfair / best peer ({ratio['bestPeer']}){at}, {RATIO_OF[workload]}: "
                    f"{ratio['jobfair']:.2f}"
                )
    print(f"\nmachine speed after: {speed_line(machine['speedAfter'])}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = json.dumps(results, indent=2)
    (RESULTS / "peers.json").write_text(out)
    print("\n" + out)


if __name__ == "__main__":
    main()
