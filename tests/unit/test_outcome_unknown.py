"""Which statements could have committed when their connection died (OUTCOME_UNKNOWN
rather than RESOURCE_EXHAUSTED, when sent outside a transaction)."""

from __future__ import annotations

import pytest

from app.db.pool import _writes


@pytest.mark.parametrize(
    ("query", "writes"),
    [
        ("SELECT 1", False),
        ("SELECT job_key FROM jobs WHERE state = 'CREATED' FOR UPDATE SKIP LOCKED", False),
        ("SELECT 1 FROM lanes FOR NO KEY UPDATE", False),
        ("WITH done AS (UPDATE jobs SET state = 'COMPLETED') SELECT 1", True),
        ("INSERT INTO tenants VALUES ($1)", True),
        ("delete from jobs where job_key = $1", True),
    ],
)
def test_a_statement_writes_if_it_inserts_updates_or_deletes(query: str, writes: bool) -> None:
    assert _writes(query) is writes
