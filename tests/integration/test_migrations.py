"""An empty database migrates to head, and the result equals the declared metadata; migrations
started together take turns."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from alembic import command
from app import migrations
from app.db.locks import MIGRATION_LOCK, MIGRATION_LOCK_CLASS
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


def test_the_revisions_read_without_alembic_are_alembic_s():
    script = ScriptDirectory.from_config(migrations.alembic_config("unused"))
    assert migrations.head_revision() == script.get_current_head()
    revisions = {r.revision for r in script.walk_revisions()}
    assert {r for r in revisions if migrations.known(r)} == revisions
    assert not migrations.known("from_the_future")


async def test_every_migration_from_0009_records_the_oldest_server_it_serves(postgres):
    """A rolling upgrade relies on it (tests/deploy/test_rolling_upgrade.py): each
    migration declares ``oldest_server`` (itself, or a revision before it) and writes it."""
    script = ScriptDirectory.from_config(migrations.alembic_config("unused"))
    chain = [r for r in reversed(list(script.walk_revisions()))]
    later = [r for r in chain if int(r.revision) >= 9]
    assert later and later[0].revision == "0009"
    postgres.psql('DROP DATABASE IF EXISTS "migrate_compat" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "migrate_compat";')
    url = postgres.url("migrate_compat")
    try:
        for rev in later:
            oldest = getattr(rev.module, "oldest_server", None)
            assert oldest is not None, f"{rev.revision} declares no oldest_server"
            earlier = [r.revision for r in chain[: chain.index(rev) + 1]]
            assert oldest in earlier, f"{rev.revision}: {oldest} is not itself or before it"
            await asyncio.to_thread(command.upgrade, migrations.alembic_config(url), rev.revision)
            conn = await asyncpg.connect(url)
            try:
                assert await conn.fetchval("SELECT oldest_server FROM schema_compat") == oldest
            finally:
                await conn.close()
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "migrate_compat" WITH (FORCE);')


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


async def test_migrations_started_together_take_turns_and_all_succeed(postgres):
    """N replicas' ``jobfair migrate`` on one fresh database: each waits for the
    migration lock (held here until all of them wait on it), then the first migrates and
    the others find the schema at head.  Without the lock they would create the same
    tables at once and all but one fail."""
    postgres.psql('DROP DATABASE IF EXISTS "migrate_race" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "migrate_race";')
    url = postgres.url("migrate_race")
    holder = await asyncpg.connect(url)
    procs: list[asyncio.subprocess.Process] = []
    try:
        await holder.execute("BEGIN")
        await holder.execute(MIGRATION_LOCK)
        env = {**os.environ, "JOBFAIR_DATABASE_URL": url}
        for _ in range(4):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *("-m", "app.cli", "migrate"),
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                )
            )
        await _until_waiting_for_the_lock(holder, procs)
        await holder.execute("COMMIT")
        for proc in procs:
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, out.decode()
        assert await holder.fetchval("SELECT version_num FROM alembic_version") == (
            migrations.head_revision()
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await holder.close()
        postgres.psql('DROP DATABASE IF EXISTS "migrate_race" WITH (FORCE);')


async def _until_waiting_for_the_lock(
    conn: asyncpg.Connection, procs: list[asyncio.subprocess.Process]
) -> None:
    """Polls pg_locks (another process's wait has no event to await), with a deadline."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = $1::bigint::oid AND objid = 0 AND objsubid = 2",
            MIGRATION_LOCK_CLASS,
        )
        if waiting == len(procs):
            return
        for proc in procs:
            assert proc.returncode is None, "a migration ended without waiting for the lock"
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(procs)} migrations never all waited for the migration lock")


# What a server reads and writes: every table's columns, indexes and constraints, and the
# jobs table's storage (a rewrite gives it a new relfilenode).
_SHAPE = """
SELECT (SELECT string_agg(table_name || '.' || column_name || ':' || data_type || ':'
                          || is_nullable || ':' || coalesce(column_default, ''), ','
                          ORDER BY table_name, column_name)
          FROM information_schema.columns WHERE table_schema = 'public'),
       (SELECT string_agg(indexdef, ',' ORDER BY indexname) FROM pg_indexes
         WHERE schemaname = 'public'),
       (SELECT string_agg(conname || ':' || pg_get_constraintdef(oid), ',' ORDER BY conname)
          FROM pg_constraint WHERE connamespace = 'public'::regnamespace),
       (SELECT relfilenode FROM pg_class WHERE relname = 'jobs')
"""


