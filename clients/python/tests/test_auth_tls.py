"""jobfair_client with API keys against a live Jobfair that requires them, over plain HTTP
and over HTTPS (its certificate issued by the test's own CA, trusted through ``verify``)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from jobfair_client import AsyncJobfair, Jobfair, NotFound, Unauthorized, Worker

from app.keys import Role
from tests.fixtures import Live, Tls, quiet_settings


@pytest.fixture
def settings():
    return quiet_settings(auth="required")


@pytest.fixture(params=["http", "https"])
def url(request, live: Live, live_tls: str) -> str:
    return live.url if request.param == "http" else live_tls


async def test_keys_are_sent_and_scoped_over_http_and_https(live: Live, tls: Tls, url: str):
    keys = live.services.keys
    _, admin = await keys.create(Role.ADMIN, None, None, None, None, "test")
    _, worker = await keys.create(Role.WORKER, ["acme"], None, None, None, "test")
    async with AsyncJobfair(url, api_key=admin, verify=str(tls.ca)) as jf:
        mine = await jf.create_job("mail", tenant_id="acme")
        theirs = await jf.create_job("mail", tenant_id="globex")
    async with AsyncJobfair(url, api_key=worker, verify=tls.client_context()) as jf:
        assert (await jf.get_job(mine.key)).tenant_id == "acme"
        with pytest.raises(NotFound):  # another tenant's job, as one that does not exist
            await jf.get_job(theirs.key)
        jobs = await jf.activate("mail", max_jobs=10, timeout_ms=60_000, request_timeout_ms=-1)
        assert [j.key for j in jobs] == [mine.key]
        await jf.complete(jobs[0], {"done": True})
        assert (await jf.get_job(mine.key)).state == "COMPLETED"
    async with AsyncJobfair(url, api_key=worker[:-1] + "x", verify=str(tls.ca)) as jf:
        with pytest.raises(Unauthorized):
            await jf.get_job(mine.key)
    async with AsyncJobfair(url, verify=str(tls.ca)) as jf:
        with pytest.raises(Unauthorized):
            await jf.get_job(mine.key)


async def test_the_blocking_client_and_worker_trust_the_ca_given(live: Live, tls: Tls, live_tls):
    _, producer = await live.services.keys.create(Role.PRODUCER, ["acme"], None, None, None, "t")
    _, worker = await live.services.keys.create(Role.WORKER, ["acme"], None, None, None, "t")
    async with AsyncJobfair(live_tls, api_key=producer, verify=str(tls.ca)) as jf:
        job = await jf.create_job("mail", tenant_id="acme")

    def drain() -> str:
        # In a thread: the server runs in this test's event loop.
        with Jobfair(live_tls, api_key=worker, verify=str(tls.ca)) as jf:
            seen = []

            def handle(j):
                seen.append(j.key)
                w.stop()
                return {"handled": True}

            w = Worker(jf, "mail", handle, concurrency=1, request_timeout_ms=5000)
            w.run()
            assert seen == [job.key]
            return jf.get_job(job.key).state

    assert await asyncio.wait_for(asyncio.to_thread(drain), timeout=60) == "COMPLETED"


async def test_without_the_ca_the_certificate_is_refused(live_tls, live: Live):
    _, admin = await live.services.keys.create(Role.ADMIN, None, None, None, None, "test")
    async with AsyncJobfair(live_tls, api_key=admin, max_attempts=1) as jf:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await jf.get_job("1")
