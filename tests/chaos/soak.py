"""The soak of issue 27 section 4: a steady mixed load at half the measured capacity, for
minutes, with everything on, and what drifts.

* **Capacity first.** A backlog is drained as fast as the same workers can (activate,
  complete at once, no delays or failures): that rate is the server's drain capacity on
  this machine, now.
* **Then half of it, for the soak's length.** A producer posts a batch every 100 ms,
  open-loop, paced to half the capacity, over ten tenants (weights 1 to 3, two with a
  cap), five priorities, one job in ten delayed 0.5 to 5 s. Long-poll workers complete
  what they are given, except one first attempt in ten, which they fail with a retry and
  a 1 s back-off (so it comes back, and is completed on its next activation). The server
  runs its background work on its own timers (lease sweeps, promotion, retention, the
  tenant ranking); retention is short, so finished jobs leave the table as fast as they
  come and the table can reach a steady size.
* **Each interval** it records: the jobs completed per second; the latency from a job's
  creation to its completion (first-attempt, undelayed jobs of the tenants without a cap:
  the capped ones wait on their caps, as they should); the server's RSS and open
  descriptors (its whole process tree); the jobs table, its indexes, the history and the
  lanes (bytes, live and dead tuples, autovacuums).
* **At the end** the producer stops, the workers drain the rest, and the ledger is
  checked: every job created was completed exactly once, none is left ACTIVATED, no call
  was answered 5xx.

``drift`` compares the throughput of the first and last windows (5 minutes each in the
30-minute soak, a quarter of a short one, after the first 10 s in which the delayed and
retried jobs are not yet due). tests/chaos/test_soak.py runs a 2-minute soak and asserts
on it, at a third of the capacity: in ``make test`` the other test worker's tests take a
core the capacity was measured with, and at half it the first window could fall behind
the offered rate (621 jobs/s of 747 in a fresh clone's CI run) though nothing drifted;
``make soak`` runs ``python -m tests.chaos.soak`` (30 minutes), which prints the
rows as JSON and a table and draws docs/img/soak.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench.wire import Connection

JOB_TYPE = "soak"
TENANTS = 10
WEIGHTS = {f"s{i}": 1 + i % 3 for i in range(TENANTS)}
CAPS = {"s0": 6, "s1": 12}
# The capped tenants get one job in fifty each, well within what their caps let through,
# so that their backlogs do not grow (and they drain with the others at the end).
CAPPED_ONE_IN = 50
WORKERS = 8
MAX_JOBS = 10
TICK_S = 0.1
FAIL_ONE_IN = 10
DELAY_ONE_IN = 10
RETRY_BACKOFF_MS = 1000
WARM_UP_S = 10.0
# Retention for the soak: finished jobs (and their history) are pruned this long after
# they end, by a sweep every quarter of it.
RETENTION_S = 30

SIZES = """
SELECT pg_relation_size('jobs') AS jobs_bytes,
       pg_indexes_size('jobs') AS jobs_index_bytes,
       pg_total_relation_size('job_events') AS events_bytes,
       pg_total_relation_size('lanes') AS lanes_bytes,
       (SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'jobs') AS jobs_live,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs') AS jobs_dead,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'job_events')
         AS events_dead,
       (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'lanes') AS lanes_dead,
       (SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 'jobs')
         AS jobs_autovacuums,
       (SELECT count(*) FROM jobs WHERE state = 'CREATED') AS pending
