"""Every statement of app/db/sql/*.sql parses and plans on a migrated database (with its
parameters unknown: EXPLAIN (GENERIC_PLAN)), and the loader maps names to $n as a
driver needs them."""

from __future__ import annotations

import pytest

from app.db import sql

# citus.sql names Citus's catalog, which a database without Citus has not: its statements
# are planned on a Citus cluster, by make citus (tests/citus).
CITUS_ONLY = {"citus"}
STATEMENTS = [
    st
    for concept in sql.concepts()
    if concept not in CITUS_ONLY
    for st in sql.load(concept).values()
]


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


def test_a_fragment_is_put_in_whole_and_its_parameters_numbered_where_it_is_used():
    source = (
        "-- fragment: ready\n-- a part\nready AS (SELECT :job_type AS t, {{PROBED_LANES}} AS n)\n"
        "-- name: s\nWITH {{ready}} SELECT :limit, :job_type FROM ready\n"
        "-- name: u\nWITH {{ready}} SELECT :job_type FROM ready"
    )
    found = sql.parse("t", source)
    assert sorted(found) == ["s", "u"]  # a fragment is not a statement
    assert found["s"].text == "WITH ready AS (SELECT $1 AS t, 16 AS n) SELECT $2, $1 FROM ready"
    assert found["s"].params == ("job_type", "limit")
    assert found["u"].params == ("job_type",)


def test_a_fragment_of_another_file_is_named_with_its_file():
    others = {"lanes": sql._blocks("lanes", "-- fragment: wake\nwoken AS (SELECT :n)")}
    [st] = sql.parse("t", "-- name: s\nWITH {{lanes.wake}} SELECT 1", others).values()
    assert st.text == "WITH woken AS (SELECT $1) SELECT 1" and st.params == ("n",)


@pytest.mark.parametrize(
    ("source", "refused"),
    [
        ("-- name: s\nSELECT {{nowhere}}", "no fragment"),
        ("-- name: s\nSELECT {{NO_SUCH_BOUND}}", "no bound"),
        ("-- name: f\nSELECT 1\n-- name: s\nSELECT {{f}}", "no fragment"),  # a statement
        ("-- fragment: f\n{{g}}\n-- fragment: g\n{{f}}\n-- name: s\nSELECT {{f}}", "itself"),
    ],
)
def test_a_name_that_resolves_to_nothing_or_to_itself_is_refused(source, refused):
    with pytest.raises(ValueError, match=refused):
        sql.parse("t", source)


def test_a_fragment_in_a_comment_or_a_string_is_not_put_in_but_a_bound_in_a_string_is():
    source = (
        "-- fragment: f\nmany\nlines\n-- name: s\n"
        "SELECT 1 -- not {{f}} nor {{PROBED_LANES}}\n, '{{f}}', {{f}}, '{{PROBED_LANES}}'"
    )
    [st] = sql.parse("t", source).values()
    assert st.text == ("SELECT 1 -- not {{f}} nor {{PROBED_LANES}}\n, '{{f}}', many\nlines, '16'")
