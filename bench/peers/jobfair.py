"""Jobfair: one ``jobfair serve`` process (``--workers 1``, auth off) per run; the producer
and the worker are the Python client (AsyncJobfair, AsyncWorker) in this process, over
HTTP.  W2 at 50 in flight also runs through the TypeScript and Java clients' workers."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

import asyncpg
from jobfair_client import AsyncJobfair, AsyncWorker, Job, NewJob

from bench.harness import ROOT, Postgres, server, server_pid
from bench.peers.common import (
    BATCH,
    TYPE,
    W3_CONCURRENCY,
    W4_CONCURRENCY,
    Meter,
    Pickup,
    Sizes,
    Window,
    b_position,
    until,
)
from bench.preload import preload

NAME = "jobfair"
HERE = Path(__file__).resolve().parent
TS_DIST = ROOT / "clients" / "typescript" / "dist" / "index.js"
JAVA_JAR = ROOT / "clients" / "java" / "build" / "jobfair-client.jar"
JAVA_OUT = ROOT / ".jobfair" / "peers-java"
TENANTS = 10  # W1 and W2 spread their jobs over t0..t9
Mode = Literal["poll", "stream"]


async def _count(url: str, where: str = "") -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(
            await conn.fetchval(f"SELECT count(*) FROM jobs WHERE job_type = $1 {where}", TYPE)
        )
    finally:
        await conn.close()


async def _warm(jf: AsyncJobfair) -> None:
    """A few calls first: the server opens its pool's connections and prepares its
    statements on its first requests, which a running service did long ago."""
    for _ in range(3):
        await jf.create_jobs([NewJob("warmup", tenant_id="w")])
        await jf.activate("warmup", max_jobs=1, request_timeout_ms=-1)


# -- W1 ---------------------------------------------------------------------------------


async def _enqueue(base: str, pg_pid: int, n: int) -> dict[str, Any]:
    async with AsyncJobfair(base) as jf:
        await _warm(jf)
        meter = Meter(server_pid(base), pg_pid)
        t0 = time.perf_counter()
        for k in range(0, n, BATCH):
            jobs = [
                NewJob(TYPE, tenant_id=f"t{i % TENANTS}", variables={"n": i})
                for i in range(k, min(n, k + BATCH))
            ]
            await jf.create_jobs(jobs)
        elapsed = time.perf_counter() - t0
        return {"jobsPerSec": n / elapsed, **meter.split(n)}


def enqueue(pg: Postgres, sizes: Sizes) -> dict[str, Any]:
    url = pg.fresh_db("peers_jobfair")
    with server(url) as base:
        row = asyncio.run(_enqueue(base, pg.postmaster_pid, sizes.enqueue))
    assert asyncio.run(_count(url)) == sizes.enqueue
    return row


# -- W2 ---------------------------------------------------------------------------------


async def _noop(job: Job) -> None:
    return None


async def _drain(
    base: str, pg_pid: int, n: int, warm: int, concurrency: int, mode: Mode = "poll"
) -> dict[str, Any]:
    async with AsyncJobfair(base) as jf:
        await _warm(jf)
        window = Window(warm, server_pid(base), pg_pid)
        w = AsyncWorker(jf, TYPE, _noop, concurrency=concurrency, mode=mode)
        running = asyncio.create_task(w.run())
        await until(lambda: window.started(w.stats.completed) or running.done(), "W2: warm-up")
        await until(lambda: w.stats.completed >= warm + n or running.done(), "W2: unfinished")
        row = window.row(w.stats.completed, time.perf_counter())
        w.stop()
        await running
        assert w.stats.completed == warm + n, (w.stats, warm + n)
    return row


def _preloaded(pg: Postgres, n: int) -> str:
    url = pg.fresh_db("peers_jobfair")
    per = {f"t{i}": n // TENANTS + (1 if i < n % TENANTS else 0) for i in range(TENANTS)}
    asyncio.run(preload(url, TYPE, per))
    return url


def drain(pg: Postgres, sizes: Sizes, concurrency: int, mode: Mode = "poll") -> dict[str, Any]:
    """``mode``: the worker long-polls ("poll") or takes an SSE stream ("stream")."""
    url = _preloaded(pg, sizes.drain_warmup + sizes.drain)
    with server(url) as base:
        row = asyncio.run(
            _drain(base, pg.postmaster_pid, sizes.drain, sizes.drain_warmup, concurrency, mode)
        )
    assert asyncio.run(_count(url, "AND state IN ('CREATED', 'ACTIVATED')")) == 0
    return row


def _external_drain(pg: Postgres, sizes: Sizes, command: list[str]) -> dict[str, Any]:
    """W2 through another client's worker: ``command`` + [base, jobs, warm-up jobs] drains
    them, prints a line "warm" once the warm-up jobs are acknowledged, then one JSON line:
    jobs completed in all, those after the warm-up, seconds from the warm-up's end until
    the last one was acknowledged, and its own CPU seconds over that time."""
    url = _preloaded(pg, sizes.drain_warmup + sizes.drain)
    with server(url) as base:
        asyncio.run(_warm_only(base))
        command = [*command, base, str(sizes.drain), str(sizes.drain_warmup)]
        with subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ) as worker:
            assert worker.stdout is not None and worker.stderr is not None
            for line in worker.stdout:  # a runtime may print notices of its own first
                if line.strip() == "warm":
                    break
            else:
                raise AssertionError(worker.stderr.read()[-3000:])
            meter = Meter(server_pid(base), pg.postmaster_pid)
            out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        assert report["completed"] == sizes.drain_warmup + sizes.drain, report
        measured = report["measured"]
        row = {
            "jobsPerSec": measured / report["seconds"],
            **meter.split(measured, loadgen_s=report["cpuSeconds"]),
        }
    assert asyncio.run(_count(url, "AND state IN ('CREATED', 'ACTIVATED')")) == 0
    return row


async def _warm_only(base: str) -> None:
    async with AsyncJobfair(base) as jf:
        await _warm(jf)


def drain_ts(pg: Postgres, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    node = shutil.which("node")
    assert node and TS_DIST.exists(), "node and clients/typescript/dist (make test builds it)"
    return _external_drain(pg, sizes, [node, str(HERE / "drain.mjs"), str(concurrency)])


def java_classes() -> Path:
    """DrainWorker compiled against the Java client's jar (clients/java/build.sh)."""
    sources = (ROOT / "clients" / "java" / "src" / "main").rglob("*.java")
    built = JAVA_JAR.stat().st_mtime if JAVA_JAR.exists() else 0.0
    if any(s.stat().st_mtime > built for s in sources):
        subprocess.run([str(ROOT / "clients" / "java" / "build.sh")], check=True)
    source = HERE / "DrainWorker.java"
    target = JAVA_OUT / "DrainWorker.class"
    if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
        JAVA_OUT.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["javac", "--release", "17", "-cp", str(JAVA_JAR), "-d", str(JAVA_OUT), str(source)],
            check=True,
        )
    return JAVA_OUT


