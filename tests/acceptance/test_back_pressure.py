"""Issue 3: bounded waiters; beyond the bound a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.config import Settings
from app.db import Database
from app.db import jobs as stored_jobs
from app.domain import utcnow
from tests.acceptance.test_long_polling import POLL, until_waiting
from tests.fixtures import quiet_settings
from tests.helpers import assert_problem


@pytest.fixture
def settings() -> Settings:
    return quiet_settings(max_waiters=3)


async def test_beyond_the_waiter_bound_is_503_with_retry_after(live):
    c = live.client
    polls = [
        asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 3000}))
        for _ in range(3)
    ]
    await until_waiting(c, 3)
    r = await c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 3000})
    assert_problem(r, 503, "RESOURCE_EXHAUSTED")
    assert int(r.headers["retry-after"]) >= 1
    # An immediate request does not wait, so it is not refused.
    assert (
        await c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": -1})
    ).status_code == 200
    await asyncio.gather(*polls)


class TestExhaustedPool:
    @pytest.fixture
    def settings(self) -> Settings:
        return quiet_settings(db_pool_size=2, db_acquire_timeout_ms=200)

    async def test_an_exhausted_pool_is_503_with_retry_after(self, live):
        pool = live.services.db
        async with pool.connection(), pool.connection():  # every connection busy
            r = await live.client.post("/v2/jobs", json={"type": "x"})
            assert_problem(r, 503, "RESOURCE_EXHAUSTED")
            assert int(r.headers["retry-after"]) >= 1
        assert (await live.client.post("/v2/jobs", json={"type": "x"})).status_code == 201

    async def test_a_wake_up_that_finds_the_pool_exhausted_strands_no_waiter(
        self, live, db_url, caplog
    ):
        """The job's NOTIFY wakes the dispatcher while every connection is busy: that
        round fails; the waiter stays queued and the backup poll (~1 s) serves it."""
        c = live.client
        poll = asyncio.create_task(
            c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 10_000})
        )
        await until_waiting(c, 1)
        pool = live.services.db
        other = await Database.connect(db_url, size=1)  # another process's producer
        try:
            async with pool.connection(), pool.connection():  # every connection busy
                [job] = await stored_jobs.insert(other, [{"type": "lp"}], utcnow())
                # The wake-up's round waits out the acquire timeout (0.2 s), then fails.
                deadline = time.monotonic() + 5
                while not any("waiters of 'lp' failed" in r.message for r in caplog.records):
                    assert time.monotonic() < deadline, "the wake-up round never failed"
                    await asyncio.sleep(0.01)
        finally:
            await other.close()
        r = await poll
        assert [j["jobKey"] for j in r.json()["jobs"]] == [str(job.job_key)]
