"""Delivery benchmarks (issue 3): pickup latency, idle cost, stream drain throughput."""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

from bench.harness import (
    Postgres,
    cpu_seconds,
    latency_row,
    median,
    process_tree,
    server,
    server_pid,
)
from bench.wire import Connection, EventStream


async def _pickup(
    base: str, mode: str, jobs: int, rate: int, warmup: int = 100
) -> tuple[list[float], list[float]]:
    """Latencies of ``jobs`` jobs, after ``warmup`` jobs at the same rate that are not
    counted: a server's first requests open its pool's connections and prepare its
    statements (the first ~20 jobs took 20-110 ms), which a running service did once.
    Each job's time to the worker from its producer's answer (the figure the issue
    names), and from the moment its producer sent the request (the time a job takes end
    to end, which a server could shorten by answering its producer later)."""
    posted: dict[str, float] = {}
    returned: dict[str, float] = {}
    received: dict[str, float] = {}
    done = asyncio.Event()

    async def on_job(c: Connection, job: dict[str, Any]) -> None:
        received[job["jobKey"]] = time.perf_counter()
        await c.post(
            f"/v2/jobs/{job['jobKey']}/complete", {"activationCount": job["activationCount"]}
        )
        if len(received) >= warmup + jobs:
            done.set()

    async def poller() -> None:
        c = await Connection.open(base)
        body = {"type": "pickup", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 10_000}
        while not done.is_set():
            for job in (await c.post("/v2/jobs/activate", body)).json()["jobs"]:
                await on_job(c, job)
        await c.close()

    async def streamer() -> None:
        # The reader owns the socket and stamps each job as it arrives; completions run
        # beside it, as a worker with a handler pool would.
        s = await EventStream.open(base, "/v2/jobs/stream?type=pickup&maxJobs=4&timeout=60000")
        c = await Connection.open(base)
        arrived: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def read() -> None:
            while True:
                job = await s.next_job()
                received[job["jobKey"]] = time.perf_counter()
                arrived.put_nowait(job)

        reader = asyncio.create_task(read())
        while not done.is_set():
            job = await arrived.get()
            await c.post(
                f"/v2/jobs/{job['jobKey']}/complete", {"activationCount": job["activationCount"]}
            )
            if len(received) >= warmup + jobs:
                done.set()
        reader.cancel()
        await s.close()
        await c.close()

    consumers = [
        asyncio.create_task(poller() if mode == "longpoll" else streamer())
        for _ in range(4 if mode == "longpoll" else 1)
    ]
    await asyncio.sleep(0.5)  # consumers are waiting
    producer = await Connection.open(base)
    interval = 1.0 / rate
    start = time.perf_counter()
    counted: list[str] = []
    for i in range(warmup + jobs):
        # Paced at `rate` jobs/s against the schedule, not against the previous call.
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        r = await producer.post("/v2/jobs", {"type": "pickup", "tenantId": f"t{i % 4}"})
        assert r.status in (200, 201), r.body
        key = r.json()["jobKey"]
        returned[key] = time.perf_counter()
        posted[key] = sent
        if i >= warmup:
            counted.append(key)
    await asyncio.wait_for(done.wait(), timeout=60)
    for t in consumers:
        t.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    await producer.close()
    # A worker can hold the job before the producer's response arrives: that is 0 ms.
    held = [k for k in counted if k in received]
    return (
        [max(0.0, (received[k] - returned[k]) * 1000) for k in held],
        [(received[k] - posted[k]) * 1000 for k in held],
    )


