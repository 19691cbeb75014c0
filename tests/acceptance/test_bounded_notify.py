"""Issue 20 §1: ending many stream jobs in one statement must not overflow a NOTIFY.

A credit notification (``jobfair_done``) names the stream jobs that ended; PostgreSQL
refuses a payload of 8,000 bytes or more, and 600 job keys are ~10,000.  Each test ends
more stream jobs in one statement than one payload could name, and checks that the
statement commits and that every stream gets every credit back from the notifications
alone (the streams' own backup checks are not running: their generators are paused).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import orjson

from app.activation import ActivateRequest
from app.activation.streaming import Stream
from app.db import finishing
from app.domain import utcnow
from tests.helpers import enqueue

PER_STREAM = 1000  # the most maxJobs allows


class Held:
    """A stream that has written ``n`` jobs and is paused at its next event."""

    def __init__(self, stream: Stream, events: AsyncIterator[list[dict[str, Any]]]) -> None:
        self.stream = stream
        self.events = events
        self.jobs: list[dict[str, Any]] = []


async def _hold(live: Any, job_type: str, n: int) -> Held:
    s = live.services
    stream = s.activation.open_stream(ActivateRequest(job_type, n, 60_000), check_ms=3_600_000)
    held = Held(stream, stream.events())
    while len(held.jobs) < n:
        written = await held.events.__anext__()
        held.jobs += [orjson.loads(event["data"]) for event in written]
    return held


async def _all_credits_back(streams: list[Held]) -> None:
    """Returns once no stream holds an outstanding job (each returned credit sets the
    stream's event; nothing else clears it while its generator is paused)."""
    async with asyncio.timeout(10):
        for held in streams:
            while held.stream.outstanding:
                await held.stream.credit_back.wait()
                held.stream.credit_back.clear()


async def _close(streams: list[Held]) -> None:
    for held in streams:
        await held.events.aclose()  # type: ignore[attr-defined]


async def _states(live: Any, job_type: str) -> dict[str, int]:
    rows = await live.services.db.fetch(
        "SELECT state, count(*) FROM jobs WHERE job_type = $1 GROUP BY state", job_type
    )
    return {r[0]: r[1] for r in rows}


async def test_an_expiry_storm_of_5000_stream_jobs_is_swept_and_returns_every_credit(live):
    await enqueue(live.client, "storm", "acme", 5 * PER_STREAM)
    streams = [await _hold(live, "storm", PER_STREAM) for _ in range(5)]
    try:
        later = utcnow() + timedelta(minutes=2)
        assert await live.services.background.lease.run_once(later) == 5 * PER_STREAM
        assert await _states(live, "storm") == {"CREATED": 5 * PER_STREAM}
        await _all_credits_back(streams)
    finally:
        await _close(streams)


async def test_a_batch_complete_of_1000_stream_jobs_succeeds_and_returns_every_credit(live):
    await enqueue(live.client, "batch", "acme", PER_STREAM)
    held = await _hold(live, "batch", PER_STREAM)
    try:
        items = [
            {"jobKey": j["jobKey"], "activationCount": j["activationCount"]} for j in held.jobs
        ]
        r = await live.client.post("/v2/jobs/complete", json={"jobs": items})
        assert r.status_code == 200, r.text
        assert {x["status"] for x in r.json()["results"]} == {204}
        await _all_credits_back([held])
    finally:
        await _close([held])
    assert await _states(live, "batch") == {"COMPLETED": PER_STREAM}


async def test_a_group_commit_of_1000_single_completions_of_stream_jobs_succeeds(live, monkeypatch):
    services = live.services
    await enqueue(live.client, "group", "acme", PER_STREAM)
    held = await _hold(live, "group", PER_STREAM)
    statements: list[int] = []
    complete = finishing.complete  # what the group commit writes with

    async def counted(db: Any, items: Any, now: Any) -> Any:
        statements.append(len(items))
        return await complete(db, items, now)

    monkeypatch.setattr(finishing, "complete", counted)
    try:
        await asyncio.gather(
            *(
                services.jobs.complete(int(j["jobKey"]), j["activationCount"], None)
                for j in held.jobs
            )
        )
        await _all_credits_back([held])
    finally:
        await _close([held])
    # The calls went into one statement (after the first, which ran alone), far more
    # than one payload could name, and it committed: a statement refused on its NOTIFY
    # would have been split in halves (Coalescer's split) and its jobs written again.
    assert max(statements) >= PER_STREAM - 1
    assert sum(statements) == PER_STREAM, statements
    assert await _states(live, "group") == {"COMPLETED": PER_STREAM}
