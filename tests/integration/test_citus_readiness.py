"""The schema is ready to be distributed by tenant (Citus, distribution column ``shard``;
docs/scaling.md), checked on the migrated schema, since no Citus can be installed here:

* a tenant's shard and a job key's layout are the same in Python (app.shards) and in SQL
  (alembic 0008's functions);
* every table is either distributed by ``shard`` or a reference table, and every unique
  index of a distributed table holds ``shard``;
* every job the app makes carries its tenant's shard, in its row and in its key's high
  bits, and every lane and lane key its tenant's shard;
* every statement that finds one job by its key names the key's shard, and the primary
  key serves it;
* jobs made before the shards keep their keys, are found by them, and keep their
  idempotency keys.
"""

from __future__ import annotations

import json
import random
import string
from datetime import timedelta

import asyncpg
import pytest
from alembic.script import ScriptDirectory

from alembic import command
from app import migrations, shards
from app.db import Database, catalog, citus, claims, finishing, job_rows, sql
from app.db.claims import LeadAsk, Share
from app.domain import DEFAULT_TENANT, utcnow
from tests.fixtures import Postgres

# Tables spread over the nodes by shard, and the small ones every node holds whole: as
# jobfair migrate makes them on a Citus coordinator (app.db.citus).
DISTRIBUTED = set(citus.DISTRIBUTED)
REFERENCE = set(citus.REFERENCE)


def tenant_ids(n: int) -> list[str]:
    """``n`` tenant ids as TENANT_ID_RE allows them, of every length, and the default."""
    rng = random.Random(26)
    alphabet = string.ascii_letters + string.digits + "_.-"
    ids = {DEFAULT_TENANT, "t0", "acme"}
    while len(ids) < n:
        ids.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 31))))
    return sorted(ids)


async def test_a_tenants_shard_is_the_same_in_python_and_in_sql(store: Database) -> None:
    tenants = tenant_ids(5000)
    rows = await store.fetch(
        "SELECT t, jobfair_shard(t) AS shard FROM unnest($1::text[]) t", tenants
    )
    in_sql = {r["t"]: r["shard"] for r in rows}
    assert in_sql == {t: shards.shard_of(t) for t in tenants}
    assert all(0 <= s < shards.SHARDS for s in in_sql.values())
    # A hash spreads them: 5,000 tenants over 2,048 shards fill about 1,870.
    assert len(set(in_sql.values())) > 1700


async def test_keys_are_made_and_read_alike_in_python_and_in_sql(store: Database) -> None:
    first, last = 2251799813685249, (1 << 52) - 1  # the sequence's range
    for shard, n in [(0, first), (5, first + 51), (2047, first + 2), (1234, last)]:
        key = await store.fetchval("SELECT jobfair_job_key($1::smallint, $2)", shard, n)
        assert key == shards.job_key(shard, n)
        assert key >> shards.SHARD_BITS == n and (1 << 62) < key < (1 << 63)
        assert await store.fetchval("SELECT jobfair_key_shard($1)", key) == shard
        assert shards.shard_of_key(key) == shard
    # Keys grow with n whatever their shards: the primary key is appended to in order.
    assert shards.job_key(2047, first) < shards.job_key(0, first + 1)


UNIQUE_INDEXES = """
SELECT t.relname AS table_name, i.relname AS index_name,
       ARRAY(SELECT a.attname::text FROM unnest(x.indkey) k
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k) AS columns
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND (x.indisunique OR x.indisprimary) AND t.relname = ANY($1)
"""


async def test_every_unique_index_of_a_distributed_table_holds_the_shard(
    store: Database,
) -> None:
    rows = await store.fetch(UNIQUE_INDEXES, sorted(DISTRIBUTED))
    found = {r["index_name"]: r["columns"] for r in rows}
    assert set(found) == {
        "jobs_pkey",
        "jobs_idempotency_idx",
        "lanes_pkey",
        "job_events_pkey",
        "lane_keys_pkey",
        "key_weights_pkey",
    }
    for name, columns in found.items():
        assert "shard" in columns, f"{name} ({', '.join(columns)}) lacks the shard"
    # Lookups by key still lead with the key; the idempotency probe with the tenant.
    assert found["jobs_pkey"] == ["job_key", "shard"]
    assert found["jobs_idempotency_idx"] == ["tenant_id", "idempotency_key", "shard"]
    assert found["lanes_pkey"] == ["job_type", "tenant_id", "shard"]
    assert found["job_events_pkey"] == ["job_key", "activation_count", "step", "shard"]
    assert found["lane_keys_pkey"] == ["job_type", "tenant_id", "fairness_key", "shard"]
    assert found["key_weights_pkey"] == ["tenant_id", "fairness_key", "shard"]


