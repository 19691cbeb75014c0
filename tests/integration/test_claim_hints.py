"""Claims past the dead entries a held xmin horizon leaves in the ready index
(ClaimHints, ADR 036), on real PostgreSQL with a transaction holding the horizon."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from types import SimpleNamespace

from app.db import claims, finishing, job_rows, maintenance
from app.db.claims import SQL as CLAIMS
from app.db.claims import ClaimHints, Share
from app.db.rows import JOB_COLUMNS, Claimed, JobRow, job_row
from app.domain import DEFAULT_PRIORITY, utcnow
from app.sweepers import DeadRowsWatch, LeaseSweeper

TYPE = "hints"
KEY = ("t", "")
# The entries of jobs_ready_idx read so far, dead or alive (the session's, unflushed).
READ = "SELECT pg_stat_get_xact_tuples_returned('jobs_ready_idx'::regclass)"


async def _insert(store, n: int) -> list[int]:
    """``n`` ready jobs of tenant t, queued a second apart an hour ago, oldest first."""
    jobs = [{"type": TYPE, "tenantId": "t"} for _ in range(n)]
    keys = [i.job_key for i in await job_rows.insert(store, jobs, utcnow())]
    await store.execute(
        "UPDATE jobs SET queued_at = now() - interval '1 hour' + o * interval '1 second'"
        " FROM unnest($1::bigint[]) WITH ORDINALITY AS u(k, o) WHERE job_key = u.k",
        keys,
    )
    return keys


async def _row(store, job_key: int) -> JobRow:
    return job_row(
        await store.fetchrow(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_key = $1", job_key)
    )


@asynccontextmanager
async def _horizon_held(store) -> AsyncIterator[None]:
    """A transaction with an XID, idle until the block ends: no dead row version made
    meanwhile can be removed, by vacuum or by an index scan's kill bits."""
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        await conn.fetchval("SELECT txid_current()")
        try:
            yield
        finally:
            await tx.rollback()


async def _claim(store, n: int) -> list[int]:
    now = utcnow()
    got = await claims.claim(
        store,
        TYPE,
        {KEY: n},
        now=now,
        shares=[Share("w", 60_000, n)],
        via_stream=False,
        aging_step=0,
        aging_interval_ms=60_000,
    )
    return [c.job.job_key for c in got]


def _degraded(store) -> ClaimHints:
    hints: ClaimHints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    clock = [0.0]
    hints.clock = lambda: clock[0]
    return hints


async def _entries_read(store, since) -> tuple[int, int]:
    """The jobs_ready_idx entries the claim of one job reads, hinted at ``since`` (None:
    from the key's first entry), and the job it takes (rolled back)."""
    now = utcnow()
    bound = CLAIMS["claim"].bind(
        job_type=TYPE, tenants=["t"], keys=[""], counts=[1], now=now, workers=["w"],
        deadlines=[now + timedelta(minutes=1)], aging_step=0, aging_interval_ms=60_000,
        via_stream=False, starts=[1], hint_priorities=[None if since is None else DEFAULT_PRIORITY],
        since=[since],
    )  # fmt: skip
    async with store.connection() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            before = await conn.fetchval(READ)
            [row] = await conn.fetch(*bound)
            read = await conn.fetchval(READ) - before
        finally:
            await tx.rollback()
    return read, row["job_key"]


async def test_a_hinted_claim_descends_past_the_jobs_claimed_under_a_held_horizon(store):
    """2,000 jobs claimed from one key under a held horizon leave 2,000 dead entries at the
    front of it.  The claim from the first entry visits each; the hinted one starts past
    them.  Both take the same job."""
    keys = await _insert(store, 2_100)
    async with _horizon_held(store):
        for _ in range(40):
            await _claim(store, 50)
        last = (await store.fetchrow("SELECT queued_at FROM jobs WHERE job_key = $1", keys[1_999]))[
            0
        ]
        full, full_key = await _entries_read(store, None)
        hinted, hinted_key = await _entries_read(store, last - timedelta(seconds=1))
    assert full_key == hinted_key == keys[2_000]
    assert hinted * 10 < full, (hinted, full)


async def test_a_job_back_behind_the_hint_waits_for_the_next_claim_from_the_first_entry(store):
    """Degraded, a released job (it keeps its place) is behind the key's hint: hinted
    claims pass it; the claim from the first entry that follows within FULL_EVERY_S
    takes it first, as it would have been taken had the table not been degraded."""
    keys = await _insert(store, 20)
    hints = _degraded(store)
    assert await _claim(store, 5) == keys[:5]  # from the first entry: the hint is set
    assert len(await finishing.release(store, [await _row(store, keys[0])])) == 1
    assert await _claim(store, 2) == keys[5:7]  # hinted: the released job is behind
    hints.clock = lambda: hints.FULL_EVERY_S  # a second on: from the first entry again
    assert await _claim(store, 2) == [keys[0], keys[7]]


async def test_a_hinted_claim_that_comes_up_short_has_the_next_one_start_from_the_first(store):
    """A hinted claim that finds fewer jobs than it was given (only jobs behind its hint
    are left) makes the next claim of the key one from its first entry."""
    keys = await _insert(store, 6)
    _degraded(store)
    assert await _claim(store, 6) == keys
    assert len(await finishing.release(store, [await _row(store, keys[2])])) == 1
    assert await _claim(store, 1) == []  # hinted, short
    assert await _claim(store, 1) == [keys[2]]


async def test_not_degraded_every_claim_starts_from_the_first_entry(store):
    keys = await _insert(store, 6)
    hints: ClaimHints = store.claim_hints
    assert not hints.degraded
    assert await _claim(store, 4) == keys[:4]
    assert len(await finishing.release(store, [await _row(store, keys[1])])) == 1
    assert await _claim(store, 2) == [keys[1], keys[4]]


