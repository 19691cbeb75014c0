"""The claim statement on real PostgreSQL when another activation holds rows it wanted:
it takes the next ones in order, and does not come up short while jobs are there."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest

from app.db import claims, finishing, job_rows
from app.db.claims import SQL as CLAIMS
from app.db.claims import Share
from app.db.lanes import SQL as LANES
from app.domain import utcnow


async def _insert(store, priority: int, n: int) -> list[int]:
    jobs = [{"type": "claim", "tenantId": "t", "priority": priority} for _ in range(n)]
    return [i.job_key for i in await job_rows.insert(store, jobs, utcnow())]


def _claim(tenants: list[str], counts: list[int], now, **share) -> tuple:
    """claim's call: ``counts`` jobs of each tenant's default key, by default one share,
    worker "w", a minute's lease."""
    share = {"workers": ["w"], "deadlines": [now + timedelta(minutes=1)], "starts": [1]} | share
    share = {"hint_priorities": [None] * len(tenants), "since": [None] * len(tenants)} | share
    return CLAIMS["claim"].bind(
        job_type="claim",
        tenants=tenants,
        keys=[""] * len(tenants),
        counts=counts,
        now=now,
        aging_step=10,
        aging_interval_ms=60_000,
        via_stream=False,
        **share,
    )


async def test_a_claim_passes_rows_held_by_another_and_tops_up_from_the_next_priority(store):
    high = await _insert(store, 50, 3)
    low = await _insert(store, 0, 5)
    now = utcnow()
    async with store.connection() as other:
        tx = other.transaction()
        await tx.start()
        # Another activation has locked every job of the top priority, not yet committed:
        # to this claim they still look CREATED, so its best three are all of them.
        held = await other.fetch(*_claim(["t"], [3], now))
        assert sorted(r["job_key"] for r in held) == high
        got = await claims.claim(
            store,
            "claim",
            {("t", ""): 3},
            now=now,
            shares=[Share("w2", 60_000, 3)],
            via_stream=False,
            aging_step=10,
            aging_interval_ms=60_000,
        )
        await tx.rollback()
    # The share the held priority could not give comes from the next one, oldest first.
    assert sorted(c.job.job_key for c in got) == low[:3]


async def _plan(store, query: str, *args) -> list[dict]:
    """Every node of the plan the pool's connection makes of ``query``."""
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            [[plan]] = await conn.fetch("EXPLAIN (FORMAT JSON) " + query, *args)
        finally:
            await tx.rollback()
    return _nodes(orjson.loads(plan)[0]["Plan"])


def _nodes(node: dict) -> list[dict]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def _jobs_scans(nodes: list[dict]) -> set[str]:
    """The indexes (or scans) by which a plan reads jobs."""
    return {
        n.get("Index Name", n["Node Type"])
        for n in nodes
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
    }


def _assert_linear(nodes: list[dict]) -> None:
    """No list materialised for rescans, and a nested loop's inner side is a probe by
    key: the plan's cost grows with the rows it is given, not with their square."""
    assert not [n for n in nodes if n["Node Type"] == "Materialize"]
    for loop in (n for n in nodes if n["Node Type"] == "Nested Loop"):
        inner = next(c for c in loop["Plans"] if c["Parent Relationship"] == "Inner")
        assert inner["Node Type"] in ("Index Scan", "Index Only Scan"), inner["Node Type"]


# Each finishing statement's arguments, by name, from ten leased jobs' keys and counts.
FINISHING = {
    "complete_jobs": lambda keys, counts, now: {
        "job_keys": keys,
        "activation_counts": counts,
        "variables": [None] * 10,
        "now": now,
    },
    "release_jobs": lambda keys, counts, now: {
        "job_keys": keys,
        "activation_counts": counts,
        "now": now,
    },
    "cancel_job": lambda keys, counts, now: {"job_key": keys[0], "now": now},
    "fail_job": lambda keys, counts, now: {
        "job_key": keys[0],
        "activation_count": counts[0],
        "retries": 1,
        "error_message": "x",
        "run_at": now,
        "variables": None,
        "now": now,
    },
    "throw_error": lambda keys, counts, now: {
        "job_key": keys[0],
        "activation_count": counts[0],
        "error_code": "E",
        "error_message": "x",
        "variables": None,
        "now": now,
    },
}


@pytest.mark.parametrize("name", FINISHING)
async def test_finishing_jobs_probes_them_by_key_however_many_are_leased(store, name):
    await _insert(store, 0, 2_000)
    await store.execute("ANALYZE jobs")  # statistics that saw no lease at all
    now = utcnow()
    leased = await store.fetch(*_claim(["t"], [1_500], now))
    keys = [r["job_key"] for r in leased[:10]]
    counts = [r["activation_count"] for r in leased[:10]]
    nodes = await _plan(store, *finishing.SQL[name].bind(**FINISHING[name](keys, counts, now)))
    assert _jobs_scans(nodes) == {"jobs_pkey"}
    _assert_linear(nodes)