async def test_every_table_is_distributed_by_shard_or_a_reference_table(
    store: Database,
) -> None:
    """A new table must be put in one of the two sets: distributed (then it has a shard
    column, which is the test above's business) or small enough to be on every node."""
    tables = {
        r["relname"]: r["has_shard"]
        for r in await store.fetch(
            "SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid"
            "   AND a.attname = 'shard' AND NOT a.attisdropped) AS has_shard"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind = 'r'"
        )
    }
    assert set(tables) == DISTRIBUTED | REFERENCE
    assert {t for t, has_shard in tables.items() if has_shard} == DISTRIBUTED


async def test_every_job_and_lane_the_app_makes_carries_its_tenants_shard(
    store: Database,
) -> None:
    now = utcnow()
    tenants = [DEFAULT_TENANT, "acme", "globex", "t7", "a-b.c_d"]
    batch = [{"type": "ship", "tenantId": t} for t in tenants]
    batch += [{"type": "ship"}, {"type": "ship", "tenantId": "acme", "idempotencyKey": "k1"}]
    batch += [{"type": "later", "tenantId": "globex", "delay": 60_000}]
    await job_rows.insert(store, batch, now)
    await job_rows.insert_one(store, {"type": "one", "tenantId": "initech"}, now)
    ask = LeadAsk(None, Share("w", 1000, 1), False, 0, 60_000)
    await claims.insert_and_claim_lead(
        store, {"type": "handed", "tenantId": "hooli"}, now + timedelta(seconds=1), ask
    )
    key, got = await claims.insert_and_claim_lead(
        store, {"type": "handed", "tenantId": "umbrella"}, now + timedelta(seconds=2), ask
    )
    assert got.job is not None and got.job.job_key == key
    await finishing.complete(store, [(key, 1, None)], now + timedelta(seconds=3))
    events = await store.fetch("SELECT job_key, shard FROM job_events")
    assert [r["job_key"] for r in events] == [key]
    assert all(r["shard"] == shards.shard_of_key(r["job_key"]) for r in events)
    rows = await store.fetch("SELECT job_key, shard, tenant_id FROM jobs")
    assert len(rows) == len(batch) + 3
    for r in rows:
        assert r["shard"] == shards.shard_of(r["tenant_id"]), r
        assert shards.shard_of_key(r["job_key"]) == r["shard"], r
    lanes = await store.fetch("SELECT tenant_id, shard FROM lanes")
    assert {r["tenant_id"] for r in lanes} >= set(tenants) | {"initech", "hooli", "umbrella"}
    assert all(r["shard"] == shards.shard_of(r["tenant_id"]) for r in lanes)
    keys = await store.fetch("SELECT tenant_id, shard FROM lane_keys")
    assert {r["tenant_id"] for r in keys} == {r["tenant_id"] for r in lanes}
    assert all(r["shard"] == shards.shard_of(r["tenant_id"]) for r in keys)


def single_key_lookups() -> list[catalog.Statement]:
    """Named statements that find one job by a key parameter (``job_key = $n``)."""
    return [
        st
        for module in sql.concepts()
        for st in catalog.statements(module)
        if "job_key = $" in st.sql.replace("j.job_key", "job_key")
    ]


@pytest.mark.parametrize("st", single_key_lookups(), ids=lambda st: f"{st.module}.{st.name}")
def test_a_lookup_of_one_job_by_key_names_the_keys_shard(st: catalog.Statement) -> None:
    sql = st.sql.replace("j.", "").replace("cur.", "")
    for param in {p for p in ("$1", "$2") if f"job_key = {p}" in sql}:
        assert f"shard = jobfair_key_shard({param})" in sql, f"{st.module}.{st.name}"


def index_scans(node: dict) -> list[dict]:
    """The index scans of a plan (EXPLAIN's JSON), nested ones included."""
    found = [node] if "Index Name" in node else []
    for child in node.get("Plans", []):
        found += index_scans(child)
    return found


async def test_the_primary_key_serves_a_lookup_by_key_and_shard(store: Database) -> None:
    [made] = await job_rows.insert(store, [{"type": "x", "tenantId": "acme"}], utcnow())
    async with store.transaction() as tx:
        await tx.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        await tx.execute(f"PREPARE get_job(bigint) AS {job_rows.SQL['get_job'].text}")
        plan = await tx.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE get_job({made.job_key})")
    [scan] = [s for s in index_scans(json.loads(plan)[0]["Plan"]) if s["Relation Name"] == "jobs"]
    assert scan["Index Name"] == "jobs_pkey"
    assert "job_key = $1" in scan["Index Cond"] and "shard = " in scan["Index Cond"], scan


