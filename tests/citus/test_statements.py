"""Which of the hot path's statements run on a Citus cluster today, and how each of the
others fails (make citus).  The statements are the pool's warm-up calls (a job's path:
create, read lanes and keys, claim, charge, complete), each run with arguments that
match nothing in a transaction rolled back.

``NOT_YET`` is issue 42's work list: each entry is the error Citus gives now.  The test
fails when a statement's error changes -- or when it runs, and its entry must go."""

from __future__ import annotations

import re

import asyncpg
import pytest

from app.db import pool, sql
from tests.citus.cluster import installed

pytestmark = [
    pytest.mark.citus,
    pytest.mark.skipif(not installed(), reason="Citus is not installed (make citus)"),
]

NOT_YET = {
    # The wake's re-entry vtime reads the type's lanes of every tenant (a correlated
    # subquery over all shards) inside an INSERT ... SELECT from a CTE.
    "jobs.insert_jobs": "correlated subqueries are not supported",
    "jobs.insert_job_quiet": "correlated subqueries are not supported",
    # The charge locks lanes of many tenants (FOR NO KEY UPDATE across shards).
    "lanes.read_lanes": "could not run distributed query with FOR UPDATE/SHARE commands",
    "lanes.read_lanes_of_tenants": "could not run distributed query with FOR UPDATE/SHARE",
    "lanes.charge_lanes": "could not run distributed query with FOR UPDATE/SHARE commands",
    # Keys of many lanes joined to unnest() arrays and key_weights, not on shard.
    "lanes.read_keys": "complex joins are only supported when all distributed tables are co",
    # A claim's allotment spans tenants of many shards: its recursive skip scan is
    # single-shard only.
    "claims.claim": "recursive CTEs are only supported when they contain a filter on the",
    "claims.claim_by_worker_time": "recursive CTEs are only supported when they contain a",
    "claims.claim_lead": "recursive CTEs are only supported when they contain a filter on",
    "claims.claim_lead_of_tenants": "recursive CTEs are only supported when they contain a",
    "claims.claim_lead_by_worker_time": "recursive CTEs are only supported when they",
    "claims.claim_lead_of_tenants_by_worker_time": "recursive CTEs are only supported",
}


def _named_calls() -> dict[str, tuple[object, ...]]:
    names = {
        st.text: f"{concept}.{name}"
        for concept in sql.concepts()
        for name, st in sql.load(concept).items()
    }
    return {names[call[0]]: call for call in pool._warm_up_calls()}


CALLS = _named_calls()


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_hot_path_statement_on_citus(citus, name: str) -> None:
    text, *args = CALLS[name]
    conn = await asyncpg.connect(citus.url())
    try:
        tx = conn.transaction()
        await tx.start()
        try:
            if name in NOT_YET:
                with pytest.raises(asyncpg.PostgresError, match=re.escape(NOT_YET[name])):
                    await conn.fetch(text, *args)
            else:
                await conn.fetch(text, *args)
        finally:
            await tx.rollback()
    finally:
        await conn.close()


def test_every_entry_of_the_work_list_is_a_statement_of_the_path() -> None:
    assert set(NOT_YET) <= set(CALLS)
