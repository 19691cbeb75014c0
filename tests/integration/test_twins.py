"""The rules that exist twice, once in Python (app.scheduler) and once in SQL (app.db),
agree on a real database, for generated cases:

* the effective priority (scheduler.effective_priority / claims.sql's fragment
  effective_priority, which the claim ranks heads by and explain's jobs_ahead counts by);
* the re-entry virtual time of a lane woken by a new job (scheduler.reentry_vtime /
  lanes.sql's fragment wake, through the real insert), and of a key among its lane's
  keys (the same rule, the same fragment);
* the first pick (scheduler.allocate's / CLAIM_LEAD's lead lane, through the real
  claim), and its key (scheduler.allocate_keys' / CLAIM_LEAD's lead key);
* a worker-time settlement (scheduler.settlement and mixed_estimate / settling's
  settle_lanes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.db import Database, claims, job_rows, settling
from app.db.claims import LeadAsk, Share
from app.domain import utcnow
from app.scheduler import (
    Aging,
    FairnessBy,
    Key,
    Lane,
    Settled,
    allocate,
    allocate_keys,
    effective_priority,
    mixed_estimate,
    reentry_vtime,
    settlement,
)

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture
def run(db_url: str):
    """Runs coroutines on one loop with one Database, for hypothesis's sync tests."""
    loop = asyncio.new_event_loop()
    db = loop.run_until_complete(Database.connect(db_url, size=2, min_size=1))

    def go(make: Callable[[Database], Coroutine[Any, Any, Any]]) -> Any:
        return loop.run_until_complete(make(db))

    yield go
    loop.run_until_complete(db.close())
    loop.close()


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
# The claim's own fragment (claims.sql's effective_priority), in a statement of its own.
EFFECTIVE_SQL = claims.SQL["effective_priority_of"]


@st.composite
def waits(draw: st.DrawFn) -> tuple[int, timedelta, Aging]:
    interval_ms = draw(st.integers(1, 10_000_000))
    aging = Aging(interval_ms=interval_ms, step=draw(st.integers(0, 100)))
    # Waits on and around whole intervals (where rounding would show), and anywhere.
    k = draw(st.integers(0, 1_000))
    near = timedelta(milliseconds=k * interval_ms) + timedelta(
        microseconds=draw(st.integers(-2, 2))
    )
    anywhere = timedelta(microseconds=draw(st.integers(-(10**9), 10**13)))
    return draw(st.integers(0, 100)), draw(st.sampled_from([near, anywhere])), aging


@EXAMPLES
@given(case=waits())
def test_effective_priority_in_sql_is_its_python_twin(run, case) -> None:
    priority, wait, aging = case
    queued_at = NOW - wait
    in_sql = run(
        lambda db: db.fetchval(
            *EFFECTIVE_SQL.bind(
                priority=priority,
                queued_at=queued_at,
                now=NOW,
                step=aging.step,
                interval_ms=aging.interval_ms,
            )
        )
    )
    assert int(in_sql) == effective_priority(priority, queued_at, NOW, aging)


@st.composite
def lane_sets(draw: st.DrawFn) -> list[tuple[str, float, bool, bool]]:
    """Other lanes of the type: (tenant, vtime, active, held); vtimes on a coarse grid
    so that ties (and equal minima) come up."""
    n = draw(st.integers(0, 6))
    return [
        (f"o{i}", draw(st.integers(0, 20)) / 4, draw(st.booleans()), draw(st.booleans()))
        for i in range(n)
    ]


@EXAMPLES
@given(others=lane_sets(), own=st.integers(0, 20))
def test_a_woken_lane_reenters_where_the_python_twin_says(run, others, own) -> None:
    job_type = "twin-reentry"
    own_vtime = own / 4

    async def woken_vtime(db: Database) -> float:
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM lanes WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM jobs WHERE job_type = $1", job_type)
            await tx.executemany(
                "INSERT INTO lanes (job_type, tenant_id, shard, vtime, active, held)"
                " VALUES ($1, $2, jobfair_shard($2), $3, $4, $5)",
                [(job_type, t, v, a, h) for t, v, a, h in others]
                + [(job_type, "own", own_vtime, False, False)],  # parked
            )
        await job_rows.insert(db, [{"type": job_type, "tenantId": "own"}], utcnow())
        vtime: float = await db.fetchval(
            "SELECT vtime FROM lanes WHERE job_type = $1 AND tenant_id = 'own'", job_type
        )
        return vtime

    backlogged = [v for _, v, active, held in others if active and not held]
    expected = reentry_vtime(
        own_vtime,
        min(backlogged) if backlogged else None,
        max([own_vtime, *(v for _, v, _, _ in others)]),
    )
    assert run(woken_vtime) == expected