async def test_0014_expands_only_while_a_0013_server_holds_its_tables(postgres):
    """0014 adds a function and nothing else: migrated beside a server of 0013 (here, an
    open transaction that read jobs and lanes, as a claim does), it waits for no lock of
    theirs, rewrites no table, and leaves every table, column, index and constraint a
    0013 server reads and writes as it was, and the schema still serving 0012's."""
    postgres.psql('DROP DATABASE IF EXISTS "expand_0014" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "expand_0014";')
    url = postgres.url("expand_0014")
    try:
        await asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0013")
        conn = await asyncpg.connect(url)
        server = await asyncpg.connect(url)
        try:
            before = tuple(await conn.fetchrow(_SHAPE))
            tx = server.transaction()
            await tx.start()
            await server.fetch("SELECT count(*) FROM jobs")
            await server.fetch("SELECT count(*) FROM lanes")
            await asyncio.wait_for(
                asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0014"), 60
            )
            await tx.rollback()
            assert tuple(await conn.fetchrow(_SHAPE)) == before
            assert await conn.fetchval("SELECT oldest_server FROM schema_compat") == "0012"
            assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0014"
        finally:
            await conn.close()
            await server.close()
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "expand_0014" WITH (FORCE);')


# What a server of 0014 does to lanes (its statements as that release has them): it makes
# a lane, holds it at its tenant's cap, and samples it -- never naming held_count.
_OLD_WAKE = """
INSERT INTO lanes (job_type, tenant_id, shard, vtime, active, held)
VALUES ('t', 'acme', jobfair_shard('acme'), 0, true, false)
"""
_OLD_HOLD = """
UPDATE lanes SET held = true
WHERE job_type = $1 AND tenant_id = ANY($2::text[]) AND NOT held
"""
_OLD_SAMPLE = """
SELECT l.job_type, l.tenant_id, l.activated_total, l.active, l.held, l.vtime,
       COALESCE(t.weight, 1) AS weight, l.units_total, jt.fairness_by
FROM lanes l LEFT JOIN tenants t ON t.tenant_id = l.tenant_id
LEFT JOIN job_types jt ON jt.job_type = l.job_type
"""


async def test_0015_adds_a_column_beside_0014_servers(postgres):
    """0015 adds lanes.held_count: migrated while a server of 0014 holds a lane row for
    3 s (longer than one try's lock wait), it waits its turn without failing and
    without holding the server's later work for more than a try; no table is rewritten;
    the one change is the column; and 0014's statements still make, hold and sample
    lanes on the new schema."""
    postgres.psql('DROP DATABASE IF EXISTS "expand_0015" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "expand_0015";')
    url = postgres.url("expand_0015")
    try:
        await asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0014")
        conn = await asyncpg.connect(url)
        server = await asyncpg.connect(url)
        try:
            await server.execute(_OLD_WAKE)
            before = tuple(await conn.fetchrow(_SHAPE))
            lanes_file = await conn.fetchval(
                "SELECT relfilenode FROM pg_class WHERE relname = 'lanes'"
            )
            tx = server.transaction()
            await tx.start()
            await server.execute(_OLD_HOLD, "t", ["acme"])  # a claim's hold, uncommitted
            upgrade = asyncio.create_task(
                asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0015")
            )
            await asyncio.sleep(3)  # the server's transaction lasts: that is the test
            # Meanwhile the lane stays readable: the migration's tries give way.
            other = await asyncpg.connect(url)
            try:
                assert len(await asyncio.wait_for(other.fetch(_OLD_SAMPLE), 3)) == 1
            finally:
                await other.close()
            assert not upgrade.done()
            await tx.commit()
            await asyncio.wait_for(upgrade, 60)
            after = tuple(await conn.fetchrow(_SHAPE))
            assert (after[1], after[3]) == (before[1], before[3])  # indexes, jobs' file

            def added(i: int) -> set[str]:
                return set(after[i].split(",")) - set(before[i].split(","))

            assert added(0) == {"lanes.held_count:bigint:NO:0"}
            assert not set(before[2].split(",")) - set(after[2].split(","))
            # PostgreSQL 18 names a column's NOT NULL as a constraint; earlier ones do not.
            assert added(2) <= {"lanes_held_count_not_null:NOT NULL held_count"}
            assert lanes_file == await conn.fetchval(
                "SELECT relfilenode FROM pg_class WHERE relname = 'lanes'"
            )
            assert await conn.fetchval("SELECT oldest_server FROM schema_compat") == "0012"
            # 0014's statements on the new schema.
            await server.execute("UPDATE lanes SET held = false")
            await server.execute(_OLD_HOLD, "t", ["acme"])
            await server.execute(_OLD_WAKE.replace("'acme'", "'beta'"))
            assert len(await server.fetch(_OLD_SAMPLE)) == 2
            counts = await conn.fetch("SELECT held_count FROM lanes")
            assert [r["held_count"] for r in counts] == [0, 0]
        finally:
            await conn.close()
            await server.close()
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "expand_0015" WITH (FORCE);')


