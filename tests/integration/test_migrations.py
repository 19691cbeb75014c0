"""An empty database migrates to head, and the result equals the declared metadata."""

from __future__ import annotations

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from app import migrations
from app.db.schema import metadata


async def test_empty_database_migrates_to_head_matching_metadata(postgres):
    postgres.psql('DROP DATABASE IF EXISTS "migrate_check" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "migrate_check";')
    url = postgres.url("migrate_check")
    try:
        migrations.upgrade(url)
        migrations.upgrade(url)  # idempotent at head
        engine = create_async_engine(url.replace("postgresql://", "postgresql+asyncpg://", 1))
        async with engine.connect() as conn:

            def diff(sync_conn):  # type: ignore[no-untyped-def]
                ctx = MigrationContext.configure(sync_conn, opts={"compare_type": True})
                return ctx.get_current_revision(), compare_metadata(ctx, metadata)

            revision, changes = await conn.run_sync(diff)
        await engine.dispose()
        assert revision == migrations.head_revision()
        assert changes == []
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "migrate_check" WITH (FORCE);')


async def test_a_url_with_libpq_query_parameters_migrates(postgres):
    """``sslmode`` is how most PostgreSQL URLs are written; the migration reads the URL
    as the server's pool does."""
    postgres.psql('DROP DATABASE IF EXISTS "migrate_url" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "migrate_url";')
    try:
        url = postgres.url("migrate_url") + "&sslmode=disable"
        migrations.upgrade(url)
        conn = await asyncpg.connect(url)
        try:
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == (
                migrations.head_revision()
            )
        finally:
            await conn.close()
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "migrate_url" WITH (FORCE);')