@st.composite
def ready_lanes(draw: st.DrawFn) -> list[tuple[str, float, int]]:
    """Up to 16 backlogged lanes (all probed by the lead claim): (tenant, vtime, weight)."""
    n = draw(st.integers(1, 16))
    return [(f"t{i:02}", draw(st.integers(0, 12)) / 4, draw(st.integers(1, 5))) for i in range(n)]


@EXAMPLES
@given(lanes=ready_lanes())
def test_the_lead_claim_takes_the_python_twins_first_pick(run, lanes) -> None:
    job_type = "twin-lead"

    async def lead_tenant(db: Database) -> str | None:
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM jobs WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM lanes WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM tenants")
            await tx.executemany(
                "INSERT INTO tenants (tenant_id, weight) VALUES ($1, $2)",
                [(t, w) for t, _, w in lanes],
            )
        await job_rows.insert(
            db, [{"type": job_type, "tenantId": t} for t, _, _ in lanes], utcnow()
        )
        async with db.transaction() as tx:
            await tx.executemany(
                "UPDATE lanes SET vtime = $3 WHERE job_type = $1 AND tenant_id = $2",
                [(job_type, t, v) for t, v, _ in lanes],
            )
        ask = LeadAsk(None, Share("w", 60_000, 1), False, 10, 60_000)
        got = await claims.claim_lead(db, job_type, ask, utcnow())
        return None if got.job is None else got.job.tenant_id

    [first] = allocate([Lane(t, v, w) for t, v, w in lanes], 1).picks
    assert run(lead_tenant) == first


@st.composite
def key_sets(draw: st.DrawFn) -> list[tuple[str, float, bool]]:
    """Other keys of the lane: (key, vtime, active), vtimes on a coarse grid."""
    n = draw(st.integers(0, 6))
    return [(f"o{i}", draw(st.integers(0, 20)) / 4, draw(st.booleans())) for i in range(n)]


@EXAMPLES
@given(others=key_sets(), own=st.integers(0, 20))
def test_a_woken_key_reenters_among_its_lanes_keys_where_the_python_twin_says(
    run, others, own
) -> None:
    """The second level's re-entry (lanes' _KEY_REENTRY_VTIME) is the first's rule
    applied to a lane's keys (ADR 027)."""
    job_type = "twin-key-reentry"
    own_vtime = own / 4

    async def woken_vtime(db: Database) -> float:
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM lane_keys WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM jobs WHERE job_type = $1", job_type)
            await tx.executemany(
                "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime, active)"
                " VALUES ($1, 't', $2, jobfair_shard('t'), $3, $4)",
                [(job_type, k, v, a) for k, v, a in others]
                + [(job_type, "own", own_vtime, False)],  # parked
            )
        await job_rows.insert(
            db, [{"type": job_type, "tenantId": "t", "fairnessKey": "own"}], utcnow()
        )
        vtime: float = await db.fetchval(
            "SELECT vtime FROM lane_keys WHERE job_type = $1 AND fairness_key = 'own'", job_type
        )
        return vtime

    backlogged = [v for _, v, active in others if active]
    expected = reentry_vtime(
        own_vtime,
        min(backlogged) if backlogged else None,
        max([own_vtime, *(v for _, v, _ in others)]),
    )
    assert run(woken_vtime) == expected


@st.composite
def ready_keys(draw: st.DrawFn) -> list[tuple[str, float, int]]:
    """Up to 16 backlogged keys of one lane (all probed by the lead claim): (key, vtime,
    weight)."""
    n = draw(st.integers(1, 16))
    return [(f"k{i:02}", draw(st.integers(0, 12)) / 4, draw(st.integers(1, 5))) for i in range(n)]


