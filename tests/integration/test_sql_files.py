"""Every statement of app/db/sql/*.sql parses and plans on a migrated database (with its
parameters unknown: EXPLAIN (GENERIC_PLAN)), and the loader maps names to $n as a
driver needs them."""

from __future__ import annotations

import pytest

from app.db import sql

STATEMENTS = [st for concept in sql.concepts() for st in sql.load(concept).values()]


@pytest.mark.parametrize("st", STATEMENTS, ids=lambda st: f"{st.concept}.{st.name}")
async def test_every_statement_parses_and_plans(store, st):
    # No arguments: asyncpg sends it as a simple query, which plans $n as unknowns.
    assert await store.execute(f"EXPLAIN (GENERIC_PLAN) {st.text}") == "EXPLAIN"


async def test_a_statement_that_does_not_parse_fails_here(store):
    """What the test above relies on: a bad statement is refused when planned."""
    [bad] = sql.parse("t", "-- name: bad\nSELEC job_key FROM jobs WHERE job_key = :k").values()
    with pytest.raises(Exception, match="syntax error"):
        await store.execute(f"EXPLAIN (GENERIC_PLAN) {bad.text}")


def test_parameters_are_named_and_numbered_once_in_order_of_use():
    [st] = sql.parse(
        "t",
        "-- name: s\n-- what it does\n"
        "SELECT :b::int, ':not_a_param', \"also:not\", :a, :b -- :nor_this\nFROM t WHERE x = :a",
    ).values()
    assert st.text.startswith("SELECT $1::int, ':not_a_param', \"also:not\", $2, $1 -- :nor_this")
    assert st.params == ("b", "a") and st.header == ("what it does",)
    assert st.bind(a=1, b=2) == (st.text, 2, 1)
    with pytest.raises(TypeError, match="missing"):
        st.args(a=1)
    with pytest.raises(TypeError, match="unknown"):
        st.args(a=1, b=2, c=3)


def test_positional_parameters_in_a_file_are_refused():
    with pytest.raises(ValueError, match="name its parameters"):
        sql.parse("t", "-- name: s\nSELECT $1")
    assert sql.parse("t", "-- name: s\nSELECT '$1'")["s"].params == ()