def drain_java(pg: Postgres, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    cp = f"{JAVA_JAR}:{java_classes()}"
    return _external_drain(pg, sizes, ["java", "-cp", cp, "DrainWorker", str(concurrency)])


# -- W3 ---------------------------------------------------------------------------------


async def _pickup(base: str, sizes: Sizes, mode: Mode) -> dict[str, list[float]]:
    stamps = Pickup(sizes.pickup_warmup, sizes.pickup)

    async def handler(job: Job) -> None:
        stamps.handler_started(job.variables["i"])

    async with AsyncJobfair(base) as worker_client, AsyncJobfair(base) as producer:
        await _warm(producer)
        w = AsyncWorker(worker_client, TYPE, handler, concurrency=W3_CONCURRENCY, mode=mode)
        running = asyncio.create_task(w.run())
        await asyncio.sleep(0.5)  # the worker is waiting

        async def create(i: int) -> None:
            await producer.create_job(TYPE, tenant_id="t0", variables={"i": i})

        await stamps.produce(sizes.pickup_rate, create)
        await until(lambda: w.stats.completed >= stamps.total, "W3: completions")
        w.stop()
        await running
    return stamps.samples()


def pickup(pg: Postgres, sizes: Sizes, mode: Mode = "poll") -> dict[str, list[float]]:
    url = pg.fresh_db("peers_jobfair")
    with server(url) as base:
        return asyncio.run(_pickup(base, sizes, mode))


# -- W4 ---------------------------------------------------------------------------------


async def _fairness(base: str, sizes: Sizes) -> dict[str, int]:
    order: list[str] = []

    async def handler(job: Job) -> None:
        order.append(job.tenant_id)

    async with AsyncJobfair(base) as jf:
        for tenant, n in (("A", sizes.fair_a), ("B", sizes.fair_b)):
            for k in range(0, n, BATCH):
                jobs = [NewJob(TYPE, tenant_id=tenant) for _ in range(k, min(n, k + BATCH))]
                await jf.create_jobs(jobs)
        total = sizes.fair_a + sizes.fair_b
        w = AsyncWorker(jf, TYPE, handler, concurrency=W4_CONCURRENCY)
        running = asyncio.create_task(w.run())
        await until(lambda: w.stats.completed >= total, "W4: drain unfinished")
        w.stop()
        await running
    return b_position(order, sizes.fair_a, sizes.fair_b)


def fairness(pg: Postgres, sizes: Sizes) -> dict[str, int]:
    url = pg.fresh_db("peers_jobfair")
    with server(url) as base:
        return asyncio.run(_fairness(base, sizes))
