"""The listing and the bulk statements read indexes, never the whole jobs table: their
plans (generic, as the pool runs them) on a table of 60,000 jobs in every state, with a
small tenant among 50 large ones."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest

from app.db.bulk import SQL as BULK
from app.db.listing import list_statement
from app.domain import JobFilter, JobState, utcnow

# Fifteen plans, each on 60,000 rows loaded for it: `make extended` (a minute).
pytestmark = pytest.mark.extended

FILL = """
INSERT INTO jobs (job_key, shard, job_type, tenant_id, state, priority, retries, run_at,
                  queued_at, created_at, completed_at, deadline, activated_at, activation_count)
SELECT jobfair_job_key(jobfair_shard(t.tenant_id), nextval('job_key_seq')),
       jobfair_shard(t.tenant_id), 'k' || (g % 5), t.tenant_id, s.state, 50, 3, now(), now(),
       now() - (($1 - g) * interval '1 second'),
       CASE WHEN s.state IN ('COMPLETED', 'FAILED', 'ERROR_THROWN', 'CANCELED') THEN now() END,
       CASE WHEN s.state = 'ACTIVATED' THEN now() + interval '1 hour' END,
       CASE WHEN s.state = 'ACTIVATED' THEN now() END, 1
FROM generate_series(1, $1) g
CROSS JOIN LATERAL (SELECT CASE
    WHEN g % 100 < 90 THEN 'COMPLETED' WHEN g % 100 < 92 THEN 'FAILED'
    WHEN g % 100 < 93 THEN 'CANCELED' WHEN g % 100 < 94 THEN 'ERROR_THROWN'
    WHEN g % 100 < 98 THEN 'CREATED' WHEN g % 100 < 99 THEN 'SCHEDULED'
    ELSE 'ACTIVATED' END AS state) s
CROSS JOIN LATERAL (
    SELECT CASE WHEN g % 3001 = 0 THEN 'rare' ELSE 't' || (g % 50) END AS tenant_id) t
"""
FAILED = frozenset({JobState.FAILED})
COMBOS = {
    "tenant, FAILED": JobFilter(tenant_id="t7", states=FAILED),
    "type, FAILED": JobFilter(job_type="k3", states=FAILED),
    "FAILED": JobFilter(states=FAILED),
    "tenant, type, FAILED, created after": JobFilter(
        job_type="k2", tenant_id="t7", states=FAILED, created_after=utcnow() - timedelta(hours=1)
    ),
    "a small tenant, COMPLETED": JobFilter(
        tenant_id="rare", states=frozenset({JobState.COMPLETED})
    ),
    "type, CANCELED": JobFilter(job_type="k3", states=frozenset({JobState.CANCELED})),
    "tenant": JobFilter(tenant_id="t7"),
    "a small tenant": JobFilter(tenant_id="rare"),
    "type": JobFilter(job_type="k3"),
    "tenant, type, CREATED": JobFilter(
        job_type="k2", tenant_id="t7", states=frozenset({JobState.CREATED})
    ),
    "tenant, ACTIVATED": JobFilter(tenant_id="t7", states=frozenset({JobState.ACTIVATED})),
    "every job": JobFilter(),
    "a key's two tenants, FAILED": JobFilter(states=FAILED, tenant_scope=frozenset({"t1", "t2"})),
}


@pytest.fixture
async def table(store):
    await store.execute(FILL, 60_000)
    await store.execute("VACUUM ANALYZE jobs")
    return store


async def _scans(store, sql: str, *args) -> set[tuple[str, str]]:
    """How the pool's connection's plan of ``sql`` reads jobs: (node type, index)."""
    async with store.connection() as conn:
        [[plan]] = await conn.fetch("EXPLAIN (FORMAT JSON) " + sql, *args)

    def walk(node: dict):  # type: ignore[no-untyped-def]
        yield node
        for child in node.get("Plans", []):
            yield from walk(child)

    return {
        (n["Node Type"], n.get("Index Name", ""))
        for n in walk(orjson.loads(plan)[0]["Plan"])
        if n.get("Relation Name") == "jobs" or n["Node Type"] == "Bitmap Index Scan"
    }


def _indexes(scans: set[tuple[str, str]]) -> set[str]:
    return {index for _, index in scans if index}


@pytest.mark.parametrize("combo", COMBOS)
async def test_each_filter_combination_reads_indexes_only(table, combo):
    sql, args = list_statement(COMBOS[combo], None, 101)
    scans = await _scans(table, sql, *args)
    assert not {s for s in scans if s[0] == "Seq Scan"}, scans
    if combo in ("tenant, FAILED", "type, FAILED", "FAILED", "a key's two tenants, FAILED"):
        assert _indexes(scans) <= {
            "jobs_failed_idx",
            "jobs_done_tenant_idx",
        }, scans
    if combo == "a small tenant, COMPLETED":
        assert _indexes(scans) == {"jobs_done_tenant_idx"}, scans


async def test_a_page_after_a_cursor_reads_indexes_too(table):
    sql, args = list_statement(COMBOS["tenant"], 2**62, 101)
    assert not {s for s in await _scans(table, sql, *args) if s[0] == "Seq Scan"}


async def test_the_bulk_statements_read_their_indexes(table):
    failed = BULK["failed_batch"].bind(
        after_key=0,
        limit=1000,
        tenant_id="t7",
        job_type=None,
        created_after=None,
        created_before=None,
    )
    scans = await _scans(table, *failed)
    assert scans == {("Index Scan", "jobs_failed_idx")}
    now = utcnow()
    ready = BULK["cancel_ready"].bind(job_type="k2", tenant_id="t7", limit=1000, now=now)
    scans = await _scans(table, *ready)
    assert "jobs_ready_idx" in _indexes(scans) and ("Seq Scan", "") not in scans, scans
    delayed = BULK["cancel_delayed"].bind(tenant_id="t7", job_type=None, limit=1000, now=now)
    scans = await _scans(table, *delayed)
    assert "jobs_scheduled_idx" in _indexes(scans) and ("Seq Scan", "") not in scans, scans