# What a server of 0015 writes where 0016 adds columns (its statements' shapes): a key's
# weight, a type's configuration, a lane's key -- never naming the new columns.
_OLD_KEY_WEIGHT = """
INSERT INTO key_weights (tenant_id, fairness_key, shard, weight)
VALUES ('acme', 'k', jobfair_shard('acme'), 3)
ON CONFLICT (tenant_id, fairness_key, shard) DO UPDATE SET weight = EXCLUDED.weight
"""
_OLD_JOB_TYPE = """
INSERT INTO job_types AS t (job_type, max_active_jobs, aging_interval_ms, aging_step,
                            rate_per_s, rate_burst, rate_tokens, rate_at, fairness_by)
VALUES ('t', 5, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
ON CONFLICT (job_type) DO UPDATE SET max_active_jobs = EXCLUDED.max_active_jobs
"""
_OLD_LANE_KEY = """
INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)
VALUES ('t', 'acme', 'k', jobfair_shard('acme'), 0, true)
"""
_NEW_JOB = """
INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries, run_at,
                  queued_at, created_at)
VALUES (jobfair_job_key(jobfair_shard('acme'), nextval('job_key_seq')),
        jobfair_shard('acme'), 't', 'acme', 'CREATED', 50, 3, now(), now(), now())
"""


async def test_0016_adds_columns_beside_0015_servers_and_builds_its_index_concurrently(
    postgres,
):
    """0016 (key caps) migrated while a server of 0015 holds a transaction on the tables
    it alters: it waits its turn without failing and rewrites none of them; 0015's writes
    still work on the new schema; and the count's index is built CONCURRENTLY after it
    (app.migrations.CONCURRENT): while a server's transaction is open the build waits for
    it, and jobs are still inserted meanwhile."""
    postgres.psql('DROP DATABASE IF EXISTS "expand_0016" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "expand_0016";')
    url = postgres.url("expand_0016")
    try:
        await asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0015")
        conn = await asyncpg.connect(url)
        server = await asyncpg.connect(url)
        try:
            await server.execute(_OLD_KEY_WEIGHT)
            await _upgrade_beside_an_open_transaction(
                conn, server, url, "0016", _OLD_LANE_KEY, "lane_keys",
                ("jobs", "lane_keys", "key_weights", "job_types"),
            )  # fmt: skip
            assert await conn.fetchval("SELECT oldest_server FROM schema_compat") == "0012"
            # 0015's writes on the new schema.
            await server.execute(_OLD_KEY_WEIGHT)
            await server.execute(_OLD_JOB_TYPE)
            await server.execute(_OLD_LANE_KEY.replace("'k'", "'j'"))
            row = await conn.fetchrow(
                "SELECT w.max_active_jobs, y.max_active_per_key, k.held FROM key_weights w,"
                " job_types y, lane_keys k WHERE k.fairness_key = 'j'"
            )
            assert tuple(row) == (None, None, False)
            # The index, CONCURRENTLY: it waits for an open transaction, which goes on
            # writing jobs, as do others.
            tx = server.transaction()
            await tx.start()
            await server.execute(_NEW_JOB)
            build = asyncio.create_task(migrations.build_concurrent(url))
            await _until_a_statement_waits(conn, "CREATE INDEX CONCURRENTLY%")
            await asyncio.wait_for(conn.execute(_NEW_JOB), 5)  # not blocked by the build
            await server.execute(_NEW_JOB)
            await tx.commit()
            await asyncio.wait_for(build, 60)
            valid = await conn.fetch(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c"
                " ON c.oid = i.indexrelid WHERE c.relname = ANY($1::text[])",
                list(migrations.CONCURRENT),
            )
            # Those of 0016: the later ones wait for their migrations.
            assert set(migrations.CONCURRENT_SINCE) == set(migrations.CONCURRENT)
            of_0016 = [n for n, since in migrations.CONCURRENT_SINCE.items() if since <= "0016"]
            assert {r["relname"]: r["indisvalid"] for r in valid} == dict.fromkeys(of_0016, True)
        finally:
            await conn.close()
            await server.close()
    finally:
        postgres.psql('DROP DATABASE IF EXISTS "expand_0016" WITH (FORCE);')