async def test_the_watch_counts_what_a_vacuum_leaves_into_the_hints_and_out_again(store):
    """DeadRowsWatch: dead versions piling up between two vacuums degrade nothing; a vacuum
    that could not remove more than DEGRADED_AT of them (the horizon held) degrades the
    pool's hints; one that leaves fewer than RECOVERED_AT drops them."""
    hints: ClaimHints = store.claim_hints
    hints.DEGRADED_AT, hints.RECOVERED_AT = 300, 100
    watch = DeadRowsWatch(store)
    # No autovacuum in the middle: the test's own VACUUMs are the ones counted.
    await store.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
    await _insert(store, 200)
    await watch.run_once(utcnow())  # the vacuum count as it is

    async def dead_versions() -> None:
        async with store.connection() as conn:
            for _ in range(2):
                await conn.execute(
                    "UPDATE jobs SET retries = retries + 1 WHERE job_type = $1", TYPE
                )
            await conn.execute("SELECT pg_stat_force_next_flush()")

    await dead_versions()
    assert await watch.run_once(utcnow()) >= 300
    assert not hints.degraded  # no vacuum has run: vacuum may just be late
    async with _horizon_held(store):
        await dead_versions()
        await store.execute("VACUUM jobs")
        assert await watch.run_once(utcnow()) >= 300
        assert hints.degraded  # a vacuum could not remove them
    await store.execute("VACUUM jobs")
    assert await watch.run_once(utcnow()) < 100
    assert not hints.degraded


async def test_the_watch_says_once_when_autovacuum_looks_too_seldom(store, monkeypatch, caplog):
    """The test server looks every 5 s (app.embedded): nothing said.  A minute, as
    PostgreSQL's default: a warning, at the watch's first run only."""
    assert await maintenance.vacuum_settings(store) == (5.0, True)
    watch = DeadRowsWatch(store)
    with caplog.at_level(logging.WARNING, logger="app.sweepers"):
        await watch.run_once(utcnow())
    assert not [r for r in caplog.records if "autovacuum" in r.getMessage()]

    async def a_minute(db):
        return 60.0, True

    monkeypatch.setattr(maintenance, "vacuum_settings", a_minute)
    watch = DeadRowsWatch(store)
    with caplog.at_level(logging.WARNING, logger="app.sweepers"):
        await watch.run_once(utcnow())
        await watch.run_once(utcnow())
    said = [r.getMessage() for r in caplog.records if "autovacuum_naptime" in r.getMessage()]
    assert len(said) == 1 and "60 s" in said[0]


async def _leased_long_ago(store, n: int) -> list[int]:
    """``n`` ACTIVATED jobs whose leases ended an hour ago (as if their claim had
    committed long after their deadline)."""
    await _insert(store, n)
    keys = await _claim(store, n)
    assert len(keys) == n
    await store.execute(
        "UPDATE jobs SET deadline = now() - interval '1 hour' WHERE job_key = ANY($1)", keys
    )
    return keys


async def test_degraded_the_lease_sweep_starts_past_what_it_swept_and_sweeps_all_every_30_s(
    store,
):
    """Degraded, a sweep starts 5 s before the last whole sweep's instant: a lease that
    ended an hour ago and showed up after that sweep waits for the sweep from the first
    lease, at most FULL_EVERY_S later.  Not degraded, every sweep is from the first."""
    hints: ClaimHints = store.claim_hints
    hints.observe(hints.DEGRADED_AT)
    sweeper = LeaseSweeper(store, 1000)
    clock = [0.0]
    sweeper.clock = lambda: clock[0]
    assert await sweeper.run_once(utcnow()) == 0  # the first sweep: from the first lease
    late = await _leased_long_ago(store, 2)
    clock[0] = 1.0
    assert await sweeper.run_once(utcnow()) == 0  # from 5 s before the last sweep
    clock[0] = sweeper.FULL_EVERY_S
    assert await sweeper.run_once(utcnow()) == 2  # from the first lease
    states = await store.fetch("SELECT state FROM jobs WHERE job_key = ANY($1)", late)
    assert {r["state"] for r in states} == {"CREATED"}
    hints.observe(0)
    more = await _leased_long_ago(store, 1)
    clock[0] += 1.0
    assert await sweeper.run_once(utcnow()) == 1 and more


def test_the_longer_degraded_the_less_often_a_key_is_claimed_from_its_first_entry():
    """A claim from the first entry crosses every dead entry of its key, as many as the
    key's claims since the horizon was held: it comes every second, or every tenth of
    the time degraded if that is longer, so its cost a second stays bounded."""
    hints = ClaimHints()
    clock = [0.0]
    hints.clock = lambda: clock[0]
    hints.observe(hints.DEGRADED_AT)
    now = utcnow()
    taken = SimpleNamespace(tenant_id="t", fairness_key="", priority=50, queued_at=now)
    hints.took(TYPE, {KEY: 1}, [None], [Claimed(1, taken)], 100.0)  # from the first entry
    assert hints.starts(TYPE, [KEY], 105.0) == ([50], [now - timedelta(seconds=1)])
    assert hints.starts(TYPE, [KEY], 111.0)[0] == [50]  # 11 s < 111 / 10
    assert hints.starts(TYPE, [KEY], 112.0) == ([None], [None])  # 12 s >= 11.2
    early = ClaimHints()
    early.clock = lambda: 0.0
    early.observe(early.DEGRADED_AT)
    early.took(TYPE, {KEY: 1}, [None], [Claimed(1, taken)], 5.0)
    assert early.starts(TYPE, [KEY], 6.0) == ([None], [None])  # a second, early on