@EXAMPLES
@given(keys=ready_keys())
def test_the_lead_claim_takes_the_python_twins_first_key(run, keys) -> None:
    job_type = "twin-lead-key"

    async def lead_key(db: Database) -> tuple[str, int] | None:
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM jobs WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM lanes WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM lane_keys WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM key_weights")
            await tx.executemany(
                "INSERT INTO key_weights (tenant_id, fairness_key, shard, weight)"
                " VALUES ('t', $1, jobfair_shard('t'), $2)",
                [(k, w) for k, _, w in keys],
            )
        await job_rows.insert(
            db,
            [{"type": job_type, "tenantId": "t", "fairnessKey": k} for k, _, _ in keys],
            utcnow(),
        )
        async with db.transaction() as tx:
            await tx.executemany(
                "UPDATE lane_keys SET vtime = $3 WHERE job_type = $1 AND fairness_key = $2",
                [(job_type, k, v) for k, v, _ in keys],
            )
        ask = LeadAsk(None, Share("w", 60_000, 1), False, 10, 60_000)
        got = await claims.claim_lead(db, job_type, ask, utcnow())
        if got.job is None or got.key_weight is None:
            return None
        return got.job.fairness_key, got.key_weight

    [first] = allocate_keys([Key(k, v, w) for k, v, w in keys], 1)
    assert run(lead_key) == (first, dict((k, w) for k, _, w in keys)[first])


@EXAMPLES
@given(
    old=st.none() | st.floats(0.001, 100),
    held=st.lists(st.floats(0, 100), min_size=0, max_size=20),
    charged=st.floats(0.001, 100),
    weight=st.integers(1, 10),
    key_weight=st.integers(1, 10),
)
def test_a_settlement_in_sql_is_its_python_twin(
    run, old, held, charged, weight, key_weight
) -> None:
    """settle_lanes (ADR 029) moves a lane by scheduler.settlement's units per its weight
    and its estimate as scheduler.mixed_estimate; its key by the units per key weight."""
    job_type = "twin-settle"
    units = sum(settlement(FairnessBy.WORKER_TIME, charged, h) for h in held)

    async def settled(db: Database) -> tuple[float, float | None, float]:
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM lanes WHERE job_type = $1", job_type)
            await tx.execute("DELETE FROM lane_keys WHERE job_type = $1", job_type)
            await tx.execute(
                "INSERT INTO tenants (tenant_id, weight) VALUES ('s', $1)"
                " ON CONFLICT (tenant_id) DO UPDATE SET weight = $1",
                weight,
            )
            await tx.execute(
                "INSERT INTO key_weights (tenant_id, fairness_key, shard, weight)"
                " VALUES ('s', 'k', jobfair_shard('s'), $1)"
                " ON CONFLICT (tenant_id, fairness_key, shard) DO UPDATE SET weight = $1",
                key_weight,
            )
            await tx.execute(
                "INSERT INTO lanes (job_type, tenant_id, shard, vtime, unit_est)"
                " VALUES ($1, 's', jobfair_shard('s'), 500, $2)",
                job_type,
                old,
            )
            await tx.execute(
                "INSERT INTO lane_keys (job_type, tenant_id, fairness_key, shard, vtime)"
                " VALUES ($1, 's', 'k', jobfair_shard('s'), 500)",
                job_type,
            )
        settle = Settled(units, len(held), sum(held))
        await settling.settle(db, job_type, {"s": settle}, {("s", "k"): settle})
        lane = await db.fetchrow(
            "SELECT vtime, unit_est, units_total FROM lanes WHERE job_type = $1", job_type
        )
        key = await db.fetchrow(
            "SELECT vtime, units_total FROM lane_keys WHERE job_type = $1", job_type
        )
        # What each was served: the seconds its leases held (the stats' shares).
        assert lane["units_total"] == key["units_total"] == pytest.approx(sum(held))
        return lane["vtime"], lane["unit_est"], key["vtime"]

    vtime, estimate, key_vtime = run(settled)
    assert vtime == pytest.approx(500 + units / weight)
    assert key_vtime == pytest.approx(500 + units / key_weight)
    expected = mixed_estimate(old, sum(held), len(held))
    assert (estimate is None) == (expected is None)
    if expected is not None:
        assert estimate == pytest.approx(expected)
