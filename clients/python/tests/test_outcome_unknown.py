"""503 ``urn:jobfair:outcome-unknown`` (the server's database went away at commit) is
retried only when sending the call twice is harmless; 503 RESOURCE_EXHAUSTED always is."""

from __future__ import annotations

import json

import httpx
import pytest
from jobfair_client import AsyncJobfair, Backoff, OutcomeUnknown

JOB = {
    "jobKey": "1",
    "type": "t",
    "tenantId": "<default>",
    "state": "CREATED",
    "priority": 50,
    "effectivePriority": 50,
    "retries": 3,
    "activationCount": 0,
}


def server(first: dict[str, object], headers: dict[str, str]) -> tuple[httpx.MockTransport, list]:
    """Answers the first request with a 503 ``first``, every later one with success."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(
                503,
                json={"status": 503, "detail": "d", "instance": request.url.path, **first},
                headers={"content-type": "application/problem+json", **headers},
            )
        if request.url.path.endswith("/complete"):
            return httpx.Response(204)
        if request.url.path.endswith("/batch"):
            return httpx.Response(201, json={"jobKeys": ["1", "2"]})
        return httpx.Response(201, json=JOB)

    return httpx.MockTransport(handle), seen


UNKNOWN = {"type": "urn:jobfair:outcome-unknown", "title": "OUTCOME_UNKNOWN"}
EXHAUSTED = {"type": "urn:jobfair:resource-exhausted", "title": "RESOURCE_EXHAUSTED"}


def client(transport: httpx.MockTransport, **options: bool) -> AsyncJobfair:
    http = httpx.AsyncClient(base_url="http://jobfair", transport=transport)
    return AsyncJobfair(
        "http://jobfair", http=http, backoff=Backoff(base_ms=1, max_ms=1), **options
    )


async def test_a_creation_sent_without_idempotency_key_is_not_sent_twice_after_outcome_unknown():
    """With the client's own keys turned off, a create without one is not safe to send
    again: the outcome is the caller's to find out."""
    transport, seen = server(UNKNOWN, {})
    async with client(transport, idempotent_creates=False) as jf:
        with pytest.raises(OutcomeUnknown) as raised:
            await jf.create_job("t")
    assert raised.value.status == 503 and raised.value.retry_after_s is None
    assert len(seen) == 1
    assert "idempotencyKey" not in json.loads(seen[0].content)


@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
async def test_a_creation_gets_a_key_of_the_clients_own_and_is_sent_again_with_it(batch):
    """By default every job created without an idempotency key gets one of the client's
    own, the same in every attempt, so an outcome-unknown create is retried safely; a key
    the caller gave is kept."""
    from jobfair_client import NewJob

    transport, seen = server(UNKNOWN, {})
    async with client(transport) as jf:
        if batch:
            await jf.create_jobs([NewJob("t"), NewJob("t", idempotency_key="mine")])
        else:
            await jf.create_job("t")
    assert len(seen) == 2
    first, second = (json.loads(r.content) for r in seen)
    assert first == second
    keys = [j["idempotencyKey"] for j in first["jobs"]] if batch else [first["idempotencyKey"]]
    assert keys[0].startswith("auto-") and len(keys[0]) <= 255
    if batch:
        assert keys[1] == "mine"


async def test_idempotent_calls_are_sent_again_after_outcome_unknown():
    transport, seen = server(UNKNOWN, {})
    async with client(transport) as jf:
        job = await jf.create_job("t", idempotency_key="k1")
        assert job.key == "1"
        assert len(seen) == 2
    transport, seen = server(UNKNOWN, {})
    async with client(transport) as jf:
        await jf.complete(("1", 1))  # fenced by its activationCount
        assert len(seen) == 2


async def test_a_creation_refused_as_unavailable_is_sent_again():
    transport, seen = server(EXHAUSTED, {"Retry-After": "0"})
    async with client(transport) as jf:
        await jf.create_job("t")
    assert len(seen) == 2


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json={"results": []}),  # fewer verdicts than jobs
        httpx.Response(200, content=b"not json"),
        httpx.Response(500, json={"status": 500, "title": "INTERNAL", "detail": "x"}),
    ],
    ids=["short", "garbage", "500"],
)
async def test_a_batch_of_completions_that_fails_fails_each_finish_and_the_worker_goes_on(answer):
    """A worker whose batch of completions comes back wrong logs each job's finish as
    failed (their leases will expire) and carries on; nothing hangs or escapes."""
    from jobfair_client import AsyncWorker

    activations = 0
    jobs = [{**JOB, "jobKey": str(k), "state": "ACTIVATED", "activationCount": 1} for k in (1, 2)]

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal activations
        if request.url.path == "/v2/jobs/activate":
            activations += 1
            return httpx.Response(200, json={"jobs": jobs if activations == 1 else []})
        assert request.url.path == "/v2/jobs/complete"
        return answer

    async with client(httpx.MockTransport(handle)) as jf:
        handled = []

        async def handler(job):
            handled.append(job.key)
            if len(handled) == 2:
                worker.stop()

        worker = AsyncWorker(jf, "t", handler, concurrency=2, heartbeat=False)
        await worker.run()
    assert sorted(handled) == ["1", "2"]
    assert worker.stats.completed == 0 and worker.stats.conflicts == 0


async def test_at_shutdown_a_job_whose_handler_returned_is_not_released():
    """stop() with a short grace while a completion is slow on its way: the job is not
    also given back (released and completed, it could run twice); only a job whose
    handler still runs is."""
    import asyncio

    from jobfair_client import AsyncWorker

    sent: list[str] = []
    jobs = [{**JOB, "jobKey": str(k), "state": "ACTIVATED", "activationCount": 1} for k in (1, 2)]
    activations = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal activations
        sent.append(request.url.path)
        if request.url.path == "/v2/jobs/activate":
            activations += 1
            if activations > 1:
                await asyncio.sleep(0.05)  # a long poll that finds nothing
            return httpx.Response(200, json={"jobs": jobs if activations == 1 else []})
        if request.url.path == "/v2/jobs/complete":
            await asyncio.sleep(0.5)  # a slow answer, longer than the grace
            return httpx.Response(200, json={"results": [{"jobKey": "1", "status": 204}]})
        return httpx.Response(204)  # the release of job 2

    slow_started = asyncio.Event()

    async def handler(job):
        if job.key == "2":
            slow_started.set()
            await asyncio.Event().wait()  # never returns: released at shutdown
        return {"ok": True}

    async with client(httpx.MockTransport(handle)) as jf:
        worker = AsyncWorker(jf, "t", handler, concurrency=2, heartbeat=False, shutdown_grace_s=0.1)
        run = asyncio.create_task(worker.run())
        await slow_started.wait()
        worker.stop()
        await run
    assert "/v2/jobs/1/fail" not in sent and "/v2/jobs/2/fail" in sent
    assert worker.stats.completed == 1 and worker.stats.released == 1
