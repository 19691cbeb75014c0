"""Alembic environment: runs migrations over SQLAlchemy's asyncpg dialect.

The database URL is passed in by ``app.migrations`` as ``config.attributes["url"]``, or
read from ``JOBFAIR_DATABASE_URL`` when alembic is run by hand.
"""

from __future__ import annotations

import asyncio
import os

from sqlalchemy.ext.asyncio import create_async_engine

from alembic import context
from app.db.connect import connect
from app.db.locks import MIGRATION_LOCK
from app.db.schema import metadata

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("JOBFAIR_DATABASE_URL")
    if not url:
        raise SystemExit("set JOBFAIR_DATABASE_URL, or run `jobfair migrate`")
    return url


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        # Before Alembic reads the version: migrations started together (N replicas) take
        # turns, and each after the first finds the schema at head (app.db.locks).
        connection.exec_driver_sql(MIGRATION_LOCK)
        context.run_migrations()


async def _run_async() -> None:
    # asyncpg reads the URL itself, as the server's pool does: SQLAlchemy's dialect would
    # turn its query into connect() arguments, and refuse libpq's (``sslmode=...``).
    url = _url()
    engine = create_async_engine("postgresql+asyncpg://", async_creator=lambda: connect(url))
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline mode is not supported")
asyncio.run(_run_async())
