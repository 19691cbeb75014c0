"""Procrastinate 3.10 in this process: ``App(connector=PsycopgConnector(...))`` with one
async task; producer and worker share the app's psycopg pool, as in one application.
Its schema comes from ``schema_manager.apply_schema_async()``.

Concurrency N is ``run_worker_async(concurrency=N)``; the pool holds N + 2 connections,
opened before anything is timed (one listens for its NOTIFY, one fetches, N finish: its
default of 4 would leave a worker of 50 waiting on the pool).  A job is acknowledged when
``JobManager.finish_job`` (its status update) returns; the drain is timed to the last."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from procrastinate import App, PsycopgConnector

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

NAME = "procrastinate"


def _app(url: str, handler: Callable[..., Awaitable[None]], pool: int = 4) -> App:
    app = App(connector=PsycopgConnector(conninfo=url, min_size=pool, max_size=pool))
    app.task(name=TYPE)(handler)
    return app


async def _noop(**kwargs: Any) -> None:
    return None


async def _count(app: App, status: str | None = None) -> int:
    rows = await app.connector.execute_query_all_async(
        "SELECT count(*) AS n FROM procrastinate_jobs WHERE task_name = %(t)s"
        + (" AND status = %(s)s" if status else ""),
        t=TYPE,
        s=status,
    )
    return int(rows[0]["n"])


def _fresh(pg: Postgres) -> str:
    url = pg.fresh_db("peers_procrastinate", migrate=False)

    async def install() -> None:
        app = _app(url, _noop, pool=1)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(install())
    return url


async def _preload(url: str, kwargs: list[dict[str, Any]]) -> None:
    app = _app(url, _noop, pool=1)
    async with app.open_async():
        task = app.tasks[TYPE]
        for k in range(0, len(kwargs), PRELOAD_BATCH):
            await task.batch_defer_async(*kwargs[k : k + PRELOAD_BATCH])
    conn = await asyncpg.connect(url)  # VACUUM runs outside a transaction
    try:
        await conn.execute("VACUUM ANALYZE procrastinate_jobs")
    finally:
        await conn.close()


class _Acked:
    """Counts ``finish_job`` calls that have returned (the job's status is written)."""

    def __init__(self, app: App) -> None:
        self.count = 0
        self.last_at = 0.0
        manager = app.job_manager
        original = manager.finish_job

        async def finish_job(*args: Any, **kwargs: Any) -> None:
            await original(*args, **kwargs)
            self.count += 1
            self.last_at = time.perf_counter()

        manager.finish_job = finish_job  # type: ignore[method-assign]


async def _run_worker(
    url: str,
    concurrency: int,
    handler: Callable[..., Awaitable[None]],
    expected: int,
    meter_pg: int | None = None,
    warm: int = 0,
    while_running: Callable[[App], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """A worker running ``handler`` until ``expected`` jobs are acknowledged.  With
    ``meter_pg`` (PostgreSQL's pid): jobs/s from its start and the CPU per job."""
    app = _app(url, handler, pool=concurrency + 2)
    row: dict[str, Any] = {}
    async with app.open_async():
        acked = _Acked(app)
        window = Window(warm, None, meter_pg) if meter_pg is not None else None
        running = asyncio.create_task(
            app.run_worker_async(
                concurrency=concurrency,
                # Draining: return once caught up with the queue.  Waiting (W3): wake
                # on its NOTIFY (listen_notify, the default) until stopped.
                wait=while_running is not None,
                install_signal_handlers=False,
            )
        )
        try:
            if while_running is not None:
                await asyncio.sleep(0.5)  # the worker is waiting
                await while_running(app)
            if window is not None:
                await until(lambda: window.started(acked.count) or running.done(), f"{NAME}: warm")
            await until(lambda: acked.count >= expected or running.done(), f"{NAME}: unfinished")
            if window is not None:
                row = window.row(acked.count, acked.last_at)
        finally:
            if not running.done():
                running.cancel()  # its graceful stop
            await asyncio.gather(running, return_exceptions=True)
        left = await _count(app) - await _count(app, "succeeded")
    assert acked.count == expected and left == 0, (acked.count, expected, left)
    return row


# -- W1 ---------------------------------------------------------------------------------


async def _enqueue(url: str, pg_pid: int, n: int) -> dict[str, Any]:
    app = _app(url, _noop, pool=1)
    async with app.open_async():
        task = app.tasks[TYPE]
        await task.batch_defer_async({"n": -1})  # warm-up: the pool's connection
        meter = Meter(None, pg_pid)
        t0 = time.perf_counter()
        for k in range(0, n, BATCH):
            await task.batch_defer_async(*({"n": i} for i in range(k, min(n, k + BATCH))))
        elapsed = time.perf_counter() - t0
        row = {"jobsPerSec": n / elapsed, **meter.split(n)}
        assert await _count(app) == n + 1
    return row


def enqueue(pg: Postgres, sizes: Sizes) -> dict[str, Any]:
    return asyncio.run(_enqueue(_fresh(pg), pg.postmaster_pid, sizes.enqueue))


# -- W2 ---------------------------------------------------------------------------------


def drain(pg: Postgres, sizes: Sizes, concurrency: int) -> dict[str, Any]:
    url = _fresh(pg)
    total = sizes.drain_warmup + sizes.drain
    asyncio.run(_preload(url, [{"n": i} for i in range(total)]))
    return asyncio.run(
        _run_worker(url, concurrency, _noop, total, pg.postmaster_pid, sizes.drain_warmup)
    )


# -- W3 ---------------------------------------------------------------------------------


def pickup(pg: Postgres, sizes: Sizes) -> dict[str, list[float]]:
    url = _fresh(pg)
    stamps = Pickup(sizes.pickup_warmup, sizes.pickup)

    async def handler(i: int) -> None:
        stamps.handler_started(i)

    async def produce(app: App) -> None:
        task = app.tasks[TYPE]

        async def create(i: int) -> None:
            await task.defer_async(i=i)

        await stamps.produce(sizes.pickup_rate, create)

    asyncio.run(_run_worker(url, W3_CONCURRENCY, handler, stamps.total, while_running=produce))
    return stamps.samples()


# -- W4 ---------------------------------------------------------------------------------


def fairness(pg: Postgres, sizes: Sizes) -> dict[str, int]:
    url = _fresh(pg)
    for tenant, n in (("A", sizes.fair_a), ("B", sizes.fair_b)):
        asyncio.run(_preload(url, [{"tenant": tenant}] * n))
    order: list[str] = []

    async def handler(tenant: str) -> None:
        order.append(tenant)

    asyncio.run(_run_worker(url, W4_CONCURRENCY, handler, sizes.fair_a + sizes.fair_b))
    return b_position(order, sizes.fair_a, sizes.fair_b)