async def test_a_claim_shared_among_requests_still_takes_its_jobs_by_key(store):
    """The jobs a claim shares out are joined to their shares; the update must still
    probe them by key, not scan jobs (the generic plan, as the pool runs it)."""
    await _insert(store, 0, 2_000)
    await store.execute("ANALYZE jobs")
    now = utcnow()
    shares = {"workers": ["a", "b"], "deadlines": [now, now], "starts": [1, 6]}
    nodes = await _plan(store, *_claim(["t"], [10], now, **shares))
    assert _jobs_scans(nodes) == {"jobs_ready_idx", "jobs_pkey"}
    activated = next(n for n in nodes if n["Node Type"] == "ModifyTable")
    _assert_linear(_nodes(activated))


async def test_charging_many_lanes_costs_linear_time(store):
    """The charge's generic plan is linear in the lanes charged.  The plan it replaced
    matched each lane against a materialised list of all the others: 21 ms for 400
    lanes of 10,000, against 15 ms."""
    tenants = [f"t{i:05}" for i in range(10_000)]
    await store.execute(
        "INSERT INTO lanes (job_type, tenant_id, shard)"
        " SELECT 'claim', t, jobfair_shard(t) FROM unnest($1::text[]) t",
        tenants,
    )
    await store.execute(
        "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard)"
        " SELECT 'claim', t, '', jobfair_shard(t) FROM unnest($1::text[]) t",
        tenants,
    )
    await store.execute("ANALYZE lanes; ANALYZE lane_keys")
    charged = "'{" + ",".join(tenants[::25]) + "}'"
    ones, floats = "array_fill(1, ARRAY[400])", "array_fill(1.0::float8, ARRAY[400])"
    nodes = await _generic_plan(
        store,
        LANES["charge_lanes"],
        job_type="'claim'",
        tenants=charged,
        counts=ones,
        strides=floats,
        served=floats,
        key_tenants=charged,
        keys="array_fill(''::text, ARRAY[400])",
        key_counts=ones,
        key_strides=floats,
        key_served=floats,
    )
    _assert_linear(nodes)


async def _generic_plan(store, statement, **values: str) -> list[dict]:
    """Every node of ``statement``'s generic plan (as the pool's prepared statement runs
    it), executed with ``values`` (SQL literals by parameter name; '{}' where none is
    given)."""
    query = statement.text
    args = ", ".join(values.get(p, "'{}'") for p in statement.params)
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE q AS {query}")
            [[plan]] = await conn.fetch(f"EXPLAIN (FORMAT JSON) EXECUTE q({args})")
        finally:
            await tx.rollback()
            await conn.execute("DEALLOCATE ALL")
    return _nodes(orjson.loads(plan)[0]["Plan"])


@pytest.mark.parametrize("lanes", [300, 2_000, 20_000])
async def test_a_lane_read_walks_the_lanes_in_order_and_sorts_none(store, lanes):
    """read_lanes stops at the lane after the last one it needs: that holds only while
    it reads lanes_type_vtime_idx in order.  A type with fewer lanes than the read's
    1,024-lane limit made the generic plan join every lane to its tenant and sort them
    all (2.6 ms a read at 2,000 lanes, against 0.5 ms in order)."""
    tenants = [f"t{i:05}" for i in range(lanes)]
    await store.execute(
        "INSERT INTO tenants (tenant_id) SELECT unnest($1::text[])", tenants[: lanes // 2]
    )
    await store.execute(
        "INSERT INTO lanes (job_type, tenant_id, shard, vtime)"
        " SELECT 'claim', t, jobfair_shard(t), n"
        " FROM unnest($1::text[]) WITH ORDINALITY AS u(t, n)",
        tenants,
    )
    await store.execute("ANALYZE lanes; ANALYZE tenants")
    nodes = await _generic_plan(store, LANES["read_lanes"], job_type="'claim'", limit="32")
    sorts = [n["Sort Key"] for n in nodes if n["Node Type"] == "Sort"]
    assert not [key for key in sorts if any("vtime" in k for k in key)], sorts
    scans = {n.get("Index Name") for n in nodes if n.get("Relation Name") == "lanes"}
    assert "lanes_type_vtime_idx" in scans
    # Restricted to a few tenants, the read finds their lanes by key instead (of 300
    # lanes, the planner may rightly read them all).
    nodes = await _generic_plan(
        store,
        LANES["read_lanes_of_tenants"],
        job_type="'claim'",
        limit="32",
        tenant_ids="'{t00001,t00002}'",
    )
    scans = {
        n.get("Index Name", n["Node Type"])
        for n in nodes
        if n.get("Relation Name") == "lanes" and "Scan" in n["Node Type"]
    }
    assert scans == {"lanes_pkey"} or lanes < 1_000, scans
