"""The pool opens its connections at start and keeps them, each warmed: the statements
of a job's path prepared and planned, with arguments that match nothing."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg

from app.db import Database
from app.db import pool as st


async def test_a_pool_opens_all_its_connections_warm_and_the_warm_up_writes_nothing(
    db_url: str,
) -> None:
    store = await Database.connect(db_url, size=3)
    try:
        assert store.get_size() == 3
        async with contextlib.AsyncExitStack() as stack:
            # All three at once, so each is a different connection.
            conns = await asyncio.gather(
                *(stack.enter_async_context(store.connection()) for _ in range(3))
            )
            for conn in conns:
                prepared = {
                    r["statement"]
                    for r in await conn.fetch(
                        "SELECT statement FROM pg_prepared_statements WHERE generic_plans > 0"
                    )
                }
                for sql, *_ in st._warm_up_calls():
                    assert sql in prepared  # prepared, and its generic plan built
    finally:
        await store.close()
    conn = await asyncpg.connect(db_url)
    try:
        for table in ("jobs", "lanes", "tenants", "job_types"):
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
        assert await conn.fetchval("SELECT is_called FROM job_key_seq") is False
    finally:
        await conn.close()


async def test_a_transaction_begun_with_its_locks_commits_or_rolls_back_whole(
    db_url: str,
) -> None:
    """``transaction(first=...)`` sends BEGIN and the locks in one round trip: the locks
    are held to the end, a body that raises (or is cancelled) leaves nothing behind."""
    store = await Database.connect(db_url, size=2)
    other = await asyncpg.connect(db_url)
    locks = "SELECT pg_advisory_xact_lock_shared(7, 1), pg_advisory_xact_lock_shared(7, 2)"
    taken = "SELECT pg_try_advisory_xact_lock(7, 2)"  # exclusive: fails while shared held
    try:
        await other.execute("CREATE TABLE t (x int)")
        async with store.transaction(first=locks) as tx:
            await tx.execute("INSERT INTO t VALUES (1)")
            async with other.transaction():
                assert await other.fetchval(taken) is False  # held inside
        async with other.transaction():
            assert await other.fetchval(taken) is True  # released at commit
        with contextlib.suppress(RuntimeError):
            async with store.transaction(first=locks) as tx:
                await tx.execute("INSERT INTO t VALUES (2)")
                raise RuntimeError("the body fails")
        entered = asyncio.Event()

        async def cancelled() -> None:
            async with store.transaction(first=locks) as tx:
                await tx.execute("INSERT INTO t VALUES (3)")
                entered.set()
                await asyncio.Event().wait()

        task = asyncio.create_task(cancelled())
        await entered.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert [r["x"] for r in await other.fetch("SELECT x FROM t")] == [1]
        async with other.transaction():
            assert await other.fetchval(taken) is True
        async with store.connection() as conn:  # both pooled connections are clean
            assert not conn.is_in_transaction()
    finally:
        await other.close()
        await store.close()