async def _upgrade_beside_an_open_transaction(
    conn: asyncpg.Connection,
    server: asyncpg.Connection,
    url: str,
    target: str,
    write: str,
    table: str,
    tables: tuple[str, ...],
) -> None:
    """Migrate to ``target`` while an older server's uncommitted ``write`` holds
    ``table``: the migration waits for it (its ALTER seen waiting) without failing, and
    none of ``tables`` is rewritten (their files are the same after)."""
    files = "SELECT string_agg(relname || relfilenode, ',' ORDER BY relname) FROM pg_class"
    files += " WHERE relname = ANY($1)"
    before = await conn.fetchval(files, list(tables))
    tx = server.transaction()
    await tx.start()
    await server.execute(write)  # uncommitted: it holds the table
    upgrade = asyncio.create_task(
        asyncio.to_thread(command.upgrade, migrations.alembic_config(url), target)
    )
    await _until_a_statement_waits(conn, f"ALTER TABLE {table}%")
    assert not upgrade.done()
    await tx.commit()
    await asyncio.wait_for(upgrade, 60)
    assert await conn.fetchval(files, list(tables)) == before  # no table rewritten


async def _until_a_statement_waits(conn: asyncpg.Connection, like: str) -> None:
    """Until a session running a statement ``like`` waits for a lock (another session's
    wait has no event to await), with a deadline."""
    deadline = time.monotonic() + 60
    while not await conn.fetchval(  # noqa: ASYNC110
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND wait_event_type = 'Lock'",
        like,
    ):
        assert time.monotonic() < deadline, f"no {like} waited for a lock"
        await asyncio.sleep(0.05)


_OLD_TENANT = """
INSERT INTO tenants AS t (tenant_id, weight, max_active_jobs, rate_per_s, rate_burst,
                          rate_tokens, rate_at)
VALUES ('acme', 2, 5, NULL, NULL, NULL, NULL)
ON CONFLICT (tenant_id) DO UPDATE SET weight = EXCLUDED.weight
"""


async def test_0017_to_0019_expand_beside_0016_servers_and_rewrite_no_table(postgres):
    """FIFO keys (0017), minimums (0018) and keys drawn one at a time (0019) run while a
    0016 server's transaction holds the tables they alter: they wait for it, rewrite no
    table, keep serving servers from 0012 on, and a 0016 server's writes (which name
    none of the new columns) go on working; the indexes are then built CONCURRENTLY."""
    postgres.psql('DROP DATABASE IF EXISTS "expand_0019" WITH (FORCE);')
    postgres.psql('CREATE DATABASE "expand_0019";')
    url = postgres.url("expand_0019")
    await asyncio.to_thread(command.upgrade, migrations.alembic_config(url), "0016")
    conn = await asyncpg.connect(url)
    server = await asyncpg.connect(url)
    try:
        await _upgrade_beside_an_open_transaction(
            conn, server, url, "head", _OLD_JOB_TYPE, "job_types",
            ("jobs", "tenants", "job_types", "lane_keys"),
        )  # fmt: skip
        assert await conn.fetchval("SELECT oldest_server FROM schema_compat") == "0012"
        # 0016's writes on the new schema.
        await server.execute(_OLD_TENANT)
        await server.execute(_OLD_JOB_TYPE)
        await server.execute(_NEW_JOB)
        row = await conn.fetchrow(
            "SELECT t.min_active_jobs, y.key_ordering FROM tenants t, job_types y"
        )
        assert tuple(row) == (None, None)
        await migrations.build_concurrent(url)
        valid = await conn.fetch(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c"
            " ON c.oid = i.indexrelid WHERE c.relname = ANY($1::text[])",
            list(migrations.CONCURRENT),
        )
        assert {r["relname"]: r["indisvalid"] for r in valid} == dict.fromkeys(
            migrations.CONCURRENT, True
        )
        # Job keys drawn one at a time.
        assert (
            await conn.fetchval(
                "SELECT cache_size FROM pg_sequences WHERE sequencename = 'job_key_seq'"
            )
            == 1
        )
    finally:
        await conn.close()
        await server.close()


