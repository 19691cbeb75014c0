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
                for sql, _ in st._warm_up_calls():
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
