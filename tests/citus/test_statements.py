"""The hot path's statements in their Citus spellings run on a Citus cluster (make citus):
the pool's warm-up calls on Citus (a job's path: create, read lanes and keys, claim,
charge, complete), each run with arguments that match nothing, as the pool runs them
(custom plans), in a transaction rolled back."""

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

# Statements of the path that do not run on Citus yet, with the error Citus gives (none:
# every warm-up statement, in its Citus spelling, runs).
NOT_YET: dict[str, str] = {}


def _named_calls() -> dict[str, tuple[object, ...]]:
    names = {
        st.text: f"{concept}.{name}"
        for concept in sql.concepts()
        for name, st in sql.load(concept).citus.items()
    }
    return {names[call[0]]: call for call in pool._citus_warm_up_calls()}


CALLS = _named_calls()


@pytest.mark.parametrize("name", sorted(CALLS))
async def test_a_hot_path_statement_on_citus(citus, name: str) -> None:
    text, *args = CALLS[name]
    conn = await asyncpg.connect(
        citus.url(), server_settings={"plan_cache_mode": "force_custom_plan"}
    )
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
