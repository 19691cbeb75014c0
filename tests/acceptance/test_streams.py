"""Issue 3: SSE streams with credit-based flow control, keep-alives, release on close."""

from __future__ import annotations

import asyncio
import json

import httpx
import orjson
import pytest

from app.activation import ActivateRequest
from tests.helpers import activate, assert_problem, complete, enqueue


class Events:
    """Reads an SSE response in a task of its own (cancelling a read mid-iteration would
    end httpx's line iterator): ``job`` events to a queue, comment lines to a list."""

    def __init__(self, response: httpx.Response) -> None:
        self.jobs: asyncio.Queue[dict] = asyncio.Queue()
        self.comments: list[str] = []
        self.reader = asyncio.create_task(self._read(response))

    async def next_job(self, wait_s: float = 5.0) -> dict:
        return await asyncio.wait_for(self.jobs.get(), wait_s)

    async def _read(self, response: httpx.Response) -> None:
        try:
            await self._lines(response)
        except (httpx.HTTPError, RuntimeError):
            pass  # the test closed the stream

    async def _lines(self, response: httpx.Response) -> None:
        event: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line.startswith(":"):
                self.comments.append(line)
            elif line == "":
                if event.get("event") == "job":
                    job = json.loads(event["data"])
                    assert event["id"] == job["jobKey"]
                    self.jobs.put_nowait(job)
                event = {}
            else:
                name, _, value = line.partition(":")
                event[name] = value.strip()


STREAM = "/v2/jobs/stream?type=s&maxJobs=2&timeout=60000&worker=w"


async def test_credit_is_respected_and_each_completion_brings_one_more(live):
    c = live.client
    await enqueue(c, "s", "acme", 5)
    async with c.stream("GET", STREAM) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = Events(r)
        first = [await events.next_job(), await events.next_job()]
        assert all(j["state"] == "ACTIVATED" and j["worker"] == "w" for j in first)
        # Credit is 2: no third job while both are unfinished.
        with pytest.raises(TimeoutError):
            await events.next_job(wait_s=1.5)
        assert (await complete(c, first[0])).status_code == 204
        third = await events.next_job()
        with pytest.raises(TimeoutError):
            await events.next_job(wait_s=1.0)
        # A failure with retries returns a credit too (and the job comes back).
        r2 = await c.post(
            f"/v2/jobs/{first[1]['jobKey']}/fail",
            json={"activationCount": first[1]["activationCount"], "retries": 0},
        )
        assert r2.status_code == 204
        fourth = await events.next_job()
        keys = {first[0]["jobKey"], first[1]["jobKey"], third["jobKey"], fourth["jobKey"]}
        assert len(keys) == 4
    active = (await c.get("/v2/stats")).json()["jobTypes"][0]["active"]
    # Disconnected: delivered jobs (third, fourth) keep their lease.
    assert active == 2


async def test_lease_expiry_returns_a_credit(live):
    c = live.client
    await enqueue(c, "s", "acme", 3)
    async with c.stream("GET", "/v2/jobs/stream?type=s&maxJobs=1&timeout=1") as r:
        events = Events(r)
        first = await events.next_job()
        from datetime import timedelta

        from app.domain import utcnow

        await live.services.background.lease.run_once(utcnow() + timedelta(seconds=1))
        second = await events.next_job()
        assert second["jobKey"] != first["jobKey"] or second["activationCount"] == 2


async def test_undelivered_activations_are_released_on_close(live):
    services = live.services
    await enqueue(live.client, "u", "acme", 1)
    stream = services.activation.open_stream(ActivateRequest("u", 3, 60_000), check_ms=1000)
    events = stream.events()
    [first] = await events.__anext__()
    await enqueue(live.client, "u", "acme", 2)
    # Asked for the next write: the first was written.  Closed at the second's yield:
    # its write was cut, both of its jobs with it.
    assert len(await events.__anext__()) == 2
    await events.aclose()
    jobs = [(await live.client.get(f"/v2/jobs/{k}")).json() for k in await _keys(live, "u")]
    states = sorted((j["jobKey"] == first["id"], j["state"]) for j in jobs)
    assert states == [(False, "CREATED"), (False, "CREATED"), (True, "ACTIVATED")]
    # Activatable again at once.
    assert len(await activate(live.client, "u", 5)) == 2


async def test_the_jobs_of_one_claim_go_out_in_one_write(live):
    """A claim's jobs are one chunk on the wire, each still an ``event: job`` of its own:
    the worker reads them at once (and finishes them together)."""
    c = live.client
    await enqueue(c, "w1", "acme", 3)
    async with c.stream("GET", "/v2/jobs/stream?type=w1&maxJobs=3&timeout=60000") as r:
        chunk = await anext(r.aiter_raw())
    events = [e for e in chunk.split(b"\r\n\r\n") if e]
    assert len(events) == 3, chunk
    assert all(e.startswith(b"id: ") and b"\r\nevent: job\r\ndata: {" in e for e in events)
    assert len({orjson.loads(e.split(b"data: ", 1)[1])["jobKey"] for e in events}) == 3


async def test_a_claim_of_large_jobs_goes_out_in_writes_of_bounded_size(live):
    """At most WRITE_BYTES of data a write, one job at least: a claim of large jobs is
    not one write (which the server's buffer would take whole, counting all of it
    delivered)."""
    from app.activation.streaming import WRITE_BYTES

    size = WRITE_BYTES // 3 - 200
    await enqueue(live.client, "big", "acme", 10, variables={"blob": "x" * size})
    stream = live.services.activation.open_stream(ActivateRequest("big", 10, 60_000))
    events = stream.events()
    try:
        writes = [await events.__anext__() for _ in range(4)]
    finally:
        await events.aclose()
    assert [len(w) for w in writes] == [2, 2, 2, 2]  # the third would pass WRITE_BYTES
    assert all(sum(len(e["data"]) for e in w) <= WRITE_BYTES for w in writes)


async def _keys(live, job_type):
    rows = await live.services.db.fetch("SELECT job_key FROM jobs WHERE job_type = $1", job_type)
    return [str(r[0]) for r in rows]


async def test_streams_and_long_polls_share_a_type(live):
    c = live.client
    async with c.stream("GET", "/v2/jobs/stream?type=mix&maxJobs=1&timeout=60000") as r:
        events = Events(r)
        await asyncio.sleep(0.1)
        poll = asyncio.create_task(
            c.post(
                "/v2/jobs/activate",
                json={"type": "mix", "maxJobs": 1, "timeout": 60000, "requestTimeout": 10_000},
            )
        )
        await enqueue(c, "mix", "acme", 2)
        streamed = await events.next_job()
        polled = (await poll).json()["jobs"]
        assert len(polled) == 1 and polled[0]["jobKey"] != streamed["jobKey"]


async def test_bad_stream_parameters_are_400(live):
    c = live.client
    for query in (
        "type=s&maxJobs=0&timeout=1000",
        "type=s&maxJobs=x&timeout=1000",
        "type=a%20b&maxJobs=1&timeout=1000",
        "maxJobs=1&timeout=1000",
        "type=s&maxJobs=1&timeout=1000&color=red",
    ):
        assert_problem(await c.get(f"/v2/jobs/stream?{query}"), 400)