"""


def server_env(retention_s: int = RETENTION_S) -> dict[str, str]:
    """The settings the soak's server runs with (everything else at its default)."""
    return {
        "JOBFAIR_RETENTION_S": str(retention_s),
        "JOBFAIR_RETENTION_SWEEP_INTERVAL_MS": str(retention_s * 1000 // 4),
        "JOBFAIR_LOG_LEVEL": "warning",
    }


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def rss_and_fds(pid: int) -> tuple[float, int]:
    """The process tree's resident memory (MiB) and open descriptors."""
    rss = fds = 0
    for p in process_tree(pid):
        try:
            rss += p.memory_info().rss
            fds += p.num_fds()
        except psutil.NoSuchProcess:
            pass
    return rss / 2**20, fds


@dataclass
class Ledger:
    """What the servers acknowledged: creations, and accepted completions and failures."""

    created: set[str] = field(default_factory=set)
    completed: Counter[str] = field(default_factory=Counter)
    failed: set[str] = field(default_factory=set)
    statuses: Counter[int] = field(default_factory=Counter)
    # creation → completion, seconds, of undelayed jobs of uncapped tenants completed at
    # their first attempt
    latencies: list[float] = field(default_factory=list)
    born: dict[str, float] = field(default_factory=dict)


@dataclass
class Soak:
    capacity_jobs_per_s: float
    rate_jobs_per_s: float
    seconds: float
    rows: list[dict[str, Any]]
    created: int
    completed_once: int
    completed_twice: int
    lost: int
    failed_then_retried: int
    left_activated: int
    server_errors: int
    drift: float
    window_s: float
    first_window_jobs_per_s: float
    last_window_jobs_per_s: float
    rss_mib: tuple[float, float, float]  # after warm-up, at the middle, at the end
    fds: tuple[int, int]  # most, at the end
    drain_s: float

    def summary(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "rows"}


async def configure(base: str) -> None:
    c = await Connection.open(base)
    try:
        for tenant, weight in WEIGHTS.items():
            body: dict[str, Any] = {"weight": weight}
            if tenant in CAPS:
                body["maxActiveJobs"] = CAPS[tenant]
            r = await c.request("PUT", f"/v2/tenants/{tenant}", body)
            assert r.status in (200, 201, 204), (r.status, r.body)
    finally:
        await c.close()


async def measure_capacity(base: str, jobs: int = 4000) -> float:
    """Jobs a second the soak's workers drain from a backlog of ``jobs`` (its own type),
    completing each at once."""
    kind = "soak-capacity"
    c = await Connection.open(base)
    for start in range(0, jobs, 1000):
        batch = [
            {"type": kind, "tenantId": f"s{(start + i) % TENANTS}"}
            for i in range(min(1000, jobs - start))
        ]
        r = await c.post("/v2/jobs/batch", {"jobs": batch})
        assert r.status == 201, r.body
    await c.close()
    done = 0

    async def work(i: int) -> None:
        nonlocal done
        w = await Connection.open(base)
        body = {"type": kind, "maxJobs": MAX_JOBS, "timeout": 60_000, "worker": f"cap{i}"}
        try:
            while done < jobs:
                got = (await w.post("/v2/jobs/activate", {**body, "requestTimeout": -1})).json()
                if not got["jobs"]:
                    return
                finished = [
                    {"jobKey": j["jobKey"], "activationCount": j["activationCount"]}
                    for j in got["jobs"]
                ]
                r = await w.post("/v2/jobs/complete", {"jobs": finished})
                assert r.status == 200, r.body
                done += len(finished)
        finally:
            await w.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(WORKERS)))
    return done / (time.perf_counter() - t0)


def tenant_of(i: int) -> str:
    """The tenant of the producer's ``i``-th job: a capped one for 2 in 50, else one of
    the eight others in turn."""
    capped = sorted(CAPS)
    if i % CAPPED_ONE_IN < len(capped):
        return capped[i % CAPPED_ONE_IN]
    return f"s{len(capped) + i % (TENANTS - len(capped))}"