def bench_pickup(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each mode ``--repeat`` times, alternating, each run on a fresh database and
    server: the machine's noise comes in bursts, and alternating spreads a burst over
    both modes instead of one."""
    runs: dict[str, list[list[float]]] = {"longpoll": [], "stream": []}
    from_post: dict[str, list[list[float]]] = {"longpoll": [], "stream": []}
    for _ in range(args.repeat):
        for mode, samples in runs.items():
            url = pg.fresh_db("bench_pickup")
            with server(url) as base:
                after_answer, after_post = asyncio.run(
                    _pickup(base, mode, args.pickup_jobs, args.pickup_rate)
                )
            samples.append(after_answer)
            from_post[mode].append(after_post)
    rows = []
    for mode, samples in runs.items():
        end_to_end = latency_row(from_post[mode])
        rows.append(
            {
                "mode": mode,
                "runs": len(samples),
                "ratePerSec": args.pickup_rate,
                **latency_row(samples),
                "fromPostP50Ms": end_to_end["p50Ms"],
                "fromPostP99Ms": end_to_end["p99Ms"],
            }
        )
    return rows


async def _idle(base: str, pid: int, polls: int, streams: int, seconds: float) -> float:
    conns = [await Connection.open(base) for _ in range(polls)]
    stop = asyncio.Event()

    async def poll(c: Connection) -> None:
        body = {"type": "idle", "maxJobs": 1, "timeout": 60_000, "requestTimeout": 60_000}
        while not stop.is_set():
            await c.post("/v2/jobs/activate", body)

    tasks = [asyncio.create_task(poll(c)) for c in conns]
    opened = [
        await EventStream.open(base, "/v2/jobs/stream?type=idle-s&maxJobs=10&timeout=60000")
        for _ in range(streams)
    ]
    await asyncio.sleep(3)  # settle: every poll and stream is waiting
    tree = process_tree(pid)
    before = cpu_seconds(tree)
    await asyncio.sleep(seconds)
    after = cpu_seconds(tree)
    stop.set()
    for t in tasks:
        t.cancel()
    for s in opened:
        await s.close()
    return (after - before) / seconds * 100


def bench_idle(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    url = pg.fresh_db("bench_idle")
    with server(url) as base:
        pid = server_pid(base)
        pct = asyncio.run(_idle(base, pid, args.idle_polls, args.idle_streams, args.idle_seconds))
    return [
        {
            "longPolls": args.idle_polls,
            "streams": args.idle_streams,
            "seconds": args.idle_seconds,
            "serverCpuPctOfOneCore": pct,
        }
    ]


async def _stream_drain(base: str, streams: int, credit: int, total: int) -> float:
    done = 0
    finished = asyncio.Event()

    async def consume() -> None:
        nonlocal done
        path = f"/v2/jobs/stream?type=bench&maxJobs={credit}&timeout=300000"
        s = await EventStream.open(base, path)
        c = await Connection.open(base)
        jobs: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def read() -> None:  # never cancelled mid-chunk: it owns the socket
            while True:
                jobs.put_nowait(await s.next_job())

        reader = asyncio.create_task(read())
        while not finished.is_set():
            batch = [await jobs.get()]
            while not jobs.empty():
                batch.append(jobs.get_nowait())
            await c.post(
                "/v2/jobs/complete",
                {
                    "jobs": [
                        {"jobKey": j["jobKey"], "activationCount": j["activationCount"]}
                        for j in batch
                    ]
                },
            )
            done += len(batch)
            if done >= total:
                finished.set()
        reader.cancel()
        await s.close()
        await c.close()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(consume()) for _ in range(streams)]
    await asyncio.wait_for(finished.wait(), timeout=600)
    elapsed = time.perf_counter() - t0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return done / elapsed


def bench_stream_drain(pg: Postgres, args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench.preload import preload

    rows = []
    total = args.drain_jobs
    for sw in args.server_workers:
        runs = []
        for _ in range(args.repeat):
            url = pg.fresh_db("bench_stream")
            asyncio.run(preload(url, "bench", {f"t{i}": total // 10 for i in range(10)}))
            with server(url, workers=sw) as base:
                runs.append(asyncio.run(_stream_drain(base, 8, 100, total)))
        rows.append(
            {
                "streams": 8,
                "credit": 100,
                "completion": "batch",
                "serverWorkers": sw,
                "jobsPerSec": median(runs),
                "runs": runs,
            }
        )
    return rows
