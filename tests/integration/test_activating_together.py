"""Callers asking at once for one job type are activated together (ADR 009), on real
PostgreSQL: one claim shared out in arrival order, each caller's jobs under its own worker
name and lease, and nothing left activated for a caller that went away."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

from app.activation import ActivateRequest
from app.activation.rounds import Rounds
from app.config import Settings
from app.db import claims, job_rows, operating
from app.db.locks import TYPE_CAP_LOCK_CLASS, cap_key
from app.db.locks import int4 as _int4
from app.domain import utcnow

ACTIVATED_BY_WORKER = """
SELECT worker, count(*) AS n FROM jobs WHERE state = 'ACTIVATED' GROUP BY worker
"""


async def _backlog(store, tenants: str, per_tenant: int) -> None:
    jobs = [{"type": "together", "tenantId": t} for t in tenants for _ in range(per_tenant)]
    await job_rows.insert(store, jobs, utcnow())


def _callers(n: int) -> list[ActivateRequest]:
    """Caller i asks for i + 1 jobs, leased for i + 1 minutes, as worker "w<i>"."""
    return [ActivateRequest("together", i + 1, 60_000 * (i + 1), worker=f"w{i}") for i in range(n)]


async def test_callers_asking_at_once_share_one_claim_each_under_its_own_lease(store):
    service = Rounds(store, Settings())
    await _backlog(store, "abc", 20)
    callers = _callers(8)  # 36 jobs asked in all
    results = await asyncio.gather(*(service.activate(req) for req in callers))
    # One read and one claim served all eight (each alone would have cost one).
    assert service.counters.queries == 1
    for req, (rows, dry) in zip(callers, results, strict=True):
        assert len(rows) == req.max_jobs and not dry
        for row in rows:
            assert row.worker == req.worker
            assert row.deadline - row.activated_at == timedelta(milliseconds=req.lease_ms)
    keys = [row.job_key for rows, _ in results for row in rows]
    assert len(keys) == len(set(keys)) == 36
    # The shared claim was fair between the tenants, as one caller's would have been.
    assert Counter(r.tenant_id for rows, _ in results for r in rows) == {
        "a": 12,
        "b": 12,
        "c": 12,
    }
    in_db = {r["worker"]: r["n"] for r in await store.fetch(ACTIVATED_BY_WORKER)}
    assert in_db == {req.worker: req.max_jobs for req in callers}


async def test_callers_beyond_the_backlog_are_served_in_arrival_order(store):
    service = Rounds(store, Settings())
    await _backlog(store, "ab", 2)
    callers = _callers(3)  # 1 + 2 + 3 jobs asked, 4 there
    results = await asyncio.gather(*(service.activate(req) for req in callers))
    assert [len(rows) for rows, _ in results] == [1, 2, 1]
    results = await asyncio.gather(*(service.activate(req) for req in callers))
    # Nothing left: every caller is told so, and that the type is dry.
    assert results == [([], True)] * 3


async def test_a_caller_that_leaves_while_its_claim_runs_leaves_no_job_activated(
    store, monkeypatch
):
    """A caller cancelled while the claim it shares is in flight: its share goes back to
    CREATED at once; the callers that stayed keep theirs."""
    await operating.upsert_job_type(store, "together", 1_000, None, None)  # a cap: claims lock it
    service = Rounds(store, Settings())
    await _backlog(store, "ab", 10)
    stay, leave = _callers(2)
    claiming = asyncio.Event()
    lock_and_count = claims.lock_and_count

    async def observed_lock_and_count(*args, **kwargs):
        claiming.set()  # the capped claim's transaction has begun: it waits on the lock
        return await lock_and_count(*args, **kwargs)

    monkeypatch.setattr(claims, "lock_and_count", observed_lock_and_count)
    lock = f"pg_advisory_xact_lock({_int4(TYPE_CAP_LOCK_CLASS)}, {cap_key('together')})"
    async with store.connection() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(f"SELECT {lock}")
        staying = asyncio.create_task(service.activate(stay))
        leaving = asyncio.create_task(service.activate(leave))
        # The shared claim has begun; it cannot end before the holder lets the lock go.
        await claiming.wait()
        leaving.cancel()
        await tx.rollback()
    rows, _ = await staying
    assert len(rows) == stay.max_jobs
    await service.settle()  # the release of the leaver's share
    in_db = {r["worker"]: r["n"] for r in await store.fetch(ACTIVATED_BY_WORKER)}
    assert in_db == {stay.worker: stay.max_jobs}
    assert leaving.cancelled()


async def test_an_activation_that_fails_fails_each_caller_in_it_and_not_the_next(
    store, monkeypatch
):
    service = Rounds(store, Settings())
    await _backlog(store, "ab", 5)
    claim = claims.claim
    failures = iter([ConnectionResetError("the database went away")])

    async def failing_once(*args, **kwargs):
        for exc in failures:
            raise exc
        return await claim(*args, **kwargs)

    monkeypatch.setattr(claims, "claim", failing_once)
    first = await asyncio.gather(
        *(service.activate(req) for req in _callers(3)), return_exceptions=True
    )
    assert [type(r) for r in first] == [ConnectionResetError] * 3
    rows, _ = await service.activate(_callers(1)[0])
    assert len(rows) == 1


async def test_a_lease_runs_from_the_claim_not_from_a_wait_for_the_cap_lock_before_it(store):
    """Issue 39: a capped claim that waited for its type's cap lock (behind other claims
    of the type, on a slow database: seconds) counted its leases from before the wait,
    so they were shorter than asked by that much -- on a slow database some ended before
    their jobs reached the worker.  Here the lock is held for 1.5 s: the lease of 3 s
    must still run 3 s from the claim."""
    await operating.upsert_job_type(store, "together", 10, None, None)  # a cap: claims lock it
    service = Rounds(store, Settings())
    await _backlog(store, "a", 1)
    lock = f"pg_advisory_xact_lock({_int4(TYPE_CAP_LOCK_CLASS)}, {cap_key('together')})"
    async with store.connection() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(f"SELECT {lock}")
        claiming = asyncio.create_task(
            service.activate(ActivateRequest("together", 1, 3_000, worker="w"))
        )
        await asyncio.sleep(1.5)  # the wait being measured: the lock is held this long
        released = utcnow()
        await tx.rollback()
    [row], _ = await claiming
    assert row.deadline - released >= timedelta(milliseconds=2_900), (row.deadline, released)
    assert row.deadline - row.activated_at == timedelta(milliseconds=3_000)