class _Pace:
    """Lets its caller take ``rate`` jobs per second in all, from its start."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.perf_counter()
        self.taken = 0

    async def take(self, n: int) -> None:
        self.taken += n
        delay = self.start + self.taken / self.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def _produce(base: str, rate: float, until: float, ledger: Ledger) -> None:
    c = await Connection.open(base)
    pace = _Pace(rate)
    n = 0
    carry = 0.0
    try:
        while time.perf_counter() < until:
            carry += rate * TICK_S
            count, carry = int(carry), carry - int(carry)
            if count:
                jobs: list[dict[str, Any]] = []
                for i in range(n, n + count):
                    job: dict[str, Any] = {
                        "type": JOB_TYPE,
                        "tenantId": tenant_of(i),
                        "priority": (i * 7 % 5) * 25,
                        "retries": 3,
                        "variables": {"n": i, "fail": i % FAIL_ONE_IN == 3},
                    }
                    if i % DELAY_ONE_IN == 5:
                        job["delay"] = 500 + (i * 37) % 4500
                    jobs.append(job)
                r = await c.post("/v2/jobs/batch", {"jobs": jobs})
                ledger.statuses[r.status] += 1
                assert r.status == 201, r.body
                born = time.perf_counter()
                for i, key in zip(range(n, n + count), r.json()["jobKeys"], strict=True):
                    ledger.created.add(key)
                    if i % DELAY_ONE_IN != 5 and i % FAIL_ONE_IN != 3 and tenant_of(i) not in CAPS:
                        ledger.born[key] = born
                n += count
            await pace.take(count) if count else await asyncio.sleep(TICK_S)
    finally:
        await c.close()


async def _work(i: int, base: str, stop: asyncio.Event, ledger: Ledger) -> None:
    c = await Connection.open(base)
    ask = {
        "type": JOB_TYPE,
        "maxJobs": MAX_JOBS,
        "timeout": 60_000,
        "worker": f"soak{i}",
        "requestTimeout": 1000,
    }
    try:
        while not stop.is_set():
            r = await c.post("/v2/jobs/activate", ask)
            ledger.statuses[r.status] += 1
            assert r.status == 200, r.body
            jobs = r.json()["jobs"]
            finished = []
            for j in jobs:
                key = j["jobKey"]
                if j["variables"].get("fail") and key not in ledger.failed:
                    f = await c.post(
                        f"/v2/jobs/{key}/fail",
                        {
                            "activationCount": j["activationCount"],
                            "retries": j["retries"] - 1,
                            "retryBackOff": RETRY_BACKOFF_MS,
                            "errorMessage": "soak: a failure to retry",
                        },
                    )
                    ledger.statuses[f.status] += 1
                    assert f.status == 204, f.body
                    ledger.failed.add(key)
                else:
                    finished.append({"jobKey": key, "activationCount": j["activationCount"]})
            if finished:
                r = await c.post("/v2/jobs/complete", {"jobs": finished})
                ledger.statuses[r.status] += 1
                assert r.status == 200, r.body
                now = time.perf_counter()
                for item, verdict in zip(finished, r.json()["results"], strict=True):
                    assert verdict["status"] == 204, verdict
                    key = item["jobKey"]
                    ledger.completed[key] += 1
                    born = ledger.born.pop(key, None)
                    if born is not None:
                        ledger.latencies.append(now - born)
    finally:
        await c.close()


async def _sample(
    db_url: str,
    pid: int,
    start: float,
    until: float,
    interval: float,
    ledger: Ledger,
    progress: bool,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    conn = await asyncpg.connect(db_url)
    last, last_done = start, 0
    try:
        while time.perf_counter() < until - interval / 2:
            await asyncio.sleep(max(0.0, min(interval, until - time.perf_counter())))
            now = time.perf_counter()
            done = sum(ledger.completed.values())
            latencies, ledger.latencies = ledger.latencies, []
            sizes = dict(await conn.fetchrow(SIZES))
            rss, fds = rss_and_fds(pid)
            rows.append(
                {
                    "atS": round(now - start, 1),
                    "jobsPerSec": round((done - last_done) / (now - last), 1),
                    "latencyP50Ms": _ms(latencies, 50),
                    "latencyP99Ms": _ms(latencies, 99),
                    "pending": sizes["pending"],
                    "rssMiB": round(rss, 1),
                    "load1": round(os.getloadavg()[0], 2),
                    "fds": fds,
                    "jobsMiB": round(sizes["jobs_bytes"] / 2**20, 2),
                    "jobsIndexesMiB": round(sizes["jobs_index_bytes"] / 2**20, 2),
                    "historyMiB": round(sizes["events_bytes"] / 2**20, 2),
                    "lanesKiB": round(sizes["lanes_bytes"] / 2**10, 1),
                    "jobsLive": sizes["jobs_live"],
                    "jobsDead": sizes["jobs_dead"],
                    "historyDead": sizes["events_dead"],
                    "lanesDead": sizes["lanes_dead"],
                    "jobsAutovacuums": sizes["jobs_autovacuums"],
                }
            )
            if progress:
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            last, last_done = now, done
    finally:
        await conn.close()
    return rows


def _ms(samples: Sequence[float], p: float) -> float | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))] * 1000, 1)


def _window_rate(rows: Sequence[dict[str, Any]], lo: float, hi: float) -> float:
    """Jobs per second over the rows that end in (lo, hi]."""
    picked = [r["jobsPerSec"] for r in rows if lo < r["atS"] <= hi + 0.5]
    return statistics.fmean(picked) if picked else 0.0


async def soak(
    base: str,
    db_url: str,
    pid: int,
    seconds: float,
    interval: float,
    window_s: float,
    capacity: float | None = None,
    progress: bool = False,
    fraction: float = 0.5,
) -> Soak:
    """Runs the soak on the server at ``base`` (process tree ``pid``), its database at
    ``db_url``, at ``fraction`` of the capacity (``capacity``, measured first unless
    given)."""
    await configure(base)
    if capacity is None:
        capacity = await measure_capacity(base)
    rate = capacity * fraction
    ledger = Ledger()
    stop = asyncio.Event()
    start = time.perf_counter()
    until = start + seconds
    workers = [asyncio.create_task(_work(i, base, stop, ledger)) for i in range(WORKERS)]
    sampler = asyncio.create_task(_sample(db_url, pid, start, until, interval, ledger, progress))
    await _produce(base, rate, until, ledger)
    rows = await sampler
    drain_start = time.perf_counter()
    while set(ledger.completed) != ledger.created:
        if time.perf_counter() - drain_start > 120:
            break
        await asyncio.sleep(0.2)
    drain_s = time.perf_counter() - drain_start
    stop.set()
    await asyncio.gather(*workers)
    conn = await asyncpg.connect(db_url)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE job_type = $1 AND state = 'ACTIVATED'", JOB_TYPE
        )
    finally:
        await conn.close()
    first = _window_rate(rows, WARM_UP_S, WARM_UP_S + window_s)
    last = _window_rate(rows, seconds - window_s, seconds)
    settled = [r for r in rows if r["atS"] > WARM_UP_S] or rows
    middle = settled[len(settled) // 2]
    return Soak(
        capacity_jobs_per_s=round(capacity, 1),
        rate_jobs_per_s=round(rate, 1),
        seconds=seconds,
        rows=rows,
        created=len(ledger.created),
        completed_once=sum(1 for n in ledger.completed.values() if n == 1),
        completed_twice=sum(1 for n in ledger.completed.values() if n > 1),
        lost=len(ledger.created - set(ledger.completed)),
        failed_then_retried=len(ledger.failed & set(ledger.completed)),
        left_activated=left,
        server_errors=sum(n for s, n in ledger.statuses.items() if s >= 500),
        drift=round(abs(last - first) / first, 4) if first else 1.0,
        window_s=window_s,
        first_window_jobs_per_s=round(first, 1),
        last_window_jobs_per_s=round(last, 1),
        rss_mib=(settled[0]["rssMiB"], middle["rssMiB"], rows[-1]["rssMiB"]),
        fds=(max(r["fds"] for r in rows), rows[-1]["fds"]),
        drain_s=round(drain_s, 2),
    )


COLUMNS = [
    "atS",
    "jobsPerSec",
    "latencyP50Ms",
    "latencyP99Ms",
    "pending",
    "rssMiB",
    "fds",
    "load1",
    "jobsMiB",
    "jobsIndexesMiB",
    "historyMiB",
    "jobsDead",
    "historyDead",
    "jobsAutovacuums",
]


def plot(result: Soak, path: Path) -> None:
    """Throughput, latency, RSS and the table sizes over the soak, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.rows
    minutes = [r["atS"] / 60 for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    ax = axes[0][0]
    ax.plot(minutes, [r["jobsPerSec"] for r in rows], label="completed")
    ax.axhline(result.rate_jobs_per_s, color="grey", linestyle=":", label="offered")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("jobs / s")
    ax.legend(loc="lower right")
    ax = axes[0][1]
    ax.plot(minutes, [r["latencyP50Ms"] for r in rows], label="p50")
    ax.plot(minutes, [r["latencyP99Ms"] for r in rows], label="p99")
    ax.set_yscale("log")
    ax.set_ylabel("created → completed, ms (log)")
    ax.legend(loc="upper right")
    ax = axes[1][0]
    ax.plot(minutes, [r["rssMiB"] for r in rows], label="server RSS")
    ax.set_ylim(bottom=0)
    ax.set_ylabel("MiB")
    ax.set_xlabel("minutes")
    ax.legend(loc="lower right")
    ax = axes[1][1]
    for key, label in [
        ("jobsMiB", "jobs heap"),
        ("jobsIndexesMiB", "jobs indexes"),
        ("historyMiB", "history"),
    ]:
        ax.plot(minutes, [r[key] for r in rows], label=label)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("MiB")
    ax.set_xlabel("minutes")
    ax.legend(loc="upper left")
    fig.suptitle(
        f"Jobfair soak: {result.rate_jobs_per_s:g} jobs/s "
        f"({result.rate_jobs_per_s / result.capacity_jobs_per_s:.0%} of "
        f"{result.capacity_jobs_per_s:g}), {result.seconds / 60:g} min, "
        f"drift {result.drift * 100:.1f} %"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join("" if r[c] is None else str(r[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from bench.harness import ROOT, Postgres, server, server_pid

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--interval", type=float, default=60, help="seconds per row")
    p.add_argument("--window", type=float, default=300, help="drift window, seconds")
    p.add_argument("--server-workers", type=int, default=2)
    p.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "soak.png")
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    p.add_argument("--replot", action="store_true", help="only draw --json's run again")
    args = p.parse_args(argv)
    if args.replot:
        saved = json.loads(args.json.read_text())
        plot(
            Soak(**{**saved, "rss_mib": tuple(saved["rss_mib"]), "fds": tuple(saved["fds"])}),
            args.plot,
        )
        return
    data = ROOT / ".jobfair" / "soak-pg"
    pg = Postgres(data)
    url = pg.fresh_db("soak")
    with server(url, workers=args.server_workers, env=server_env()) as base:
        result = asyncio.run(
            soak(
                base,
                url,
                server_pid(base),
                args.minutes * 60,
                args.interval,
                args.window,
                progress=True,
            )
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(asdict(result), indent=1))
    print(json.dumps(result.summary(), indent=1))
    print(_table(result.rows))
    try:
        plot(result, args.plot)
        print(f"plot: {os.path.relpath(args.plot, ROOT)}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)")


if __name__ == "__main__":
    main()
