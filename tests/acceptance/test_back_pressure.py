"""Issue 3: bounded waiters; beyond the bound a 503 with Retry-After."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from app.config import Settings
from app.db import Database, job_rows
from app.domain import utcnow
from tests.acceptance.test_long_polling import POLL, until_waiting
from tests.acceptance.test_metrics import scrape, value
from tests.acceptance.test_streams import Events
from tests.fixtures import quiet_settings
from tests.helpers import assert_problem, complete, enqueue


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


STREAM = "/v2/jobs/stream?type=lp&maxJobs=1&timeout=60000"


async def test_a_stream_beyond_the_waiter_bound_is_503_before_it_opens(live, caplog):
    """Refused after its 200, a stream could only end at once with an error logged, and
    its client would reconnect straight into the same refusal."""
    c = live.client
    polls = [
        asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 3000}))
        for _ in range(3)
    ]
    await until_waiting(c, 3)
    async with c.stream("GET", STREAM) as r:
        await r.aread()
        assert_problem(r, 503, "RESOURCE_EXHAUSTED")
        assert int(r.headers["retry-after"]) >= 1
    await asyncio.gather(*polls)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_stream_that_finds_the_waiters_full_later_waits_for_a_place(live, caplog):
    """Open with its credit taken by a job; three long polls then fill every waiter
    place.  The job's completion sends the stream back to the queue, which is full: the
    stream stays open, and gets the next job once a place is free."""
    c = live.client
    await enqueue(c, "lp", "acme", 1)
    async with c.stream("GET", STREAM) as r:
        assert r.status_code == 200
        events = Events(r)
        first = await events.next_job()
        polls = [
            asyncio.create_task(c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 1500}))
            for _ in range(3)
        ]
        await until_waiting(c, 3)
        assert (await complete(c, first)).status_code == 204
        assert [len(p.json()["jobs"]) for p in await asyncio.gather(*polls)] == [0, 0, 0]
        [second] = await enqueue(c, "lp", "acme", 1)
        assert (await events.next_job())["jobKey"] == second
        assert not events.reader.done()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - a counter of the app's, no event to wait on
            await asyncio.sleep(0.01)


class TestInFlightBound:
    @pytest.fixture
    def settings(self) -> Settings:
        return quiet_settings(max_in_flight=1, db_pool_size=2, db_acquire_timeout_ms=10_000)

    async def test_past_it_new_work_is_503_and_waiters_probes_and_finishes_are_not_refused(
        self, live
    ):
        c = live.client
        admission = live.app.admission  # type: ignore[attr-defined]
        poll = asyncio.create_task(
            c.post("/v2/jobs/activate", json={**POLL, "requestTimeout": 5000})
        )
        await until_waiting(c, 1)
        assert admission.in_flight == 0  # a long poll waiting is not work in flight
        pool = live.services.db
        async with pool.connection(), pool.connection():  # every connection busy
            create = asyncio.create_task(c.post("/v2/jobs", json={"type": "lp"}))
            await _until(lambda: admission.in_flight == 1)  # it waits for a connection
            r = await c.post("/v2/jobs", json={"type": "lp"})
            body = assert_problem(r, 503, "RESOURCE_EXHAUSTED")
            assert "worked on" in body["detail"]
            assert r.headers["retry-after"] == "1"
            assert (await c.get("/healthz")).status_code == 200
            finish = asyncio.create_task(
                c.post("/v2/jobs/12345/complete", json={"activationCount": 1})
            )
            await _until(lambda: admission.in_flight == 2)  # past the bound: it ends work
        assert (await create).status_code == 201
        assert (await finish).status_code == 404
        assert len((await poll).json()["jobs"]) == 1
        assert admission.in_flight == 0
        samples = await scrape(c)
        assert value(samples, "jobfair_http_503_answers_total", reason="overloaded") == 1


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
                [job] = await job_rows.insert(other, [{"type": "lp"}], utcnow())
                # The wake-up's round waits out the acquire timeout (0.2 s), then fails.
                deadline = time.monotonic() + 5
                while not any("waiters of 'lp' failed" in r.message for r in caplog.records):
                    assert time.monotonic() < deadline, "the wake-up round never failed"
                    await asyncio.sleep(0.01)
        finally:
            await other.close()
        r = await poll
        assert [j["jobKey"] for j in r.json()["jobs"]] == [str(job.job_key)]