@pytest.fixture
def before_shards(postgres: Postgres):
    """A database migrated up to the revision before the shards."""
    name = "citus_ready_upgrade"
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')
    postgres.psql(f'CREATE DATABASE "{name}";')
    url = postgres.url(name)
    cfg = migrations.alembic_config(url)
    previous = ScriptDirectory.from_config(cfg).get_revision("0008").down_revision
    command.upgrade(cfg, str(previous))
    yield url
    postgres.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE);')


async def test_jobs_made_before_the_shards_keep_their_keys_and_their_idempotency(
    before_shards: str,
) -> None:
    conn = await asyncpg.connect(before_shards)
    try:
        made = await conn.fetch(
            "INSERT INTO jobs (job_type, tenant_id, state, priority, retries, run_at,"
            "                  queued_at, created_at, idempotency_key)"
            " SELECT 'old', t, 'CREATED', 50, 3, now(), now(), now(), 'once'"
            " FROM unnest($1::text[]) t RETURNING job_key, tenant_id",
            [DEFAULT_TENANT, "acme"],
        )
        await conn.execute(
            "INSERT INTO lanes (job_type, tenant_id) SELECT 'old', unnest($1::text[])",
            [DEFAULT_TENANT, "acme"],
        )
    finally:
        await conn.close()
    migrations.upgrade(before_shards)
    db = await Database.connect(before_shards, size=2)
    try:
        for row in made:
            # An old key names the shard it names: its job is found by it as before.
            job = await job_rows.get(db, row["job_key"])
            assert job is not None and job.job.tenant_id == row["tenant_id"]
            # Its idempotency key still answers with it, whatever its tenant's shard.
            [again] = await job_rows.insert(
                db,
                [{"type": "old", "tenantId": row["tenant_id"], "idempotencyKey": "once"}],
                utcnow(),
            )
            assert (again.job_key, again.created) == (row["job_key"], False)
            # And a single create's statement (POST /v2/jobs) finds it taken.
            one = {"type": "old", "tenantId": row["tenant_id"], "idempotencyKey": "once"}
            assert await job_rows.insert_one(db, one, utcnow()) is None
        assert await db.fetchval("SELECT count(*) FROM jobs") == 2
        lanes = await db.fetch("SELECT tenant_id, shard FROM lanes")
        assert {r["tenant_id"]: r["shard"] for r in lanes} == {
            t: shards.shard_of(t) for t in (DEFAULT_TENANT, "acme")
        }
        # What a distributed database would need moved: the old jobs outside their
        # tenant's shard.
        moved = await db.fetch("SELECT tenant_id FROM jobs WHERE shard <> jobfair_shard(tenant_id)")
        assert {r["tenant_id"] for r in moved} == {
            r["tenant_id"]
            for r in made
            if shards.shard_of_key(r["job_key"]) != shards.shard_of(r["tenant_id"])
        }
        # A new job of the same tenant is in its tenant's shard.
        [new_job] = await job_rows.insert(db, [{"type": "old", "tenantId": "acme"}], utcnow())
        assert shards.shard_of_key(new_job.job_key) == shards.shard_of("acme")
        assert new_job.job_key > max(r["job_key"] for r in made)
        # While one of them is outside its tenant's shard, keyed inserts look there too.
        assert moved, "the fixture's tenants: one of them has a key naming another shard"
        assert db.keys_before_0008 is not None
        assert await db.keys_before_0008.remain(db) and not db.keys_before_0008.none_left
        # Once none is left (retention), a new pool finds so and looks no more: the key
        # is free, and a keyed insert makes a new job under it.
        await db.execute("DELETE FROM jobs WHERE job_type = 'old' AND job_key < $1", 2**52)
    finally:
        await db.close()
    db = await Database.connect(before_shards, size=2)
    try:
        assert db.keys_before_0008 is not None
        assert not await db.keys_before_0008.remain(db) and db.keys_before_0008.none_left
        again = {"type": "old", "tenantId": "acme", "idempotencyKey": "once"}
        [made_now] = await job_rows.insert(db, [again], utcnow())
        assert made_now.created
        assert (await job_rows.insert_one(db, {**again, "tenantId": DEFAULT_TENANT}, utcnow()))
    finally:
        await db.close()