async def test_a_contracting_migration_waits_until_no_older_server_is_connected(
    db_url, spawn_server, tmp_path
):
    """Issue 45 §1: every connection names its server's version (application_name
    "jobfair/<revision>"); a pending migration that raises ``oldest_server`` is refused,
    before it changes anything, while a connection of a version below the new bound is
    open, and runs once it is gone.  Expanding migrations never wait."""
    import subprocess

    import httpx

    from tests.fixtures import wait_ready

    server = spawn_server()  # this version's: its connections name the head revision
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        await wait_ready(c, server)
    conn = await asyncpg.connect(db_url)
    names = {
        r["application_name"]
        for r in await conn.fetch(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        )
    }
    assert migrations.application_name() in names, names
    assert migrations.application_name() == f"jobfair/{migrations.head_revision()}"
    # A name the URL gives is kept (an operator's own, for their monitoring).
    from app.db.connect import connect

    sep = "&" if "?" in db_url else "?"
    mine = await connect(f"{db_url}{sep}application_name=mine")
    assert await mine.fetchval("SHOW application_name") == "mine"
    await mine.close()
    named = await connect(db_url)
    assert await named.fetchval("SHOW application_name") == migrations.application_name()
    await named.close()
    # As if at 0009, before migrations that contract (0010, 0011 and 0013 raise the bound,
    # to 0012 in the end): an "0009 server" connected blocks them.
    await conn.execute("UPDATE alembic_version SET version_num = '0009'")
    await conn.execute("UPDATE schema_compat SET oldest_server = '0008'")
    assert migrations.contract_bound("0009", "0008") == "0012"
    assert migrations.contract_bound("0016", "0012") is None  # 0017-0019 only expand
    old = await asyncpg.connect(db_url, server_settings={"application_name": "jobfair/0009"})
    migrate = [sys.executable, "-m", "app.cli", "migrate", "--database-url", db_url]
    done = await asyncio.to_thread(
        subprocess.run, migrate, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert "contracts the schema" in done.stderr and "jobfair/" not in done.stdout
    assert "1 connection(s) of 0009" in done.stderr, done.stderr
    # Nothing changed.
    assert await conn.fetchval("SELECT version_num FROM alembic_version") == "0009"
    await old.close()
    # Gone (and this version's own server still connected): the check passes.
    assert await migrations.servers_left_behind(conn, "0012") == {}
    await migrations._refuse_to_contract_under_older_servers(db_url)
    await conn.execute("UPDATE alembic_version SET version_num = $1", migrations.head_revision())
    await conn.close()


async def test_migrate_at_head_builds_the_indexes_an_interrupted_run_left(db_url, tmp_path):
    """A ``jobfair migrate`` stopped during its CONCURRENTLY builds leaves the schema at
    head and an index invalid or unbuilt; the next run, finding the schema at head, builds
    them (it skipped them, and said nothing)."""
    import subprocess

    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DROP INDEX tenants_min_idx")
        # What an interrupted CREATE INDEX CONCURRENTLY leaves: the index, not valid.
        await conn.execute(
            "UPDATE pg_index SET indisvalid = false"
            " WHERE indexrelid = 'jobs_waiting_key_idx'::regclass"
        )
        migrate = [sys.executable, "-m", "app.cli", "migrate", "--database-url", db_url]
        done = await asyncio.to_thread(
            subprocess.run, migrate, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert f"schema at {migrations.head_revision()}, indexes built" in done.stderr
        valid = dict(
            await conn.fetch(
                "SELECT c.relname, i.indisvalid FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = ANY($1)",
                ["tenants_min_idx", "jobs_waiting_key_idx"],
            )
        )
        assert valid == {"tenants_min_idx": True, "jobs_waiting_key_idx": True}, valid
    finally:
        await conn.close()
