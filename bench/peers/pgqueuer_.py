"""PgQueuer 1.6 in this process: ``Queries`` over an ``AsyncpgDriver`` (one asyncpg
connection each for the producer and the worker, as its README does) and a
``QueueManager`` with one entrypoint.  Its schema comes from ``Queries.install()``.

Concurrency N is ``QueueManager.run(max_concurrent_tasks=N)``, this worker's cap on the
jobs it holds (enforced by its dequeue query), with the largest batch that cap allows
(``batch_size`` at most N / 2).  A finished job is acknowledged when PgQueuer's status
buffer flushes it (``Queries.log_jobs``: the row is deleted from the queue and logged);
the drain is timed to the flush that logs the last one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import orjson
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

from bench.harness import Postgres
from bench.peers.common import (
    BATCH,
    PRELOAD_BATCH,
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

NAME = "pgqueuer"


async def _queries(url: str) -> tuple[asyncpg.Connection, Queries]:
    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


async def _queued(q: Queries) -> int:
    return sum(s.count for s in await q.queue_size() if s.entrypoint == TYPE)


async def _setup(url: str) -> None:
    conn, q = await _queries(url)
    try:
        await q.install()
    finally:
        await conn.close()


async def _enqueue_many(q: Queries, payloads: list[bytes]) -> None:
    n = len(payloads)
    await q.enqueue([TYPE] * n, list(payloads), [0] * n)


async def _preload(url: str, payloads: list[bytes]) -> None:
    conn, q = await _queries(url)
    try:
        for k in range(0, len(payloads), PRELOAD_BATCH):
            await _enqueue_many(q, payloads[k : k + PRELOAD_BATCH])
        await conn.execute(f"VACUUM ANALYZE {q.qbe.settings.qualified.queue_table}")
    finally:
        await conn.close()


def _fresh(pg: Postgres) -> str:
    url = pg.fresh_db("peers_pgqueuer", migrate=False)
    asyncio.run(_setup(url))
    return url


class _Acked:
    """Counts the jobs PgQueuer has logged as successful (its acknowledgement)."""

    def __init__(self, q: Queries) -> None:
        self.count = 0
        self.last_at = 0.0
        original = q.log_jobs

        async def log_jobs(job_status: list[Any]) -> None:
            await original(job_status)
            self.count += sum(1 for _, status, _ in job_status if status == "successful")
            self.last_at = time.perf_counter()

        q.log_jobs = log_jobs  # type: ignore[method-assign]


async def _run_manager(
    url: str,
    concurrency: int,
    handler: Callable[[Job], Awaitable[None]],
    expected: int,
    meter_pg: int | None = None,
    warm: int = 0,
    while_running: Callable[[], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """A QueueManager running ``handler`` until ``expected`` jobs are acknowledged.
    With ``meter_pg`` (PostgreSQL's pid): jobs/s from its start and the CPU per job."""
    conn, q = await _queries(url)
    acked = _Acked(q)
    qm = QueueManager(q)
    qm.entrypoint(TYPE)(handler)
    window = Window(warm, None, meter_pg) if meter_pg is not None else None
    running = asyncio.create_task(
        qm.run(batch_size=max(1, concurrency // 2), max_concurrent_tasks=concurrency)
    )
    row: dict[str, Any] = {}
    try:
        if while_running is not None:
            await asyncio.sleep(0.5)  # the worker is waiting
            await while_running()
        if window is not None:
            await until(lambda: window.started(acked.count) or running.done(), f"{NAME}: warm")
        await until(lambda: acked.count >= expected or running.done(), f"{NAME}: unfinished")
        if window is not None:
            row = window.row(acked.count, acked.last_at)
    finally:
        qm.shutdown.set()
        await running
        left = await _queued(q)
        await conn.close()
    assert acked.count == expected and left == 0, (acked.count, expected, left)
    return row


# -- W1 ---------------------------------------------------------------------------------


async def _enqueue(url: str, pg_pid: int, n: int) -> dict[str, Any]:
    conn, q = await _queries(url)
    try:
        await _enqueue_many(q, [orjson.dumps({"n": -1})])  # warm-up: prepares the statement
        await q.clear_queue()
        meter = Meter(None, pg_pid)
        t0 = time.perf_counter()
        for k in range(0, n, BATCH):
            await _enqueue_many(q, [orjson.dumps({"n": i}) for i in range(k, min(n, k + BATCH))])
        elapsed = time.perf_counter() - t0
        row = {"jobsPerSec": n / elapsed, **meter.split(n)}
        assert await _queued(q) == n
    finally:
        await conn.close()
    return row


def enqueue(pg: Postgres, sizes: Sizes) -> dict[str, Any]:
    return asyncio.run(_enqueue(_fresh(pg), pg.postmaster_pid, sizes.enqueue))


# -- W2 ---------------------------------------------------------------------------------


async def _noop(job: Job) -> None:
    return None


def drain(pg: Postgres, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    url = _fresh(pg)
    total = sizes.drain_warmup + sizes.drain
    asyncio.run(_preload(url, [orjson.dumps({"n": i}) for i in range(total)]))
    return asyncio.run(
        _run_manager(url, concurrency, _noop, total, pg.postmaster_pid, sizes.drain_warmup)
    )


# -- W3 ---------------------------------------------------------------------------------


async def _pickup(url: str, sizes: Sizes) -> dict[str, list[float]]:
    stamps = Pickup(sizes.pickup_warmup, sizes.pickup)

    async def handler(job: Job) -> None:
        stamps.handler_started(orjson.loads(job.payload or b"{}")["i"])

    conn, producer = await _queries(url)

    async def create(i: int) -> None:
        await producer.enqueue(TYPE, orjson.dumps({"i": i}))

    async def produce() -> None:
        await stamps.produce(sizes.pickup_rate, create)

    try:
        await _run_manager(url, W3_CONCURRENCY, handler, stamps.total, while_running=produce)
    finally:
        await conn.close()
    return stamps.samples()


def pickup(pg: Postgres, sizes: Sizes) -> dict[str, list[float]]:
    return asyncio.run(_pickup(_fresh(pg), sizes))


# -- W4 ---------------------------------------------------------------------------------


def fairness(pg: Postgres, sizes: Sizes) -> dict[str, int]:
    url = _fresh(pg)
    for tenant, n in (("A", sizes.fair_a), ("B", sizes.fair_b)):
        asyncio.run(_preload(url, [orjson.dumps({"tenant": tenant})] * n))
    order: list[str] = []

    async def handler(job: Job) -> None:
        order.append(orjson.loads(job.payload or b"{}")["tenant"])

    asyncio.run(_run_manager(url, W4_CONCURRENCY, handler, sizes.fair_a + sizes.fair_b))
    return b_position(order, sizes.fair_a, sizes.fair_b)
