"""The store side of the job browser: a job's history is bounded and pruned with the
job, can be turned off, and the bulk operations commit in bounded batches."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app import browser
from app.browser import BrowserService
from app.db import Database, claims, finishing, history, job_rows, maintenance, parking
from app.db.claims import Share
from app.domain import FailedFilter, utcnow
from app.scheduler import Aging


async def _insert(store, n: int, job_type: str = "h", tenant: str = "t") -> list[int]:
    jobs = [{"type": job_type, "tenantId": tenant} for _ in range(n)]
    return [i.job_key for i in await job_rows.insert(store, jobs, utcnow())]


async def _claim(store, job_type: str = "h", tenant: str = "t", n: int = 1, worker: str = "w"):
    now = utcnow()
    got = await claims.claim(
        store,
        job_type,
        {(tenant, ""): n},
        now=now,
        shares=[Share(worker, 60_000, n)],
        via_stream=False,
        aging_step=10,
        aging_interval_ms=60_000,
    )
    return [c.job for c in got]


async def test_a_job_keeps_its_first_and_latest_activations_and_says_it_was_cut(store):
    [key] = await _insert(store, 1)
    rounds = history.FIRST_ACTIVATIONS + history.LAST_ACTIVATIONS + 15
    for i in range(rounds):
        [job] = await _claim(store, worker=f"w{i + 1}")
        assert [(e.job_type, e.tenant_id) for e in await finishing.release(store, [job])] == [
            ("h", "t")
        ]
    rows = await store.fetchval("SELECT count(*) FROM job_events WHERE job_key = $1", key)
    assert rows == history.FIRST_ACTIVATIONS + history.LAST_ACTIVATIONS
    h = await history.read(store, key)
    assert h is not None and h.truncated
    assert len(h.entries) <= history.MAX_ENTRIES
    kept = sorted({e.activation_count for e in h.entries if e.event == "released"})
    first = list(range(1, history.FIRST_ACTIVATIONS + 1))
    latest = list(range(rounds - history.LAST_ACTIVATIONS + 1, rounds + 1))
    assert kept == first + latest
    # Each kept activation reads as its start and its end, in order, with its worker.
    for n in (1, rounds):
        start, end = [e for e in h.entries if e.activation_count == n]
        assert (start.event, end.event) == ("activated", "released")
        assert start.worker == end.worker == f"w{n}" and start.at <= end.at
    # A job below both windows is not cut.
    [other] = await _insert(store, 1, tenant="u")
    [job] = await _claim(store, tenant="u")
    assert job.job_key == other
    h = await history.read(store, other)
    assert h is not None and not h.truncated
    assert [e.event for e in h.entries] == ["created", "activated"]


async def test_retention_deletes_a_jobs_history_with_it(store):
    keys = await _insert(store, 3)
    jobs = await _claim(store, n=3)
    assert await finishing.complete(
        store, [(j.job_key, j.activation_count, None) for j in jobs], utcnow()
    )
    assert await store.fetchval("SELECT count(*) FROM job_events") == 3
    later = utcnow() + timedelta(days=1)
    assert await maintenance.prune_terminal(store, later, 2) == 2
    left = await store.fetch("SELECT job_key FROM job_events")
    assert len(left) == 1 and left[0]["job_key"] in keys
    assert await maintenance.prune_terminal(store, later, 2) == 1
    assert await store.fetchval("SELECT count(*) FROM job_events") == 0


async def test_with_history_off_the_transitions_write_nothing(db_url):
    db = await Database.connect(db_url, size=2, min_size=1, history=False)
    try:
        [key] = await _insert(db, 1)
        [job] = await _claim(db)
        assert [(e.job_type, e.tenant_id) for e in await finishing.release(db, [job])] == [
            ("h", "t")
        ]
        [job] = await _claim(db)
        assert await finishing.complete(db, [(key, job.activation_count, None)], utcnow())
        assert await db.fetchval("SELECT count(*) FROM job_events") == 0
        h = await history.read(db, key)
        assert h is not None and [e.event for e in h.entries] == ["created"]
    finally:
        await db.close()


def _service(store) -> BrowserService:
    return BrowserService(store, lambda interval, step: Aging(60_000, 10))


async def _batches(store, state: str) -> int:
    """How many transactions wrote the jobs now in ``state``: the distinct xmin."""
    n: int = await store.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM jobs WHERE state = $1", state
    )
    return n


async def test_bulk_operations_commit_a_bounded_batch_per_transaction(store, monkeypatch):
    monkeypatch.setattr(browser, "BULK_BATCH", 7)
    service = _service(store)
    await _insert(store, 30, tenant="a")
    await _insert(store, 5, tenant="b")
    await job_rows.insert(
        store, [{"type": "h", "tenantId": "a", "delay": 3_600_000} for _ in range(9)], utcnow()
    )
    assert await service.cancel_created("a", None, 25) == (25, True)
    assert await _batches(store, "CANCELED") == 4  # 7 + 7 + 7 + 4
    assert await service.cancel_created("a", "h", 100) == (14, False)  # 5 ready, 9 delayed
    assert await _batches(store, "CANCELED") == 4 + 1 + 2
    # Revives, the same way: 5 of b failed (no retries left), then revived in batches.
    jobs = await _claim(store, tenant="b", n=5)
    for j in jobs:
        ended = await finishing.fail(
            store,
            j.job_key,
            j.activation_count,
            retries=0,
            error_message="x",
            run_at=utcnow(),
            variables=None,
            now=utcnow(),
        )
        assert ended is not None
    assert await parking.park(store, "h", ["b"]) == ["b"]  # drained: parked
    monkeypatch.setattr(browser, "BULK_BATCH", 2)
    everything = FailedFilter(None, None, None, None)
    assert await service.retry_failed(everything, 3, 4) == (4, True)
    assert await service.retry_failed(everything, 3, 4) == (1, False)
    assert await _batches(store, "CREATED") == 3  # 2 + 2 + 1
    revived = await store.fetch("SELECT retries FROM jobs WHERE tenant_id = 'b'")
    assert [r["retries"] for r in revived] == [3] * 5
    # Revived jobs are ready: their lane was woken.
    assert await store.fetchval("SELECT active FROM lanes WHERE tenant_id = 'b'") is True
    assert len(await _claim(store, tenant="b", n=5)) == 5


async def test_a_bulk_retry_takes_each_failed_job_once_even_if_it_fails_again(store, monkeypatch):
    """A batch continues after the last key of the one before: a job revived, activated
    and failed again meanwhile is not revived twice by the same call."""
    monkeypatch.setattr(browser, "BULK_BATCH", 1)
    await _insert(store, 3)
    for j in await _claim(store, n=3):
        await finishing.fail(
            store, j.job_key, j.activation_count, retries=0, error_message="x",
            run_at=utcnow(), variables=None, now=utcnow(),
        )  # fmt: skip
    service = _service(store)
    revive = browser.bulk.revive
    calls = 0

    async def revive_and_fail_again(db, jobs, retries, now):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        n = await revive(db, jobs, retries, now)
        [j] = await _claim(store)
        await finishing.fail(
            store, j.job_key, j.activation_count, retries=0, error_message="again",
            run_at=utcnow(), variables=None, now=utcnow(),
        )  # fmt: skip
        return n

    monkeypatch.setattr(browser.bulk, "revive", revive_and_fail_again)
    assert await service.retry_failed(FailedFilter(None, None, None, None), 1, 100) == (3, False)
    assert calls == 3


@pytest.mark.parametrize("job_type", [None, "h"])
async def test_bulk_cancel_passes_jobs_an_activator_holds(store, job_type):
    await _insert(store, 4)
    async with store.connection() as other:
        tx = other.transaction()
        await tx.start()
        held = await other.fetch(
            # The tenant's shard named: Citus locks rows of one shard only (make citus).
            "SELECT job_key FROM jobs WHERE state = 'CREATED' AND shard = jobfair_shard('t')"
            " ORDER BY job_key LIMIT 2 FOR UPDATE"
        )
        assert await _service(store).cancel_created("t", job_type, 100) == (2, False)
        await tx.rollback()
    left = await store.fetch("SELECT job_key FROM jobs WHERE state = 'CREATED' ORDER BY job_key")
    assert [r["job_key"] for r in left] == [r["job_key"] for r in held]
